"""QANet's layers (Yu et al. 2018), Flax linen.

    sinusoid_positions      the fixed positional encoding added at the start of every block
    DepthwiseConv, DepthwiseSeparableConv
                            per-channel convolution along the sequence, then a pointwise Dense
    Highway                 gated highway layers (the input embedding's two)
    CharacterCNN            character embeddings -> a convolution over each token's characters
                            -> max-pool over its REAL characters
    MultiHeadAttention      full or Reformer LSH self-attention (`lsh.lsh_attention`)
    ConvSublayer, AttentionSublayer, FeedForwardSublayer
                            the residual branches of a block: pre-LayerNorm, the operation,
                            dropout (the caller adds the residual)
    EncoderBlock            positional encoding, convs, self-attention, feed-forward
    EncoderStack            blocks in sequence, as plain residuals or as reversible layers
    ContextQueryAttention   trilinear similarity, context-to-query and query-to-context

Padding: every convolution zeroes the padded positions of its input first, so a real token's
output equals that of the same segment without padding (the convolution's own "SAME" zero
padding beyond the last real token); attention gives padded keys exactly zero weight
(MASK_BIAS), LayerNorm and the feed-forward are per position. So a segment's states at its real
tokens do not depend on how far it is padded: what lets a passage be cached once and read at
any width.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from dil_jax.model.attention import attention_bias
from dil_jax.model.lsh import MASK_BIAS, lsh_attention
from dil_jax.model.memory import map_row_chunks
from dil_jax.model.qanet_config import ENCODERS, QANetConfig, layer_survival
from dil_jax.model.qanet_inputs import CHAR_PAD
from dil_jax.model.reversible import reversible_scan


def sinusoid_positions(length: int, width: int) -> np.ndarray:
    """Vaswani et al.'s encoding, [length, width] float32: PE[t, 2i] = sin(t / 10000^(2i/width)),
    PE[t, 2i+1] = cos(t / 10000^(2i/width)); computed in float64, a constant under jit."""
    position = np.arange(length, dtype=np.float64)[:, None]
    rate = 10000.0 ** (-(np.arange(width) // 2 * 2) / width)
    angle = position * rate
    return np.where(np.arange(width) % 2 == 0, np.sin(angle), np.cos(angle)).astype(np.float32)


def _layer_norm(config: QANetConfig, name: str | None = None) -> nn.LayerNorm:
    return nn.LayerNorm(epsilon=config.layer_norm_eps, name=name)


class DepthwiseConv(nn.Module):
    """A per-channel convolution of width `kernel` along the sequence, "SAME" ((kernel - 1) / 2
    zeros each side), no bias: out[t, c] = sum_j x[t + j - (kernel - 1) / 2, c] kernel[j, 0, c]
    (a cross-correlation, as nn.Conv's; the kernel has nn.Conv's [kernel, 1, channels] layout
    and lecun-normal init, so it is the depthwise nn.Conv's parameter).

    Computed as `kernel` shifted multiply-adds, not as a grouped convolution: XLA:CPU runs
    `feature_group_count = channels` as a slow generic loop (forward + backward at [16, 160,
    128], kernel 7: 57.5 ms against 1.7 ms for the shifted sum, 2-core AMD EPYC).
    """

    kernel: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        """x: [batch, seq, channels] -> [batch, seq, channels]."""
        channels, seq = x.shape[-1], x.shape[1]
        weights = self.param("kernel", nn.initializers.lecun_normal(),
                             (self.kernel, 1, channels))
        half = (self.kernel - 1) // 2
        padded = jnp.pad(x, [(0, 0), (half, half), (0, 0)])
        out = padded[:, 0:seq] * weights[0, 0]
        for j in range(1, self.kernel):
            out = out + padded[:, j:j + seq] * weights[j, 0]
        return out


class DepthwiseSeparableConv(nn.Module):
    """relu(pointwise(depthwise(x))): `DepthwiseConv` along the sequence, then a Dense to
    `features`."""

    features: int
    kernel: int

    @nn.compact
    def __call__(self, x: jax.Array, mask: jax.Array) -> jax.Array:
        """x: [batch, seq, channels]; mask: [batch, seq] -> [batch, seq, features]."""
        # Padded positions are zeroed so that they read as the convolution's own zero padding.
        x = x * (mask[..., None] > 0).astype(x.dtype)
        x = DepthwiseConv(self.kernel, name="depthwise")(x)
        return jax.nn.relu(nn.Dense(self.features, name="pointwise")(x))


class Highway(nn.Module):
    """`layers` highway layers: x <- g * relu(W_h x + b_h) + (1 - g) * x, g = sigmoid(W_g x +
    b_g); dropout on the transform."""

    layers: int
    dropout: float

    @nn.compact
    def __call__(self, x: jax.Array, deterministic: bool = True) -> jax.Array:
        """x: [..., width] -> [..., width]."""
        width = x.shape[-1]
        for i in range(self.layers):
            gate = jax.nn.sigmoid(nn.Dense(width, name=f"gate_{i}")(x))
            transform = jax.nn.relu(nn.Dense(width, name=f"transform_{i}")(x))
            transform = nn.Dropout(self.dropout)(transform, deterministic=deterministic)
            x = gate * transform + (1.0 - gate) * x
        return x


class CharacterCNN(nn.Module):
    """A token's characters -> one vector: embed, convolve along the characters, relu, max-pool
    over the token's real characters (CHAR_PAD slots excluded, not counted as zeros).

    config: any config with char_vocab_size, char_dim, char_dropout, char_filters and
    char_kernel (QANetConfig; BiDAFConfig shares the layer).
    """

    config: Any

    @nn.compact
    def __call__(self, chars: jax.Array, deterministic: bool = True) -> jax.Array:
        """chars: [batch, seq, max_chars] int -> [batch, seq, char_filters]; a token without
        characters (a padding token) gets zeros."""
        cfg = self.config
        real = chars != CHAR_PAD
        x = nn.Embed(cfg.char_vocab_size, cfg.char_dim, name="embed")(chars)
        x = nn.Dropout(cfg.char_dropout)(x, deterministic=deterministic)
        # Zeroed padding slots = the convolution's own zero padding after the last character,
        # so a token's vector does not depend on max_chars.
        x = x * real[..., None].astype(x.dtype)
        batch, seq, slots, width = x.shape
        x = nn.Conv(cfg.char_filters, (cfg.char_kernel,), padding="SAME", name="conv")(
            x.reshape(batch * seq, slots, width))
        x = jax.nn.relu(x).reshape(batch, seq, slots, cfg.char_filters)
        pooled = jnp.max(jnp.where(real[..., None], x, -jnp.inf), axis=2)
        return jnp.where(real.any(axis=-1)[..., None], pooled, 0.0)


class MultiHeadAttention(nn.Module):
    """Multi-head self-attention, full (float32 softmax, padded keys weight 0) or LSH."""

    config: QANetConfig

    @nn.compact
    def __call__(self, x: jax.Array, mask: jax.Array, lsh_rng: jax.Array | None = None
                 ) -> jax.Array:
        """x: [batch, seq, d_model]; mask: [batch, seq]; lsh_rng: given, Reformer LSH attention
        with these hash rotations (`lsh.lsh_attention`) -> [batch, seq, d_model]."""
        cfg = self.config
        batch, seq, _ = x.shape

        def heads(name: str) -> jax.Array:  # [batch, heads, seq, head_dim]
            y = nn.Dense(cfg.d_model, name=name)(x)
            return y.reshape(batch, seq, cfg.num_heads, cfg.head_dim).transpose(0, 2, 1, 3)

        query = heads("query") * (1.0 / math.sqrt(cfg.head_dim))
        key, value = heads("key"), heads("value")
        if lsh_rng is not None:
            context = lsh_attention(
                query, key, value, mask, lsh_rng, num_hashes=cfg.lsh_num_hashes,
                bucket_size=cfg.lsh_bucket_size, num_buckets=cfg.lsh_num_buckets,
                exclude_self=cfg.lsh_exclude_self)
        else:
            scores = jnp.einsum("bhqd,bhkd->bhqk", query, key) + attention_bias(mask)
            context = jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(scores, axis=-1), value)
        context = context.transpose(0, 2, 1, 3).reshape(batch, seq, cfg.d_model)
        return nn.Dense(cfg.d_model, name="output")(context)


class ConvSublayer(nn.Module):
    """The residual branch dropout(conv(LN(x))) of one depthwise-separable convolution."""

    config: QANetConfig
    kernel: int

    @nn.compact
    def __call__(self, x: jax.Array, mask: jax.Array, deterministic: bool = True) -> jax.Array:
        """x: [batch, seq, d_model]; mask: [batch, seq] -> [batch, seq, d_model]."""
        cfg = self.config
        y = _layer_norm(cfg, "norm")(x)
        y = DepthwiseSeparableConv(cfg.d_model, self.kernel, name="conv")(y, mask)
        return nn.Dropout(cfg.dropout)(y, deterministic=deterministic)


class AttentionSublayer(nn.Module):
    """The residual branch dropout(attention(LN(x)))."""

    config: QANetConfig

    @nn.compact
    def __call__(self, x: jax.Array, mask: jax.Array, deterministic: bool = True,
                 lsh_rng: jax.Array | None = None) -> jax.Array:
        """x: [batch, seq, d_model]; mask: [batch, seq] -> [batch, seq, d_model]."""
        cfg = self.config
        y = MultiHeadAttention(cfg, name="attention")(_layer_norm(cfg, "norm")(x), mask, lsh_rng)
        return nn.Dropout(cfg.dropout)(y, deterministic=deterministic)


class FeedForwardSublayer(nn.Module):
    """The residual branch dropout(W_2 relu(W_1 LN(x))), in row chunks of
    `config.ffn_chunk_size` when set (exact: the feed-forward is row-wise, `map_row_chunks`)."""

    config: QANetConfig

    def setup(self) -> None:
        cfg = self.config
        self.norm = _layer_norm(cfg)
        self.ffn_in = nn.Dense(cfg.ffn_dim)
        self.ffn_out = nn.Dense(cfg.d_model)
        self.dropout = nn.Dropout(cfg.dropout)

    def __call__(self, x: jax.Array, deterministic: bool = True) -> jax.Array:
        """x: [batch, seq, d_model] -> [batch, seq, d_model]."""
        return self.dropout(self._ffn(self.norm(x)), deterministic=deterministic)

    def _ffn(self, x: jax.Array) -> jax.Array:
        chunk = self.config.ffn_chunk_size
        if not chunk or x.shape[1] <= chunk or self.is_initializing():
            return self.ffn_out(jax.nn.relu(self.ffn_in(x)))
        # Inside lax.map only pure functions may run: the same Dense layers applied to this
        # sublayer's own parameters (as layers.Block._ffn does).
        dense_in, dense_out = self.ffn_in.clone(parent=None), self.ffn_out.clone(parent=None)
        params_in = {"params": self.ffn_in.variables["params"]}
        params_out = {"params": self.ffn_out.variables["params"]}

        def rows_ffn(rows: jax.Array) -> jax.Array:
            return dense_out.apply(params_out, jax.nn.relu(dense_in.apply(params_in, rows)))

        return map_row_chunks(rows_ffn, x, chunk)


def _sublayer_names(num_convs: int) -> list[str]:
    """A block's residual sublayers in order (also their parameter names)."""
    return [f"conv_{i}" for i in range(num_convs)] + ["attention", "feed_forward"]


class EncoderBlock(nn.Module):
    """x + PE, then `num_convs` conv sublayers, self-attention, feed-forward, each as
    x <- x + branch(x) (pre-LayerNorm residuals).

    Stochastic depth (`config.layer_dropout` > 0, training only): sublayer l of the stack
    (`first_sublayer` + j of `stack_sublayers`) keeps its branch with probability
    `layer_survival(l, L, layer_dropout)`, drawn per example from the "dropout" rng, and a kept
    branch is scaled by 1 / p_l so that inference (every branch, unscaled) sees the training
    expectation.
    """

    config: QANetConfig
    num_convs: int
    kernel: int
    first_sublayer: int = 1
    stack_sublayers: int = 0

    def setup(self) -> None:
        cfg = self.config
        self.convs = [ConvSublayer(cfg, self.kernel, name=f"conv_{i}")
                      for i in range(self.num_convs)]
        self.attention = AttentionSublayer(cfg)
        self.feed_forward = FeedForwardSublayer(cfg)

    def branch(self, name: str, x: jax.Array, mask: jax.Array, deterministic: bool,
               lsh_rng: jax.Array | None) -> jax.Array:
        """The residual branch of the sublayer `name` (`_sublayer_names`) at x."""
        if name == "attention":
            return self.attention(x, mask, deterministic, lsh_rng)
        if name == "feed_forward":
            return self.feed_forward(x, deterministic)
        return self.convs[int(name.removeprefix("conv_"))](x, mask, deterministic)

    def __call__(self, x: jax.Array, mask: jax.Array, deterministic: bool = True,
                 lsh_rng: jax.Array | None = None) -> jax.Array:
        """x: [batch, seq, d_model]; mask: [batch, seq] -> [batch, seq, d_model]."""
        x = x + sinusoid_positions(x.shape[1], x.shape[2])
        for j, name in enumerate(_sublayer_names(self.num_convs)):
            branch = self.branch(name, x, mask, deterministic, lsh_rng)
            x = x + self._stochastic_depth(branch, self.first_sublayer + j, deterministic)
        return x

    def _stochastic_depth(self, branch: jax.Array, sublayer: int, deterministic: bool
                          ) -> jax.Array:
        """branch [batch, seq, d_model], kept per example with probability p_l and scaled by
        1 / p_l in training; as it is otherwise."""
        rate = self.config.layer_dropout
        if deterministic or not rate or self.is_initializing():
            return branch
        survival = layer_survival(sublayer, self.stack_sublayers, rate)
        keep = jax.random.bernoulli(self.make_rng("dropout"), survival,
                                    (branch.shape[0], 1, 1))
        return jnp.where(keep, branch / survival, 0.0)


def _reversible_branch(config: QANetConfig, kernel: int, deterministic: bool, role: str,
                       layer_params: dict[str, Any], x: jax.Array, aux: tuple[Any, ...]
                       ) -> jax.Array:
    """F (role "f") or G ("g") of one reversible layer of an encoder stack, as a pure function
    (`reversible.Residual`). layer_params: {"f": {name: params}, "g": {name: params}}, one
    sublayer each (F and G of a layer share the params object, so that the backward pass can
    add their gradients; each reads its own half); aux: (mask, (dropout key or None, LSH key or
    None)), as `reversible.reversible_scan` passes (shared, the layer's aux); x: [batch, seq,
    d_model] -> the same shape."""
    ((name, params),) = layer_params[role].items()
    mask, (dropout_rng, lsh_rng) = aux
    # F and G draw different dropout masks from the layer's one key; the recomputation in the
    # backward pass draws the same ones again.
    rngs = (None if dropout_rng is None
            else {"dropout": jax.random.fold_in(dropout_rng, int(role == "g"))})
    # parent=None: an unbound module even when called from inside EncoderStack.
    if name == "attention":
        return AttentionSublayer(config, parent=None).apply(
            {"params": params}, x, mask, deterministic, lsh_rng, rngs=rngs)
    if name == "feed_forward":
        return FeedForwardSublayer(config, parent=None).apply(
            {"params": params}, x, deterministic, rngs=rngs)
    return ConvSublayer(config, kernel, parent=None).apply(
        {"params": params}, x, mask, deterministic, rngs=rngs)


def _stack_over_blocks(per_block: list[Any]) -> Any:
    """The same pytree of every block -> one pytree, each leaf stacked [blocks, ...] (None
    entries stay None)."""
    return jax.tree.map(lambda *leaves: jnp.stack(leaves), *per_block)


class EncoderStack(nn.Module):
    """`encoder` ("embedding" or "model") blocks in sequence.

    Plain: each block as `EncoderBlock.__call__`. Reversible (`config.reversible`): the stack's
    sublayers pair up, (conv_0, conv_1), ..., (attention, feed_forward) per block, as reversible
    layers y1 = x1 + F(x2), y2 = x2 + G(y1) (`reversible.reversible_scan`: a block per loop
    iteration, only the last layer's outputs kept for the backward pass); both streams start
    as x + PE (the encoding is added once per stack, not per block: a reversible layer has no
    place to add a constant to its streams), and the output is their mean.
    """

    config: QANetConfig
    encoder: str

    def setup(self) -> None:
        cfg = self.config
        blocks, convs, kernel = self._shape()
        per_block = len(_sublayer_names(convs))
        self.blocks = [EncoderBlock(cfg, convs, kernel, first_sublayer=1 + i * per_block,
                                    stack_sublayers=blocks * per_block, name=f"block_{i}")
                       for i in range(blocks)]

    def _shape(self) -> tuple[int, int, int]:
        cfg = self.config
        if self.encoder == "embedding":
            return cfg.embedding_blocks, cfg.embedding_convs, cfg.embedding_kernel
        return cfg.model_blocks, cfg.model_convs, cfg.model_kernel

    def _lsh_rng(self, block: int, deterministic: bool) -> jax.Array | None:
        """The hash rotations' key of `block`, None without LSH in this encoder: a fresh "lsh"
        rng in training when the caller passes one, else fixed by `config.lsh_seed` (the same
        buckets on every call: inference, cached passages)."""
        cfg = self.config
        if self.encoder not in cfg.lsh_encoders:
            return None
        if not deterministic and self.has_rng("lsh"):
            return jax.random.fold_in(self.make_rng("lsh"), block)
        seeded = jax.random.fold_in(jax.random.key(cfg.lsh_seed), ENCODERS.index(self.encoder))
        return jax.random.fold_in(seeded, block)

    def __call__(self, x: jax.Array, mask: jax.Array, deterministic: bool = True) -> jax.Array:
        """x: [batch, seq, d_model]; mask: [batch, seq] -> [batch, seq, d_model]."""
        if self.config.reversible:
            return self._reversible(x, mask, deterministic)
        if self.config.scan_blocks and len(self.blocks) > 1 and not self.is_initializing():
            return self._scanned(x, mask, deterministic)
        for i, block in enumerate(self.blocks):
            x = block(x, mask, deterministic, self._lsh_rng(i, deterministic))
        return x

    def _scanned(self, x: jax.Array, mask: jax.Array, deterministic: bool) -> jax.Array:
        """The plain stack as one `lax.scan` over the blocks (`config.scan_blocks`): each
        block's params, LSH key and dropout key stacked [blocks, ...]; the same block function
        as the loop above, so inference gives the loop's outputs (training draws other dropout
        masks: one key per block instead of one per sublayer scope)."""
        cfg = self.config
        _, convs, kernel = self._shape()
        count = len(self.blocks)
        params = _stack_over_blocks([block.variables["params"] for block in self.blocks])
        lsh = [self._lsh_rng(i, deterministic) for i in range(count)]
        keys = (None if lsh[0] is None else jnp.stack(lsh),
                None if deterministic else jnp.stack([self.make_rng("dropout")
                                                      for _ in range(count)]))

        def one_block(x: jax.Array, per_block: tuple[Any, ...]) -> tuple[jax.Array, None]:
            block_params, lsh_rng, dropout_rng = per_block
            rngs = None if dropout_rng is None else {"dropout": dropout_rng}
            # parent=None: an unbound module even when called from inside EncoderStack.
            block = EncoderBlock(cfg, convs, kernel, parent=None)
            return block.apply({"params": block_params}, x, mask, deterministic, lsh_rng,
                               rngs=rngs), None

        x, _ = jax.lax.scan(one_block, x, (params, *keys))
        return x

    def _reversible(self, x: jax.Array, mask: jax.Array, deterministic: bool) -> jax.Array:
        cfg = self.config
        _, convs, kernel = self._shape()
        names = _sublayer_names(convs)
        pairs = list(zip(names[0::2], names[1::2], strict=True))  # (F, G) of a block's layers
        # Per block, per layer: (dropout key, LSH key), drawn in the order blocks then layers.
        aux = []
        for i in range(len(self.blocks)):
            lsh_rng = self._lsh_rng(i, deterministic)
            aux.append(tuple((None if deterministic else self.make_rng("dropout"),
                              lsh_rng if "attention" in pair else None) for pair in pairs))
        x = x + sinusoid_positions(x.shape[1], x.shape[2])
        if self.is_initializing():
            # The same functions as ordinary Flax calls: what creates the parameters.
            x1 = x2 = x
            for block, block_aux in zip(self.blocks, aux, strict=True):
                for (f_name, g_name), (_, lsh_rng) in zip(pairs, block_aux, strict=True):
                    x1 = x1 + block.branch(f_name, x2, mask, deterministic, lsh_rng)
                    x2 = x2 + block.branch(g_name, x1, mask, deterministic, lsh_rng)
        else:
            # Every block has the same layers: a block is one group of `reversible_scan`,
            # each layer's params and keys stacked over the blocks.
            params = tuple(
                _stack_over_blocks([{"f": {f_name: block.variables["params"][f_name]},
                                     "g": {g_name: block.variables["params"][g_name]}}
                                    for block in self.blocks])
                for f_name, g_name in pairs)
            layer_aux = tuple(_stack_over_blocks([block_aux[j] for block_aux in aux])
                              for j in range(len(pairs)))
            x1, x2 = reversible_scan(
                functools.partial(_reversible_branch, cfg, kernel, deterministic, "f"),
                functools.partial(_reversible_branch, cfg, kernel, deterministic, "g"),
                params, layer_aux, mask, x, x)
        return (x1 + x2) * 0.5


class ContextQueryAttention(nn.Module):
    """Context-query attention: trilinear similarity S[i, j] = w . [c_i; q_j; c_i * q_j],
    context-to-query A = softmax_j(S) Q, query-to-context B = softmax_j(S) softmax_i(S)^T C."""

    config: QANetConfig

    @nn.compact
    def __call__(self, context: jax.Array, c_mask: jax.Array, question: jax.Array,
                 q_mask: jax.Array, deterministic: bool = True) -> jax.Array:
        """context: [batch, n, d]; c_mask: [batch, n]; question: [batch, m, d]; q_mask:
        [batch, m] -> [batch, n, 4 d]: [c, A, c * A, c * B].

        Softmaxes skip padding exactly: masked scores are MASK_BIAS (weight exactly 0), over the
        question's tokens for A, over the context's tokens for B. The trilinear form's constant
        term is left out: it cancels in both softmaxes.
        """
        cfg = self.config
        width = context.shape[-1]
        init = nn.initializers.normal(1.0 / math.sqrt(width))
        w_context = self.param("w_context", init, (width,))
        w_question = self.param("w_question", init, (width,))
        w_product = self.param("w_product", init, (width,))
        drop = nn.Dropout(cfg.dropout)
        c = drop(context, deterministic=deterministic)
        q = drop(question, deterministic=deterministic)
        # w . [c_i; q_j; c_i * q_j] without the [batch, n, m, 3d] tensor: three terms.
        scores = ((c @ w_context)[:, :, None] + (q @ w_question)[:, None, :]
                  + jnp.einsum("bnd,bmd->bnm", c * w_product, q))
        to_query = jax.nn.softmax(jnp.where(q_mask[:, None, :] > 0, scores, MASK_BIAS), axis=2)
        to_context = jax.nn.softmax(jnp.where(c_mask[:, :, None] > 0, scores, MASK_BIAS), axis=1)
        attended = jnp.einsum("bnm,bmd->bnd", to_query, q)
        # S_q S_c^T C as S_q (S_c^T C): [m, d] in the middle, not [n, n].
        question_context = jnp.einsum("bnm,bnd->bmd", to_context, c)
        query_to_context = jnp.einsum("bnm,bmd->bnd", to_query, question_context)
        return jnp.concatenate([c, attended, c * attended, c * query_to_context], axis=-1)
