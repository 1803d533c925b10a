"""The jitted train step: it learns, accumulation is exact, and device count does not matter."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
from train_helpers import (
    REPO,
    assert_same_training,
    flat_params,
    max_abs_diff,
    one_step_params,
)

from dil_jax.config import EncoderConfig
from dil_jax.model import DelayedInteractionModel
from dil_jax.train.data import synthetic_features, windows_from_features
from dil_jax.train.losses import LossWeights
from dil_jax.train.optim import make_optimizer
from dil_jax.train.sharding import make_data_mesh, process_rows, put_process_batch, replicate
from dil_jax.train.step import init_train_state, make_train_step

TINY = EncoderConfig(vocab_size=128, hidden_size=32, num_layers=2, num_heads=2,
                     intermediate_size=64, max_position_embeddings=64, embedding_size=32,
                     max_question_len=8, num_lower_layers=1)


def _setup(config=TINY, lr=3e-3, steps=100, weights=None):
    weights = weights or LossWeights()
    mesh = make_data_mesh()
    model = DelayedInteractionModel(config)
    params = model.init(jax.random.key(0))
    tx, schedule = make_optimizer(lr, steps, 0)
    state = jax.jit(lambda p: init_train_state(p, tx))(replicate(params, mesh))
    return mesh, model, state, make_train_step(model, None, weights, tx, schedule, mesh)


def _fixed_batch(mesh, accum, micro):
    windows = windows_from_features(synthetic_features(num_questions=8, question_len=8,
                                                       passage_len=16, vocab_size=128))
    rows = np.arange(accum * micro).reshape(accum, micro)
    return put_process_batch(windows.batch(rows[:, process_rows(mesh, accum, micro)]), mesh,
                             micro)


def test_loss_decreases_on_a_fixed_batch():
    mesh, _, state, step = _setup()
    batch = _fixed_batch(mesh, 1, 8)
    losses = []
    for _ in range(25):
        state, metrics = step(state, None, batch, jax.random.key(1))
        losses.append(float(metrics["loss"]))
    assert losses[-1] < 0.5 * losses[0], losses
    assert int(state.step) == 25


def test_accumulation_equals_one_big_batch():
    # Without dropout, 2 micro-batches of 4 must give the update of 1 batch of 8.
    config = TINY.replace(hidden_dropout=0.0, attention_dropout=0.0)
    mesh, _, state_a, step_a = _setup(config)
    _, _, state_b, step_b = _setup(config)
    big = _fixed_batch(mesh, 1, 8)
    split = {k: v.reshape(2, 4, *v.shape[2:]) for k, v in big.items()}
    state_a, metrics_a = step_a(state_a, None, big, jax.random.key(1))
    state_b, metrics_b = step_b(state_b, None, split, jax.random.key(1))
    assert abs(float(metrics_a["loss"]) - float(metrics_b["loss"])) < 1e-5
    assert abs(float(metrics_a["grad_norm"]) / float(metrics_b["grad_norm"]) - 1) < 1e-5
    # Adam's first update is ~lr * g / |g|: for near-zero gradients summation-order noise
    # moves it by a small fraction of lr, hence a tolerance relative to lr (3e-3).
    assert max_abs_diff(flat_params(state_a.params), flat_params(state_b.params)) < 3e-5


def test_bfloat16_compute_keeps_float32_params():
    mesh, _, state, step = _setup(TINY.replace(dtype="bfloat16"))
    state, metrics = step(state, None, _fixed_batch(mesh, 1, 8), jax.random.key(1))
    assert np.isfinite(float(metrics["loss"]))
    assert {leaf.dtype for leaf in jax.tree.leaves(state.params)} == {jnp.dtype(jnp.float32)}


def test_one_device_equals_eight_forced_host_devices(tmp_path):
    assert jax.device_count() == 1
    single = one_step_params(num_train_steps=2)
    out = tmp_path / "eight.npz"
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8",
               PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu")
    subprocess.run([sys.executable, str(REPO / "tests" / "train_helpers.py"), "one_step",
                    str(out), "2"], check=True, env=env, cwd=REPO, timeout=240)
    eight = dict(np.load(out))
    assert eight.keys() == single.keys()
    # Same global batch and dropout keys; only the gradient all-reduce order differs.
    assert_same_training(single, eight)
    assert max_abs_diff(single, flat_params(_setup()[2].params)) > 1e-4  # it did train
