"""Flax (linen) modules of a delayed-interaction reader.

One post-LayerNorm transformer serves BERT, ALBERT and DistilBERT; they differ only in the
embeddings (ALBERT factorizes them, DistilBERT has no token types) and in how many distinct blocks
carry parameters (ALBERT shares one block, or a few groups, across all `l` layers). The split is
the paper's:

  encode_lower:  embeddings + blocks 1..k on ONE segment, a question `[CLS] q [SEP]` or a passage
                 `p [SEP]`. Positions restart at 0 for each segment (plus an optional offset) and
                 the token type is 0 for questions and 1 for passages, as in DeFormer and DilBert,
                 so a passage's lower state never depends on the question.
  encode_upper:  concatenate `[question ; passage]` lower states (the question padded to a fixed
                 length, its padding masked) and run blocks k+1..l and the span head.

With k = 0 and the passage offset set to the question's length this is exactly standard BERT over
`[CLS] q [SEP] p [SEP]`: masked padding between the two segments receives zero attention weight.
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from dil_jax.config import ACTIVATIONS, ConfigError, EncoderConfig

QUESTION_SEGMENT = 0
PASSAGE_SEGMENT = 1

# Added to attention scores of padding keys. float32 min as in Hugging Face: exp() underflows to an
# exact 0, so masked keys get exactly zero weight and padding never changes a real token's state.
MASK_BIAS = float(jnp.finfo(jnp.float32).min)
# Logit given to padded passage positions so that softmax over spans ignores them.
PADDED_LOGIT = -1e9

# One attention's (query, key, value), each [batch, heads, seq, head_dim], the query pre-scaled.
QKV = tuple[jax.Array, jax.Array, jax.Array]


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


def attention_bias(mask: jax.Array) -> jax.Array:
    """Key-padding mask [batch, seq] (1 = token, 0 = pad) -> additive bias [batch, 1, 1, seq]."""
    return jnp.where(mask[:, None, None, :] > 0, 0.0, MASK_BIAS).astype(jnp.float32)


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


def _dense(config: EncoderConfig, features: int, name: str | None = None) -> nn.Dense:
    return nn.Dense(
        features,
        dtype=config.compute_dtype,
        param_dtype=jnp.float32,
        kernel_init=nn.initializers.normal(config.initializer_range),
        name=name,
    )


def _layer_norm(config: EncoderConfig, name: str | None = None) -> nn.LayerNorm:
    return nn.LayerNorm(
        epsilon=config.layer_norm_eps, dtype=config.compute_dtype, param_dtype=jnp.float32,
        name=name,
    )


class Embeddings(nn.Module):
    """Word + position (+ token type) embeddings, LayerNorm, dropout (+ ALBERT's projection)."""

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
        if cfg.architecture == "albert":
            # ALBERT's factorized embeddings: project E -> H before the first block. Always, as
            # transformers' AlbertTransformer does (`embedding_hidden_mapping_in`), even when
            # E == H: the checkpoint holds a trained projection then too.
            x = _dense(cfg, cfg.hidden_size, "projection")(x)
        return x


def attends_per_example(config: EncoderConfig) -> bool:
    """Whether inference attention loops over the batch (`config.attention_form`).

    "auto": on CPU only, where it is the fast form; on GPU/TPU the batched form is.
    """
    if config.attention_form == "auto":
        return jax.default_backend() == "cpu"
    return config.attention_form == "per_example"


def _attend(cfg: EncoderConfig, query: jax.Array, key: jax.Array, value: jax.Array,
            bias: jax.Array, dropout=None) -> jax.Array:
    """Dot-product attention, head-major, with or without a leading batch axis.

    query, key, value: [..., heads, seq, head_dim], the query already scaled by 1/sqrt(head_dim);
    bias: [..., 1, 1, seq] -> context [..., heads, seq, head_dim]. Scores and softmax are float32.
    `dropout` (optional) is applied to the probabilities.
    """
    scores = jnp.einsum("...qd,...kd->...qk", query, key, preferred_element_type=jnp.float32)
    scores = scores + bias
    weights = jnp.exp(scores - jnp.max(scores, axis=-1, keepdims=True))
    total = jnp.sum(weights, axis=-1, keepdims=True)
    if dropout is None:
        # softmax(s) @ v == (exp(s - max) @ v) / sum: dividing the [seq, head_dim] context
        # instead of the [seq, seq] weights saves a pass over the largest tensor of the block.
        context = jnp.einsum("...qk,...kd->...qd", weights.astype(cfg.compute_dtype), value,
                             preferred_element_type=jnp.float32)
        return (context / total).astype(cfg.compute_dtype)
    probs = dropout(weights / total)
    return jnp.einsum("...qk,...kd->...qd", probs.astype(cfg.compute_dtype), value)


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
        self.query = _dense(cfg, cfg.hidden_size)
        self.key = _dense(cfg, cfg.hidden_size)
        self.value = _dense(cfg, cfg.hidden_size)
        self.output = _dense(cfg, cfg.hidden_size)
        self.dropout = nn.Dropout(cfg.attention_dropout)

    def project(self, x: jax.Array) -> QKV:
        """x: [batch, seq, hidden] -> (query, key, value), each [batch, heads, seq, head_dim].

        The query is already scaled by 1/sqrt(head_dim) (seq x hidden values, not seq x seq).
        """
        cfg = self.config
        batch, seq, _ = x.shape

        def heads(dense: nn.Dense, scale: float = 1.0) -> jax.Array:
            projected = dense(x)
            if scale != 1.0:
                projected = projected * jnp.asarray(scale, projected.dtype)
            return projected.reshape(batch, seq, cfg.num_heads, cfg.head_dim).transpose(0, 2, 1, 3)

        return (heads(self.query, 1.0 / float(np.sqrt(cfg.head_dim))), heads(self.key),
                heads(self.value))

    def __call__(self, x: jax.Array, bias: jax.Array, deterministic: bool = True,
                 qkv: QKV | None = None) -> jax.Array:
        """x: [batch, seq, hidden]; bias: [batch, 1, 1, seq] -> [batch, seq, hidden].

        qkv: `project(x)` if the caller already has it (the same values), else None.
        """
        cfg = self.config
        batch, seq, _ = x.shape
        query, key, value = self.project(x) if qkv is None else qkv
        if deterministic and attends_per_example(cfg):
            # XLA:CPU materialises the [batch, heads, seq, seq] scores, several passes of a tensor
            # far larger than the caches; one example at a time the passes stay in cache
            # (benchmarks/README.md, "What was changed for speed", item 1).
            context = jax.lax.map(lambda args: _attend(cfg, *args), (query, key, value, bias))
        elif deterministic:
            context = _attend(cfg, query, key, value, bias)
        else:
            context = _attend(cfg, query, key, value, bias,
                              lambda probs: self.dropout(probs, deterministic=False))
        context = context.transpose(0, 2, 1, 3).reshape(batch, seq, cfg.hidden_size)
        return self.output(context)


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
                 qkv: QKV | None = None) -> jax.Array:
        """x: [batch, seq, hidden]; bias: [batch, 1, 1, seq] -> [batch, seq, hidden].

        qkv: this block's attention projections of x, if precomputed (see SelfAttention).
        """
        attended = self.attention(x, bias, deterministic, qkv)
        x = self.attention_norm(x + self.dropout(attended, deterministic=deterministic))
        hidden = activation_fn(self.config.hidden_act)(self.ffn_in(x))
        out = self.ffn_out(hidden)
        return self.output_norm(x + self.dropout(out, deterministic=deterministic))


