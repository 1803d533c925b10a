"""Training memory and step time of QANet against its Reformer variants, by passage length
(issue 42's table: Reformer-QANet vs QANet at 1,024 / 4,096 passage tokens).

    python benchmarks/qanet_memory.py --lengths 256 1024 4096 --time-lengths 1024 \\
        --variants plain reformer lsh reversible --batch 2 --out benchmarks/results/qanet_memory
    python benchmarks/qanet_memory.py --lengths 512 --time-lengths --variants plain reversible \\
        --model-blocks 1 2 4 7 --out ...    # against depth

Memory is XLA's own account of the compiled train step (`jax.jit(step).lower(...).compile()
.memory_analysis()`): `temp_size_in_bytes` is what the step allocates beyond its arguments and
outputs, i.e. the activations kept for the backward pass and the workspace, which is what
LSH attention (no [p, p] score matrix), reversible blocks (activations recomputed, not stored)
and the chunked feed-forward cut; `argument_size_in_bytes` holds the params (the 47 MB frozen
table included), the Adam moments and the batch, the same for every variant. Nothing is run to
measure memory, so the 4,096-token programs need only compiling.

The step is `qanet_train_step.py`'s: QANetConfig() at the paper's shape with the variant's
options (benchmarks/qanet_train_step.py VARIANTS; "reformer" = LSH in both encoders, 2 hashes,
buckets of 64, reversible stacks, feed-forward in chunks of 64 rows), dropout on, span CE,
AdamW, params donated; question 32 tokens, random ids and characters. Time (at
--time-lengths) is measured side by side: the variants' compiled steps interleaved in
--rounds rounds of --steps steps, the median round. Writes STEM.json, STEM.md and STEM.png.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dil_jax.bench.machine import load_average, machine_record
from dil_jax.model.qanet import QANetModel
from dil_jax.model.qanet_config import QANetConfig
from dil_jax.model.qanet_inputs import minilm_word_table
from dil_jax.train.losses import span_cross_entropy

ROOT = Path(__file__).resolve().parents[1]
MIB = 2 ** 20


def _qanet_train_step_module():
    spec = importlib.util.spec_from_file_location("qanet_train_step",
                                                  ROOT / "benchmarks/qanet_train_step.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class CompiledStep:
    """One variant's train step at one passage length, compiled (not run)."""

    def __init__(self, variant: str, batch: int, q_len: int, p_len: int, table, seed: int,
                 model_blocks: int = 0):
        bench = _qanet_train_step_module()
        self.variant, self.p_len, self.windows = variant, p_len, batch
        blocks = {"model_blocks": model_blocks} if model_blocks else {}
        model = QANetModel(QANetConfig(**bench.VARIANTS[variant], **blocks))
        variables = model.init(jax.random.key(seed), word_table=table)
        tx = optax.adamw(1e-3)
        rng = np.random.default_rng(seed)
        config = model.config
        question = bench.random_segment(rng, batch, q_len, config.max_chars)
        passage = bench.random_segment(rng, batch, p_len, config.max_chars)
        start = jnp.asarray(rng.integers(0, p_len, batch), jnp.int32)
        end = jnp.asarray(rng.integers(0, p_len, batch), jnp.int32)

        def step(params, opt_state, frozen, key):
            def loss_fn(p):
                out = model({"params": p, "frozen": frozen}, question, passage,
                            deterministic=False, rngs={"dropout": key, "lsh": key})
                return span_cross_entropy(out, start, end)

            loss, grads = jax.value_and_grad(loss_fn)(params)
            updates, opt_state = tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, loss

        self.params, self.opt_state = variables["params"], tx.init(variables["params"])
        self.frozen = variables["frozen"]
        started = time.perf_counter()
        self.compiled = jax.jit(step, donate_argnums=(0, 1)).lower(
            self.params, self.opt_state, self.frozen, jax.random.key(0)).compile()
        self.compile_s = time.perf_counter() - started
        memory = self.compiled.memory_analysis()
        self.temp_bytes = int(memory.temp_size_in_bytes)
        self.argument_bytes = int(memory.argument_size_in_bytes)
        self.output_bytes = int(memory.output_size_in_bytes)
        self.alias_bytes = int(memory.alias_size_in_bytes)
        self.count = 0

    @property
    def total_bytes(self) -> int:
        """Arguments + temporaries + outputs not written over a donated argument."""
        return self.argument_bytes + self.temp_bytes + self.output_bytes - self.alias_bytes

    def run(self, steps: int) -> float:
        started = time.perf_counter()
        for _ in range(steps):
            self.count += 1
            self.params, self.opt_state, loss = self.compiled(
                self.params, self.opt_state, self.frozen, jax.random.key(self.count))
        jax.block_until_ready(loss)
        return time.perf_counter() - started


