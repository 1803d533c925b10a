"""What every span reader module shares (the BERT family's `bert.SpanReaderModule`, XLNet's
`xlnet.XLNetSpanReaderModule`): the two segments, `ReaderOutput` and the span head's scores, the
aligned-pairs call, and the pair's first-upper-block q/k/v from per-segment projections.

A reader module has this API, called by name (`DelayedInteractionModel`, `dil_jax.reading`):

  encode_lower(ids, mask, segment, position_offset, deterministic, output_hidden_states)
      one segment: [batch, seq] ids -> [batch, seq, hidden] lower states (blocks 1..k)
  encode_upper(q_lower, q_mask, p_lower, p_mask, deterministic, output_hidden_states)
      blocks k+1..l over `[question ; passage]` and the span head -> ReaderOutput (training and
      the reference computation)
  project_upper(lower)
      the first upper block's q/k/v of one segment: [batch, seq, hidden] ->
      3 x [batch, heads, seq, head_dim]
  read_upper(q_lower, q_mask, p_lower, p_mask, q_qkv, p_qkv, p_stats, span_rows_only)
      `encode_upper` at inference with the pair program's exact reuses (deterministic, no
      hidden states); with none of them it computes what `encode_upper` computes
"""

from __future__ import annotations

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from dil_jax.model.attention import QKV

QUESTION_SEGMENT = 0
PASSAGE_SEGMENT = 1

# Logit given to padded passage positions so that softmax over spans ignores them.
PADDED_LOGIT = -1e9


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


def span_output(logits: jax.Array, p_mask: jax.Array,
                hidden_states: tuple[jax.Array, ...] | None) -> ReaderOutput:
    """The span head's logits [batch, rows, 2] -> ReaderOutput. Row 0 is `[CLS]` (the null
    score); the passage's rows are the last p_len (p_mask: [batch, p_len]), after the question's
    or after `[CLS]` alone; padded passage rows score PADDED_LOGIT."""
    passage_rows = logits.shape[1] - p_mask.shape[1]
    passage_logits = jnp.where(p_mask[..., None] > 0, logits[:, passage_rows:], PADDED_LOGIT)
    return ReaderOutput(
        start_logits=passage_logits[..., 0],
        end_logits=passage_logits[..., 1],
        null_start_logits=logits[:, 0, 0],
        null_end_logits=logits[:, 0, 1],
        hidden_states=hidden_states,
    )


def pair_qkv(reader: nn.Module, q_lower: jax.Array, p_lower: jax.Array, q_qkv: QKV | None,
             p_qkv: QKV | None) -> QKV | None:
    """The first upper block's q/k/v of `[question ; passage]` from those of each segment
    (3 x [batch, heads, seq, head_dim]), projecting here a side not given; None when neither
    is given (the block then projects the pair itself)."""
    if q_qkv is None and p_qkv is None:
        return None
    q_qkv = reader.project_upper(q_lower) if q_qkv is None else q_qkv
    p_qkv = reader.project_upper(p_lower) if p_qkv is None else p_qkv
    return tuple(jnp.concatenate([q, p], axis=2) for q, p in zip(q_qkv, p_qkv))


def read_aligned_pairs(reader: nn.Module, q_ids: jax.Array, q_mask: jax.Array, p_ids: jax.Array,
                       p_mask: jax.Array, passage_offset: jax.Array | None, deterministic: bool,
                       output_hidden_states: bool) -> ReaderOutput:
    """encode_lower on each segment, then encode_upper: the `__call__` of every reader module.
    q_ids, q_mask: [batch, q_len]; p_ids, p_mask: [batch, p_len]; passage_offset: [batch] or
    None. With output_hidden_states, the lower states of the two segments are concatenated as
    `[question ; passage]` before the upper blocks' states."""
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
