"""Pure-functional entry points of the reader: params in, arrays out.

    model = DelayedInteractionModel(config)
    params = model.init(jax.random.key(0))
    q_lower = model.encode_lower(params, q_ids, q_mask, QUESTION_SEGMENT)   # once per question
    p_lower = model.encode_lower(params, p_ids, p_mask, PASSAGE_SEGMENT)    # once per passage
    out = model.encode_upper(params, q_lower, q_mask, p_lower, p_mask)      # per pair

`encode_upper` is the training and reference computation. Reading pairs at inference, with the
pair program's exact reuses (the first upper block's q/k/v per segment, the passages' attention
statistics, the last block's rows), is `dil_jax.reading.upper`'s, over the reader module's
`project_upper` / `read_upper`.

Every method is a plain function of its array arguments (the object only holds the static config),
so each can be wrapped in `jax.jit`, `jax.vmap` or a sharded computation. Shape checks run on
static shapes and raise `InputError` before any tracing reaches deep into XLA.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from dil_jax.errors import DilJaxError
from dil_jax.model.bert import SpanReaderModule
from dil_jax.model.encoder_config import EncoderConfig
from dil_jax.model.span_reader import PASSAGE_SEGMENT, QUESTION_SEGMENT, ReaderOutput
from dil_jax.model.xlnet import XLNetSpanReaderModule

Params = Any  # a nested dict of float32 arrays


class InputError(DilJaxError, ValueError):
    """Arrays handed to the model do not fit it; the message names the argument and shapes."""


def _check_segment_arrays(config: EncoderConfig, ids: Any, mask: Any, what: str) -> None:
    if ids.ndim != 2:
        raise InputError(f"{what} ids must be [batch, seq], got shape {tuple(ids.shape)}")
    if tuple(mask.shape) != tuple(ids.shape):
        raise InputError(
            f"{what} mask shape {tuple(mask.shape)} differs from ids shape {tuple(ids.shape)}"
        )
    if not jnp.issubdtype(ids.dtype, jnp.integer):
        raise InputError(f"{what} ids must be integers, got dtype {ids.dtype}")
    if ids.shape[1] > config.num_positions:
        raise InputError(f"{what} length {ids.shape[1]} exceeds {config.positions_text()}")


def check_segment_lengths(config: EncoderConfig, question_len: int, passage_len: int,
                          fix: str = "lower the question or passage length") -> None:
    """Raises InputError unless a question of `question_len` and a passage of `passage_len`
    tokens fit the position table (`num_positions`: `max_position_embeddings`, less
    padding_idx + 1 for RoBERTa) of a reader split at k.

    The rule: with k = 0 (the full model) passage positions follow the question's, so question
    + passage must fit; with k > 0 the question is numbered from 0 and the passage from
    `passage_position_offset`, and each must fit. Why check
    up front: past the table, the position lookup reads out of range and XLA returns NaN logits
    (or clamps), never an error. `fix` names the flags the caller's user can change.
    """
    limit = config.num_positions
    table = config.positions_text()
    k = config.num_lower_layers
    offset = config.passage_position_offset if k > 0 else 0
    if k == 0 and question_len + passage_len > limit:
        raise InputError(
            f"the full model (k = 0) numbers passage positions after the question: question "
            f"length {question_len} + passage length {passage_len} = "
            f"{question_len + passage_len} exceeds {table}; {fix}, or "
            f"read with k > 0")
    if offset and offset + passage_len > limit:
        raise InputError(f"passage positions start at passage_position_offset {offset}: "
                         f"{offset} + passage length {passage_len} = {offset + passage_len} "
                         f"exceeds {table} (k = {k}); {fix}")
    for name, length in (("question", question_len), ("passage", passage_len)):
        if length > limit:
            raise InputError(f"{name} length {length} exceeds {table} (k = {k}); {fix}")


def check_lower_states(config: EncoderConfig, lower: Any, name: str) -> None:
    """Raises InputError unless `lower` is [batch, seq, hidden] lower states of this reader."""
    if lower.ndim != 3 or lower.shape[-1] != config.hidden_size:
        raise InputError(f"{name} lower states must be [batch, seq, {config.hidden_size}], got "
                         f"{tuple(lower.shape)}")


def check_upper_inputs(config: EncoderConfig, q_lower: Any, q_mask: Any, p_lower: Any,
                       p_mask: Any) -> None:
    """Raises InputError unless question and passage lower states [batch, seq, hidden] and
    their masks [batch, seq] fit each other and the reader."""
    for name, lower, mask in (("question", q_lower, q_mask), ("passage", p_lower, p_mask)):
        check_lower_states(config, lower, name)
        if tuple(mask.shape) != tuple(lower.shape[:2]):
            raise InputError(f"{name} mask shape {tuple(mask.shape)} does not match lower "
                             f"states {tuple(lower.shape)}")
    if q_lower.shape[0] != p_lower.shape[0]:
        raise InputError(f"question batch {q_lower.shape[0]} differs from passage batch "
                         f"{p_lower.shape[0]}")


def reader_module(config: EncoderConfig) -> SpanReaderModule | XLNetSpanReaderModule:
    """The Flax module of an architecture: XLNet's relative attention has its own
    (`model/xlnet.py`); BERT, ALBERT, DistilBERT, RoBERTa, XLM-RoBERTa and ELECTRA share
    `SpanReaderModule` (`model/bert.py`). Both have the methods `model/span_reader.py` lists,
    called by name."""
    if config.architecture == "xlnet":
        return XLNetSpanReaderModule(config)
    return SpanReaderModule(config)


class DelayedInteractionModel:
    """A reader with split point `config.num_lower_layers` (k) of `config.num_layers` (l)."""

    def __init__(self, config: EncoderConfig):
        self.config = config
        self.module = reader_module(config)

    def init(self, rng: jax.Array, passage_len: int = 8) -> Params:
        """Fresh float32 params (normal(initializer_range) weights, as Hugging Face inits)."""
        q = jnp.ones((1, self.config.max_question_len), jnp.int32)
        p = jnp.ones((1, passage_len), jnp.int32)
        return self.module.init(rng, q, q, p, p)["params"]

    def encode_lower(self, params: Params, ids: jax.Array, mask: jax.Array, segment: int,
                     position_offset: jax.Array | None = None, *, deterministic: bool = True,
                     rngs: dict[str, jax.Array] | None = None,
                     output_hidden_states: bool = False):
        """Embeddings + blocks 1..k of one segment; [batch, seq] ids -> [batch, seq, hidden].

        `segment` is QUESTION_SEGMENT (ids `[CLS] q [SEP]`) or PASSAGE_SEGMENT (ids `p [SEP]`).
        """
        if segment not in (QUESTION_SEGMENT, PASSAGE_SEGMENT):
            raise InputError(f"segment must be {QUESTION_SEGMENT} (question) or "
                             f"{PASSAGE_SEGMENT} (passage), got {segment!r}")
        _check_segment_arrays(self.config, ids, mask, "question" if segment == 0 else "passage")
        self._check_hidden_states(output_hidden_states)
        start = self.config.passage_position_offset
        if position_offset is None and segment == PASSAGE_SEGMENT and start:
            if start + ids.shape[1] > self.config.num_positions:
                raise InputError(
                    f"passage_position_offset {start} + passage length {ids.shape[1]} = "
                    f"{start + ids.shape[1]} exceeds {self.config.positions_text()}; shorten "
                    f"the passage")
        if position_offset is not None and not isinstance(position_offset, jax.core.Tracer):
            # A concrete offset is checked here; traced ones (inside PairGrid's jit) are
            # bounded by the static question length, checked by PairGrid.
            last = int(jnp.max(jnp.asarray(position_offset))) + ids.shape[1]
            if last > self.config.num_positions:
                raise InputError(
                    f"position_offset up to {last - ids.shape[1]} + passage length "
                    f"{ids.shape[1]} = {last} exceeds {self.config.positions_text()}; shorten "
                    f"the question or passage")
        return self.module.apply(
            {"params": params}, ids, mask, segment, position_offset, deterministic,
            output_hidden_states, rngs=rngs, method="encode_lower")

    def _check_hidden_states(self, output_hidden_states: bool) -> None:
        if output_hidden_states and self.config.reversible:
            raise InputError("output_hidden_states with reversible=True: reversible blocks keep "
                             "no per-layer states (that is the memory they save)")

    def encode_upper(self, params: Params, q_lower: jax.Array, q_mask: jax.Array,
                     p_lower: jax.Array, p_mask: jax.Array, *, deterministic: bool = True,
                     rngs: dict[str, jax.Array] | None = None,
                     output_hidden_states: bool = False) -> ReaderOutput:
        """Blocks k+1..l over `[q ; p]` and the span head.

        q_lower: [batch, q_len, hidden], q_mask: [batch, q_len],
        p_lower: [batch, p_len, hidden], p_mask: [batch, p_len] -> ReaderOutput.
        """
        check_upper_inputs(self.config, q_lower, q_mask, p_lower, p_mask)
        self._check_hidden_states(output_hidden_states)
        return self.module.apply(
            {"params": params}, q_lower, q_mask, p_lower, p_mask, deterministic,
            output_hidden_states, rngs=rngs, method="encode_upper")

    def __call__(self, params: Params, q_ids: jax.Array, q_mask: jax.Array, p_ids: jax.Array,
                 p_mask: jax.Array, *, deterministic: bool = True,
                 rngs: dict[str, jax.Array] | None = None,
                 output_hidden_states: bool = False) -> ReaderOutput:
        """The whole reader on aligned (question, passage) pairs (`SpanReaderModule.__call__`)."""
        _check_segment_arrays(self.config, q_ids, q_mask, "question")
        _check_segment_arrays(self.config, p_ids, p_mask, "passage")
        if q_ids.shape[0] != p_ids.shape[0]:
            raise InputError(f"question batch {q_ids.shape[0]} differs from passage batch "
                             f"{p_ids.shape[0]}")
        check_segment_lengths(self.config, q_ids.shape[1], p_ids.shape[1])
        self._check_hidden_states(output_hidden_states)
        return self.module.apply(
            {"params": params}, q_ids, q_mask, p_ids, p_mask, deterministic,
            output_hidden_states, rngs=rngs)


def with_num_lower_layers(model: DelayedInteractionModel, k: int) -> DelayedInteractionModel:
    """The same architecture split at k (the params need no change)."""
    return DelayedInteractionModel(model.config.replace(num_lower_layers=k))
