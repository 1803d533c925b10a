"""`optim.ema_decay`: the weights' exponential moving average (QANet's 0.9999), kept in the
optimizer state, is what evaluation reads and the export writes."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dil_jax.errors import UsageError
from dil_jax.train.config_rules import validate_config
from dil_jax.train.loop import train
from dil_jax.train.optim import averaged, ema_params
from dil_jax.train.step import weights_of

from tests.helpers.training import flat_params, tiny_config


def test_the_average_follows_the_decay_rule_by_hand():
    """SGD steps of +1 from 0 (params 1, 2, 3) under ema_params(0.5): the decay of update t is
    min(0.5, (1 + t) / (10 + t)) = 0.1, 2/11, 0.25, so the average is
    0.9, 0.1818... * 0.9 + 0.8181... * 2 = 1.8, 0.25 * 1.8 + 0.75 * 3 = 2.7."""
    tx = optax.chain(optax.sgd(1.0), ema_params(0.5))
    params = {"w": jnp.array(0.0)}
    state = tx.init(params)
    seen = []
    for _ in range(3):
        updates, state = tx.update({"w": jnp.array(-1.0)}, state, params)
        params = optax.apply_updates(params, updates)
        seen.append(float(averaged(state)["w"]))
    np.testing.assert_allclose(seen, [0.9, 1.8, 2.7], rtol=1e-6)
    assert float(params["w"]) == 3.0  # the updates themselves pass through unchanged
    assert averaged(optax.sgd(1.0).init(params)) is None


def test_a_run_exports_and_evaluates_its_moving_average(tmp_path):
    overrides = {"num_train_steps": 6, "checkpoint.every_steps": 6, "optim.ema_decay": 0.9,
                 "checkpoint.best_metric": ""}
    result = train(tiny_config(tmp_path / "ema", overrides))
    average = averaged(result.state.opt_state)
    assert average is not None
    from dil_jax.checkpoints import load_params

    _, exported = load_params(tmp_path / "ema" / "params")
    flat_export, flat_average = flat_params(exported), flat_params(average)
    for name, values in flat_export.items():
        np.testing.assert_array_equal(values, flat_average[name])
    # ... which is not the last weights (6 updates: the average lags them).
    last = flat_params(result.state.params)
    assert any(np.any(last[name] != flat_average[name]) for name in last)
    assert weights_of(result.state) is average


def test_a_decay_of_one_is_refused_by_key(tmp_path):
    config = tiny_config(tmp_path, {"optim.ema_decay": 1.0})
    with pytest.raises(UsageError, match="optim.ema_decay"):
        validate_config(config)
