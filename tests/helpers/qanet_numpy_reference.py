"""An independent float64 NumPy QANet, written from the paper's definitions.

It shares no code with dil_jax.model.qanet*: it reads the Flax params by name and computes one
example at a time on its REAL tokens only (the padding is cut off first, so it never has to be
masked), with explicit loops where dil_jax uses batched forms:

- the depthwise convolution as a sum over kernel taps with explicit zero padding beyond the
  segment's real tokens (cross-correlation, as Flax's nn.Conv and the usual framework
  convolutions are: no kernel flip);
- the character CNN over each token's real characters alone, so a max-pool over padding slots
  cannot hide in it;
- the trilinear similarity as the paper writes it, w . [c_i; q_j; c_i * q_j] with one
  concatenated 3d-vector, for every (i, j);
- attention as a softmax over the real keys per head;
- the positional encoding from sin / cos of t / 10000^(2i/d) per element.
"""

from __future__ import annotations

import math

import numpy as np


def as64(tree):
    """A params tree as float64 numpy arrays."""
    if isinstance(tree, dict):
        return {key: as64(value) for key, value in tree.items()}
    return np.asarray(tree, dtype=np.float64)


def dense(x, p):
    return x @ p["kernel"] + p["bias"]


def layer_norm(x, p, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * p["scale"] + p["bias"]


def relu(x):
    return np.maximum(x, 0.0)


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def positional_encoding(length, width):
    pe = np.zeros((length, width))
    for t in range(length):
        for i in range(width):
            angle = t / 10000 ** ((i - i % 2) / width)
            pe[t, i] = math.sin(angle) if i % 2 == 0 else math.cos(angle)
    return pe


def correlate_same(x, kernel):
    """x [n, channels], kernel [k, channels] (one filter per channel) -> [n, channels]:
    out[t] = sum_j x[t + j - (k - 1) / 2] * kernel[j], zeros outside 0..n-1."""
    n, k = len(x), len(kernel)
    half = (k - 1) // 2
    out = np.zeros_like(x)
    for t in range(n):
        for j in range(k):
            s = t + j - half
            if 0 <= s < n:
                out[t] += x[s] * kernel[j]
    return out


def depthwise_separable(x, p, kernel_size):
    """x [n, c] (real tokens only) -> relu(pointwise(depthwise(x)))."""
    depthwise = p["depthwise"]["kernel"]  # Flax: [k, 1, channels]
    assert depthwise.shape[0] == kernel_size
    return relu(dense(correlate_same(x, depthwise[:, 0, :]), p["pointwise"]))


def highway(x, p, layers=2):
    for i in range(layers):
        gate = sigmoid(dense(x, p[f"gate_{i}"]))
        x = gate * relu(dense(x, p[f"transform_{i}"])) + (1 - gate) * x
    return x


def char_cnn(char_ids, p):
    """char_ids: one token's REAL character ids (a list, maybe empty) -> [filters]."""
    filters = p["conv"]["bias"].shape[0]
    if not len(char_ids):
        return np.zeros(filters)
    embedded = p["embed"]["embedding"][np.asarray(char_ids)]  # [L, char_dim]
    kernel = p["conv"]["kernel"]  # [k, char_dim, filters]
    k, half = kernel.shape[0], (kernel.shape[0] - 1) // 2
    out = np.zeros((len(char_ids), filters))
    for t in range(len(char_ids)):
        for j in range(k):
            s = t + j - half
            if 0 <= s < len(char_ids):
                out[t] += embedded[s] @ kernel[j]
    return relu(out + p["conv"]["bias"]).max(axis=0)


def attention(x, p, num_heads):
    """x [n, d] (real tokens only): multi-head self-attention over all of them."""
    n, d = x.shape
    hd = d // num_heads
    q, k, v = (dense(x, p[name]).reshape(n, num_heads, hd) for name in ("query", "key", "value"))
    out = np.zeros((n, num_heads, hd))
    for h in range(num_heads):
        scores = q[:, h] @ k[:, h].T / math.sqrt(hd)
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        weights /= weights.sum(-1, keepdims=True)
        out[:, h] = weights @ v[:, h]
    return dense(out.reshape(n, d), p["output"])


def feed_forward(x, p, eps):
    y = layer_norm(x, p["norm"], eps)
    return dense(relu(dense(y, p["ffn_in"])), p["ffn_out"])


def sublayer_branch(name, x, p, cfg, kernel):
    """The residual branch of one sublayer (no dropout: inference)."""
    eps = cfg.layer_norm_eps
    if name == "attention":
        return attention(layer_norm(x, p["norm"], eps), p["attention"], cfg.num_heads)
    if name == "feed_forward":
        return feed_forward(x, p, eps)
    return depthwise_separable(layer_norm(x, p["norm"], eps), p["conv"], kernel)


def sublayer_names(num_convs):
    return [f"conv_{i}" for i in range(num_convs)] + ["attention", "feed_forward"]


def encoder_stack(x, p, cfg, num_blocks, num_convs, kernel, reversible=False):
    """x [n, d] -> [n, d]: blocks of (x + PE, convs, attention, feed-forward) pre-LN
    residuals; reversible: both streams x + PE, pairs of sublayers as y1 = x1 + F(x2),
    y2 = x2 + G(y1), the mean of the streams out."""
    names = sublayer_names(num_convs)
    if reversible:
        x1 = x2 = x + positional_encoding(*x.shape)
        for b in range(num_blocks):
            block = p[f"block_{b}"]
            for f_name, g_name in zip(names[0::2], names[1::2]):
                x1 = x1 + sublayer_branch(f_name, x2, block[f_name], cfg, kernel)
                x2 = x2 + sublayer_branch(g_name, x1, block[g_name], cfg, kernel)
        return (x1 + x2) / 2
    for b in range(num_blocks):
        block = p[f"block_{b}"]
        x = x + positional_encoding(*x.shape)
        for name in names:
            x = x + sublayer_branch(name, x, block[name], cfg, kernel)
    return x


def context_query(c, q, p):
    """c [n, d], q [m, d] (real tokens only) -> [n, 4d], with S[i, j] = w . [c_i; q_j; c_i q_j]."""
    w = np.concatenate([p["w_context"], p["w_question"], p["w_product"]])
    n, m = len(c), len(q)
    s = np.array([[w @ np.concatenate([c[i], q[j], c[i] * q[j]]) for j in range(m)]
                  for i in range(n)])
    row = np.exp(s - s.max(1, keepdims=True))
    row /= row.sum(1, keepdims=True)  # softmax over the question's tokens
    col = np.exp(s - s.max(0, keepdims=True))
    col /= col.sum(0, keepdims=True)  # softmax over the context's tokens
    a = row @ q
    b = row @ col.T @ c
    return np.concatenate([c, a, c * a, c * b], axis=1)


def encode_lower(params, table, ids, chars, cfg):
    """One segment's real tokens: ids [n], chars: n lists of real character ids -> [n, d]."""
    words = table[np.asarray(ids)]
    characters = np.stack([char_cnn(c, params["char_cnn"]) for c in chars])
    x = dense(np.concatenate([words, characters], axis=1), params["projection"])
    x = highway(x, params["highway"])
    return encoder_stack(x, params["embedding_encoder"], cfg, cfg.embedding_blocks,
                         cfg.embedding_convs, cfg.embedding_kernel, cfg.reversible)


def encode_upper(params, q_state, p_state, cfg):
    """Real tokens only -> (start [n], end [n]) logits over the passage."""
    x = dense(context_query(p_state, q_state, params["context_query"]),
              params["model_projection"])
    passes = []
    for _ in range(3):
        x = encoder_stack(x, params["model_encoder"], cfg, cfg.model_blocks, cfg.model_convs,
                          cfg.model_kernel, cfg.reversible)
        passes.append(x)
    start = dense(np.concatenate([passes[0], passes[1]], 1), params["start_pointer"])[:, 0]
    end = dense(np.concatenate([passes[0], passes[2]], 1), params["end_pointer"])[:, 0]
    return start, end


def real_characters(chars_row):
    """[max_chars] ids of one token -> the list of its real (non-zero) ids."""
    return [int(c) for c in chars_row if c != 0]


def qanet_forward(variables, question, passage, row, cfg):
    """One pair (row `row` of two QANetSegment batches) -> (start, end) over the passage's real
    tokens, float64."""
    params = as64(variables["params"])
    table = np.asarray(variables["frozen"]["word_table"], np.float64)
    states = []
    for segment in (question, passage):
        mask = np.asarray(segment.mask[row]) > 0
        ids = np.asarray(segment.ids[row])[mask]
        chars = [real_characters(c) for c in np.asarray(segment.chars[row])[mask]]
        states.append(encode_lower(params, table, ids, chars, cfg))
    return encode_upper(params, states[0], states[1], cfg)
