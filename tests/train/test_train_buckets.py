"""data.length_buckets: batches of one length bucket each, cut to its length.

What must hold: every unit lands in a batch whose length holds its real tokens; an epoch visits
every unit at most once and drops only what the unbucketed order would (remainders), with a
number of batches fixed by the bucket counts (hand-counted below); the order is a pure function of
(seed, step) (a resumed run reads the same batches); cutting a batch's padding changes no loss
(padding is masked: its attention weights are exp(-1e9 - max) = 0 exactly, so the sums differ only
by float32 reassociation, well under 1e-5 here); a resume with other buckets is refused; a bad
spec names its key.
"""

from __future__ import annotations

import numpy as np
import pytest

from dil_jax.errors import CheckpointError, UsageError
from dil_jax.train import losses
from dil_jax.train.buckets import BucketedOrder, cut_passages, parse_buckets
from dil_jax.train.loop import _check_resume, data_identity, train
from dil_jax.train.setup import load_run_data, load_run_models
from dil_jax.train.step import compute_losses
from dil_jax.train.train_config import TrainConfig

from tests.helpers.training import tiny_config

# Real lengths of 8 units, buckets of 32 / 64 / 96 tokens, 2 units a batch:
# bucket 0 holds units 0, 3, 6 (10, 20, 15), bucket 1 units 1, 7 (50, 60), bucket 2 units
# 2, 4, 5 (70, 90, 95). Batches: bucket 0 fills 1 and passes 1 unit up; bucket 1 then has 3,
# fills 1 and passes 1 up; bucket 2 has 4 and fills 2. 4 batches, no unit dropped.
REAL = np.array([10, 50, 70, 20, 90, 95, 15, 60])
LENGTHS = (32, 64, 96)


def test_parse_buckets():
    assert parse_buckets("", 160) == ()
    assert parse_buckets("96,128", 160) == (96, 128, 160)
    assert parse_buckets("96,128,160", 160) == (96, 128, 160)
    for bad in ("128,96", "0,160", "200", "96,,128", "a", "96,96"):
        with pytest.raises(UsageError, match="config.data.length_buckets"):
            parse_buckets(bad, 160)


def test_batches_per_bucket_by_hand():
    order = BucketedOrder.build(REAL, LENGTHS, units_per_batch=2, seed=0)
    assert order.bucket_of_unit.tolist() == [0, 1, 2, 0, 2, 2, 0, 1]
    assert order.batches_per_bucket == (1, 1, 2)
    assert order.per_epoch == 4


@pytest.mark.parametrize("epoch", [0, 1, 5])
def test_every_unit_fits_its_batch_once(epoch):
    order = BucketedOrder.build(REAL, LENGTHS, units_per_batch=2, seed=3)
    batches = order.epoch_batches(epoch)
    assert len(batches) == 4
    seen = np.concatenate([units for _, units in batches])
    assert sorted(seen.tolist()) == list(range(8))  # here nothing is left over
    for length, units in batches:
        assert len(units) == 2 and length in LENGTHS
        assert (REAL[units] <= length).all()


def test_the_order_is_a_function_of_seed_and_step():
    a = BucketedOrder.build(REAL, LENGTHS, 2, seed=7)
    b = BucketedOrder.build(REAL, LENGTHS, 2, seed=7)  # a resumed run builds its own
    for step in (9, 0, 5, 4, 13):  # out of order, across epochs
        units_a, length_a = a.step_units(step)
        units_b, length_b = b.step_units(step)
        assert units_a.tolist() == units_b.tolist() and length_a == length_b
    epochs = [[u.tolist() for _, u in a.epoch_batches(e)] for e in range(4)]
    assert any(epochs[0] != other for other in epochs[1:])  # epochs are reshuffled


def test_a_remainder_is_dropped_only_at_the_top():
    real = np.array([5, 6, 7, 40, 41])  # 3 in bucket 0, 2 in bucket 1; batches of 2
    order = BucketedOrder.build(real, (32, 64), 2, seed=0)
    assert order.batches_per_bucket == (1, 1)  # the carried unit joins bucket 1; 1 dropped
    seen = np.concatenate([u for _, u in order.epoch_batches(0)])
    assert len(set(seen.tolist())) == 4


def test_cutting_the_padding_changes_no_loss(tmp_path):
    config = tiny_config(tmp_path, {"data.length_buckets": "12"})
    models = load_run_models(TrainConfig.of(config), evaluate_fn=None)
    data = load_run_data(TrainConfig.of(config), models.student, 1, None, None)
    assert data.buckets is not None and data.buckets.lengths == (12, 16)
    weights = losses.LossWeights(ce=1.0)
    rows_all = np.arange(data.micro)
    for step in range(data.per_epoch):
        units, length = data.buckets.step_units(step)
        if length == 16:
            continue
        rows, valid = data.train.unit_rows(units)
        full = data.train.batch(rows[None], valid[None])
        assert (full["p_mask"][..., length:] == 0).all()  # only padding is cut
        cut = data.step_batch(step, rows_all)
        assert cut["p_ids"].shape[-1] == length
        losses_of = [float(compute_losses(models.student, None, weights,
                                          models.student.params, None,
                                          {k: v[0] for k, v in batch.items()}, None,
                                          deterministic=True)[0])
                     for batch in (full, cut)]
        np.testing.assert_allclose(losses_of[1], losses_of[0], rtol=1e-5)
        break
    else:
        pytest.fail("no batch of the short bucket")


def test_training_with_buckets_runs_and_resume_checks_them(tmp_path):
    result = train(tiny_config(tmp_path / "run", {"data.length_buckets": "12",
                                                  "num_train_steps": 4}))
    assert int(result.state.step) == 4 and np.isfinite(result.last_metrics["loss"])
    config = tiny_config(tmp_path / "x", {"data.length_buckets": "12"})
    settings = TrainConfig.of(config)
    student = load_run_models(settings, evaluate_fn=None).student
    identity = data_identity(load_run_data(settings, student, 1, None, None))
    assert identity["length_buckets"] == [12, 16]
    meta = {**identity, "step": 10, "length_buckets": []}
    with pytest.raises(CheckpointError, match="length_buckets"):
        _check_resume(meta, identity)
    old = {key: value for key, value in identity.items() if key != "length_buckets"}
    _check_resume({**old, "step": 10}, {**identity, "length_buckets": []})  # before buckets
    assert cut_passages({"p_ids": np.ones((1, 2, 16)), "start": np.ones((1, 2))}, 12)[
        "p_ids"].shape == (1, 2, 12)
