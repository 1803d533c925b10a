"""Tiny QANet configs, inputs and perturbed params shared by the QANet test files."""

from __future__ import annotations

import jax
import numpy as np

from dil_jax.model.qanet import QANetModel
from dil_jax.model.qanet_config import QANetConfig
from dil_jax.model.qanet_inputs import CHAR_VOCAB_SIZE, QANetSegment

from tests.helpers import CONFIGS

# Every stage present, each small: 4 convs in the embedding block (the paper's), 2 model blocks
# of 2 convs, kernels 5 and 3 so that a token sees neighbours 2 and 1 away. No dropout (the
# references are inference); tests that need dropout switch it on.
TINY = dict(vocab_size=40, word_dim=12, max_chars=6, char_dim=8, char_filters=10,
            char_kernel=3, d_model=16, num_heads=2, ffn_dim=20, embedding_blocks=1,
            embedding_convs=4, embedding_kernel=5, model_blocks=2, model_convs=2, model_kernel=3,
            dropout=0.0, char_dropout=0.0, word_dropout=0.0)


def tiny_config(**changes) -> QANetConfig:
    return QANetConfig(**{**TINY, **changes})


def tiny_bidaf_config(tokenizer, max_question_len: int):
    """A tiny BiDAF over the tokenizer's vocabulary (a narrow table), no dropout."""
    from dil_jax.model.bidaf_config import BiDAFConfig

    return BiDAFConfig(vocab_size=tokenizer.vocab_size, word_dim=8, max_chars=TINY["max_chars"],
                       char_dim=4, char_filters=6, char_kernel=3, hidden=8, dropout=0.0,
                       char_dropout=0.0, max_question_len=max_question_len)


def tiny_bidaf_variables(config, seed: int = 0):
    """A tiny BiDAF's variables: its params perturbed as `tiny_variables`'s, its frozen word
    table as initialised."""
    from dil_jax.model.bidaf import BiDAFModel

    variables = BiDAFModel(config).init(jax.random.key(seed))
    return {"params": perturb(variables["params"], seed + 100), "frozen": variables["frozen"]}


def tiny_char_index(root, tokenizer, q_len: int, p_len: int, stride: int, kind: str = "qanet"):
    """A tiny QANet or BiDAF export (`kind`) over MiniLM's vocabulary (random, perturbed
    weights) and an index of the sample passages with its float32 cache (`dil-jax index --k 1`,
    windows of p_len tokens): (export folder, index folder, corpus source)."""
    from dil_jax.checkpoints.char_readers import save_char_reader

    from tests.helpers.index import build_sample_index

    if kind == "qanet":
        config = tiny_config(vocab_size=tokenizer.vocab_size, word_dim=8,
                             max_chars=TINY["max_chars"], max_question_len=q_len)
        variables = tiny_variables(config)
    elif kind == "bidaf":
        config = tiny_bidaf_config(tokenizer, q_len)
        variables = tiny_bidaf_variables(config)
    else:
        raise ValueError(f"kind {kind!r}: qanet or bidaf")
    export = save_char_reader(root / kind, variables, config)
    # float32 states: the tests compare the reads with the whole model within float32 rounding
    # (int8, the default storage, has its own tests).
    index, source = build_sample_index(
        root, "--checkpoint", str(export), "--max-passage-len", str(p_len), "--doc-stride",
        str(stride), "--max-question-len", str(q_len), "--batch-size", "2",
        "--cache-dtype", "float32", ks=("1",))
    return export, index, source


def perturb(tree, seed: int, scale: float = 0.3):
    """Every leaf plus N(0, scale^2) noise: Flax starts biases at 0 and LayerNorm scales at 1,
    which would hide a bias applied in the wrong place or a norm read from the wrong layer."""
    leaves, treedef = jax.tree.flatten(tree)
    rng = np.random.default_rng(seed)
    return jax.tree.unflatten(treedef, [
        np.asarray(leaf) + scale * rng.normal(size=np.shape(leaf)).astype(np.float32)
        for leaf in leaves])


def tiny_variables(config: QANetConfig, seed: int = 0):
    variables = QANetModel(config).init(jax.random.key(seed))
    return {**variables, "params": perturb(variables["params"], seed + 100)}


