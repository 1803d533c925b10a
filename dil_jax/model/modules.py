"""Flax (linen) modules of a delayed-interaction reader.

One post-LayerNorm transformer serves BERT, ALBERT, DistilBERT, RoBERTa, XLM-RoBERTa and ELECTRA;
they differ only in the embeddings (ALBERT and ELECTRA may factorize them, DistilBERT has no token
types, RoBERTa numbers positions from padding_idx + 1 and gives both segments type 0) and in how
many distinct blocks carry parameters (ALBERT shares one block, or a few groups, across all `l`
layers). The split is the paper's:

  encode_lower:  embeddings + blocks 1..k on ONE segment, a question `[CLS] q [SEP]` or a passage
                 `p [SEP]` (RoBERTa: `<s> q </s></s>` and `p </s>`, the tokenizer's pair layout
                 cut before the passage). Positions restart at the first position for each
                 segment (plus an optional offset) and the token type is 0 for questions and 1
                 for passages, as in DeFormer and DilBert (RoBERTa, XLM-RoBERTa: 0 for both;
                 DistilBERT: none; those segments are told apart by the position restart alone),
                 so a passage's lower state never depends on the question.
  encode_upper:  concatenate `[question ; passage]` lower states (the question padded to a fixed
                 length, its padding masked) and run blocks k+1..l and the span head.

With k = 0 and the passage offset set to the question's length this is exactly standard BERT over
`[CLS] q [SEP] p [SEP]`: masked padding between the two segments receives zero attention weight.

Long passages (docs/architecture.md, "Long passages"): `EncoderConfig` can chunk the feed-forward
over the sequence, put LSH attention in chosen blocks (`lsh.py`), remat the blocks
(`memory.py`) or make them reversible (`reversible.py`); all off by default.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from dil_jax.config import ACTIVATIONS, ConfigError, EncoderConfig
from dil_jax.model.attention import (
    QKV,
    PassageAttentionStats,
    SelfAttention,
    _dense,
    attention_bias,
)
from dil_jax.model.memory import checkpoint_policy, map_row_chunks
from dil_jax.model.reversible import reversible_layers

QUESTION_SEGMENT = 0
PASSAGE_SEGMENT = 1

# Logit given to padded passage positions so that softmax over spans ignores them.
PADDED_LOGIT = -1e9


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


@flax.struct.dataclass
class ReaderOutput:
    """Span scores of a (question, passage) pair batch.

    Attributes:
      start_logits: [batch, passage_len] start scores of passage tokens (padding = PADDED_LOGIT).
      end_logits: [batch, passage_len] end scores of passage tokens.
      null_start_logits: [batch] start score of `[CLS]` (SQuAD 2.0's no-answer score).
      null_end_logits: [batch] end score of `[CLS]`.
      hidden_states: None, or l+1 arrays [batch, question_len + passage_len, hidden]: the embedding
        output and each block's output over the concatenated pair (for layers <= k, the two
        segments' lower states side by side).
    """

    start_logits: jax.Array
    end_logits: jax.Array
    null_start_logits: jax.Array
    null_end_logits: jax.Array
    hidden_states: tuple[jax.Array, ...] | None = None


def _layer_norm(config: EncoderConfig, name: str | None = None) -> nn.LayerNorm:
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
        x = _layer_norm(cfg, "norm")(x)
        x = nn.Dropout(cfg.hidden_dropout)(x, deterministic=deterministic)
        if cfg.projects_embeddings:
            # Factorized embeddings: project E -> H before the first block. ALBERT always, as
            # transformers' AlbertTransformer does (`embedding_hidden_mapping_in`), even when
            # E == H: the checkpoint holds a trained projection then too. ELECTRA only when
            # E != H (ElectraModel's `embeddings_project`).
            x = _dense(cfg, cfg.hidden_size, "projection")(x)
        return x


def _pair_rows(x: jax.Array, question_len: int, question_rows: int, axis: int) -> jax.Array:
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
        self.attention_norm = _layer_norm(cfg)
        self.ffn_in = _dense(cfg, cfg.intermediate_size)
        self.ffn_out = _dense(cfg, cfg.hidden_size)
        self.output_norm = _layer_norm(cfg)
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
        rows = _pair_rows(x, question_len, question_rows, axis=1)
        if qkv is None:
            key, value = self.attention.project_key_value(x)
            query = self.attention.project_query(rows)
        else:
            query, key, value = qkv
            query = _pair_rows(query, question_len, question_rows, axis=2)
        attended = self.attention.attend_rows(query, key, value, bias, question_len, stats)
        return self._feed_forward(rows, attended, True)


def num_param_blocks(config: EncoderConfig) -> int:
    """How many blocks carry their own parameters (ALBERT: its hidden groups)."""
    return config.num_hidden_groups if config.shares_block_weights else config.num_layers


def param_block_of_layer(config: EncoderConfig, layer: int) -> int:
    """Index of the parameter block that layer `layer` (0-based) applies."""
    if config.shares_block_weights:
        return layer * config.num_hidden_groups // config.num_layers
    return layer


def pair_reuses_apply(config: EncoderConfig) -> bool:
    """Whether the pair program's exact reuses (the first upper block's q/k/v per segment, the
    passage's attention statistics, the last block's rows) hold: they assume post-LayerNorm
    blocks with full attention above k, so not with reversible blocks or LSH upper layers."""
    return not config.reversible and not config.lsh_in_upper_blocks()


def _reversible_residual(config: EncoderConfig, deterministic: bool, method: str,
                         params: Any, x: jax.Array, aux: tuple[Any, ...]) -> jax.Array:
    """F ("attention") or G ("feed_forward") of one reversible block as a pure function
    (`reversible.Residual`): params of one Block, x [batch, seq, hidden] -> the same shape.

    aux: (bias [batch, 1, 1, seq], dropout key or None, LSH key or None)."""
    bias, dropout_rng, lsh_rng = aux
    rngs = None if dropout_rng is None else {"dropout": dropout_rng}
    # parent=None: an unbound module even when called inside SpanReaderModule's methods.
    block = Block(config, parent=None)
    if method == "attention":
        return block.apply({"params": params}, x, bias, deterministic, lsh_rng, rngs=rngs,
                           method=Block.reversible_attention)
    if method == "feed_forward":
        return block.apply({"params": params}, x, deterministic, rngs=rngs,
                           method=Block.reversible_feed_forward)
    raise ValueError(f"unknown reversible residual {method!r}: 'attention' or 'feed_forward'")


class SpanReaderModule(nn.Module):
    """Delayed-interaction extractive QA reader (see the module docstring)."""

    config: EncoderConfig

    def setup(self) -> None:
        cfg = self.config
        self.embeddings = Embeddings(cfg)
        block_class = Block
        if cfg.remat_policy != "none":
            # Arguments counted with self as 0: `deterministic` (3) is a Python bool.
            block_class = nn.remat(Block, policy=checkpoint_policy(cfg.remat_policy),
                                   static_argnums=(3,))
        self.blocks = [block_class(cfg, name=f"block_{i}")
                       for i in range(num_param_blocks(cfg))]
        self.qa_outputs = _dense(cfg, 2, "qa_outputs")
        if cfg.reversible:
            # Pre-LayerNorm streams are not normalised at the end of the stack; post-LN
            # readers have no such layer, so it exists only in reversible readers.
            self.reversible_norm = _layer_norm(cfg, "reversible_norm")

    def _lsh_rng(self, layer: int, deterministic: bool) -> jax.Array | None:
        """The hash rotations' key of `layer`, None if it is not an LSH layer: a fresh "lsh"
        rng in training when the caller passes one, else the fixed `config.lsh_seed` (the same
        buckets on every call: inference, caches)."""
        cfg = self.config
        if layer not in cfg.lsh_attention_layers:
            return None
        if not deterministic and self.has_rng("lsh"):
            return jax.random.fold_in(self.make_rng("lsh"), layer)
        return jax.random.fold_in(jax.random.key(cfg.lsh_seed), layer)

    def _run_layers(self, x: jax.Array, mask: jax.Array, layers: Sequence[int],
                    deterministic: bool, first_qkv: QKV | None = None) -> list[jax.Array]:
        """first_qkv: the first layer's attention projections of x, if precomputed."""
        if self.config.reversible:
            return self._run_reversible(x, mask, layers, deterministic)
        bias = attention_bias(mask)
        states = []
        for i, layer in enumerate(layers):
            qkv = first_qkv if i == 0 else None
            x = self.blocks[param_block_of_layer(self.config, layer)](
                x, bias, deterministic, qkv, self._lsh_rng(layer, deterministic))
            states.append(x)
        return states

    def _run_reversible(self, x: jax.Array, mask: jax.Array, layers: Sequence[int],
                        deterministic: bool) -> list[jax.Array]:
        """Reversible blocks: both streams start as x [batch, seq, hidden]; -> [their mean
        after the last layer] (one state: the per-layer states are what is not kept).

        `reversible_layers` recomputes activations in the backward pass. At init the same
        functions run as ordinary Flax calls, which is what creates the parameters.
        """
        cfg = self.config
        if not layers:
            return []
        bias = attention_bias(mask)
        blocks = [self.blocks[param_block_of_layer(cfg, layer)] for layer in layers]
        aux = tuple((bias, None if deterministic else self.make_rng("dropout"),
                     self._lsh_rng(layer, deterministic)) for layer in layers)
        if self.is_initializing():
            x1 = x2 = x
            for block, (_, _, lsh_rng) in zip(blocks, aux):
                x1 = x1 + block.reversible_attention(x2, bias, deterministic, lsh_rng)
                x2 = x2 + block.reversible_feed_forward(x1, deterministic)
        else:
            params = tuple(block.variables["params"] for block in blocks)
            x1, x2 = reversible_layers(
                functools.partial(_reversible_residual, cfg, deterministic, "attention"),
                functools.partial(_reversible_residual, cfg, deterministic, "feed_forward"),
                params, aux, x, x)
        return [(x1 + x2) * jnp.asarray(0.5, x1.dtype)]

    def encode_lower(self, ids: jax.Array, mask: jax.Array, segment: int,
                     position_offset: jax.Array | None = None, deterministic: bool = True,
                     output_hidden_states: bool = False):
        """Embeddings + the first k blocks on one segment alone.

        Args:
          ids: [batch, seq] token ids of `[CLS] q [SEP]` (segment 0) or `p [SEP]` (segment 1).
          mask: [batch, seq] 1 for tokens, 0 for padding.
          segment: QUESTION_SEGMENT or PASSAGE_SEGMENT, used as the token type id (type 0 for
            both where `config.segment_token_types` is False: RoBERTa, XLM-RoBERTa).
          position_offset: None or [batch] int added to every position; the full model (k = 0)
            passes the question length so that positions are standard BERT's. None: a question
            is numbered from 0, a passage from `config.passage_position_offset` (default 0).
            Every position is then shifted by `config.first_position` (RoBERTa: padding_idx +
            1, so token i of `<s> q </s></s> p </s>` gets padding_idx + 1 + i, as Hugging Face
            numbers an unpadded sequence; at k > 0 each segment is numbered as if alone).
        Returns:
          [batch, seq, hidden] lower states, or (that, tuple of k+1 states) with hidden states.
        """
        first = self.config.first_position
        positions = jnp.broadcast_to(jnp.arange(first, first + ids.shape[1], dtype=jnp.int32),
                                     ids.shape)
        if position_offset is None and segment == PASSAGE_SEGMENT:
            # Delayed passages: a constant start, the same for every question (cacheable).
            positions = positions + self.config.passage_position_offset
        elif position_offset is not None:
            positions = positions + position_offset[:, None].astype(jnp.int32)
        token_type = segment if self.config.segment_token_types else 0
        token_types = jnp.full(ids.shape, token_type, dtype=jnp.int32)
        x = self.embeddings(ids, token_types, positions, deterministic)
        states = [x] + self._run_layers(x, mask, range(self.config.num_lower_layers),
                                        deterministic)
        if output_hidden_states:
            return states[-1], tuple(states)
        return states[-1]

    def project_upper(self, lower: jax.Array) -> QKV:
        """The first upper block's attention query/key/value of one segment's lower states.

        lower: [batch, seq, hidden] -> 3 x [batch, heads, seq, head_dim]. A token's projections
        depend on its own lower state only, so a grid computes them once per question and once
        per passage instead of once per pair; with k = l - 1 that takes the q/k/v matmuls out of
        the q x p pair phase (their share: benchmarks/README.md, "The q/k/v projections per
        segment vs in every pair").
        """
        cfg = self.config  # 0 <= k < l: checked by DelayedInteractionModel
        block = self.blocks[param_block_of_layer(cfg, cfg.num_lower_layers)]
        return block.attention.project(lower)

    def encode_upper(self, q_lower: jax.Array, q_mask: jax.Array, p_lower: jax.Array,
                     p_mask: jax.Array, deterministic: bool = True,
                     output_hidden_states: bool = False, q_qkv: QKV | None = None,
                     p_qkv: QKV | None = None, span_rows_only: bool = False,
                     p_stats: PassageAttentionStats | None = None):
        """Blocks k+1..l over `[question ; passage]` and the span head.

        Args:
          q_lower: [batch, q_len, hidden] question lower states (q_len = padded question length).
          q_mask: [batch, q_len].
          p_lower: [batch, p_len, hidden] passage lower states.
          p_mask: [batch, p_len].
          q_qkv, p_qkv: `project_upper` of q_lower / p_lower, if already computed (either, both
            or neither; the other is computed here). Same result, less work per pair.
          span_rows_only: the last block computes only the rows the span head reads, `[CLS]`
            (the null score) and the passage (inference only; no hidden states).
          p_stats: `passage_attention_stats` of p_lower's first-upper-block projections: the
            first upper block's passage rows then score only the question's keys (inference
            only; 0 < k < l).
          Both reuses are exact up to float rounding (docs/architecture.md, "Exact reuse").
        Returns:
          ReaderOutput (hidden_states holds the l-k upper states, if asked).
        """
        x = jnp.concatenate([q_lower, p_lower], axis=1)
        mask = jnp.concatenate([q_mask, p_mask], axis=1)
        q_len = q_lower.shape[1]
        layers = range(self.config.num_lower_layers, self.config.num_layers)
        first_qkv = None
        if q_qkv is not None or p_qkv is not None:
            q_qkv = self.project_upper(q_lower) if q_qkv is None else q_qkv
            p_qkv = self.project_upper(p_lower) if p_qkv is None else p_qkv
            first_qkv = tuple(jnp.concatenate([q, p], axis=2) for q, p in zip(q_qkv, p_qkv))
        if span_rows_only or p_stats is not None:
            states = self._read_upper_rows(x, mask, q_len, first_qkv, span_rows_only, p_stats)
        else:
            states = self._run_layers(x, mask, layers, deterministic, first_qkv)
        final = states[-1] if states else x
        if self.config.reversible:
            final = self.reversible_norm(final)
        logits = self.qa_outputs(final).astype(jnp.float32)  # [batch, rows, 2]
        # The passage's rows are the last p_len: after the question's (or [CLS] alone).
        passage_rows = final.shape[1] - p_lower.shape[1]
        passage_logits = jnp.where(p_mask[..., None] > 0, logits[:, passage_rows:],
                                   PADDED_LOGIT)
        return ReaderOutput(
            start_logits=passage_logits[..., 0],
            end_logits=passage_logits[..., 1],
            null_start_logits=logits[:, 0, 0],
            null_end_logits=logits[:, 0, 1],
            hidden_states=tuple(states) if output_hidden_states else None,
        )

    def _read_upper_rows(self, x: jax.Array, mask: jax.Array, question_len: int,
                         first_qkv: QKV | None, span_rows_only: bool,
                         p_stats: PassageAttentionStats | None) -> list[jax.Array]:
        """The upper blocks at inference with the pair program's reuses (`Block.read_rows`).

        x: [batch, q_len + p_len, hidden] -> each upper block's output; the last one is
        [batch, 1 + p_len, hidden] ([CLS], then the passage) with span_rows_only. p_stats
        serves the first upper block only: above it the passage's states depend on the question.
        """
        cfg = self.config
        bias = attention_bias(mask)
        layers = range(cfg.num_lower_layers, cfg.num_layers)
        states = []
        for i, layer in enumerate(layers):
            last = i == len(layers) - 1
            question_rows = 1 if span_rows_only and last else question_len
            x = self.blocks[param_block_of_layer(cfg, layer)].read_rows(
                x, bias, question_len, question_rows, first_qkv if i == 0 else None,
                p_stats if i == 0 else None)
            states.append(x)
        return states

    def __call__(self, q_ids: jax.Array, q_mask: jax.Array, p_ids: jax.Array, p_mask: jax.Array,
                 deterministic: bool = True, output_hidden_states: bool = False) -> ReaderOutput:
        """The whole reader on question/passage pairs: lower on each segment, then upper.

        q_ids, q_mask: [batch, q_len]; p_ids, p_mask: [batch, p_len]. With k = 0 the passage
        positions continue after the question's real tokens (standard BERT); with k > 0 they
        restart at 0 (the delayed-interaction convention).
        """
        offset = None
        if self.config.num_lower_layers == 0:
            offset = jnp.sum(q_mask, axis=1).astype(jnp.int32)
        return read_aligned_pairs(self, q_ids, q_mask, p_ids, p_mask, offset, deterministic,
                                  output_hidden_states)


