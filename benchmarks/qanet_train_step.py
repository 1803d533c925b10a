"""QANet's training step on these cores, beside the MiniLM reader's (benchmarks/train_step.py).

    python benchmarks/qanet_train_step.py --variants plain --minilm full --steps 3 --rounds 3 \\
        --out benchmarks/results/qanet_train_step

A QANet step: forward + backward of `QANetModel` at the paper's shape (`QANetConfig()`: d_model
128, 8 heads, 1 + 7 blocks, kernel 7, the 30522 x 384 frozen word table) with dropout on, span
cross-entropy (`train.losses.span_cross_entropy`), AdamW; jitted, the params donated. The
batch is the MiniLM config's (`configs/minilm_squad.py`: batch_size windows of question 32 +
passage 160 tokens), random ids and characters: a step's cost does not depend on their values
(as in benchmarks/train_step.py). `--minilm full` times the trainer's own MiniLM step of the
same shapes in the same rounds (settings interleaved, so a change of load hits all alike).
QANet variants: plain, lsh (LSH in both encoders, 2 hashes, bucket 64), reversible, chunked
(feed-forward in chunks of 64 rows), reformer (all three). `--scan` adds each QANet variant
run inside a one-iteration `lax.scan`, side by side. Writes STEM.json and STEM.md.
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
from dil_jax.model.qanet_inputs import CHAR_VOCAB_SIZE, QANetSegment, minilm_word_table
from dil_jax.train.losses import span_cross_entropy

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = {
    "plain": {},
    "lsh": {"lsh_encoders": ("embedding", "model")},
    "reversible": {"reversible": True},
    "chunked": {"ffn_chunk_size": 64},
    "reformer": {"lsh_encoders": ("embedding", "model"), "reversible": True,
                 "ffn_chunk_size": 64},
    "scanned": {"scan_blocks": True},
}


def _train_step_module():
    spec = importlib.util.spec_from_file_location("train_step", ROOT / "benchmarks/train_step.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def random_segment(rng: np.random.Generator, batch: int, length: int, max_chars: int
                   ) -> QANetSegment:
    ids = rng.integers(1000, 20000, (batch, length)).astype(np.int32)
    counts = rng.integers(1, 9, (batch, length))  # WordPiece tokens: a few characters each
    chars = rng.integers(4, CHAR_VOCAB_SIZE, (batch, length, max_chars)).astype(np.int32)
    chars[np.arange(max_chars)[None, None, :] >= counts[..., None]] = 0
    return QANetSegment(jnp.asarray(ids), jnp.asarray(chars), jnp.ones((batch, length),
                                                                       jnp.int32))


class QANetSetting:
    """One compiled QANet train step and its state, ready to time."""

    def __init__(self, variant: str, batch: int, q_len: int, p_len: int, table, seed: int,
                 in_scan: bool = False):
        self.name = f"qanet {variant} q{q_len} p{p_len}" + (" in lax.scan(1)" if in_scan else "")
        self.windows = batch
        config = QANetConfig(**VARIANTS[variant])
        model = QANetModel(config)
        variables = model.init(jax.random.key(seed), word_table=table)
        self.frozen = variables["frozen"]
        tx = optax.adamw(1e-3)
        rng = np.random.default_rng(seed)
        self.question = random_segment(rng, batch, q_len, config.max_chars)
        self.passage = random_segment(rng, batch, p_len, config.max_chars)
        self.start = jnp.asarray(rng.integers(0, p_len, batch), jnp.int32)
        self.end = jnp.asarray(rng.integers(0, p_len, batch), jnp.int32)

        def step(params, opt_state, frozen, question, passage, start, end, key):
            def loss_fn(p):
                out = model({"params": p, "frozen": frozen}, question, passage,
                            deterministic=False, rngs={"dropout": key, "lsh": key})
                return span_cross_entropy(out, start, end)

            if in_scan:  # as the trainer's gradient accumulation ran one micro-batch before
                def body(carry, _):
                    return carry, jax.value_and_grad(loss_fn)(params)

                _, (loss, grads) = jax.lax.scan(body, 0, jnp.arange(1))
                loss, grads = loss[0], jax.tree.map(lambda g: g[0], grads)
            else:
                loss, grads = jax.value_and_grad(loss_fn)(params)
            updates, opt_state = tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, loss

        self.step_fn = jax.jit(step, donate_argnums=(0, 1))
        self.params, self.opt_state = variables["params"], tx.init(variables["params"])
        self.count = 0
        started = time.perf_counter()
        self.run(1)  # compile
        self.compile_s = time.perf_counter() - started

    def run(self, steps: int) -> float:
        started = time.perf_counter()
        for _ in range(steps):
            self.count += 1
            self.params, self.opt_state, loss = self.step_fn(
                self.params, self.opt_state, self.frozen, self.question, self.passage,
                self.start, self.end, jax.random.key(self.count))
        jax.block_until_ready(loss)
        return time.perf_counter() - started


def command_line(args: argparse.Namespace) -> str:
    """The command that reproduces this run (a switch by its name alone, when on)."""
    parts = ["python benchmarks/qanet_train_step.py"]
    for key, value in vars(args).items():
        flag = f"--{key.replace('_', '-')}"
        if isinstance(value, bool):
            parts += [flag] if value else []
        elif isinstance(value, list):
            parts.append(" ".join([flag, *map(str, value)]))
        else:
            parts.append(f"{flag} {value}")
    return " ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variants", nargs="+", default=["plain"], choices=list(VARIANTS))
    parser.add_argument("--minilm", nargs="*", default=["full"],
                        help="configs/minilm_squad.py variants timed beside (none: omit)")
    parser.add_argument("--scan", action="store_true",
                        help="also time each QANet variant with its forward and backward inside "
                             "a one-iteration lax.scan (the trainer's accumulation loop before "
                             "it skipped one micro-batch)")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True, help="output stem")
    args = parser.parse_args()
    load_before = load_average()
    train_step = _train_step_module()
    reference = train_step.variant_config("full", "float32", 160)
    batch, q_len = int(reference.batch_size), int(reference.model.max_question_len)
    p_len = int(reference.data.max_passage_len)
    table = minilm_word_table()
    settings = [QANetSetting(variant, batch, q_len, p_len, table, args.seed, in_scan)
                for variant in args.variants for in_scan in ((False, True) if args.scan
                                                             else (False,))]
    settings += [train_step.Setting(variant, "float32", p_len, args.seed)
                 for variant in args.minilm]
    seconds = {setting.name: [] for setting in settings}
    for _ in range(args.rounds):
        for setting in settings:
            seconds[setting.name].append(setting.run(args.steps))
    rows = []
    for setting in settings:
        median_s = statistics.median(seconds[setting.name])
        rows.append({"setting": setting.name, "windows": setting.windows,
                     "windows_per_s": setting.windows * args.steps / median_s,
                     "compile_s": setting.compile_s, "round_seconds": seconds[setting.name]})
    record = {"command": command_line(args),
              "machine": machine_record(), "load_before": load_before,
              "load_after": load_average(), "rows": rows}
    lines = ["| setting | windows/s | compile s |", "| --- | --- | --- |"]
    lines += [f"| {row['setting']} | {row['windows_per_s']:.2f} | {row['compile_s']:.0f} |"
              for row in rows]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for suffix, text in ((".json", json.dumps(record, indent=2)), (".md", "\n".join(lines) + "\n")):
        path = args.out.with_suffix(suffix)
        staging = path.with_name(path.name + ".new")
        staging.write_text(text)
        os.replace(staging, path)
    print("\n".join(lines))
    print(f"load average before {load_before}, after {record['load_after']}")


if __name__ == "__main__":
    main()
