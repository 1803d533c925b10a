"""BiDAF (dil_jax.model.bidaf) against hand-unrolled float64 NumPy references.

The LSTM reference is a Python loop over the time steps of ONE sequence's real tokens (the
backward direction loops from the last real token down to the first), with the gates computed
one by one from their definitions: it shares with dil_jax only the parameter names and the gate
order i, f, g, o. The attention flow is written per (t, j) from w . [h; u; h * u].

Tolerances from float32 rounding: an LSTM step sums ~(features + hidden) products of size ~1
into each gate, rounded to ~1e-7 relative, and the sigmoid/tanh contract errors; over 12 steps
the states (|h| < 1) stay within ~1e-6 of float64 (measured 1.1e-7), so 1e-5. The whole
reader: 5 BiLSTMs deep, logits ~1, measured within 3.4e-7 of float64; 1e-4 of the largest logit.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from dil_jax.model.bidaf import AttentionFlow, BiDAFModel, BiLSTM, reverse_padded
from dil_jax.model.bidaf_config import BiDAFConfig
from dil_jax.model.encoder_config import ConfigError
from dil_jax.model.span_reader import PADDED_LOGIT

import tests.helpers.qanet_numpy_reference as ref
from tests.helpers.qanet import perturb, segment

ATOL, MODEL_RTOL = 1e-5, 1e-4
TINY = dict(vocab_size=40, word_dim=12, max_chars=6, char_dim=8, char_filters=10, char_kernel=3,
            hidden=7, dropout=0.0, char_dropout=0.0)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def lstm_reference(x, p, hidden):
    """One direction over x [n, features] (real tokens only), unrolled: -> [n, hidden]."""
    w_x, b, w_h = p["input"]["kernel"], p["input"]["bias"], p["recurrent"]
    h, c = np.zeros(hidden), np.zeros(hidden)
    out = []
    for t in range(len(x)):
        z = x[t] @ w_x + b + h @ w_h
        i = _sigmoid(z[0 * hidden:1 * hidden])
        f = _sigmoid(z[1 * hidden:2 * hidden])
        g = np.tanh(z[2 * hidden:3 * hidden])
        o = _sigmoid(z[3 * hidden:4 * hidden])
        c = f * c + i * g
        h = o * np.tanh(c)
        out.append(h)
    return np.stack(out)


def bilstm_reference(x, p, hidden):
    forward = lstm_reference(x, p["forward"], hidden)
    backward = lstm_reference(x[::-1], p["backward"], hidden)[::-1]
    return np.concatenate([forward, backward], axis=1)


def attention_flow_reference(h, u, p):
    w = np.concatenate([p["w_context"], p["w_question"], p["w_product"]])
    s = np.array([[w @ np.concatenate([h[t], u[j], h[t] * u[j]]) for j in range(len(u))]
                  for t in range(len(h))])
    a = np.exp(s - s.max(1, keepdims=True))
    a /= a.sum(1, keepdims=True)
    u_tilde = a @ u
    best = s.max(1)
    b = np.exp(best - best.max())
    b /= b.sum()
    h_tilde = b @ h
    return np.concatenate([h, u_tilde, h * u_tilde, h * h_tilde[None, :]], axis=1)


def bidaf_reference(variables, question, passage, row, cfg):
    params = ref.as64(variables["params"])
    table = np.asarray(variables["frozen"]["word_table"], np.float64)
    states = []
    for seg in (question, passage):
        real = np.asarray(seg.mask[row]) > 0
        words = table[np.asarray(seg.ids[row])[real]]
        chars = np.stack([ref.char_cnn(ref.real_characters(c), params["char_cnn"])
                          for c in np.asarray(seg.chars[row])[real]])
        x = ref.highway(np.concatenate([words, chars], 1), params["highway"])
        states.append(bilstm_reference(x, params["contextual"], cfg.hidden))
    g = attention_flow_reference(states[1], states[0], params["attention_flow"])
    m = bilstm_reference(bilstm_reference(g, params["modelling_0"], cfg.hidden),
                         params["modelling_1"], cfg.hidden)
    m2 = bilstm_reference(m, params["output_lstm"], cfg.hidden)
    start = ref.dense(np.concatenate([g, m], 1), params["start_pointer"])[:, 0]
    end = ref.dense(np.concatenate([g, m2], 1), params["end_pointer"])[:, 0]
    return start, end


def _mask(batch, length, pads):
    mask = np.ones((batch, length), np.int32)
    for row, pad in enumerate(pads):
        if pad:
            mask[row, length - pad:] = 0
    return mask


def test_reverse_padded_reverses_real_tokens_only():
    x = np.arange(10).reshape(2, 5)
    mask = _mask(2, 5, (2, 0))
    out = np.asarray(reverse_padded(x, mask))
    np.testing.assert_array_equal(out, [[2, 1, 0, 3, 4], [9, 8, 7, 6, 5]])
    np.testing.assert_array_equal(np.asarray(reverse_padded(out, mask)), x)


def test_bilstm_matches_the_hand_unrolled_reference():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 12, 5)).astype(np.float32)
    mask = _mask(2, 12, (0, 4))
    x[1, 8:] = 100.0  # padding the backward direction must not read
    module = BiLSTM(hidden=7)
    params = perturb(module.init(jax.random.key(0), x, mask)["params"], 1)
    got = np.asarray(module.apply({"params": params}, x, mask))
    p64 = ref.as64(params)
    for row in range(2):
        real = mask[row] > 0
        want = bilstm_reference(x[row][real].astype(np.float64), p64, 7)
        np.testing.assert_allclose(got[row][real], want, atol=ATOL)
        assert np.all(got[row][~real] == 0)
    # Without the padding-aware reversal the backward states of row 1 would start from the
    # padding: the reference tells the difference.
    plain_reverse = bilstm_reference(x[1].astype(np.float64), p64, 7)[:8]
    assert np.abs(plain_reverse - got[1][:8]).max() > 1e-2


def test_attention_flow_matches_reference_with_masks():
    rng = np.random.default_rng(1)
    h = rng.normal(size=(2, 9, 6)).astype(np.float32)
    u = rng.normal(size=(2, 5, 6)).astype(np.float32)
    c_mask, q_mask = _mask(2, 9, (3, 0)), _mask(2, 5, (0, 2))
    h[0, 6:] = 30.0
    u[1, 3:] = 30.0
    module = AttentionFlow()
    params = perturb(module.init(jax.random.key(0), h, c_mask, u, q_mask)["params"], 2)
    got = np.asarray(module.apply({"params": params}, h, c_mask, u, q_mask))
    for row in range(2):
        rc, rq = c_mask[row] > 0, q_mask[row] > 0
        want = attention_flow_reference(h[row][rc].astype(np.float64),
                                        u[row][rq].astype(np.float64), ref.as64(params))
        np.testing.assert_allclose(got[row][rc], want, atol=ATOL)


def test_jitted_bidaf_matches_reference_and_splits_like_a_delayed_reader():
    config = BiDAFConfig(**TINY)
    model = BiDAFModel(config)
    variables = model.init(jax.random.key(0))
    variables = {"params": perturb(variables["params"], 3), "frozen": variables["frozen"]}
    question, passage = segment(10, 2, 7, (0, 3), config), segment(11, 2, 12, (4, 0), config)
    out = jax.jit(lambda v, q, p: model(v, q, p))(variables, question, passage)
    for row in range(2):
        real = np.asarray(passage.mask[row]) > 0
        start, end = bidaf_reference(variables, question, passage, row, config)
        scale = max(np.abs(start).max(), np.abs(end).max())
        np.testing.assert_allclose(np.asarray(out.start_logits[row])[real], start,
                                   atol=MODEL_RTOL * scale)
        np.testing.assert_allclose(np.asarray(out.end_logits[row])[real], end,
                                   atol=MODEL_RTOL * scale)
        assert np.all(np.asarray(out.start_logits[row])[~real] == PADDED_LOGIT)
    # The split path is the same computation.
    split = model.encode_upper(variables, model.encode_lower(variables, question),
                               question.mask, model.encode_lower(variables, passage),
                               passage.mask)
    eager = model(variables, question, passage)
    np.testing.assert_array_equal(np.asarray(split.start_logits), np.asarray(eager.start_logits))


def test_bidaf_config_is_checked_by_name():
    with pytest.raises(ConfigError, match="hidden"):
        BiDAFConfig(**{**TINY, "hidden": 0})
    with pytest.raises(ConfigError, match="dropout"):
        BiDAFConfig(**{**TINY, "dropout": 1.5})
