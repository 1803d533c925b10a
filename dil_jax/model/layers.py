"""The layers a BERT-family reader stacks: activations, embeddings and the transformer block.

    gelu_exact, activation_fn
                the feed-forward activations by their Hugging Face config names
    layer_norm the LayerNorm every layer of the reader builds (compute dtype, float32 params)
    Embeddings  word + position (+ token type) embeddings, LayerNorm, dropout (+ the factorized
                E -> H projection of ALBERT and ELECTRA)
    pair_rows, Block
                the post-LayerNorm block: full or LSH attention, the (optionally chunked)
                feed-forward, the pre-LayerNorm residuals of a reversible block, and
                `read_rows`, the pair program's row-subset form

Separate from bert.py, which stacks these layers into the reader (`SpanReaderModule`: which
parameter block each layer applies, remat, reversible stacks, `encode_lower` / `encode_upper` and
the span head): one layer's arithmetic here, the order the layers run in and what a pair reuses
there. XLNet's reader (xlnet.py) builds its own blocks from `layer_norm`, `pair_rows` and
`activation_fn`. Dependencies run one way: attention, memory <- layers <- bert, xlnet.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from dil_jax.model.attention import (
    QKV,
    PassageAttentionStats,
    SelfAttention,
    dense,
)
from dil_jax.model.encoder_config import ACTIVATIONS, ConfigError, EncoderConfig
from dil_jax.model.memory import map_row_chunks


def gelu_exact(x: jax.Array) -> jax.Array:
    """The exact (erf) GELU, x/2 * (1 + erf(x/sqrt 2)), written as Hugging Face's `gelu` is.

    Not `jax.nn.gelu(approximate=False)`: that is x/2 * erfc(-x/sqrt 2), and XLA:CPU expands erfc
    into two polynomials, an exp and a select per element, where erf is one cheap polynomial.
    Same function, as exact as torch's erf GELU (timings and errors: benchmarks/README.md, "What
    was changed for speed", item 4).
    """
    return x * (0.5 + 0.5 * jax.lax.erf(x * np.sqrt(0.5).astype(x.dtype)))


def activation_fn(name: str):
    """Feed-forward activation by its Hugging Face config name."""
    if name == "gelu":
        return gelu_exact
    if name in ("gelu_new", "gelu_pytorch_tanh", "gelu_fast"):
        return lambda x: jax.nn.gelu(x, approximate=True)
    if name == "relu":
        return jax.nn.relu
    raise ConfigError(f"unsupported hidden_act {name!r}; supported: {ACTIVATIONS}")


def layer_norm(config: EncoderConfig, name: str | None = None) -> nn.LayerNorm:
    return nn.LayerNorm(
        epsilon=config.layer_norm_eps, dtype=config.compute_dtype, param_dtype=jnp.float32,
        name=name,
    )


class Embeddings(nn.Module):
    """Word + position (+ token type) embeddings, LayerNorm, dropout (+ an E -> H projection:
    ALBERT's, ELECTRA's when E != H)."""

    config: EncoderConfig

    @nn.compact
    def __call__(self, ids: jax.Array, token_types: jax.Array, positions: jax.Array,
                 deterministic: bool = True) -> jax.Array:
        """ids, token_types, positions: [batch, seq] int -> [batch, seq, hidden]."""
        cfg = self.config
        init = nn.initializers.normal(cfg.initializer_range)

        def table(rows: int, name: str) -> nn.Embed:
            return nn.Embed(rows, cfg.embedding_size, dtype=cfg.compute_dtype,
                            param_dtype=jnp.float32, embedding_init=init, name=name)

        x = table(cfg.vocab_size, "word_embeddings")(ids)
        x = x + table(cfg.max_position_embeddings, "position_embeddings")(positions)
        if cfg.type_vocab_size:
            x = x + table(cfg.type_vocab_size, "token_type_embeddings")(token_types)
        x = layer_norm(cfg, "norm")(x)
        x = nn.Dropout(cfg.hidden_dropout)(x, deterministic=deterministic)
        if cfg.projects_embeddings:
            # Factorized embeddings: project E -> H before the first block. ALBERT always, as
            # transformers' AlbertTransformer does (`embedding_hidden_mapping_in`), even when
            # E == H: the checkpoint holds a trained projection then too. ELECTRA only when
            # E != H (ElectraModel's `embeddings_project`).
            x = dense(cfg, cfg.hidden_size, "projection")(x)
        return x


def pair_rows(x: jax.Array, question_len: int, question_rows: int, axis: int) -> jax.Array:
    """The rows of a pair a block computes: the first `question_rows` of the question's
    `question_len` rows, then every passage row, along `axis` (static slices)."""
    if question_rows == question_len:
        return x
    asked = jax.lax.slice_in_dim(x, 0, question_rows, axis=axis)
    read = jax.lax.slice_in_dim(x, question_len, x.shape[axis], axis=axis)
    return jnp.concatenate([asked, read], axis=axis)


class Block(nn.Module):
    """Post-LayerNorm transformer block (BERT, ALBERT and DistilBERT all use this form)."""

    config: EncoderConfig

    def setup(self) -> None:
        cfg = self.config
        self.attention = SelfAttention(cfg)
        self.attention_norm = layer_norm(cfg)
        self.ffn_in = dense(cfg, cfg.intermediate_size)
        self.ffn_out = dense(cfg, cfg.hidden_size)
        self.output_norm = layer_norm(cfg)
        self.dropout = nn.Dropout(cfg.hidden_dropout)

    def __call__(self, x: jax.Array, bias: jax.Array, deterministic: bool = True,
                 qkv: QKV | None = None, lsh_rng: jax.Array | None = None) -> jax.Array:
        """x: [batch, seq, hidden]; bias: [batch, 1, 1, seq] -> [batch, seq, hidden].

        qkv: this block's attention projections of x, if precomputed (see SelfAttention).
        lsh_rng: given, the attention is LSH attention with these hash rotations (an LSH layer
        of `config.lsh_attention_layers`).
        """
        attended = self._attention(x, bias, deterministic, qkv, lsh_rng)
        return self._feed_forward(x, attended, deterministic)

    def _attention(self, x: jax.Array, bias: jax.Array, deterministic: bool,
                   qkv: QKV | None = None, lsh_rng: jax.Array | None = None) -> jax.Array:
        if lsh_rng is not None:
            return self.attention.attend_lsh(x, bias, lsh_rng, qkv)
        return self.attention(x, bias, deterministic, qkv)

    def _ffn(self, x: jax.Array) -> jax.Array:
        """The feed-forward proper, row-wise: [batch, rows, hidden] -> [batch, rows, hidden];
        in chunks of `config.ffn_chunk_size` rows when set (exact: `map_row_chunks`)."""
        cfg = self.config
        act = activation_fn(cfg.hidden_act)
        chunk = cfg.ffn_chunk_size
        if not chunk or x.shape[1] <= chunk or self.is_initializing():
            return self.ffn_out(act(self.ffn_in(x)))
        # Inside lax.map only pure functions may run: the same Dense layers, applied to this
        # block's own parameters.
        dense_in, dense_out = self.ffn_in.clone(parent=None), self.ffn_out.clone(parent=None)
        params_in = {"params": self.ffn_in.variables["params"]}
        params_out = {"params": self.ffn_out.variables["params"]}

        def rows_ffn(rows: jax.Array) -> jax.Array:
            return dense_out.apply(params_out, act(dense_in.apply(params_in, rows)))

        return map_row_chunks(rows_ffn, x, chunk)

    def reversible_attention(self, x2: jax.Array, bias: jax.Array, deterministic: bool = True,
                             lsh_rng: jax.Array | None = None) -> jax.Array:
        """F of a reversible block (pre-LayerNorm): dropout(attention(LN(x2))), [batch, seq,
        hidden] -> [batch, seq, hidden]; y1 = x1 + F(x2) (`dil_jax.model.reversible`)."""
        attended = self._attention(self.attention_norm(x2), bias, deterministic, None, lsh_rng)
        return self.dropout(attended, deterministic=deterministic)

    def reversible_feed_forward(self, y1: jax.Array, deterministic: bool = True) -> jax.Array:
        """G of a reversible block (pre-LayerNorm): dropout(FFN(LN(y1))); y2 = x2 + G(y1)."""
        return self.dropout(self._ffn(self.output_norm(y1)), deterministic=deterministic)

    def _feed_forward(self, x: jax.Array, attended: jax.Array, deterministic: bool
                      ) -> jax.Array:
        """Residual + LayerNorm, FFN, residual + LayerNorm of the rows x: [batch, rows, hidden]
        given their attention output attended: [batch, rows, hidden]. Row by row."""
        x = self.attention_norm(x + self.dropout(attended, deterministic=deterministic))
        out = self._ffn(x)
        return self.output_norm(x + self.dropout(out, deterministic=deterministic))

    def read_rows(self, x: jax.Array, bias: jax.Array, question_len: int, question_rows: int,
                  qkv: QKV | None = None, stats: PassageAttentionStats | None = None
                  ) -> jax.Array:
        """The block at inference on [question ; passage] pairs, computing only some rows.

        x: [batch, q_len + p_len, hidden]; bias: [batch, 1, 1, q_len + p_len]; question_len:
        q_len; question_rows: how many leading question rows to compute (q_len, or 1 for `[CLS]`
        alone: the last block, whose other question rows no span score reads); qkv: `project`
        of x if precomputed; stats: the passage's `PassageAttentionStats` (first upper block
        only) or None -> [batch, question_rows + p_len, hidden], this block's output at those
        rows. Every row still serves as a key and value; everything after the keys and values
        (queries, attention, W_o, LayerNorms, FFN) runs on the computed rows only.
        """
        rows = pair_rows(x, question_len, question_rows, axis=1)
        if qkv is None:
            key, value = self.attention.project_key_value(x)
            query = self.attention.project_query(rows)
        else:
            query, key, value = qkv
            query = pair_rows(query, question_len, question_rows, axis=2)
        attended = self.attention.attend_rows(query, key, value, bias, question_len, stats)
        return self._feed_forward(rows, attended, True)