def read_aligned_pairs(reader: nn.Module, q_ids: jax.Array, q_mask: jax.Array, p_ids: jax.Array,
                       p_mask: jax.Array, passage_offset: jax.Array | None, deterministic: bool,
                       output_hidden_states: bool) -> ReaderOutput:
    """encode_lower on each segment, then encode_upper: the `__call__` of every reader module
    (SpanReaderModule, XLNet's). q_ids, q_mask: [batch, q_len]; p_ids, p_mask: [batch, p_len];
    passage_offset: [batch] or None. With output_hidden_states, the lower states of the two
    segments are concatenated as `[question ; passage]` before the upper blocks' states."""
    q_out = reader.encode_lower(q_ids, q_mask, QUESTION_SEGMENT, None, deterministic,
                                output_hidden_states)
    p_out = reader.encode_lower(p_ids, p_mask, PASSAGE_SEGMENT, passage_offset, deterministic,
                                output_hidden_states)
    if not output_hidden_states:
        return reader.encode_upper(q_out, q_mask, p_out, p_mask, deterministic)
    (q_lower, q_states), (p_lower, p_states) = q_out, p_out
    out = reader.encode_upper(q_lower, q_mask, p_lower, p_mask, deterministic, True)
    lower_states = tuple(jnp.concatenate([q, p], axis=1) for q, p in zip(q_states, p_states))
    return out.replace(hidden_states=lower_states + out.hidden_states)
