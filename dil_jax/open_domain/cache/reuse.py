"""The first upper block's passage arrays a cache can store (`dil-jax index --cache-reuse`).

In the open domain a retrieved window is read by one question, so the pair program's automatic
rule (`dil_jax.reading.plan.ReusePlan`) never hoists its first-upper-block q/k/v or softmax
statistics: each pair would compute them. They depend on the passage alone, so the cache can hold
them, computed once at `index` time. With all of them stored, a pair's first upper block does only
what involves the question: the passage rows' scores against the question's keys, the merge,
`[CLS]`'s (or the question rows') attention over all keys, W_o, the FFN. What each array serves:

  upper_query      [rows, p_len, hidden]  passage queries (pre-scaled): scored against the
                                          question's keys per pair (needed with the statistics)
  upper_key        [rows, p_len, hidden]  passage keys and values: the question rows (at k = l-1
  upper_value      [rows, p_len, hidden]  only `[CLS]`) attend them, per pair
  upper_context    [rows, p_len, hidden]  the passage rows' attention over the passage's own keys,
                                          normalised: o_p / l_p (per head, head-major in hidden)
  upper_logsumexp  [rows, p_len, heads]   m_p + log l_p, float32 in every storage

Token-major ([rows, p_len, hidden], heads split on read) so one token's values form one row of
the storage scheme (one int8 scale per token). The statistics are stored as (log-sum-exp,
normalised context) rather than (m, l, o): one array less, and the context is a convex
combination of values, as bounded as the values themselves (good for int8). It is the same
`PassageAttentionStats` with row_max = lse, row_sum = 1, weighted_values = o / l: the merge
computes the same softmax (the log-sum-exp rule only needs each part's exp-sum against some max).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from dil_jax.model.attention import QKV, PassageAttentionStats
from dil_jax.open_domain.cache.store import REUSE_LSE_ARRAY as LSE_ARRAY
from dil_jax.open_domain.cache.store import REUSE_WIDE_ARRAYS as WIDE_ARRAYS
from dil_jax.open_domain.cache.store import ReuseEncoder
from dil_jax.reading.plan import ReusePlan

if TYPE_CHECKING:
    from dil_jax.readers.protocol import Reader

REUSE_ARRAYS = WIDE_ARRAYS + (LSE_ARRAY,)



def _token_major(x: np.ndarray) -> np.ndarray:
    """[n, heads, p_len, head_dim] -> [n, p_len, heads * head_dim]."""
    n, heads, p_len, head_dim = x.shape
    return np.ascontiguousarray(np.transpose(x, (0, 2, 1, 3)).reshape(n, p_len, heads * head_dim))


def _head_major(x: np.ndarray, heads: int) -> np.ndarray:
    """[n, p_len, heads * head_dim] -> [n, heads, p_len, head_dim]."""
    n, p_len, hidden = x.shape
    return np.transpose(x.reshape(n, p_len, heads, hidden // heads), (0, 2, 1, 3))


def reuse_arrays(qkv: QKV, stats: PassageAttentionStats) -> dict[str, np.ndarray]:
    """The stored form of `project_upper` and `passage_attention_stats` outputs.

    qkv: 3 x [n, heads, p_len, head_dim]; stats: [n, heads, p_len](, head_dim) -> REUSE_ARRAYS
    (see the module docstring), float32 numpy.
    """
    row_max, row_sum = np.asarray(stats.row_max, np.float32), np.asarray(stats.row_sum,
                                                                         np.float32)
    context = np.asarray(stats.weighted_values, np.float32) / row_sum[..., None]
    arrays = {name: _token_major(np.asarray(x, np.float32))
              for name, x in zip(WIDE_ARRAYS, (*qkv, context))}
    # row_sum >= 1 (the max term is exp(0)), so the log is finite.
    arrays[LSE_ARRAY] = np.ascontiguousarray(np.transpose(row_max + np.log(row_sum), (0, 2, 1)))
    return arrays


def pair_inputs(arrays: dict[str, np.ndarray], num_heads: int, compute_dtype
                ) -> tuple[QKV, PassageAttentionStats]:
    """REUSE_ARRAYS of some rows -> (p_qkv, p_stats) for `PairGrid.read_pairs`.

    q/k/v in the model's compute dtype (what `project_upper` gives), the statistics float32:
    row_max = lse [n, heads, p_len], row_sum = 1, weighted_values = the normalised context;
    numpy (the caller places them on its devices once).
    """
    query, key, value, context = (_head_major(arrays[name], num_heads) for name in WIDE_ARRAYS)
    lse = np.ascontiguousarray(np.transpose(arrays[LSE_ARRAY], (0, 2, 1)), np.float32)
    qkv = tuple(np.asarray(x).astype(compute_dtype) for x in (query, key, value))
    stats = PassageAttentionStats(row_max=lse, row_sum=np.ones_like(lse),
                                  weighted_values=np.asarray(context, np.float32))
    return qkv, stats


def reuse_encoder(reader: Reader, batch_size: int = 32) -> ReuseEncoder | None:
    """The function computing REUSE_ARRAYS from `reader`'s passage lower states, with the pair
    program's own jitted steps (`PairGrid.project_segments`, `passage_attention_stats`) on this
    process's devices (`Reader.local_grid`: batch_size rows per device); None where there is
    nothing to store (a reader without `pair_reuse`, e.g. QANet / BiDAF: no such block; k = 0:
    no question-independent passage state; k = l: no upper block)."""
    if (not reader.capabilities.pair_reuse
            or not ReusePlan.for_config(reader.config).hoists_projections):
        return None
    grid = reader.local_grid(batch_size)

    def encode(states: np.ndarray, mask: np.ndarray) -> dict[str, np.ndarray]:
        qkv = grid.project_segments(reader.params, np.asarray(states, np.float32))
        return reuse_arrays(qkv, grid.passage_attention_stats(qkv, np.asarray(mask)))

    return encode