def num_param_blocks(config: EncoderConfig) -> int:
    """How many blocks carry their own parameters (ALBERT: its hidden groups)."""
    return config.num_hidden_groups if config.shares_block_weights else config.num_layers


def param_block_of_layer(config: EncoderConfig, layer: int) -> int:
    """Index of the parameter block that layer `layer` (0-based) applies."""
    if config.shares_block_weights:
        return layer * config.num_hidden_groups // config.num_layers
    return layer


class SpanReaderModule(nn.Module):
    """Delayed-interaction extractive QA reader (see the module docstring)."""

    config: EncoderConfig

    def setup(self) -> None:
        cfg = self.config
        self.embeddings = Embeddings(cfg)
        self.blocks = [Block(cfg, name=f"block_{i}") for i in range(num_param_blocks(cfg))]
        self.qa_outputs = _dense(cfg, 2, "qa_outputs")

    def _run_layers(self, x: jax.Array, mask: jax.Array, layers: Sequence[int],
                    deterministic: bool, first_qkv: QKV | None = None) -> list[jax.Array]:
        """first_qkv: the first layer's attention projections of x, if precomputed."""
        bias = attention_bias(mask)
        states = []
        for i, layer in enumerate(layers):
            qkv = first_qkv if i == 0 else None
            x = self.blocks[param_block_of_layer(self.config, layer)](x, bias, deterministic,
                                                                      qkv)
            states.append(x)
        return states

    def encode_lower(self, ids: jax.Array, mask: jax.Array, segment: int,
                     position_offset: jax.Array | None = None, deterministic: bool = True,
                     output_hidden_states: bool = False):
        """Embeddings + the first k blocks on one segment alone.

        Args:
          ids: [batch, seq] token ids of `[CLS] q [SEP]` (segment 0) or `p [SEP]` (segment 1).
          mask: [batch, seq] 1 for tokens, 0 for padding.
          segment: QUESTION_SEGMENT or PASSAGE_SEGMENT, used as the token type id.
          position_offset: None or [batch] int added to every position; the full model (k = 0)
            passes the question length so that positions are standard BERT's. None: a question
            is numbered from 0, a passage from `config.passage_position_offset` (default 0).
        Returns:
          [batch, seq, hidden] lower states, or (that, tuple of k+1 states) with hidden states.
        """
        positions = jnp.broadcast_to(jnp.arange(ids.shape[1], dtype=jnp.int32), ids.shape)
        if position_offset is None and segment == PASSAGE_SEGMENT:
            # Delayed passages: a constant start, the same for every question (cacheable).
            positions = positions + self.config.passage_position_offset
        elif position_offset is not None:
            positions = positions + position_offset[:, None].astype(jnp.int32)
        token_types = jnp.full(ids.shape, segment, dtype=jnp.int32)
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
                     p_qkv: QKV | None = None):
        """Blocks k+1..l over `[question ; passage]` and the span head.

        Args:
          q_lower: [batch, q_len, hidden] question lower states (q_len = padded question length).
          q_mask: [batch, q_len].
          p_lower: [batch, p_len, hidden] passage lower states.
          p_mask: [batch, p_len].
          q_qkv, p_qkv: `project_upper` of q_lower / p_lower, if already computed (either, both
            or neither; the other is computed here). Same result, less work per pair.
        Returns:
          ReaderOutput (hidden_states holds the l-k upper states, if asked).
        """
        x = jnp.concatenate([q_lower, p_lower], axis=1)
        mask = jnp.concatenate([q_mask, p_mask], axis=1)
        layers = range(self.config.num_lower_layers, self.config.num_layers)
        first_qkv = None
        if q_qkv is not None or p_qkv is not None:
            q_qkv = self.project_upper(q_lower) if q_qkv is None else q_qkv
            p_qkv = self.project_upper(p_lower) if p_qkv is None else p_qkv
            first_qkv = tuple(jnp.concatenate([q, p], axis=2) for q, p in zip(q_qkv, p_qkv))
        states = self._run_layers(x, mask, layers, deterministic, first_qkv)
        final = states[-1] if states else x
        logits = self.qa_outputs(final).astype(jnp.float32)  # [batch, seq, 2]
        q_len = q_lower.shape[1]
        passage_logits = jnp.where(p_mask[..., None] > 0, logits[:, q_len:], PADDED_LOGIT)
        return ReaderOutput(
            start_logits=passage_logits[..., 0],
            end_logits=passage_logits[..., 1],
            null_start_logits=logits[:, 0, 0],
            null_end_logits=logits[:, 0, 1],
            hidden_states=tuple(states) if output_hidden_states else None,
        )

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
        q_out = self.encode_lower(q_ids, q_mask, QUESTION_SEGMENT, None, deterministic,
                                  output_hidden_states)
        p_out = self.encode_lower(p_ids, p_mask, PASSAGE_SEGMENT, offset, deterministic,
                                  output_hidden_states)
        if not output_hidden_states:
            return self.encode_upper(q_out, q_mask, p_out, p_mask, deterministic)
        (q_lower, q_states), (p_lower, p_states) = q_out, p_out
        out = self.encode_upper(q_lower, q_mask, p_lower, p_mask, deterministic, True)
        lower_states = tuple(jnp.concatenate([q, p], axis=1) for q, p in zip(q_states, p_states))
        return out.replace(hidden_states=lower_states + out.hidden_states)
