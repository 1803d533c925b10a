"""Shared pieces of the training tests: the tiny encoder and config, the `dil-jax train` argv of
a quick run, param comparison, a few distillation steps on one batch.

Also run as a module by the subprocess tests (8 forced host devices; two distributed processes),
from the repository root (or with it on PYTHONPATH):
    python -m tests.helpers.training one_step OUT.npz [STEPS [DEVICES]]
    python -m tests.helpers.training multiprocess OUT.npz WORKDIR PORT PROCESS_ID
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

from dil_jax.train.train_config import TrainConfig

from tests.helpers import CONFIGS

TINY_CONFIG = CONFIGS / "tiny.py"
# The training tests' tiny encoder (`tiny_encoder`): 2 blocks of 2 heads, hidden 32, 128 words.
TINY_ENCODER = dict(vocab_size=128, hidden_size=32, num_layers=2, num_heads=2,
                    intermediate_size=64, max_position_embeddings=64, embedding_size=32,
                    max_question_len=8, num_lower_layers=1)
# A few steps, no validation pass, no export: the cheapest run that writes checkpoints.
QUICK = {"checkpoint.export_params": "false", "eval.use_validation_loss": "false"}
# The num_train_steps of the tiny config's runs in tests/train/test_train_loop.py,
# test_train_divergence.py and test_train_curves.py (test_reliability_train.py has its own): the
# learning-rate schedule's length is a constant of the compiled train step, so every other length
# compiles the whole step again (the compilation cache shares a program across tests, files and
# processes only if its constants are the same). A test that needs a shorter run stops it with
# `train(..., stop_after_step=n)`, as an interrupted run stops: the same data order, dropout keys
# and checkpoint cadence; only each step's learning rate is not an n-step run's (none of these
# tests asserts on it).
STEPS = 10
# The best checkpoint chosen by the F1 of the run's evaluate_fn (no validation loss pass).
BEST_BY_F1 = {"checkpoint.best_metric": "f1", "checkpoint.best_mode": "max",
              "eval.use_validation_loss": "false"}


def tiny_encoder(**changes):
    """An EncoderConfig of TINY_ENCODER's fields (k = 1, question 8 tokens) with `changes`."""
    from dil_jax.model.encoder_config import EncoderConfig

    return EncoderConfig(**{**TINY_ENCODER, **changes})


def scripted_f1(*scores: float):
    """(evaluate_fn, rest): an evaluate_fn(params) whose F1 is the next of `scores` at each
    evaluation (EM 0), and the iterator of the scores it has not used yet."""
    rest = iter(scores)

    def evaluate_fn(params):
        return {"exact": 0.0, "f1": next(rest)}

    return evaluate_fn, rest


def tiny_config(workdir: str | os.PathLike, overrides: dict | None = None):
    """configs/tiny.py, quiet, with dotted-key overrides given as a dict."""
    from dil_jax.train.config_files import apply_overrides, load_config_file

    base = {"workdir": str(workdir), "log.progress": "false", "log.tensorboard": "false",
            "checkpoint.async_save": "false"}
    base.update({key: str(value) for key, value in (overrides or {}).items()})
    return apply_overrides(load_config_file(TINY_CONFIG), list(base.items()))


def flat_params(params) -> dict[str, np.ndarray]:
    """{"a/b/kernel": array} of a param tree (for npz files and comparisons)."""
    import jax

    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    return {"/".join(str(getattr(k, "key", k)) for k in path): np.asarray(leaf)
            for path, leaf in leaves}


