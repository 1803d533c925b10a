"""BiDAF (Seo et al. 2017), the "Inquisition" seed's baseline, with the delayed readers' split.

    embed: frozen word table (MiniLM WordPiece, as QANet's) ; character CNN -> highway x2
      -> contextual BiLSTM                                   = encode_lower(segment)
    attention flow (trilinear S; C2Q U~; Q2C h~ from max_j S) -> G = [H; U~; H*U~; H*H~]
      -> modelling BiLSTM x2 -> M -> start = w1 . [G; M]
      -> output BiLSTM -> M2     -> end   = w2 . [G; M2]      = encode_upper(...)

Like QANet, BiDAF is delayed interaction by construction: question and context go through the
embeddings and the contextual BiLSTM separately (shared weights) and meet only at the attention
flow, so `encode_lower` / `encode_upper` split it as they split QANet (`model/qanet.py`).

The LSTM (`LSTM`, `BiLSTM`) is written here with `lax.scan`, gates in the order i, f, g, o:
    i, f, g, o = split(x W_x + b + h W_h);  c' = s(f) c + s(i) tanh(g);  h' = s(o) tanh(c')
(s the logistic sigmoid). The backward direction reads each sequence from its LAST REAL token
(padding sits at the end), so no real state ever depends on padding; outputs at padding are 0.

Differences from the paper: WordPiece tokens and MiniLM's frozen 384-wide table instead of
100-d GloVe words; the pointers' softmax over the passage is left to the loss (logits out).
"""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from dil_jax.model import word_table as table_lib
from dil_jax.model.bidaf_config import BiDAFConfig
from dil_jax.model.delayed import InputError
from dil_jax.model.lsh import MASK_BIAS
from dil_jax.model.qanet_inputs import QANetSegment
from dil_jax.model.qanet_layers import CharacterCNN, Highway
from dil_jax.model.span_reader import PADDED_LOGIT, ReaderOutput
from dil_jax.model.word_table import Variables


def reverse_padded(x: jax.Array, mask: jax.Array) -> jax.Array:
    """Each sequence's real tokens in reverse order, padding left in place.

    x: [batch, seq, ...]; mask: [batch, seq] with the real tokens first -> the same shape:
    out[b, t] = x[b, n_b - 1 - t] for t < n_b (n_b real tokens), x[b, t] after. Its own inverse.
    """
    seq = x.shape[1]
    lengths = jnp.sum(mask > 0, axis=1, keepdims=True)
    t = jnp.arange(seq)[None, :]
    index = jnp.where(t < lengths, lengths - 1 - t, t)
    index = index.reshape(index.shape + (1,) * (x.ndim - 2))
    return jnp.take_along_axis(x, index, axis=1)


class LSTM(nn.Module):
    """One-direction LSTM over [batch, seq, features] -> hidden states [batch, seq, hidden],
    zero initial state; gates i, f, g, o (module docstring)."""

    hidden: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        batch = x.shape[0]
        inputs = nn.Dense(4 * self.hidden, name="input")(x)  # x W_x + b for every step at once
        recurrent = self.param("recurrent", nn.initializers.orthogonal(),
                               (self.hidden, 4 * self.hidden))

        def step(carry, gates_x):
            h, c = carry
            gates = gates_x + h @ recurrent
            i, f, g, o = jnp.split(gates, 4, axis=-1)
            c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
            h = jax.nn.sigmoid(o) * jnp.tanh(c)
            return (h, c), h

        zeros = jnp.zeros((batch, self.hidden), inputs.dtype)
        _, states = jax.lax.scan(step, (zeros, zeros), inputs.swapaxes(0, 1))
        return states.swapaxes(0, 1)


class BiLSTM(nn.Module):
    """[forward LSTM ; backward LSTM] over the real tokens: [batch, seq, features], mask
    [batch, seq] -> [batch, seq, 2 hidden], 0 at padding."""

    hidden: int

    @nn.compact
    def __call__(self, x: jax.Array, mask: jax.Array) -> jax.Array:
        forward = LSTM(self.hidden, name="forward")(x)
        backward = reverse_padded(LSTM(self.hidden, name="backward")(reverse_padded(x, mask)),
                                  mask)
        out = jnp.concatenate([forward, backward], axis=-1)
        return out * (mask[..., None] > 0).astype(out.dtype)


