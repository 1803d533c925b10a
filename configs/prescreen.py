"""The sentence prescreener ("Prototype 4") on the shared SQuAD articles.

    dil-jax prescreen --config configs/prescreen.py --config.workdir=runs/prescreen

Articles are split by article, as the reader's configs do: the reader configs train on 0:28 and
validate on 28:35; the prescreener trains on 0:25, stops early on 25:28 (dev) and is scored on
28:35, so its validation questions are the readers' validation questions.

Why not `base_config()`: that schema is the reader's training loop (`dil-jax train`: an encoder,
optimizer, checkpoints, distributed settings); the prescreener is another, small model trained by
`dil-jax prescreen` on sentence embeddings, whose keys below are all `train_prescreener` takes.
It shares the data file and the article split with the reader configs.
"""

import ml_collections

from dil_jax.defaults import SHARED_SQUAD_FILE


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.workdir = "runs/prescreen"  # the prescreener checkpoint folder written at the end
    c.data = ml_collections.ConfigDict(dict(
        file=SHARED_SQUAD_FILE,
        train_articles="0:25", dev_articles="25:28", val_articles="28:35", max_sentences=32))
    # The sentence encoder whose embeddings the prescreener reads ("default": the embedded
    # all-MiniLM-L6-v2), and its token limit per sentence.
    c.encoder = ml_collections.ConfigDict(dict(checkpoint="default", max_sentence_len=64))
    c.model = ml_collections.ConfigDict(dict(width=128, num_layers=4, num_heads=4, mlp_dim=256,
                                             dropout=0.1))
    c.train = ml_collections.ConfigDict(dict(steps=3000, batch_size=64, learning_rate=1e-3,
                                             weight_decay=0.01, seed=0, eval_every=100))
    return c
