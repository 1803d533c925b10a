"""A run that goes non-finite (NaN/Inf) stops by name and never saves or exports a non-finite
state."""


import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from test_reliability_train import train_argv
from train_helpers import flat_params, tiny_config

from dil_jax.errors import TrainingDiverged
from dil_jax.train import loop
from dil_jax.train.checkpointing import TrainCheckpointer
from dil_jax.train.loop import train

from conftest import run_cli


def _all_finite(tree) -> bool:
    return all(np.isfinite(value).all() for value in flat_params(tree).values())


def _nan_at_update(index: int) -> optax.GradientTransformation:
    """Adds NaN to every update of the optimizer step numbered `index` (0-based), finite else."""
    def update(updates, count, params=None):
        poison = jnp.where(count == index, jnp.nan, 0.0)
        return jax.tree.map(lambda u: u + poison, updates), count + 1

    return optax.GradientTransformation(lambda params: jnp.zeros((), jnp.int32), update)


def test_a_nan_step_stops_the_run_by_name_and_the_last_finite_checkpoint_survives(
        tmp_path, monkeypatch):
    real = loop.make_run_optimizer

    def poisoned(config, total_steps):
        tx, schedule = real(config, total_steps)
        return optax.chain(tx, _nan_at_update(2)), schedule  # NaN params after step 3

    monkeypatch.setattr(loop, "make_run_optimizer", poisoned)
    # Saves at 2, 4, ...; logs at 5: the NaN of step 3 is found before the save of step 4, and
    # named as step 3 (the first), not 4. keep = 1: retention may keep only the newest save.
    config = tiny_config(tmp_path, {"num_train_steps": 8, "checkpoint.every_steps": 2,
                                    "checkpoint.keep": 1, "log.every_steps": 5,
                                    "eval.use_validation_loss": "false"})
    with pytest.raises(TrainingDiverged) as caught:
        train(config)
    error = caught.value
    assert (error.first_step, error.last_finite_step) == (3, 2)
    message = str(error)
    assert "non-finite (NaN/Inf) at step 3" in message and "\n" not in message
    assert f"the last finite checkpoint is step 2 in {tmp_path / 'checkpoints'}" in message
    assert "config.optim.learning_rate" in message
    checkpointer = TrainCheckpointer(tmp_path / "checkpoints", every_steps=2, best_metric=None)
    assert checkpointer.all_steps() == [2]  # no NaN state was saved; 2 was not deleted
    assert not (tmp_path / "params").exists()  # nor exported
    restored = checkpointer.manager.restore(2)["state"]
    assert _all_finite(restored)


def test_cli_run_with_a_huge_learning_rate_fails_with_one_line_and_saves_only_finite_states(
        tmp_path, capsys):
    workdir = tmp_path / "run"
    status, out, err = run_cli(train_argv(
        workdir, "--config.optim.learning_rate=1e6", "--config.num_train_steps=40",
        "--config.checkpoint.every_steps=1", "--config.checkpoint.keep=1",
        "--config.checkpoint.export_params=true"), capsys)
    assert status == 1 and '"finished"' not in out
    lines = [line for line in err.splitlines() if line.startswith("dil-jax train: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    first = int(lines[0].split("non-finite (NaN/Inf) at step ")[1].split(";")[0])
    # Step 1 has learning rate 0 (the warmup starts at 0), so it cannot diverge; saving every
    # step, the newest checkpoint is the step before the first non-finite one.
    assert first >= 2
    assert f"the last finite checkpoint is step {first - 1}" in lines[0]
    assert "lower config.optim.learning_rate (now 1e+06)" in lines[0]
    checkpointer = TrainCheckpointer(workdir / "checkpoints", every_steps=1, best_metric=None)
    assert checkpointer.all_steps() == [first - 1]
    assert _all_finite(checkpointer.manager.restore(first - 1)["state"])
    assert not (workdir / "params").exists()
