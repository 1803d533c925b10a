"""The pair program with and without the first upper block's q/k/v computed per segment.

    python benchmarks/hoisting.py                        # MiniLM (embedded), k = 4 and 5
    python benchmarks/hoisting.py --suite bert-base      # BERT-base shape, k = 10 and 11

`PairGrid` computes the first upper block's query/key/value once per question and per passage
(`project_upper`) when a segment is read by several pairs, and hands them to `read_upper`.
This times one chunk of pairs (the shapes `speed_grid.py` uses: 64 + 256 tokens, 8 pairs) through
`read_upper` both ways, jitted, interleaved, on the same gathered inputs: the per-pair program
without the projections against the one that computes them itself. The projections themselves
(once per segment) are not in either figure. Also prints the largest span-score difference.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import numpy as np

from dil_jax.bench.grids import GridInputs, GridSpec, random_grid
from dil_jax.bench.suites import default_ks, suite_model
from dil_jax.mesh import data_mesh
from dil_jax.model.delayed import DelayedInteractionModel
from dil_jax.reading.grid import PairGrid
from dil_jax.reading.upper import read_upper


def compare(config, params, inputs: GridInputs, k: int, repeats: int) -> None:
    """Times one chunk (pair i = question i with passage i) through both programs; prints."""
    model = DelayedInteractionModel(config.replace(num_lower_layers=k))
    pairs = inputs.q_ids.shape[0]
    reader = PairGrid(model, data_mesh(), pairs, pairs)
    q_lower = reader.encode_questions(params, inputs.q_ids, inputs.q_mask)
    p_lower = reader.encode_passages(params, inputs.p_ids, inputs.p_mask)
    q_qkv = reader.project_segments(params, q_lower)
    p_qkv = reader.project_segments(params, p_lower)
    in_pairs = jax.jit(lambda p, q, qm, s, sm: read_upper(model, p, q, qm, s, sm))
    hoisted = jax.jit(lambda p, q, qm, s, sm, qq, pq: read_upper(
        model, p, q, qm, s, sm, q_qkv=qq, p_qkv=pq))
    args = (params, q_lower, inputs.q_mask, p_lower, inputs.p_mask)
    runs = {"q/k/v in every pair": lambda: in_pairs(*args),
            "q/k/v per segment": lambda: hoisted(*args, q_qkv, p_qkv)}
    starts = [np.asarray(jax.block_until_ready(run()).start_logits) for run in runs.values()]
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            jax.block_until_ready(run())
            times[name].append(time.perf_counter() - start)
    for name in runs:
        print(f"k={k:<3d} {name:22s} median {statistics.median(times[name]) * 1e3:8.2f} ms"
              f"   min {min(times[name]) * 1e3:8.2f} ms")
    base, fast = (statistics.median(times[name]) for name in runs)
    print(f"k={k:<3d} pair program x{base / fast:.3f} faster with q/k/v per segment "
          f"(largest span-score difference {float(np.max(np.abs(starts[0] - starts[1]))):.1e})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", choices=("minilm", "bert-base"), default="minilm")
    parser.add_argument("--pairs", type=int, default=8, help="pairs per chunk")
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()

    reader, weights = suite_model(args.suite, question_len=64)
    config, params = reader.config, reader.params
    spec = GridSpec(num_questions=args.pairs, num_passages=args.pairs)
    inputs = random_grid(spec, config.vocab_size)
    print(f"{args.suite} ({weights}): one chunk of {args.pairs} pairs of "
          f"{spec.question_len} + {spec.passage_len} tokens, {args.repeats} interleaved repeats")
    for k in default_ks(config.num_layers):
        compare(config, params, inputs, k, args.repeats)


if __name__ == "__main__":
    main()