def write_plot(rows: list[dict], path: Path) -> None:
    """Temporaries against passage length at the paper's depth; beside it, where rows at other
    depths exist, temporaries against the model encoder's blocks (one line per variant and
    length)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paper = QANetConfig().model_blocks
    at_paper = [row for row in rows if (row.get("model_blocks") or paper) == paper]
    depths = {(row.get("model_blocks") or paper) for row in rows}
    figure, axes = plt.subplots(1, 2 if len(depths) > 1 else 1,
                                figsize=(11 if len(depths) > 1 else 6, 4), squeeze=False)
    axis = axes[0, 0]
    for variant in dict.fromkeys(row["variant"] for row in at_paper):
        mine = sorted({row["p_len"]: row["temp_mib"] for row in at_paper
                       if row["variant"] == variant}.items())
        axis.plot(*zip(*mine, strict=True), marker="o", label=variant)
    axis.set_xscale("log", base=2)
    axis.set_yscale("log")
    axis.set_xlabel("passage tokens")
    axis.set_ylabel("train-step temporaries (MiB, XLA)")
    axis.set_title(f"QANet train step, batch {rows[0]['windows']}, {paper} model blocks")
    axis.legend()
    axis.grid(True, which="both", alpha=0.3)
    if len(depths) > 1:
        axis = axes[0, 1]
        for variant, p_len in dict.fromkeys((row["variant"], row["p_len"]) for row in rows
                                            if (row.get("model_blocks") or paper) != paper):
            mine = sorted({(row.get("model_blocks") or paper): row["temp_mib"] for row in rows
                           if (row["variant"], row["p_len"]) == (variant, p_len)}.items())
            axis.plot(*zip(*mine, strict=True), marker="o", label=f"{variant}, {p_len} tokens")
        axis.set_xlabel("model encoder blocks (each applied 3 times)")
        axis.set_ylabel("train-step temporaries (MiB, XLA)")
        axis.set_title("memory against depth")
        axis.legend()
        axis.grid(True, alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", type=int, nargs="*", default=[256, 1024, 4096],
                        help="passage lengths to compile (none: only --merge earlier records)")
    parser.add_argument("--time-lengths", type=int, nargs="*", default=[1024])
    parser.add_argument("--variants", nargs="+", default=["plain", "reformer"])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--question-len", type=int, default=32)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model-blocks", type=int, nargs="+", default=[0],
                        help="the model encoder's blocks, one compile each (0: the paper's 7): "
                        "how the memory grows with depth")
    parser.add_argument("--merge", type=Path, nargs="*", default=[],
                        help="earlier records (STEM.json) whose rows join this table and plot")
    parser.add_argument("--word-table", type=Path, default=None,
                        help="a MiniLM folder whose model.safetensors holds the word table "
                        "(default: the embedded MiniLM's; a device without that package names "
                        "the carried copy)")
    parser.add_argument("--out", type=Path, required=True, help="output stem")
    args = parser.parse_args()
    load_before = load_average()
    table = minilm_word_table(args.word_table)
    rows, timed = [], []
    for blocks in args.model_blocks:
        for p_len in args.lengths:
            for variant in args.variants:
                try:
                    step = CompiledStep(variant, args.batch, args.question_len, p_len, table,
                                        args.seed, blocks)
                except jax.errors.JaxRuntimeError as error:  # e.g. out of device memory
                    print(f"{variant} at {p_len}: not compiled: {error}", flush=True)
                    continue
                rows.append({"variant": variant, "p_len": p_len, "windows": args.batch,
                             "model_blocks": blocks or QANetConfig().model_blocks,
                             "temp_mib": step.temp_bytes / MIB,
                             "total_mib": step.total_bytes / MIB,
                             "argument_mib": step.argument_bytes / MIB,
                             "compile_s": step.compile_s})
                print(json.dumps(rows[-1]), flush=True)
                if p_len in args.time_lengths:
                    try:
                        step.run(1)  # the first call's one-off costs
                    except jax.errors.JaxRuntimeError as error:  # e.g. out of device memory
                        rows[-1]["step_error"] = str(error).splitlines()[0][:300]
                        print(f"{variant} at {p_len}: {rows[-1]['step_error']}", flush=True)
                    timed.append((rows[-1], step))
                else:
                    del step
    seconds: dict[int, list[float]] = {id(row): [] for row, _ in timed}
    for _ in range(args.rounds):
        for row, step in timed:
            if "step_error" not in row:
                try:
                    seconds[id(row)].append(step.run(args.steps))
                except jax.errors.JaxRuntimeError as error:  # e.g. out of device memory
                    row["step_error"] = str(error).splitlines()[0][:300]
                    print(f"{row['variant']} at {row['p_len']}: {row['step_error']}", flush=True)
    for row, _ in timed:
        if seconds[id(row)]:
            row["step_s"] = statistics.median(seconds[id(row)]) / args.steps
            row["round_seconds"] = seconds[id(row)]
    merged = [json.loads(path.read_text()) for path in args.merge]
    rows += [{**row, "record": str(path)} for path, old in zip(args.merge, merged, strict=True)
             for row in old["rows"] if "record" not in row]
    record = {"command": "python benchmarks/qanet_memory.py " + " ".join(
                  f"--{key.replace('_', '-')} " + " ".join(map(str, value))
                  if isinstance(value, list) else f"--{key.replace('_', '-')} {value}"
                  for key, value in vars(args).items() if key != "merge"),
              "merged": [{"record": str(path), "command": old["command"],
                          "load_before": old["load_before"], "load_after": old["load_after"]}
                         for path, old in zip(args.merge, merged, strict=True)],
              "machine": machine_record(), "load_before": load_before,
              "load_after": load_average(), "rows": rows}
    lines = ["| variant | passage tokens | model blocks | temporaries MiB | total MiB | step s |",
             "| --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {r['variant']} | {r['p_len']} | {r.get('model_blocks', '–')} | "
              f"{r['temp_mib']:.1f} | {r['total_mib']:.1f} | "
              + (f"{r['step_s']:.3f}" if "step_s" in r
                 else "failed" if "step_error" in r else "–") + " |" for r in rows]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for suffix, text in ((".json", json.dumps(record, indent=2)),
                         (".md", "\n".join(lines) + "\n")):
        path = args.out.with_suffix(suffix)
        staging = path.with_name(path.name + ".new")
        staging.write_text(text)
        os.replace(staging, path)
    try:
        write_plot(rows, args.out.with_suffix(".png"))
    except ImportError as error:  # a device image without matplotlib: the table still stands
        print(f"no plot: {error}")
    print("\n".join(lines))
    print(f"load average before {load_before}, after {record['load_after']}")


if __name__ == "__main__":
    main()
