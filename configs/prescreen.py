"""The sentence prescreener ("Prototype 4") on the complete SQuAD v1.1 training set.

    dil-jax prescreen --config configs/prescreen.py --config.workdir=runs/prescreen

Trains on every article of `data.file` (../shared/data/squad/train-v1.1.json: 442 articles,
87,599 questions), stops early on articles 25:28 of `data.eval_file` (the shared dev file: dev)
and is scored on its articles 28:35 (validation), the readers' validation questions. A training
article that is also a dev or validation one is refused. `--config.data.eval_file=''` takes all
three splits from `data.file` (`configs/prescreen.py:shared`: the earlier recipe on the shared
articles 0:25, 4,142 questions). `--config.data.val_articles=''` leaves the validation split
out: runs that compare configs by the dev accuracy need not see it (it is reported once, for the
chosen config).

Sentence embeddings are cached in `encoder.cache_dir` ('' = not cached) as they are computed:
a stopped run resumes, and a second config over the same data embeds nothing.

Why not `base_config()`: that schema is the reader's training loop (`dil-jax train`: an encoder,
optimizer, checkpoints, distributed settings); the prescreener is another, small model trained by
`dil-jax prescreen` on sentence embeddings, whose keys below are all `train_prescreener` takes.
It shares the data files and the article split with the reader configs.
"""

import ml_collections

from dil_jax.defaults import SHARED_SQUAD_FILE, SHARED_SQUAD_TRAIN_FILE
from dil_jax.errors import UsageError

VARIANTS = ("full", "shared")


def get_config(variant: str = "full") -> ml_collections.ConfigDict:
    if variant not in VARIANTS:
        raise UsageError(f"configs/prescreen.py:{variant}: unknown variant; one of "
                         f"{', '.join(VARIANTS)}")
    c = ml_collections.ConfigDict()
    c.workdir = "runs/prescreen"  # the prescreener checkpoint folder written at the end
    c.data = ml_collections.ConfigDict(dict(
        file=SHARED_SQUAD_TRAIN_FILE, eval_file=SHARED_SQUAD_FILE,
        train_articles=":", dev_articles="25:28", val_articles="28:35", max_sentences=32))
    # The sentence encoder whose embeddings the prescreener reads ("default": the embedded
    # all-MiniLM-L6-v2), its token limit per sentence, and where its embeddings are cached.
    c.encoder = ml_collections.ConfigDict(dict(checkpoint="default", max_sentence_len=64,
                                               cache_dir="runs/prescreen-embeddings"))
    # interaction: the question-sentence product as an input and the cosine in the score;
    # overlap: each sentence's IDF-weighted word overlap with the question, the IDF fitted on
    # the training passages (dil_jax.prescreening.model.PrescreenConfig).
    c.model = ml_collections.ConfigDict(dict(width=128, num_layers=4, num_heads=4, mlp_dim=256,
                                             dropout=0.1, interaction=True, overlap=True))
    c.train = ml_collections.ConfigDict(dict(steps=3000, batch_size=64, learning_rate=1e-3,
                                             weight_decay=0.01, seed=0, eval_every=100))
    if variant == "shared":
        c.workdir = "runs/prescreen_shared"
        c.data.file, c.data.eval_file, c.data.train_articles = SHARED_SQUAD_FILE, "", "0:25"
    return c
