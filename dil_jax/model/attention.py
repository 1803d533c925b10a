"""Self-attention of the reader, and the softmax-part arithmetic behind the pair program's reuse.

    attention_bias      key-padding mask -> additive bias (padded keys get MASK_BIAS: weight 0)
    _attend             scaled dot-product attention, head-major, float32 scores and softmax
    _softmax_parts      one key set's running-softmax statistics (row max, row sum, unnormalised
                        context); `_merge_softmax_parts` joins two disjoint sets by log-sum-exp
    PassageAttentionStats, passage_attention_stats, attend_with_passage_stats
                        a passage's first-upper-block statistics over its own keys, computed once
                        per passage; each pair then scores only the question's keys and merges
    attends_per_example, _per_example
                        whether inference attention loops over the batch (the CPU form), and
                        that loop
    dense, bfloat16_operands_dot, matmul_params
                        the reader's Dense layer, at float32 or with bfloat16 matmul operands
                        (`EncoderConfig.matmul_dtype`), and the kernels that mode reads
    SelfAttention       the Flax module: q/k/v projections (`project`, reusable per segment),
                        full, LSH (`lsh.py`) and row-subset (`attend_rows`) attention, W_o

Separate from layers.py (embeddings, blocks) and bert.py (the BERT-family reader module) because the
pair program's exact reuses are made here: the passage-statistics path (`_softmax_parts` per key
set, `PassageAttentionStats` cached per passage, `_merge_softmax_parts` per pair) must equal
`_attend` over all keys up to float rounding, and keeping the two side by side, apart from the
blocks and the span head, lets that equality be read and tested (tests/reading/test_pair_reuse.py)
in one place; XLNet's reader (xlnet.py) uses `attention_bias` and `PassageAttentionStats` without
the BERT-family blocks. Dependencies run one way: layers.py, bert.py and xlnet.py import this
module, never the reverse, so `dense` (the Dense layer every module of the reader builds,
SelfAttention's included) is defined here.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from dil_jax.model.encoder_config import EncoderConfig
from dil_jax.model.lsh import MASK_BIAS, lsh_attention  # one padding bias for full and LSH

# One attention's (query, key, value), each [batch, heads, seq, head_dim], the query pre-scaled.
QKV = tuple[jax.Array, jax.Array, jax.Array]


def attention_bias(mask: jax.Array) -> jax.Array:
    """Key-padding mask [batch, seq] (1 = token, 0 = pad) -> additive bias [batch, 1, 1, seq]."""
    return jnp.where(mask[:, None, None, :] > 0, 0.0, MASK_BIAS).astype(jnp.float32)


def bfloat16_operands_dot(lhs: jax.Array, rhs: jax.Array, dimension_numbers: Any,
                          precision: Any = None, preferred_element_type: Any = None
                          ) -> jax.Array:
    """`lax.dot_general` of the two operands rounded to bfloat16, accumulated and returned in
    float32 (`EncoderConfig.matmul_dtype` "bfloat16"). XLA:CPU multiplies bfloat16 pairs
    natively where the CPU has AVX512-BF16 or AMX; a bfloat16 *result* would take its slow
    path, hence the float32 one. A kernel already held in bfloat16 (`matmul_params`) is not
    rounded again (XLA folds the float32 round trip that `nn.Dense`'s promotion adds)."""
    del precision, preferred_element_type  # this dot's precision is its operands' dtype
    return jax.lax.dot_general(lhs.astype(jnp.bfloat16), rhs.astype(jnp.bfloat16),
                               dimension_numbers, preferred_element_type=jnp.float32)


def dense(config: EncoderConfig, features: int, name: str | None = None) -> nn.Dense:
    """The reader's Dense layer: `config.compute_dtype` throughout, or, at `matmul_dtype`
    "bfloat16", its matmul's operands rounded to bfloat16 (`bfloat16_operands_dot`)."""
    extra = ({"dot_general": bfloat16_operands_dot}
             if config.matmul_dtype == "bfloat16" else {})
    return nn.Dense(
        features,
        dtype=config.compute_dtype,
        param_dtype=jnp.float32,
        kernel_init=nn.initializers.normal(config.initializer_range),
        name=name,
        **extra,
    )


def matmul_params(params: Any, config: EncoderConfig) -> Any:
    """The params a reader reads with at `config.matmul_dtype`: every dense kernel (a 2-D
    "kernel" leaf) rounded to bfloat16 once, rather than at every call, where it is
    "bfloat16"; the params as they are otherwise. Embeddings, biases and LayerNorms stay
    float32. The result is for reading only: training and saving want the float32 kernels."""
    if config.matmul_dtype == "float32":
        return params

    def rounded(path: tuple[Any, ...], leaf: Any) -> Any:
        name = getattr(path[-1], "key", None)
        return leaf.astype(jnp.bfloat16) if name == "kernel" and leaf.ndim == 2 else leaf

    return jax.tree_util.tree_map_with_path(rounded, params)


def attends_per_example(config: EncoderConfig) -> bool:
    """Whether inference attention loops over the batch (`config.attention_form`).

    "auto": on CPU only, where it is the fast form; on GPU/TPU the batched form is.
    """
    if config.attention_form == "auto":
        return jax.default_backend() == "cpu"
    return config.attention_form == "per_example"


def _softmax_parts(cfg: EncoderConfig, query: jax.Array, key: jax.Array, value: jax.Array,
                   bias: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The running-softmax statistics of scaled dot-product attention over some keys.

    query: [..., heads, rows, head_dim] (pre-scaled), key, value: [..., heads, keys, head_dim],
    bias: [..., 1, 1, keys] -> (row max m [..., heads, rows, 1], row sum of exp l [..., rows, 1],
    unnormalised context o [..., rows, head_dim]), float32: softmax(s) @ v == o / l with
    s = q k^T + bias, m = max_k s, l = sum_k exp(s - m), o = exp(s - m) @ v. Two such parts over
    disjoint key sets merge exactly by the log-sum-exp rule (`_merge_softmax_parts`).
    """
    scores = jnp.einsum("...qd,...kd->...qk", query, key, preferred_element_type=jnp.float32)
    scores = scores + bias
    row_max = jnp.max(scores, axis=-1, keepdims=True)
    weights = jnp.exp(scores - row_max)
    total = jnp.sum(weights, axis=-1, keepdims=True)
    context = jnp.einsum("...qk,...kd->...qd", weights.astype(cfg.compute_dtype), value,
                         preferred_element_type=jnp.float32)
    return row_max, total, context


def _attend(cfg: EncoderConfig, query: jax.Array, key: jax.Array, value: jax.Array,
            bias: jax.Array, dropout=None) -> jax.Array:
    """Dot-product attention, head-major, with or without a leading batch axis.

    query, key, value: [..., heads, seq, head_dim], the query already scaled by 1/sqrt(head_dim);
    bias: [..., 1, 1, seq] -> context [..., heads, seq, head_dim]. Scores and softmax are float32.
    `dropout` (optional) is applied to the probabilities.
    """
    if dropout is None:
        # softmax(s) @ v == (exp(s - max) @ v) / sum: dividing the [seq, head_dim] context
        # instead of the [seq, seq] weights saves a pass over the largest tensor of the block.
        _, total, context = _softmax_parts(cfg, query, key, value, bias)
        return (context / total).astype(cfg.compute_dtype)
    scores = jnp.einsum("...qd,...kd->...qk", query, key, preferred_element_type=jnp.float32)
    scores = scores + bias
    weights = jnp.exp(scores - jnp.max(scores, axis=-1, keepdims=True))
    probs = dropout(weights / jnp.sum(weights, axis=-1, keepdims=True))
    return jnp.einsum("...qk,...kd->...qd", probs.astype(cfg.compute_dtype), value)


@flax.struct.dataclass
class PassageAttentionStats:
    """A passage's first-upper-block attention over its OWN keys, per head and token.

    In the first upper block (layer k + 1) a passage token's scores against the passage's keys
    do not depend on the question (both sides are question-independent lower states), so their
    softmax statistics are computed once per passage (`passage_attention_stats`); each pair then
    scores the passage queries against the question's keys only and merges the two parts
    (`_merge_softmax_parts`), exact up to float rounding. With s the scaled scores of query
    token i against the passage's keys j plus the key-padding bias (padded keys get MASK_BIAS):

      row_max:         [batch, heads, p_len] float32, m_i = max_j s_ij
      row_sum:         [batch, heads, p_len] float32, l_i = sum_j exp(s_ij - m_i)
      weighted_values: [batch, heads, p_len, head_dim] float32, o_i = sum_j exp(s_ij - m_i) v_j

    A pytree: it is gathered per pair, sharded and replicated like the q/k/v of `project_upper`,
    and can be stored beside a passage's lower states (float32, (heads * (head_dim + 2)) values
    per token).
    """

    row_max: jax.Array
    row_sum: jax.Array
    weighted_values: jax.Array


def _merge_softmax_parts(cfg: EncoderConfig, first: tuple[jax.Array, jax.Array, jax.Array],
                         second: tuple[jax.Array, jax.Array, jax.Array]) -> jax.Array:
    """softmax over the union of two disjoint key sets, from each set's `_softmax_parts`.

    (m_1, l_1, o_1), (m_2, l_2, o_2) with m, l: [..., rows, 1], o: [..., rows, head_dim] ->
    context [..., rows, head_dim] in the compute dtype. The log-sum-exp rule: with
    m = max(m_1, m_2), l = l_1 e^(m_1 - m) + l_2 e^(m_2 - m), o likewise, context = o / l. Each
    part's exponentials were taken against its own max; rescaling both to the common max is
    what makes the sum exact (the max itself cancels in o / l).
    """
    (max_1, sum_1, context_1), (max_2, sum_2, context_2) = first, second
    row_max = jnp.maximum(max_1, max_2)
    scale_1, scale_2 = jnp.exp(max_1 - row_max), jnp.exp(max_2 - row_max)
    total = sum_1 * scale_1 + sum_2 * scale_2
    context = context_1 * scale_1 + context_2 * scale_2
    return (context / total).astype(cfg.compute_dtype)


def attend_with_passage_stats(cfg: EncoderConfig, query: jax.Array, key: jax.Array,
                               value: jax.Array, bias: jax.Array, row_max: jax.Array,
                               row_sum: jax.Array, weighted_values: jax.Array) -> jax.Array:
    """Passage queries' attention over [question ; passage] keys from the passage part's stats.

    query: [..., heads, p_len, head_dim] passage queries (pre-scaled); key, value:
    [..., heads, q_len, head_dim] the QUESTION's keys and values; bias: [..., 1, 1, q_len] the
    question's key-padding bias; row_max, row_sum: [..., heads, p_len] and weighted_values:
    [..., heads, p_len, head_dim], a `PassageAttentionStats`' fields -> context
    [..., heads, p_len, head_dim], `_attend` over all q_len + p_len keys up to float rounding.
    Per pair this scores p_len x q_len, not p_len x (q_len + p_len).
    """
    passage_part = (row_max[..., None], row_sum[..., None], weighted_values)
    return _merge_softmax_parts(cfg, passage_part, _softmax_parts(cfg, query, key, value, bias))


def passage_attention_stats(config: EncoderConfig, qkv: QKV, mask: jax.Array
                            ) -> PassageAttentionStats:
    """The first upper block's attention statistics of passages over their own keys.

    qkv: `SpanReaderModule.project_upper` of the passages' lower states, 3 x [batch, heads,
    p_len, head_dim]; mask: [batch, p_len] (1 = token) -> PassageAttentionStats ([batch, heads,
    p_len] and [batch, heads, p_len, head_dim]). Needs no parameters: the projections hold them.
    """
    query, key, value = qkv

    def stats(query, key, value, bias):
        row_max, total, context = _softmax_parts(config, query, key, value, bias)
        return PassageAttentionStats(row_max[..., 0], total[..., 0], context)

    return _per_example(config, stats, query, key, value, attention_bias(mask))


def _per_example(cfg: EncoderConfig, fn: Callable[..., Any], *args: Any) -> Any:
    """fn(*args) on arrays with a leading batch axis; on CPU (`attends_per_example`) one example
    at a time: XLA:CPU then keeps each example's [heads, rows, keys] scores in cache instead of
    materialising the whole batch's (benchmarks/README.md, "What was changed for speed", item 1).
    """
    if attends_per_example(cfg):
        return jax.lax.map(lambda one: fn(*one), args)
    return fn(*args)


class SelfAttention(nn.Module):
    """Multi-head self-attention; scores and softmax in float32 whatever the compute dtype.

    `project` and the attention proper are separate methods because a delayed-interaction grid
    computes the FIRST upper block's query/key/value once per question and per passage, not once
    per pair (see `SpanReaderModule.project_upper`): each token's projections depend on that
    token alone.
    """

    config: EncoderConfig

    def setup(self) -> None:
        cfg = self.config
        self.query = dense(cfg, cfg.hidden_size)
        self.key = dense(cfg, cfg.hidden_size)
        self.value = dense(cfg, cfg.hidden_size)
        self.output = dense(cfg, cfg.hidden_size)
        self.dropout = nn.Dropout(cfg.attention_dropout)

    def _heads(self, layer: nn.Dense, x: jax.Array, scale: float = 1.0) -> jax.Array:
        """x: [batch, seq, hidden] -> layer(x) * scale as [batch, heads, seq, head_dim]."""
        cfg = self.config
        batch, seq, _ = x.shape
        projected = layer(x)
        if scale != 1.0:
            projected = projected * jnp.asarray(scale, projected.dtype)
        return projected.reshape(batch, seq, cfg.num_heads, cfg.head_dim).transpose(0, 2, 1, 3)

    def project_query(self, x: jax.Array) -> jax.Array:
        """x: [batch, seq, hidden] -> query [batch, heads, seq, head_dim], scaled by
        1/sqrt(head_dim) (seq x hidden values, not seq x seq)."""
        return self._heads(self.query, x, 1.0 / float(np.sqrt(self.config.head_dim)))

    def project_key_value(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        """x: [batch, seq, hidden] -> (key, value), each [batch, heads, seq, head_dim]."""
        return self._heads(self.key, x), self._heads(self.value, x)

    def project(self, x: jax.Array) -> QKV:
        """x: [batch, seq, hidden] -> (query, key, value), each [batch, heads, seq, head_dim];
        the query pre-scaled (`project_query`)."""
        return (self.project_query(x), *self.project_key_value(x))

    def _output(self, context: jax.Array) -> jax.Array:
        """context: [batch, heads, rows, head_dim] -> W_o of the joined heads [batch, rows,
        hidden]."""
        batch, _, rows, _ = context.shape
        context = context.transpose(0, 2, 1, 3).reshape(batch, rows, self.config.hidden_size)
        return self.output(context)

    def __call__(self, x: jax.Array, bias: jax.Array, deterministic: bool = True,
                 qkv: QKV | None = None) -> jax.Array:
        """x: [batch, seq, hidden]; bias: [batch, 1, 1, seq] -> [batch, seq, hidden].

        qkv: `project(x)` if the caller already has it (the same values), else None.
        """
        cfg = self.config
        query, key, value = self.project(x) if qkv is None else qkv
        if deterministic:
            context = _per_example(cfg, functools.partial(_attend, cfg), query, key, value, bias)
        else:
            context = _attend(cfg, query, key, value, bias,
                              lambda probs: self.dropout(probs, deterministic=False))
        return self._output(context)

    def attend_lsh(self, x: jax.Array, bias: jax.Array, rng: jax.Array,
                   qkv: QKV | None = None) -> jax.Array:
        """Reformer LSH attention (`dil_jax.model.lsh`) of x: [batch, seq, hidden] with the key
        padding bias [batch, 1, 1, seq] -> [batch, seq, hidden] (W_o applied). rng: the hash
        rotations' key. No attention-probability dropout (see lsh.py)."""
        cfg = self.config
        query, key, value = self.project(x) if qkv is None else qkv
        mask = (bias[:, 0, 0, :] == 0).astype(jnp.int32)  # attention_bias: 0 = token
        context = lsh_attention(query, key, value, mask, rng, num_hashes=cfg.lsh_num_hashes,
                                bucket_size=cfg.lsh_bucket_size,
                                num_buckets=cfg.lsh_num_buckets,
                                exclude_self=cfg.lsh_exclude_self,
                                compute_dtype=cfg.compute_dtype)
        return self._output(context)

    def attend_rows(self, query: jax.Array, key: jax.Array, value: jax.Array, bias: jax.Array,
                    question_len: int, stats: PassageAttentionStats | None = None) -> jax.Array:
        """Inference attention of a pair for some query rows: the first `rows - p_len` question
        rows and every passage row, over all q_len + p_len keys.

        query: [batch, heads, rows, head_dim] (pre-scaled); key, value: [batch, heads, q_len +
        p_len, head_dim]; bias: [batch, 1, 1, q_len + p_len]; question_len: q_len (static);
        stats: the passage's `PassageAttentionStats` over its own keys, or None. With stats the
        passage rows score only the question's keys and merge the passage part from the stats
        (`attend_with_passage_stats`). -> [batch, rows, hidden] (W_o applied).
        """
        cfg = self.config
        if stats is None:
            context = _per_example(cfg, functools.partial(_attend, cfg), query, key, value, bias)
            return self._output(context)
        question_rows = query.shape[2] - (key.shape[2] - question_len)

        def attend(query, key, value, bias, row_max, row_sum, weighted_values):
            # The question rows (all, or [CLS] alone) attend every key as usual.
            asked = _attend(cfg, query[..., :question_rows, :], key, value, bias)
            read = attend_with_passage_stats(
                cfg, query[..., question_rows:, :], key[..., :question_len, :],
                value[..., :question_len, :], bias[..., :question_len], row_max, row_sum,
                weighted_values)
            return jnp.concatenate([asked, read], axis=-2)

        context = _per_example(cfg, attend, query, key, value, bias, stats.row_max,
                               stats.row_sum, stats.weighted_values)
        return self._output(context)
