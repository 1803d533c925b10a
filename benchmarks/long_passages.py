"""Memory and time of a reader vs passage length under the long-passage options.

    python benchmarks/long_passages.py --out benchmarks/results/long_passages_small

For each passage length and each variant (full attention; LSH attention in every block with
1, 2 and 4 hashes; chunked feed-forward; remat "full" and "dots_saveable"; reversible blocks;
"reformer" = reversible + LSH 2 hashes + chunked FFN) it compiles two programs of a randomly
initialised reader (params from shapes, `jax.eval_shape`):

  - train: the gradient of the span cross-entropy (`dil_jax.train.losses.span_cross_entropy`)
    over `--batch` (question, passage) pairs, dropout on;
  - inference: the span logits of the same pairs;

and reads XLA's memory analysis of each (`dil_jax.bench.programs.program_stats`: argument,
output and temp bytes; compiling is enough, nothing runs). With `--time-max-len L` it also runs
both programs `--repeats` times on random ids for lengths <= L and records the median seconds.
The reader is the full model (k = 0 by default: question and passage in one sequence, which is
where attention is quadratic in the passage); `--k` splits it, and LSH goes into every block
(`--lsh-layers lower`: only the passage's lower blocks). The defaults (`--size small`: 4
blocks, hidden 128; passages of 256 and 512 tokens, timed at 256) take a few minutes on 2 busy
cores, mostly compiling. The full sweep:

    python benchmarks/long_passages.py --size minilm --lengths 384 1024 2048 4096 \
        --time-max-len 1024 --out benchmarks/results/long_passages_minilm

(`--size minilm`: 6 blocks, hidden 384, 12 heads, the embedded reader's shape; `--size tiny`
is for the test.)

Writes STEM.json (the record: command, machine, load, every row), STEM.md (the table) and
STEM.png (memory and time vs length; needs matplotlib).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dil_jax.bench.machine import load_average, machine_record
from dil_jax.bench.programs import ProgramStats, program_stats
from dil_jax.model.delayed import DelayedInteractionModel
from dil_jax.model.encoder_config import EncoderConfig
from dil_jax.train.losses import span_cross_entropy

SIZES = {
    "tiny": dict(hidden_size=32, embedding_size=32, num_layers=2, num_heads=2,
                 intermediate_size=64),
    "small": dict(hidden_size=128, embedding_size=128, num_layers=4, num_heads=4,
                  intermediate_size=512),
    "minilm": dict(hidden_size=384, embedding_size=384, num_layers=6, num_heads=12,
                   intermediate_size=1536),
}
VARIANTS = ("full", "lsh1", "lsh2", "lsh4", "ffn_chunk", "remat_full", "remat_dots",
            "reversible", "reformer")
QUESTION_LEN = 64


def variant_fields(variant: str, num_layers: int, k: int, lsh_layers: str, bucket_size: int,
                   ffn_chunk: int) -> dict[str, Any]:
    """The EncoderConfig fields a variant sets."""
    layers = tuple(range(k if lsh_layers == "lower" else num_layers))

    def lsh(hashes: int) -> dict[str, Any]:
        return dict(lsh_attention_layers=layers, lsh_num_hashes=hashes,
                    lsh_bucket_size=bucket_size)

    fields = {"full": {}, "lsh1": lsh(1), "lsh2": lsh(2), "lsh4": lsh(4),
              "ffn_chunk": dict(ffn_chunk_size=ffn_chunk),
              "remat_full": dict(remat_policy="full"),
              "remat_dots": dict(remat_policy="dots_saveable"),
              "reversible": dict(reversible=True),
              "reformer": dict(reversible=True, ffn_chunk_size=ffn_chunk, **lsh(2))}
    return fields[variant]


def reader_config(size: str, passage_len: int, k: int, **fields: Any) -> EncoderConfig:
    return EncoderConfig(vocab_size=30522, max_position_embeddings=QUESTION_LEN + passage_len,
                         max_question_len=QUESTION_LEN, num_lower_layers=k,
                         attention_form="batched", **SIZES[size], **fields)


def programs(config: EncoderConfig, batch: int, passage_len: int):
    """(train, inference) jitted functions and their abstract arguments."""
    model = DelayedInteractionModel(config)

    def inference(params, q_ids, p_ids):
        out = model(params, q_ids, jnp.ones_like(q_ids), p_ids, jnp.ones_like(p_ids))
        return out.start_logits, out.end_logits

    def loss(params, q_ids, p_ids, start, end, rng):
        dropout, lsh = jax.random.split(rng)
        out = model(params, q_ids, jnp.ones_like(q_ids), p_ids, jnp.ones_like(p_ids),
                    deterministic=False, rngs={"dropout": dropout, "lsh": lsh})
        return span_cross_entropy(out, start, end)

    params = jax.eval_shape(lambda: model.init(jax.random.key(0)))
    ids = (jax.ShapeDtypeStruct((batch, QUESTION_LEN), jnp.int32),
           jax.ShapeDtypeStruct((batch, passage_len), jnp.int32))
    targets = (jax.ShapeDtypeStruct((batch,), jnp.int32),) * 2
    key = jax.eval_shape(lambda: jax.random.key(0))
    return ((jax.jit(jax.grad(loss)), (params, *ids, *targets, key)),
            (jax.jit(inference), (params, *ids)), model)


def _stats_record(stats: ProgramStats) -> dict[str, Any]:
    return {"argument_bytes": stats.argument_bytes, "output_bytes": stats.output_bytes,
            "temp_bytes": stats.temp_bytes,
            "footprint_bytes": stats.argument_bytes + stats.output_bytes + stats.temp_bytes,
            "compile_s": stats.compile_s}


def _median_seconds(fn, args: Sequence[Any], repeats: int) -> float:
    jax.block_until_ready(fn(*args))  # compile and warm up
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        jax.block_until_ready(fn(*args))
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)


def _concrete_args(model: DelayedInteractionModel, batch: int, passage_len: int,
                   seed: int) -> tuple[Any, ...]:
    rng = np.random.default_rng(seed)
    params = model.init(jax.random.key(seed))
    q_ids = jnp.asarray(rng.integers(1000, 20000, (batch, QUESTION_LEN)), jnp.int32)
    p_ids = jnp.asarray(rng.integers(1000, 20000, (batch, passage_len)), jnp.int32)
    targets = jnp.asarray(rng.integers(0, passage_len, (2, batch)), jnp.int32)
    return params, q_ids, p_ids, targets[0], targets[1], jax.random.key(seed)


def measure(variant: str, passage_len: int, args: argparse.Namespace) -> dict[str, Any]:
    """One row: the variant's compiled memory at this length (and times, if asked)."""
    size = SIZES[args.size]
    fields = variant_fields(variant, size["num_layers"], args.k, args.lsh_layers,
                            args.bucket_size, args.ffn_chunk)
    config = reader_config(args.size, passage_len, args.k, **fields)
    (train_fn, train_args), (infer_fn, infer_args), model = programs(config, args.batch,
                                                                     passage_len)
    row = {"variant": variant, "passage_len": passage_len, "fields": fields,
           "train": _stats_record(program_stats([train_fn.lower(*train_args)])),
           "inference": _stats_record(program_stats([infer_fn.lower(*infer_args)]))}
    if passage_len <= args.time_max_len:
        concrete = _concrete_args(model, args.batch, passage_len, args.seed)
        row["train"]["median_s"] = _median_seconds(train_fn, concrete, args.repeats)
        row["inference"]["median_s"] = _median_seconds(infer_fn, concrete[:3], args.repeats)
    return row