def max_abs_diff(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    assert a.keys() == b.keys()
    return max(float(np.max(np.abs(a[k] - b[k]))) for k in a)


def mean_abs_diff(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    assert a.keys() == b.keys()
    total = sum(float(np.sum(np.abs(a[k] - b[k]))) for k in a)
    return total / sum(a[k].size for k in a)


# Share of the tiny model's params whose exact gradient is 0, with room to spare: softmax ignores
# a constant shift, so the QA bias (2), the attention key biases (2 x 32) and the last
# LayerNorm's bias (32, it feeds only the QA head) get only rounding noise: 98 of ~23k, 0.4%.
ZERO_GRADIENT_SHARE = 0.01


def learning_rate_sum(config) -> float:
    """Sum of the learning rates of the optimizer steps a train() run with `config` takes."""
    from dil_jax.train.optim import warmup_linear_decay
    from dil_jax.train.setup import warmup_steps

    steps = int(config.num_train_steps)
    schedule = warmup_linear_decay(config.optim.learning_rate, steps,
                                   warmup_steps(TrainConfig.of(config), steps))
    return sum(float(schedule(step)) for step in range(steps))


def assert_same_training(a: dict[str, np.ndarray], b: dict[str, np.ndarray],
                         config) -> None:
    """Params of two train() runs of `config` that differ only in float summation order.

    Adam divides by sqrt(v) + eps: a parameter whose exact gradient is 0 (ZERO_GRADIENT_SHARE)
    gets the step lr * d / (|d| + eps) from rounding noise d, so its two runs can step apart by
    up to Adam's largest step, c = (1 - b1) / sqrt(1 - b2) learning rates (Kingma & Ba, sec.
    2.1), twice: 2 c sum(lr) is the only bound on the max difference that rounding allows
    (an eps-relative bound is fitted to one CPU: the max was 1e-5 on an AMD EPYC, at the QA
    bias). Every other parameter follows its gradient and agrees to float precision, so the
    mean difference is at most ZERO_GRADIENT_SHARE * 2 c sum(lr); a run that read other rows
    or other dropout keys moves most params by ~lr and fails it. (Measured mean: ~1e-9.)
    """
    lr_sum = learning_rate_sum(config)
    step_bound = (1 - config.optim.b1) / np.sqrt(1 - config.optim.b2)
    assert lr_sum > 0
    assert max_abs_diff(a, b) <= 2 * step_bound * lr_sum, (max_abs_diff(a, b), lr_sum)
    assert mean_abs_diff(a, b) <= ZERO_GRADIENT_SHARE * 2 * step_bound * lr_sum, (
        mean_abs_diff(a, b), lr_sum)


def distill_steps(student, teacher, params, num_steps: int, vocab_size: int
                  ) -> list[dict[str, float]]:
    """`num_steps` jitted, sharded train steps of `student` from `params` under CE + DeFormer's
    KD and LRS (weights 1, temperature 2) from `teacher` holding the same `params` frozen, all
    on one batch of 8 synthetic questions (question 8 + passage 16 tokens, ids below
    `vocab_size`): each step's "loss", "ce", "kd" and "lrs"."""
    import jax

    from dil_jax.mesh import data_mesh
    from dil_jax.readers import EncoderReader
    from dil_jax.train.data import synthetic_features, windows_from_features
    from dil_jax.train.losses import LossWeights
    from dil_jax.train.optim import make_optimizer
    from dil_jax.train.sharding import process_rows, put_process_batch, replicate
    from dil_jax.train.step import init_train_state, make_train_step

    mesh = data_mesh()
    tx, schedule = make_optimizer(3e-3, 100, 0)
    state = jax.jit(lambda p: init_train_state(p, tx))(replicate(params, mesh))
    weights = LossWeights(ce=1.0, kd=1.0, lrs=1.0, temperature=2.0)
    step = make_train_step(EncoderReader(student, None), teacher, weights, tx, schedule, mesh)
    windows = windows_from_features(synthetic_features(num_questions=8, question_len=8,
                                                       passage_len=16, vocab_size=vocab_size))
    rows = np.arange(8).reshape(1, 8)
    batch = put_process_batch(windows.batch(rows[:, process_rows(mesh, 1, 8)]), mesh, 8)
    teacher_params = replicate(params, mesh)
    steps = []
    for _ in range(num_steps):
        state, metrics = step(state, teacher_params, batch, jax.random.key(1))
        steps.append({name: float(metrics[name]) for name in ("loss", "ce", "kd", "lrs")})
    return steps


def train_argv(workdir: Path, *overrides: str) -> list[str]:
    """`dil-jax train` of configs/tiny.py for one QUICK step in `workdir`, quiet, with `overrides`
    (`--config.key=value` arguments) last."""
    return ["train", "--config", str(TINY_CONFIG), f"--config.workdir={workdir}",
            "--config.log.progress=false", "--config.log.tensorboard=false",
            "--config.checkpoint.async_save=false", "--config.num_train_steps=1",
            *(f"--config.{key}={value}" for key, value in QUICK.items()), *overrides]


def one_step_config(workdir: str | os.PathLike, num_train_steps: int = 1):
    """The tiny config of one_step_params (no saves, no validation)."""
    return tiny_config(workdir, {
        "num_train_steps": num_train_steps, "checkpoint.export_params": "false",
        "checkpoint.every_steps": 1000, "eval.use_validation_loss": "false"})


def one_step_params(num_train_steps: int = 1, workdir: str = "") -> dict[str, np.ndarray]:
    """Params after `num_train_steps` of the tiny config on every visible device (no saves)."""
    import tempfile

    from dil_jax.train.loop import train

    with tempfile.TemporaryDirectory() as tmp:
        return flat_params(train(one_step_config(workdir or tmp, num_train_steps)).state.params)


def _multiprocess(out: str, workdir: str, port: str, process_id: str) -> None:
    """One of two processes x 2 CPU devices: 2 steps, stop (checkpoint), resume to 4 steps."""
    from dil_jax.train.loop import train

    overrides = {
        "num_train_steps": 4, "checkpoint.every_steps": 2, "checkpoint.async_save": "true",
        "checkpoint.export_params": "false", "distributed.initialize": "true",
        "distributed.coordinator_address": f"localhost:{port}",
        "distributed.num_processes": 2, "distributed.process_id": process_id,
        "distributed.num_cpu_devices": 2}
    config = tiny_config(workdir, overrides)
    first = train(config, stop_after_step=2)
    import jax

    assert jax.process_count() == 2 and jax.device_count() == 4, jax.devices()
    assert int(first.state.step) == 2
    resumed = train(config)  # restores step 2 from the checkpoint both processes wrote
    assert int(resumed.state.step) == 4
    params = flat_params(jax.tree.map(np.asarray, resumed.state.params))
    np.savez(f"{out}.process{process_id}.npz", **params)


if __name__ == "__main__":
    mode, out, *rest = sys.argv[1:]
    if mode == "one_step":
        import jax

        steps, devices = (int(value) for value in (rest + ["1", "8"][len(rest):]))
        assert jax.device_count() == devices, (devices, jax.devices())
        np.savez(out, **one_step_params(steps))
    elif mode == "multiprocess":
        _multiprocess(out, *rest)
    else:
        raise SystemExit(f"unknown mode {mode}")
