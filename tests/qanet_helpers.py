"""Tiny QANet configs, inputs and perturbed params shared by the QANet test files."""

from __future__ import annotations

import jax
import numpy as np

from dil_jax.model.qanet import QANetModel
from dil_jax.model.qanet_config import QANetConfig
from dil_jax.model.qanet_inputs import CHAR_VOCAB_SIZE, QANetSegment

# Every stage present, each small: 4 convs in the embedding block (the paper's), 2 model blocks
# of 2 convs, kernels 5 and 3 so that a token sees neighbours 2 and 1 away. No dropout (the
# references are inference); tests that need dropout switch it on.
TINY = dict(vocab_size=40, word_dim=12, max_chars=6, char_dim=8, char_filters=10,
            char_kernel=3, d_model=16, num_heads=2, ffn_dim=20, embedding_blocks=1,
            embedding_convs=4, embedding_kernel=5, model_blocks=2, model_convs=2, model_kernel=3,
            dropout=0.0, char_dropout=0.0, word_dropout=0.0)


def tiny_config(**changes) -> QANetConfig:
    return QANetConfig(**{**TINY, **changes})


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
    return {"params": perturb(variables["params"], seed + 100),
            "frozen": variables["frozen"]}


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
