"""The BERT-family reader module: `SpanReaderModule`, the stack of blocks and the span head.

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

Long passages (docs/long_passages.md, "Long passages"): `EncoderConfig` can chunk the feed-forward
over the sequence, put LSH attention in chosen blocks (`lsh.py`), remat the blocks
(`memory.py`) or make them reversible (`reversible.py`); all off by default.

The layers stacked here (`Embeddings`, `Block`, the activations) are in `layers.py`; what this
module shares with XLNet's (`ReaderOutput`, the segments, the API every reader module has) is in
`span_reader.py`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from dil_jax.model.attention import (
    QKV,
    PassageAttentionStats,
    attention_bias,
    dense,
)
from dil_jax.model.encoder_config import EncoderConfig
from dil_jax.model.layers import Block, Embeddings, layer_norm
from dil_jax.model.memory import checkpoint_policy
from dil_jax.model.reversible import reversible_layers
from dil_jax.model.span_reader import (
    PASSAGE_SEGMENT,
    ReaderOutput,
    pair_qkv,
    read_aligned_pairs,
    span_output,
)


def num_param_blocks(config: EncoderConfig) -> int:
    """How many blocks carry their own parameters (ALBERT: its hidden groups)."""
    return config.num_hidden_groups if config.shares_block_weights else config.num_layers


def param_block_of_layer(config: EncoderConfig, layer: int) -> int:
    """Index of the parameter block that layer `layer` (0-based) applies."""
    if config.shares_block_weights:
        return layer * config.num_hidden_groups // config.num_layers
    return layer


def reversible_residual(config: EncoderConfig, deterministic: bool, method: str,
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
        self.qa_outputs = dense(cfg, 2, "qa_outputs")
        if cfg.reversible:
            # Pre-LayerNorm streams are not normalised at the end of the stack; post-LN
            # readers have no such layer, so it exists only in reversible readers.
            self.reversible_norm = layer_norm(cfg, "reversible_norm")

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
                functools.partial(reversible_residual, cfg, deterministic, "attention"),
                functools.partial(reversible_residual, cfg, deterministic, "feed_forward"),
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
                     output_hidden_states: bool = False) -> ReaderOutput:
        """Blocks k+1..l over `[question ; passage]` and the span head.

        Args:
          q_lower: [batch, q_len, hidden] question lower states (q_len = padded question length).
          q_mask: [batch, q_len].
          p_lower: [batch, p_len, hidden] passage lower states.
          p_mask: [batch, p_len].
        Returns:
          ReaderOutput (hidden_states holds the l-k upper states, if asked).
        """
        x = jnp.concatenate([q_lower, p_lower], axis=1)
        mask = jnp.concatenate([q_mask, p_mask], axis=1)
        layers = range(self.config.num_lower_layers, self.config.num_layers)
        states = self._run_layers(x, mask, layers, deterministic)
        return self._span_head(x, states, p_mask, output_hidden_states)

    def read_upper(self, q_lower: jax.Array, q_mask: jax.Array, p_lower: jax.Array,
                   p_mask: jax.Array, q_qkv: QKV | None = None, p_qkv: QKV | None = None,
                   p_stats: PassageAttentionStats | None = None,
                   span_rows_only: bool = False) -> ReaderOutput:
        """`encode_upper` at inference (deterministic, no hidden states) with the pair
        program's exact reuses; with none of them, the same computation.

        Args:
          q_lower, q_mask, p_lower, p_mask: as `encode_upper`.
          q_qkv, p_qkv: `project_upper` of q_lower / p_lower, if already computed (either, both
            or neither; the other is computed here), 3 x [batch, heads, seq, head_dim].
          p_stats: `passage_attention_stats` of p_lower's first-upper-block projections: the
            first upper block's passage rows then score only the question's keys (0 < k < l).
          span_rows_only: the last block computes only the rows the span head reads, `[CLS]`
            (the null score) and the passage.
          Each reuse is exact up to float rounding (docs/architecture.md, "Exact reuse").
        Returns:
          ReaderOutput without hidden states.
        """
        x = jnp.concatenate([q_lower, p_lower], axis=1)
        mask = jnp.concatenate([q_mask, p_mask], axis=1)
        first_qkv = pair_qkv(self, q_lower, p_lower, q_qkv, p_qkv)
        if span_rows_only or p_stats is not None:
            states = self._read_upper_rows(x, mask, q_lower.shape[1], first_qkv, span_rows_only,
                                           p_stats)
        else:
            layers = range(self.config.num_lower_layers, self.config.num_layers)
            states = self._run_layers(x, mask, layers, True, first_qkv)
        return self._span_head(x, states, p_mask, False)

    def _span_head(self, x: jax.Array, states: list[jax.Array], p_mask: jax.Array,
                   output_hidden_states: bool) -> ReaderOutput:
        """The span head on the last upper state (x itself at k = l): [batch, rows, hidden]
        -> ReaderOutput."""
        final = states[-1] if states else x
        if self.config.reversible:
            final = self.reversible_norm(final)
        logits = self.qa_outputs(final).astype(jnp.float32)  # [batch, rows, 2]
        return span_output(logits, p_mask, tuple(states) if output_hidden_states else None)

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