def _mb(value: float) -> str:
    return f"{value / 2**20:.1f}"


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    lines = ["| variant | passage | train temp MiB | train footprint MiB | train s | "
             "inference temp MiB | inference s |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        train, infer = row["train"], row["inference"]

        def seconds(stats: dict[str, Any]) -> str:
            return f"{stats['median_s']:.3f}" if "median_s" in stats else "–"

        lines.append(f"| {row['variant']} | {row['passage_len']} | {_mb(train['temp_bytes'])} "
                     f"| {_mb(train['footprint_bytes'])} | {seconds(train)} | "
                     f"{_mb(infer['temp_bytes'])} | {seconds(infer)} |")
    return "\n".join(lines) + "\n"


def plot(rows: Sequence[dict[str, Any]], path: Path) -> bool:
    """Train temp memory and train time vs length per variant; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    figure, (memory_axis, time_axis) = plt.subplots(1, 2, figsize=(11, 4.2))
    for variant in dict.fromkeys(row["variant"] for row in rows):
        mine = [row for row in rows if row["variant"] == variant]
        lengths = [row["passage_len"] for row in mine]
        memory_axis.plot(lengths, [row["train"]["temp_bytes"] / 2**20 for row in mine],
                         marker="o", label=variant)
        timed = [row for row in mine if "median_s" in row["train"]]
        if timed:
            time_axis.plot([row["passage_len"] for row in timed],
                           [row["train"]["median_s"] for row in timed], marker="o",
                           label=variant)
    for axis, label in ((memory_axis, "train step temp memory (MiB, XLA)"),
                        (time_axis, "train step time (s, median)")):
        axis.set_xscale("log", base=2)
        axis.set_yscale("log")
        axis.set_xlabel("passage length (tokens)")
        axis.set_ylabel(label)
        axis.grid(True, which="both", alpha=0.3)
    memory_axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return True


def _write(path: Path, text: str) -> None:
    staging = path.with_name(path.name + ".new")
    staging.write_text(text)
    os.replace(staging, path)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 512],
                        help="passage lengths (the full sweep: 384 1024 2048 4096)")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--batch", type=int, default=1, help="pairs per program call")
    parser.add_argument("--k", type=int, default=0, help="the reader's split (0: full)")
    parser.add_argument("--lsh-layers", choices=("all", "lower"), default="all",
                        help="LSH in every block, or only in blocks below k")
    parser.add_argument("--bucket-size", type=int, default=64, help="lsh_bucket_size")
    parser.add_argument("--ffn-chunk", type=int, default=128, help="ffn_chunk_size")
    parser.add_argument("--time-max-len", type=int, default=256,
                        help="time the programs (run them) up to this length; 0: memory only")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True, help="output stem")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    args = parse_args(argv)
    load_before = load_average()
    rows = []
    for passage_len in args.lengths:
        for variant in args.variants:
            rows.append(measure(variant, passage_len, args))
            print(markdown_table(rows[-1:]).splitlines()[-1], flush=True)
    command = " ".join(["python benchmarks/long_passages.py",
                        *(sys.argv[1:] if argv is None else argv)])
    record = {"command": command, "machine": machine_record(), "load_before": load_before,
              "load_after": load_average(), "size": SIZES[args.size], "batch": args.batch,
              "question_len": QUESTION_LEN, "k": args.k, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    table = markdown_table(rows)
    _write(args.out.with_suffix(".json"), json.dumps(record, indent=2))
    _write(args.out.with_suffix(".md"), f"`{command}`\n\n{table}")
    plotted = plot(rows, args.out.with_suffix(".png"))
    print(table)
    print(f"load average before {load_before}, after {record['load_after']}"
          + ("" if plotted else "; no plot (matplotlib is not installed)"))
    return rows


if __name__ == "__main__":
    main()