def segment(seed: int, batch: int, length: int, pads, config: QANetConfig) -> QANetSegment:
    """Random ids and characters; row r has pads[r] padding tokens at its end. Tokens have 1 to
    max_chars real characters (some exactly max_chars), padding tokens none."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, config.vocab_size, (batch, length)).astype(np.int32)
    mask = np.ones((batch, length), np.int32)
    for row, pad in enumerate(pads):
        if pad:
            mask[row, length - pad:] = 0
    chars = np.zeros((batch, length, config.max_chars), np.int32)
    counts = rng.integers(1, config.max_chars + 1, (batch, length))
    counts[:, 0] = config.max_chars
    for b in range(batch):
        for t in range(length):
            if mask[b, t]:
                chars[b, t, :counts[b, t]] = rng.integers(4, CHAR_VOCAB_SIZE, counts[b, t])
    ids = ids * mask
    return QANetSegment(ids=ids, chars=chars, mask=mask)


def pointing_features(seed: int, num_questions: int, question_len: int = 8,
                      passage_len: int = 16, vocab_size: int = 128):
    """A pointing task for the trainer (`char_data.CharFeatures`, one window per question): a
    passage of distinct random tokens (ids >= 4) and some padding; a question `[CLS] key x y
    [SEP]` whose key is one passage token and whose x, y occur nowhere in the passage; the
    answer is the key's position and the token after it. Only context-query attention can
    find it (the answer is where the passage matches the question): chance is 1 in the real
    tokens, a reader that learnt the match scores ~0 loss. Characters spell each id
    (`char_data.id_characters`)."""
    from dil_jax.train.char_data import CharFeatures, id_characters

    rng = np.random.default_rng(seed)
    cls, sep = 101, 102
    words = np.setdiff1d(np.arange(4, vocab_size), [cls, sep])
    q_ids = np.zeros((num_questions, question_len), np.int32)
    p_ids = np.zeros((num_questions, passage_len), np.int32)
    start = np.zeros(num_questions, np.int32)
    for i in range(num_questions):
        drawn = rng.permutation(words)
        n = int(rng.integers(passage_len // 2, passage_len))  # real tokens before [SEP]
        p_ids[i, :n], p_ids[i, n] = drawn[:n], sep
        start[i] = rng.integers(0, n - 1)
        q_ids[i, :5] = [cls, drawn[start[i]], drawn[n], drawn[n + 1], sep]
    q_mask, p_mask = (q_ids > 0).astype(np.int32), (p_ids > 0).astype(np.int32)
    return CharFeatures(q_ids=q_ids, q_mask=q_mask, p_ids=p_ids, p_mask=p_mask,
                        start_positions=start, end_positions=start + 1,
                        example_index=np.arange(num_questions, dtype=np.int32),
                        q_chars=id_characters(q_ids, q_mask), p_chars=id_characters(p_ids, p_mask),
                        p_source=np.arange(num_questions))


def trainer_config(kind: str, workdir, steps: int, **overrides):
    """configs/tiny.py:KIND ("qanet" / "bidaf") for the pointing task: batch 32, lr 1e-2, one
    final checkpoint (exported: no best metric), the validation loss at the end."""
    from dil_jax.train.config_files import apply_overrides, load_config_file

    values = {"workdir": str(workdir), "log.progress": "false", "log.tensorboard": "false",
              "checkpoint.async_save": "false", "batch_size": 32, "num_train_steps": steps,
              "optim.learning_rate": 1e-2, "optim.warmup_steps": 10,
              "checkpoint.every_steps": steps, "checkpoint.best_metric": "",
              "log.every_steps": 10, **overrides}
    return apply_overrides(load_config_file(f"{CONFIGS}/tiny.py:{kind}"),
                           [(key, str(value)) for key, value in values.items()])


def learnt_pointing(workdir, validation) -> dict:
    """Asserts that the run in `workdir` learnt the pointing task; returns the validation batch.

    Chance (`pointing_features`): loss (CE_start + CE_end) / 2 = E[log(n + 1)] ~ 2.5 over the
    n in 8..15 passage tokens and [SEP]; start accuracy ~1 in 12. A reader whose question side,
    attention masks or pointers were broken stays there. Asserted: the first logged loss near
    chance (> 2), the validation loss (256 held-out windows, no dropout) below half of chance
    (1.25), and the exported reader's held-out start accuracy > 0.5. (A logged training loss is
    one batch's, with dropout: too noisy to threshold.)
    """
    import json
    from pathlib import Path

    from dil_jax.readers import load_reader
    from dil_jax.train.char_data import char_windows

    rows = [json.loads(line) for line in (Path(workdir) / "metrics.jsonl").open()]
    losses = [row["loss"] for row in rows if row["split"] == "train"]
    val_loss = [row["val_loss"] for row in rows if row["split"] == "eval"][-1]
    assert losses[0] > 2.0, losses
    assert val_loss < 1.25, (losses, val_loss)
    reader = load_reader(Path(workdir) / "params", with_tokenizer=False)
    batch = char_windows(validation).batch(np.arange(len(validation.p_ids)))
    out = reader.outputs(reader.params, batch)
    accuracy = np.mean(np.argmax(np.asarray(out.start_logits), -1) == batch["start"])
    print(f"loss {losses[0]:.2f} -> {losses[-1]:.2f}, validation {val_loss:.2f}, "
          f"held-out start accuracy {accuracy:.3f}")
    assert accuracy > 0.5, accuracy
    return batch