class AttentionFlow(nn.Module):
    """BiDAF's attention flow: S[t, j] = w . [h_t; u_j; h_t * u_j]; U~ = softmax_j(S) U;
    b = softmax_t(max_j S); h~ = sum_t b_t h_t; G = [H; U~; H * U~; H * h~]."""

    @nn.compact
    def __call__(self, context: jax.Array, c_mask: jax.Array, question: jax.Array,
                 q_mask: jax.Array) -> jax.Array:
        """context: [batch, T, 2d]; question: [batch, J, 2d]; masks [batch, T], [batch, J]
        -> G [batch, T, 8d]. Padding is excluded exactly (MASK_BIAS) from every softmax and
        from the max over the question."""
        width = context.shape[-1]
        init = nn.initializers.normal(1.0 / math.sqrt(width))
        w_c = self.param("w_context", init, (width,))
        w_q = self.param("w_question", init, (width,))
        w_cq = self.param("w_product", init, (width,))
        scores = ((context @ w_c)[:, :, None] + (question @ w_q)[:, None, :]
                  + jnp.einsum("btd,bjd->btj", context * w_cq, question))
        scores = jnp.where(q_mask[:, None, :] > 0, scores, MASK_BIAS)
        attended = jnp.einsum("btj,bjd->btd", jax.nn.softmax(scores, axis=2), question)
        best = jnp.where(c_mask > 0, jnp.max(scores, axis=2), MASK_BIAS)  # [batch, T]
        weights = jax.nn.softmax(best, axis=1)
        summary = jnp.einsum("bt,btd->bd", weights, context)[:, None, :]
        return jnp.concatenate([context, attended, context * attended, context * summary],
                               axis=-1)


class BiDAFModule(nn.Module):
    config: BiDAFConfig

    def setup(self) -> None:
        cfg = self.config
        self.word_table = table_lib.declare(self, cfg)
        self.char_cnn = CharacterCNN(cfg)
        self.highway = Highway(2, cfg.dropout)
        self.contextual = BiLSTM(cfg.hidden)
        self.attention_flow = AttentionFlow()
        self.modelling = [BiLSTM(cfg.hidden, name=f"modelling_{i}") for i in range(2)]
        self.output_lstm = BiLSTM(cfg.hidden)
        self.start_pointer = nn.Dense(1)
        self.end_pointer = nn.Dense(1)
        self.dropout = nn.Dropout(cfg.dropout)

    def encode_lower(self, ids: jax.Array, chars: jax.Array, mask: jax.Array,
                     deterministic: bool = True) -> jax.Array:
        """Embeddings, highway, contextual BiLSTM of one segment -> [batch, seq, 2 hidden]."""
        words = table_lib.look_up(self.word_table, ids, self.config)
        x = jnp.concatenate([words, self.char_cnn(chars, deterministic)], axis=-1)
        x = self.highway(x, deterministic)
        return self.contextual(self.dropout(x, deterministic=deterministic), mask)

    def encode_upper(self, q_state: jax.Array, q_mask: jax.Array, p_state: jax.Array,
                     p_mask: jax.Array, deterministic: bool = True) -> ReaderOutput:
        """Attention flow, modelling and output layers -> ReaderOutput over the passage."""
        g = self.attention_flow(p_state, p_mask, q_state, q_mask)
        m = g
        for layer in self.modelling:
            m = layer(self.dropout(m, deterministic=deterministic), p_mask)
        m2 = self.output_lstm(self.dropout(m, deterministic=deterministic), p_mask)
        start = self.start_pointer(self.dropout(jnp.concatenate([g, m], -1),
                                                deterministic=deterministic))[..., 0]
        end = self.end_pointer(self.dropout(jnp.concatenate([g, m2], -1),
                                            deterministic=deterministic))[..., 0]
        real = p_mask > 0
        start, end = jnp.where(real, start, PADDED_LOGIT), jnp.where(real, end, PADDED_LOGIT)
        # SQuAD v1.1 reader: no no-answer score (PADDED_LOGIT, as QANet's).
        null = jnp.full(start.shape[:1], PADDED_LOGIT, start.dtype)
        return ReaderOutput(start, end, null, null)

    def __call__(self, q_ids, q_chars, q_mask, p_ids, p_chars, p_mask,
                 deterministic: bool = True) -> ReaderOutput:
        q_state = self.encode_lower(q_ids, q_chars, q_mask, deterministic)
        p_state = self.encode_lower(p_ids, p_chars, p_mask, deterministic)
        return self.encode_upper(q_state, q_mask, p_state, p_mask, deterministic)


