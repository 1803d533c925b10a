"""The pair program's upper blocks at inference: params in, arrays out, over one reader model.

    q_qkv = project_upper(model, params, q_lower)             # once per question
    p_qkv = project_upper(model, params, p_lower)             # once per passage
    p_stats = passage_attention_stats(model, p_qkv, p_mask)   # once per passage
    out = read_upper(model, params, q_lower, q_mask, p_lower, p_mask, q_qkv=q_qkv,
                     p_qkv=p_qkv, p_stats=p_stats, span_rows_only=True)   # per pair

`read_upper` is `DelayedInteractionModel.encode_upper` (the training and reference computation)
with the pair program's exact reuses, through the reader module's own inference method
(`read_upper`); with none of them it computes the same. Each function checks its arrays and
refuses, by name, a reuse the reader's `ReusePlan` does not allow, before anything is traced.
Plain functions of their array arguments: each can be wrapped in `jax.jit` (`PairGrid` does).
"""

from __future__ import annotations

from typing import Any

import jax

from dil_jax.model.attention import QKV, PassageAttentionStats
from dil_jax.model.attention import passage_attention_stats as stats_of_passages
from dil_jax.model.delayed import (
    DelayedInteractionModel,
    InputError,
    Params,
    check_lower_states,
    check_upper_inputs,
)
from dil_jax.model.span_reader import ReaderOutput
from dil_jax.model.xlnet import XLNetUnsupportedError
from dil_jax.reading.plan import ReusePlan


def _check_has_upper_block(model: DelayedInteractionModel) -> None:
    config = model.config
    if config.num_lower_layers >= config.num_layers:
        raise InputError(f"k = {config.num_lower_layers} of {config.num_layers} layers leaves "
                         f"no upper block to project for")


def _check_plain_upper(model: DelayedInteractionModel, what: str) -> None:
    config = model.config
    if not ReusePlan.for_config(config).plain_upper:
        raise InputError(
            f"{what} is an exact reuse of post-LayerNorm, full-attention upper blocks; this "
            f"reader has reversible={config.reversible}, lsh_attention_layers="
            f"{list(config.lsh_attention_layers)} with k = {config.num_lower_layers}: read pairs "
            f"without it (PairGrid turns it off itself)")


def _check_qkv(model: DelayedInteractionModel, qkv: Any, lower: Any, name: str) -> None:
    config = model.config
    want = (lower.shape[0], config.num_heads, lower.shape[1], config.head_dim)
    if len(qkv) != 3 or any(tuple(a.shape) != want for a in qkv):
        raise InputError(f"{name} q/k/v must be 3 arrays of shape {want} (project_upper of "
                         f"its lower states), got {[tuple(a.shape) for a in qkv]}")


def _refuse_xlnet_stats(model: DelayedInteractionModel) -> None:
    if model.config.architecture == "xlnet":
        raise XLNetUnsupportedError(
            "passage attention statistics (p_stats) are not implemented for architecture "
            "'xlnet': its scores carry relative position and segment terms")


def _check_stats(model: DelayedInteractionModel, stats: Any, p_lower: Any) -> None:
    _refuse_xlnet_stats(model)
    config = model.config
    if config.num_lower_layers == 0:
        raise InputError("p_stats given with k = 0: the full model has no question-independent "
                         "passage attention")
    batch, p_len = p_lower.shape[:2]
    want = {"row_max": (batch, config.num_heads, p_len),
            "row_sum": (batch, config.num_heads, p_len),
            "weighted_values": (batch, config.num_heads, p_len, config.head_dim)}
    got = {name: tuple(getattr(stats, name).shape) for name in want}
    if got != want:
        raise InputError(f"p_stats shapes {got} do not fit passage lower states "
                         f"{tuple(p_lower.shape)}: want {want} (passage_attention_stats)")


def project_upper(model: DelayedInteractionModel, params: Params, lower: jax.Array) -> QKV:
    """The first upper block's (query, key, value) of one segment's lower states.

    lower: [batch, seq, hidden] -> 3 x [batch, heads, seq, head_dim]. A token's projections
    depend on its own lower state only: computed once per question and per passage, they save
    those matmuls on every pair that reads the segment.
    """
    check_lower_states(model.config, lower, "segment")
    _check_has_upper_block(model)
    _check_plain_upper(model, "project_upper")
    return model.module.apply({"params": params}, lower, method="project_upper")


def passage_attention_stats(model: DelayedInteractionModel, p_qkv: QKV,
                            p_mask: jax.Array) -> PassageAttentionStats:
    """The first upper block's attention statistics of passages over their own keys.

    p_qkv: `project_upper` of passage lower states, 3 x [batch, heads, p_len, head_dim];
    p_mask: [batch, p_len] -> PassageAttentionStats ([batch, heads, p_len] row max and row sum,
    [batch, heads, p_len, head_dim] weighted values). Question-independent: computed once per
    passage, handed to `read_upper(..., p_stats=...)` for every pair reading it.
    """
    config = model.config
    _check_has_upper_block(model)
    _check_plain_upper(model, "passage_attention_stats")
    _refuse_xlnet_stats(model)
    if config.num_lower_layers == 0:
        raise InputError("passage attention statistics need k > 0: at k = 0 a passage's "
                         "first-block input depends on the question (its positions)")
    want = (p_mask.shape[0], config.num_heads, p_mask.shape[1], config.head_dim)
    if len(p_qkv) != 3 or any(tuple(a.shape) != want for a in p_qkv):
        raise InputError(f"p_qkv must be 3 arrays of shape {want} (project_upper of the "
                         f"passages whose mask is p_mask), got {[tuple(a.shape) for a in p_qkv]}")
    return stats_of_passages(config, tuple(p_qkv), p_mask)


def read_upper(model: DelayedInteractionModel, params: Params, q_lower: jax.Array,
               q_mask: jax.Array, p_lower: jax.Array, p_mask: jax.Array, *,
               q_qkv: QKV | None = None, p_qkv: QKV | None = None,
               p_stats: PassageAttentionStats | None = None,
               span_rows_only: bool = False) -> ReaderOutput:
    """Blocks k+1..l over `[q ; p]` and the span head, at inference, with reuses.

    q_lower: [batch, q_len, hidden], q_mask: [batch, q_len],
    p_lower: [batch, p_len, hidden], p_mask: [batch, p_len] -> ReaderOutput (no hidden states).
    q_qkv, p_qkv (optional): `project_upper` of q_lower / p_lower, already computed.
    p_stats (optional, 0 < k < l): `passage_attention_stats` of p_lower's passages.
    span_rows_only: the last block computes only `[CLS]` and the passage rows, all the span
    head reads. Every reuse is exact up to float rounding; none given is `encode_upper`.
    """
    check_upper_inputs(model.config, q_lower, q_mask, p_lower, p_mask)
    for name, lower, qkv in (("question", q_lower, q_qkv), ("passage", p_lower, p_qkv)):
        if qkv is not None:
            _check_has_upper_block(model)  # else the q/k/v would be silently unused
            _check_qkv(model, qkv, lower, name)
    if span_rows_only or p_stats is not None or q_qkv is not None or p_qkv is not None:
        _check_plain_upper(model, "span_rows_only, p_stats, q_qkv or p_qkv")
    if p_stats is not None:
        _check_has_upper_block(model)
        _check_stats(model, p_stats, p_lower)
    return model.module.apply({"params": params}, q_lower, q_mask, p_lower, p_mask, q_qkv,
                              p_qkv, p_stats, span_rows_only, method="read_upper")
