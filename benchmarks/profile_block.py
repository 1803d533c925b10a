"""One transformer block, ours (Flax/XLA) against Hugging Face's BertLayer, and its parts.

    python benchmarks/profile_block.py                    # MiniLM shape: 8 x 320 tokens, h 384
    python benchmarks/profile_block.py --hidden 768 --batch 4   # BERT-base shape, 4 pairs

Same weights, float32, 2 threads each (the process's CPUs); every candidate runs once per repeat
in a shuffled order, so load from other processes falls on all of them; medians and minima.
Parts: the three q/k/v projections, attention alone (scores, softmax, context; head-major inputs;
torch's fused scaled_dot_product_attention against our `_attend` looped over the batch as the
reader does on CPU; then ours in pieces: the scores matmul with its row max, plus the exp and
sum, and `jax.nn.dot_product_attention` batched and looped per example), the feed-forward (two
matmuls and the erf GELU), residual + LayerNorm.
"""

from __future__ import annotations

import argparse
import os
import random
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch

from dil_jax.bench.machine import retain_freed_memory
from dil_jax.bench.peer import hf_model_from_params
from dil_jax.model import attention, layers
from dil_jax.model.encoder_config import EncoderConfig


def timed(runs: dict, repeats: int) -> dict[str, list[float]]:
    for run in runs.values():
        run()
        run()
    times: dict[str, list[float]] = {name: [] for name in runs}
    order = list(runs)
    shuffle = random.Random(0).shuffle
    for _ in range(repeats):
        shuffle(order)
        for name in order:
            start = time.perf_counter()
            runs[name]()
            times[name].append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--hidden", type=int, default=384)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=320)
    parser.add_argument("--repeats", type=int, default=25)
    args = parser.parse_args()
    retain_freed_memory()  # as the speed grid does
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    h, b, s = args.hidden, args.batch, args.seq
    cfg = EncoderConfig(hidden_size=h, embedding_size=h, intermediate_size=4 * h, num_heads=12)
    heads, d = cfg.num_heads, cfg.head_dim
    rng = np.random.default_rng(0)
    x = rng.standard_normal((b, s, h)).astype(np.float32)
    mask = np.ones((b, s), np.float32)
    mask[-1, s * 3 // 4:] = 0
    bias = attention.attention_bias(jnp.asarray(mask))
    block = layers.Block(cfg)
    params = block.init(jax.random.PRNGKey(0), x, bias)
    layer = hf_model_from_params(
        cfg.replace(num_layers=1), _reader_params(cfg, params)).bert.encoder.layer[0].eval()
    p = jax.tree_util.tree_map(np.asarray, params)["params"]
    tx, tbias = torch.from_numpy(x), torch.from_numpy(np.asarray(bias))

    def torch_block():
        out = layer(tx, attention_mask=tbias)
        return out[0] if isinstance(out, tuple) else out

    ours = jax.jit(block.apply)
    with torch.inference_mode():
        diff = np.abs(np.asarray(ours(params, x, bias)) - torch_block().numpy()).max()
    print(f"block output, largest difference from HF: {diff:.2e}")

    a = p["attention"]
    q4 = jnp.asarray(rng.standard_normal((b, heads, s, d)).astype(np.float32))
    tq4 = torch.from_numpy(np.asarray(q4))
    lin = [layer.attention.self.query, layer.attention.self.key, layer.attention.self.value]
    kernels = [jnp.asarray(a[n]["kernel"]) for n in ("query", "key", "value")]
    biases = [jnp.asarray(a[n]["bias"]) for n in ("query", "key", "value")]
    w1, b1, w2, b2 = (jnp.asarray(p[name][k])
                      for name in ("ffn_in", "ffn_out") for k in ("kernel", "bias"))
    norm = layer.output.LayerNorm
    ln = layers.layer_norm(cfg, "norm")
    ln_params = {"params": p["output_norm"]}
    jx = jnp.asarray(x)

    def jit_run(f, *operands):
        compiled = jax.jit(f)
        return lambda: jax.block_until_ready(compiled(*operands))

    def attend_loop(q):
        return jax.lax.map(lambda t: attention._attend(cfg, *t), (q, q, q, bias))

    def scores(q, k, b):
        return jnp.einsum("hqd,hkd->hqk", q, k) + b

    def scores_max(q):  # the first matmul, reduced to a small output so that no write dominates
        return jax.lax.map(lambda t: jnp.max(scores(*t), axis=-1), (q, q, bias))

    def scores_exp_sum(q):
        def one(t):
            s_ = scores(*t)
            return jnp.sum(jnp.exp(s_ - jnp.max(s_, axis=-1, keepdims=True)), axis=-1)
        return jax.lax.map(one, (q, q, bias))

    q_seq_major = q4.transpose(0, 2, 1, 3)  # [batch, seq, heads, head_dim], jax.nn's layout
    key_mask = jnp.asarray(mask, bool)[:, None, None, :]

    def jax_dpa_loop(q):
        return jax.lax.map(lambda t: jax.nn.dot_product_attention(
            t[0], t[0], t[0], mask=t[1], scale=1.0), (q, key_mask))

    runs = {
        "block: HF BertLayer": torch_block,
        "block: ours": lambda: jax.block_until_ready(ours(params, x, bias)),
        "q/k/v projections: torch": lambda: [f(tx) for f in lin],
        "q/k/v projections: ours": jit_run(
            lambda x, ks, bs: [x @ k + c for k, c in zip(ks, bs)], jx, kernels, biases),
        "attention alone: torch SDPA": lambda: torch.nn.functional.scaled_dot_product_attention(
            tq4, tq4, tq4, attn_mask=tbias),
        "attention alone: ours": jit_run(attend_loop, q4),
        "  ours: scores + row max": jit_run(scores_max, q4),
        "  ours: ... + exp + sum": jit_run(scores_exp_sum, q4),
        "  jax.nn.dot_product_attention": jit_run(
            lambda q: jax.nn.dot_product_attention(q, q, q, mask=key_mask, scale=1.0),
            q_seq_major),
        "  jax.nn.dot_product_attention/ex.": jit_run(jax_dpa_loop, q_seq_major),
        "feed-forward: torch": lambda: layer.output.dense(layer.intermediate(tx)),
        "feed-forward: ours": jit_run(
            lambda x: layers.gelu_exact(x @ w1 + b1) @ w2 + b2, jx),
        "residual + LayerNorm: torch": lambda: norm(tx + tx),
        "residual + LayerNorm: ours": jit_run(lambda x: ln.apply(ln_params, x + x), jx),
    }
    with torch.inference_mode():
        times = timed(runs, args.repeats)
    print(f"hidden {h}, {b} x {s} tokens, {torch.get_num_threads()} torch threads, "
          f"{args.repeats} shuffled repeats; load average {os.getloadavg()[0]:.2f}")
    for name, ts in times.items():
        print(f"{name:30s} median {np.median(ts) * 1e3:7.2f} ms   min {min(ts) * 1e3:7.2f} ms")


def _reader_params(cfg: EncoderConfig, block_params) -> dict:
    """A one-block reader's params around `block_params` (embeddings and head random)."""
    from dil_jax.model.bert import SpanReaderModule

    reader = SpanReaderModule(cfg.replace(num_layers=1))
    ids = jnp.zeros((1, 4), jnp.int32)
    params = reader.init(jax.random.PRNGKey(1), ids, jnp.ones((1, 4)), ids, jnp.ones((1, 4)))
    params = jax.tree_util.tree_map(np.asarray, params)["params"]
    params["block_0"] = jax.tree_util.tree_map(np.asarray, block_params["params"])
    return params


if __name__ == "__main__":
    main()