class BiDAFModel:
    """BiDAF with `encode_lower` per segment and `encode_upper` per pair; the same inputs
    (`QANetSegment`) and variables layout (`{"params", "frozen": {"word_table"}}`) as
    `QANetModel`."""

    def __init__(self, config: BiDAFConfig):
        self.config = config
        self.module = BiDAFModule(config)

    def init(self, rng: jax.Array, word_table: Any = None) -> Variables:
        cfg = self.config
        ids = jnp.ones((1, 4), jnp.int32)
        chars = jnp.ones((1, 4, cfg.max_chars), jnp.int32)
        variables = self.module.init(rng, ids, chars, ids, ids, chars, ids)
        return table_lib.with_table(variables, word_table, cfg)

    def _check_segment(self, segment: QANetSegment, what: str) -> None:
        if segment.ids.ndim != 2 or tuple(segment.mask.shape) != tuple(segment.ids.shape):
            raise InputError(f"{what} ids and mask must be [batch, seq] alike, got "
                             f"{tuple(segment.ids.shape)} and {tuple(segment.mask.shape)}")
        if tuple(segment.chars.shape) != (*segment.ids.shape, self.config.max_chars):
            raise InputError(f"{what} chars must be [batch, seq, {self.config.max_chars}] "
                             f"(max_chars), got {tuple(segment.chars.shape)}")

    def encode_lower(self, variables: Variables, segment: QANetSegment, *,
                     deterministic: bool = True, rngs: dict[str, jax.Array] | None = None
                     ) -> jax.Array:
        self._check_segment(segment, "segment")
        return self.module.apply(variables, segment.ids, segment.chars, segment.mask,
                                 deterministic, rngs=rngs, method="encode_lower")

    def encode_upper(self, variables: Variables, q_state: jax.Array, q_mask: jax.Array,
                     p_state: jax.Array, p_mask: jax.Array, *, deterministic: bool = True,
                     rngs: dict[str, jax.Array] | None = None) -> ReaderOutput:
        width = 2 * self.config.hidden
        for name, state, mask in (("question", q_state, q_mask), ("passage", p_state, p_mask)):
            if state.ndim != 3 or state.shape[-1] != width or tuple(mask.shape) != tuple(
                    state.shape[:2]):
                raise InputError(f"{name} state must be [batch, seq, {width}] over its mask, "
                                 f"got {tuple(state.shape)} and mask {tuple(mask.shape)}")
        if q_state.shape[0] != p_state.shape[0]:
            raise InputError(f"question batch {q_state.shape[0]} differs from passage batch "
                             f"{p_state.shape[0]}")
        return self.module.apply(variables, q_state, q_mask, p_state, p_mask, deterministic,
                                 rngs=rngs, method="encode_upper")

    def __call__(self, variables: Variables, question: QANetSegment, passage: QANetSegment, *,
                 deterministic: bool = True, rngs: dict[str, jax.Array] | None = None
                 ) -> ReaderOutput:
        self._check_segment(question, "question")
        self._check_segment(passage, "passage")
        if question.ids.shape[0] != passage.ids.shape[0]:
            raise InputError(f"question batch {question.ids.shape[0]} differs from passage "
                             f"batch {passage.ids.shape[0]}")
        return self.module.apply(variables, question.ids, question.chars, question.mask,
                                 passage.ids, passage.chars, passage.mask, deterministic,
                                 rngs=rngs)
