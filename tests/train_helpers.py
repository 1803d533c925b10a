"""Shared pieces of the training tests: the tiny config, synthetic features, param comparison.

Also run as a script by the subprocess tests (8 forced host devices; two distributed processes):
    python tests/train_helpers.py one_step OUT.npz
    python tests/train_helpers.py multiprocess OUT.npz WORKDIR PORT PROCESS_ID
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
TINY_CONFIG = REPO / "configs" / "tiny.py"


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


def assert_same_training(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    """Params of two runs that differ only in float summation order (device/process count).

    Adam divides by sqrt(v): a parameter whose gradient is ~1e-9 (e.g. an attention key bias,
    which softmax makes nearly irrelevant) gets an update of ~lr whose sign follows rounding
    noise. So the max difference is bounded by a small fraction of the learning rate (tiny:
    3e-3), while the typical parameter agrees to float precision.
    """
    assert max_abs_diff(a, b) < 1e-4
    assert mean_abs_diff(a, b) < 1e-6


def one_step_params(num_train_steps: int = 1, workdir: str = "") -> dict[str, np.ndarray]:
    """Params after `num_train_steps` of the tiny config on every visible device (no saves)."""
    import tempfile

    from dil_jax.train.loop import train

    with tempfile.TemporaryDirectory() as tmp:
        config = tiny_config(workdir or tmp, {
            "num_train_steps": num_train_steps, "checkpoint.export_params": "false",
            "checkpoint.every_steps": 1000, "eval.use_validation_loss": "false"})
        return flat_params(train(config).state.params)


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
    sys.path.insert(0, str(REPO))
    mode, out, *rest = sys.argv[1:]
    if mode == "one_step":
        import jax

        assert jax.device_count() == 8, jax.devices()
        np.savez(out, **one_step_params(int(rest[0]) if rest else 1))
    elif mode == "multiprocess":
        _multiprocess(out, *rest)
    else:
        raise SystemExit(f"unknown mode {mode}")
