"""Pair-phase time vs the number of passage tokens kept by sentence prescreening.

    python benchmarks/kept_tokens.py [--checkpoint dil_jax/assets/minilm-squad-k2] [--k 4] \
        [--pairs 32]

One chunk of `pairs` (question, passage) pairs through the upper blocks of a reader, with all
passage tokens, then with only the first n kept (`dil_jax.reading.pairs.kept_positions`),
interleaved, median of repeats, compilation excluded. Random token ids (a dense transformer's cost
does not depend on them, nor on the weights: `--k` may read any reader at any split). Prints a
Markdown table.
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", default="dil_jax/assets/minilm-squad-k2")
    parser.add_argument("--k", type=int, default=None,
                        help="split point (default: the checkpoint's own)")
    parser.add_argument("--pairs", type=int, default=32)
    parser.add_argument("--question-len", type=int, default=32)
    parser.add_argument("--passage-len", type=int, default=160)
    parser.add_argument("--kept", type=int, nargs="+", default=[160, 96, 64, 32])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    import jax

    from dil_jax.readers import load_reader
    from dil_jax.reading.grid import PairGrid
    from dil_jax.reading.pairs import kept_positions

    loaded = load_reader(args.checkpoint, args.k, args.question_len)
    model, params = loaded.model, loaded.params
    reader = PairGrid(model, batch_size=args.pairs, chunk_size=args.pairs)
    rng = np.random.default_rng(0)
    q_ids = rng.integers(1000, 2000, (args.pairs, args.question_len)).astype(np.int32)
    p_ids = rng.integers(1000, 2000, (args.pairs, args.passage_len)).astype(np.int32)
    q_mask, p_mask = np.ones_like(q_ids), np.ones_like(p_ids)
    q_lower = reader.encode_questions(params, q_ids, q_mask)
    p_source = reader.passage_side(params, p_ids, p_mask)
    index = np.arange(args.pairs)

    def read(positions) -> None:
        for _, outputs in reader.iter_pair_chunks(params, q_lower, q_mask, p_source, p_mask,
                                                  index, index, positions):
            jax.block_until_ready(outputs)

    variants = {"all": None}
    for n in args.kept:
        keep = np.zeros((args.pairs, args.passage_len), bool)
        keep[:, :n] = True
        variants[str(n)] = kept_positions(keep)
    for positions in variants.values():
        read(positions)  # compile
    times = {name: [] for name in variants}
    for _ in range(args.repeats):
        for name, positions in variants.items():
            start = time.perf_counter()
            read(positions)
            times[name].append(time.perf_counter() - start)
    base = np.median(times["all"])
    print(f"{args.checkpoint}: k = {model.config.num_lower_layers} of "
          f"{model.config.num_layers}, {args.pairs} pairs, question {args.question_len} + "
          f"passage {args.passage_len} tokens, {jax.devices()[0].device_kind}\n")
    print("| passage tokens read | pair phase ms (median) | vs all |\n|---|---|---|")
    for name, values in times.items():
        median = np.median(values)
        label = f"all {args.passage_len}" if name == "all" else f"kept {name}"
        print(f"| {label} | {1e3 * median:.1f} | ×{base / median:.2f} |")


if __name__ == "__main__":
    main()
