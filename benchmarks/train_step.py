"""What makes a training step cheaper here? Times the jitted train step of a
`configs/minilm_squad.py` variant under several settings, side by side in one run (rounds
interleave the settings, so a change of load hits them all alike), and writes windows/s per
setting.

    python benchmarks/train_step.py --variants full k4_warm --dtypes float32 bfloat16 \\
        --passage-lens 160 --steps 8 --rounds 3 --out benchmarks/results/train_step
    python benchmarks/train_step.py --variants k4_warm --dtypes float32 \\
        --teacher-modes kd_lrs kd kd_stored --out benchmarks/results/train_step_teacher

--teacher-modes (variants with a teacher): `kd_lrs` as configured (KD + LRS, the teacher runs
in the step), `kd` (LRS off, the teacher still runs), `kd_stored` (LRS off, the teacher's scores
come with the batch as `teacher.logits_file` gives them: the teacher does not run).

The step is the trainer's own (`dil_jax.train.step.make_train_step`: student forward + backward,
the frozen teacher's forward for KD/LRS, AdamW) on random token ids of the configured shapes (a
step's cost does not depend on the ids). A `_warm`/`_distill` variant's teacher is the student's
own initial weights (`teacher.checkpoint = "student_init"`), which costs what the fine-tuned
teacher costs. Writes STEM.json (record with the machine and load) and STEM.md (table).
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

from dil_jax.bench.machine import load_average, machine_record
from dil_jax.mesh import data_mesh
from dil_jax.train.setup import load_run_models, loss_weights, make_run_optimizer
from dil_jax.train.sharding import replicate, replicated
from dil_jax.train.step import init_train_state, make_train_step
from dil_jax.train.train_config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]


TEACHER_MODES = ("kd_lrs", "kd", "kd_stored")


def variant_config(variant: str, dtype: str, passage_len: int, teacher_mode: str = "kd_lrs"):
    spec = importlib.util.spec_from_file_location("minilm_squad", ROOT / "configs/minilm_squad.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config(variant)
    config.model.dtype = dtype
    config.data.max_passage_len = passage_len
    config.eval.evaluator = ""
    if config.teacher.checkpoint:
        config.teacher.checkpoint = "student_init"
        config.model.checkpoint = "default"
        if teacher_mode != "kd_lrs":
            config.loss.lrs_weight = 0.0
    return config


def random_batch(config, rng: np.random.Generator) -> dict[str, jax.Array]:
    """One global batch [1, batch, ...] of random ids (accumulation axis of 1)."""
    batch, q_len, p_len = config.batch_size, config.model.max_question_len, \
        config.data.max_passage_len
    return {
        "q_ids": jnp.asarray(rng.integers(1000, 20000, (1, batch, q_len)), jnp.int32),
        "q_mask": jnp.ones((1, batch, q_len), jnp.int32),
        "p_ids": jnp.asarray(rng.integers(1000, 20000, (1, batch, p_len)), jnp.int32),
        "p_mask": jnp.ones((1, batch, p_len), jnp.int32),
        "start": jnp.asarray(rng.integers(0, p_len, (1, batch)), jnp.int32),
        "end": jnp.asarray(rng.integers(0, p_len, (1, batch)), jnp.int32),
        "valid": jnp.ones((1, batch), jnp.float32),
    }


def has_teacher(variant: str) -> bool:
    return bool(variant_config(variant, "float32", 160).teacher.checkpoint)


def stored_teacher_scores(config, rng: np.random.Generator) -> dict[str, jax.Array]:
    """Random teacher scores [1, batch, ...] of the keys `teacher.logits_file` adds."""
    from dil_jax.train.teacher_logits import BATCH_KEYS

    batch, p_len = config.batch_size, config.data.max_passage_len
    shapes = ((1, batch, p_len), (1, batch, p_len), (1, batch), (1, batch))
    return {key: jnp.asarray(rng.normal(size=shape), jnp.float32)
            for key, shape in zip(BATCH_KEYS, shapes)}


class Setting:
    """One compiled train step and its state, ready to time."""

    def __init__(self, variant: str, dtype: str, passage_len: int, seed: int,
                 teacher_mode: str = "kd_lrs"):
        config = variant_config(variant, dtype, passage_len, teacher_mode)
        mode = f" {teacher_mode}" if config.teacher.checkpoint else ""
        self.name = f"{variant}{mode} {dtype} p{passage_len}"
        self.windows = int(config.batch_size)
        mesh = data_mesh()
        settings = TrainConfig.of(config)
        models = load_run_models(settings, None)
        tx, schedule = make_run_optimizer(settings, 1000, models.student)
        rep = replicated(mesh)
        self.state = jax.jit(lambda p: init_train_state(p, tx), out_shardings=rep)(
            replicate(models.student.params, mesh))
        teacher = None if teacher_mode == "kd_stored" else models.teacher
        self.teacher_params = None if teacher is None else replicate(teacher.params, mesh)
        self.step_fn = make_train_step(models.student, teacher and teacher.model,
                                       loss_weights(settings), tx, schedule, mesh)
        rng = np.random.default_rng(seed)
        self.batch = random_batch(config, rng)
        if teacher_mode == "kd_stored" and models.teacher is not None:
            self.batch.update(stored_teacher_scores(config, rng))
        self.rng = jax.random.key(seed)
        started = time.perf_counter()
        self.run(1)  # compile
        self.compile_s = time.perf_counter() - started

    def run(self, steps: int) -> float:
        started = time.perf_counter()
        for _ in range(steps):
            self.state, metrics = self.step_fn(self.state, self.teacher_params, self.batch,
                                               self.rng)
        jax.block_until_ready(metrics["loss"])
        return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variants", nargs="+", default=["full", "k4_warm"])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--passage-lens", type=int, nargs="+", default=[160])
    parser.add_argument("--steps", type=int, default=8, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--teacher-modes", nargs="+", choices=TEACHER_MODES,
                        default=["kd_lrs"], help="how a variant with a teacher distils")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True, help="output stem")
    args = parser.parse_args()
    load_before = load_average()
    combinations = [(variant, dtype, passage_len, mode) for variant in args.variants
                    for dtype in args.dtypes for passage_len in args.passage_lens
                    for mode in (args.teacher_modes if has_teacher(variant) else ["kd_lrs"])]
    settings = [Setting(variant, dtype, passage_len, args.seed, mode)
                for variant, dtype, passage_len, mode in combinations]
    seconds = {setting.name: [] for setting in settings}
    for _ in range(args.rounds):
        for setting in settings:
            seconds[setting.name].append(setting.run(args.steps))
    rows = []
    baseline = None
    for setting in settings:
        median_s = statistics.median(seconds[setting.name])
        windows_per_s = setting.windows * args.steps / median_s
        baseline = baseline or windows_per_s
        rows.append({"setting": setting.name, "windows_per_s": windows_per_s,
                     "relative": windows_per_s / baseline, "compile_s": setting.compile_s,
                     "round_seconds": seconds[setting.name]})
    record = {"command": "python benchmarks/train_step.py " + " ".join(
                  f"--{key.replace('_', '-')} " + " ".join(map(str, value))
                  if isinstance(value, list) else f"--{key.replace('_', '-')} {value}"
                  for key, value in vars(args).items()),
              "machine": machine_record(), "load_before": load_before,
              "load_after": load_average(), "rows": rows}
    lines = ["| setting | windows/s | relative to the first |", "| --- | --- | --- |"]
    lines += [f"| {row['setting']} | {row['windows_per_s']:.2f} | {row['relative']:.2f} |"
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
