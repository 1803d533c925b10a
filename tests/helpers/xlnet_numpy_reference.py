"""An independent NumPy XLNet reader written straight from Hugging Face tensor names.

It shares no code with dil_jax (nor with transformers; its LayerNorm and activation are
`numpy_reference`'s): float64, one unpadded sequence in XLNet's own order `P [SEP] Q [SEP]
[CLS]`, positions = indices of that sequence, and the relative position term computed pair by
pair from the sinusoid of i - j (no position table, no rel_shift, no gather). An explicit
[seq, seq] attention mask per layer expresses delayed interaction as "block-diagonal in blocks
1..k, full above".
"""

from __future__ import annotations

import math

import numpy as np

from tests.helpers.numpy_reference import activation, layer_norm


def _state(state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {name.removeprefix("transformer."): np.asarray(value, np.float64)
            for name, value in state.items()}


def sinusoid(distance: np.ndarray, hidden: int) -> np.ndarray:
    """[...] relative distances -> [..., hidden]: [sin(d f), cos(d f)], f_m = 10000^(-2m/hidden)."""
    freq = 10000.0 ** (-np.arange(0, hidden, 2) / hidden)
    angles = distance[..., None] * freq
    return np.concatenate([np.sin(angles), np.cos(angles)], axis=-1)


def xlnet_reference(state: dict[str, np.ndarray], num_layers: int, ids: np.ndarray,
                    segment_ids: np.ndarray, allowed: list[np.ndarray], act: str = "gelu",
                    eps: float = 1e-12):
    """ids, segment_ids: [seq] (XLNet order, no padding); allowed: per layer a [seq, seq] bool
    matrix (query row may attend key column) -> (start [seq], end [seq], l + 1 hidden states)."""
    s = _state(state)
    x = s["word_embedding.weight"][ids]
    seq, hidden = x.shape
    distance = np.arange(seq)[:, None] - np.arange(seq)[None, :]       # i - j
    position = sinusoid(distance.astype(np.float64), hidden)           # [i, j, hidden]
    different = (segment_ids[:, None] != segment_ids[None, :]).astype(int)  # [i, j]
    states = [x]
    for layer in range(num_layers):
        p = f"layer.{layer}.rel_attn"
        q = np.einsum("ih,hnd->ind", x, s[f"{p}.q"])
        k = np.einsum("ih,hnd->ind", x, s[f"{p}.k"])
        v = np.einsum("ih,hnd->ind", x, s[f"{p}.v"])
        d_head = q.shape[-1]
        pos_key = np.einsum("ijh,hnd->ijnd", position, s[f"{p}.r"])    # [i, j, heads, d]
        seg = s[f"{p}.seg_embed"][different]                           # [i, j, heads, d]
        scores = (np.einsum("ind,jnd->nij", q + s[f"{p}.r_w_bias"], k)
                  + np.einsum("ind,ijnd->nij", q + s[f"{p}.r_r_bias"], pos_key)
                  + np.einsum("ind,ijnd->nij", q + s[f"{p}.r_s_bias"], seg)) / math.sqrt(d_head)
        scores = np.where(allowed[layer][None], scores, -np.inf)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        context = np.einsum("nij,jnd->ind", probs, v)
        x = layer_norm(x + np.einsum("ind,hnd->ih", context, s[f"{p}.o"]), s,
                        f"{p}.layer_norm", eps)
        f = f"layer.{layer}.ff"
        inner = activation(x @ s[f"{f}.layer_1.weight"].T + s[f"{f}.layer_1.bias"], act)
        x = layer_norm(x + inner @ s[f"{f}.layer_2.weight"].T + s[f"{f}.layer_2.bias"], s,
                        f"{f}.layer_norm", eps)
        states.append(x)
    logits = x @ s["qa_outputs.weight"].T + s["qa_outputs.bias"]
    return logits[:, 0], logits[:, 1], states
