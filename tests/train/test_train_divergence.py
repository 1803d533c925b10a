"""A run that goes non-finite (NaN/Inf) stops by name and never saves, exports or keeps as best
a non-finite state; a restored checkpoint holding NaN is set aside like a damaged one."""

import json
import logging
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dil_jax.checkpoints import CheckpointError
from dil_jax.errors import TrainingDiverged
from dil_jax.train import loop
from dil_jax.train.checkpointing import TrainCheckpointer, best_score, nonfinite_leaves
from dil_jax.train.loop import train

from tests.helpers import run_cli
from tests.helpers.training import (
    BEST_BY_F1,
    QUICK,
    STEPS,
    flat_params,
    scripted_f1,
    tiny_config,
    train_argv,
)

# The finite runs here have num_train_steps STEPS (tests/helpers/training.py says why); shorter
# runs stop with `stop_after_step`.


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

    def poisoned(config, total_steps, student):
        tx, schedule = real(config, total_steps, student)
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


def test_a_checkpoint_holding_nan_is_set_aside_and_the_previous_one_resumed(tmp_path, caplog):
    # What a diverged run of older code saved, or bytes changed on disk that still decode.
    overrides = {"num_train_steps": STEPS, "checkpoint.every_steps": 2, **QUICK}
    first = train(tiny_config(tmp_path, overrides), stop_after_step=4)
    checkpointer = TrainCheckpointer(tmp_path / "checkpoints", every_steps=2, best_metric=None,
                                     async_save=False)
    meta = json.loads((tmp_path / "checkpoints" / "4" / "meta" / "metadata").read_text())
    params = dict(first.state.params)
    params["qa_outputs"] = jax.tree.map(lambda x: x * jnp.nan, params["qa_outputs"])
    checkpointer.manager.delete(4)
    checkpointer.save(4, first.state.replace(params=params), meta, force=True)
    checkpointer.close()
    with caplog.at_level(logging.WARNING, logger="dil_jax.train.checkpointing"):
        resumed = train(tiny_config(tmp_path, overrides), stop_after_step=5)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("checkpoint step 4" in w and "non-finite values (NaN/Inf) in "
               "params/qa_outputs" in w for w in warnings), warnings
    assert any("resuming from step 2" in w and "[4]" in w for w in warnings), warnings
    assert int(resumed.state.step) == 5 and _all_finite(resumed.state.params)
    assert (tmp_path / "checkpoints.broken" / "4" / "state").is_dir()


def test_a_nan_metric_is_never_the_best(tmp_path):
    checkpointer = TrainCheckpointer(tmp_path, every_steps=1, keep=1, best_metric="val_loss",
                                     best_mode="min", async_save=False)
    state = {"w": np.ones(3, np.float32)}
    for step, val_loss in ((1, 2.0), (2, math.nan), (3, 3.0)):
        checkpointer.save(step, state, {"step": step}, metrics={"val_loss": val_loss})
    # Finite losses 2.0 (step 1) and 3.0 (step 3): the best is step 1; keep = 1 keeps step 3.
    assert checkpointer.best_step() == 1
    assert checkpointer.all_steps() == [1, 3]
    checkpointer.close()


def test_a_nan_metric_saved_by_older_code_ranks_last(tmp_path):
    checkpointer = TrainCheckpointer(tmp_path, every_steps=1, keep=3, best_metric="val_loss",
                                     best_mode="min", async_save=False)
    state = {"w": np.ones(3, np.float32)}
    from orbax.checkpoint import args as ocp_args

    def save_unchecked(step, val_loss):  # as the manager stored metrics before this check
        checkpointer.manager.save(step, args=ocp_args.Composite(
            state=ocp_args.StandardSave(state), meta=ocp_args.JsonSave({"step": step})),
            metrics={"val_loss": val_loss}, force=True)

    save_unchecked(1, math.nan)
    assert checkpointer.best_step() is None  # a NaN alone is no best: the last step is exported
    save_unchecked(2, 50.0)
    assert checkpointer.best_step() == 2  # any finite loss beats NaN
    checkpointer.close()
    # The score orbax ranks by: NaN is the worst in either mode.
    assert best_score({"f1": math.nan}, "f1", "max") == -math.inf
    assert best_score({"val_loss": math.nan}, "val_loss", "min") == -math.inf
    assert best_score({"val_loss": 2.0}, "val_loss", "min") == -2.0


def test_a_nan_evaluation_does_not_replace_the_best_export(tmp_path):
    evaluate_fn, _ = scripted_f1(10.0, 20.0, *[math.nan] * (STEPS - 2))
    overrides = {"num_train_steps": STEPS, "checkpoint.every_steps": 1, "checkpoint.keep": 1,
                 **BEST_BY_F1}
    result = train(tiny_config(tmp_path, overrides), evaluate_fn=evaluate_fn)
    assert result.best_step == 2
    assert json.loads((tmp_path / "params" / "trained_from.json").read_text())["step"] == 2
    steps = TrainCheckpointer(tmp_path / "checkpoints", every_steps=1, best_metric="f1").all_steps()
    assert steps == [2, STEPS]  # the best and the last


def test_export_refuses_a_best_checkpoint_that_went_nan_on_disk(tmp_path):
    from dil_jax.model.delayed import DelayedInteractionModel
    from dil_jax.model.encoder_config import EncoderConfig
    from dil_jax.readers import EncoderReader

    checkpointer = TrainCheckpointer(tmp_path / "checkpoints", every_steps=1, best_metric=None,
                                     async_save=False)
    state = loop.TrainState(step=jnp.asarray(2, jnp.int32),
                            params={"w": jnp.ones(3)}, opt_state=())
    checkpointer.save(1, state.replace(params={"w": jnp.full(3, jnp.nan)},
                                       step=jnp.asarray(1, jnp.int32)), {"step": 1})
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    with pytest.raises(CheckpointError, match="step 1 .*non-finite values .* in w"):
        config = EncoderConfig(vocab_size=8, hidden_size=4, num_layers=1, num_heads=1,
                               intermediate_size=4, embedding_size=4)
        loop.export_reader(checkpointer, 1, state, sharding, tmp_path / "params",
                           EncoderReader(DelayedInteractionModel(config), None))
    assert not (tmp_path / "params").exists()
    checkpointer.close()
    assert nonfinite_leaves({"a": jnp.ones(2), "b": jnp.array([1.0, jnp.inf])}) == ["b"]
