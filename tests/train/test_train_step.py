"""The jitted train step: it learns, accumulation is exact, and device count does not matter."""

import functools
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np

from dil_jax.mesh import data_mesh
from dil_jax.model.delayed import DelayedInteractionModel
from dil_jax.readers import EncoderReader
from dil_jax.train.data import synthetic_features, windows_from_features
from dil_jax.train.losses import LossWeights
from dil_jax.train.optim import make_optimizer
from dil_jax.train.sharding import process_rows, put_process_batch, replicate
from dil_jax.train.step import accumulate_gradients, init_train_state, make_train_step

from tests.helpers import REPO, SUBPROCESS_TIMEOUT_S, subprocess_env
from tests.helpers.training import (
    assert_same_training,
    flat_params,
    max_abs_diff,
    one_step_config,
    one_step_params,
    tiny_encoder,
)

TINY = tiny_encoder()
U = 2.0**-24  # float32 unit roundoff


def _flat_vector(tree) -> np.ndarray:
    """All leaves of a param-shaped tree, raveled and concatenated (float64 for the norms)."""
    leaves = jax.tree.leaves(tree)
    return np.concatenate([np.ravel(np.asarray(leaf, np.float64)) for leaf in leaves])


def _setup(config=TINY, lr=3e-3, steps=100, weights=None):
    weights = weights or LossWeights()
    mesh = data_mesh()
    model = DelayedInteractionModel(config)
    params = model.init(jax.random.key(0))
    tx, schedule = make_optimizer(lr, steps, 0)
    state = jax.jit(lambda p: init_train_state(p, tx))(replicate(params, mesh))
    return mesh, model, state, make_train_step(EncoderReader(model, None), None, weights, tx,
                                               schedule, mesh)


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
    # Without dropout, 2 micro-batches of 4 must give the gradient and loss of 1 batch of 8.
    # Compared before the optimizer, not after it: Adam's first update is lr * g / (|g| + eps),
    # so an exactly-zero gradient (a key bias, the QA bias: softmax ignores a constant shift)
    # computed as +-1e-8 of rounding noise moves its parameter by up to lr * 1e-8 / eps, which
    # makes a parameter comparison a comparison of noise.
    config = TINY.replace(hidden_dropout=0.0, attention_dropout=0.0)
    model = DelayedInteractionModel(config)
    params = model.init(jax.random.key(0))
    accumulate = jax.jit(functools.partial(accumulate_gradients, EncoderReader(model, None),
                                           None, LossWeights()))
    rng = jax.random.key(1)
    big = _fixed_batch(data_mesh(), 1, 8)  # [1, 8, ...]
    split = {k: v.reshape(2, 4, *v.shape[2:]) for k, v in big.items()}
    rows = {k: v.reshape(8, 1, 1, *v.shape[2:]) for k, v in big.items()}
    grads_one, metrics_one = accumulate(params, None, big, rng)
    grads_acc, metrics_acc = accumulate(params, None, split, rng)
    row_grads, row_metrics = jax.vmap(lambda row: accumulate(params, None, row, rng))(rows)

    # Both are float32 evaluations of the same real number, mean_r g_r over the N = 8 rows, in
    # different orders (and, for XLA, with matmuls blocked for 4 rows instead of 8). Higham's
    # bound for a float32 sum of n terms is |fl(sum x) - sum x| <= gamma_n * sum |x| with
    # gamma_n = n u / (1 - n u), u = 2^-24. No reduction in this step is longer than
    # n = N * (Lq + Lp) (the weight gradients sum over every token of the batch), and the
    # magnitudes summed are those of the per-row gradients, S = mean_r |g_r|. Each side is
    # within gamma_n * S of the exact value, so they are within 2 gamma_n * S of each other.
    # Normwise over all params: the exactly-zero gradients above are cancellation noise whose
    # per-row values are noise too, so they have no componentwise bound, but they weigh ~1e-8
    # in a norm dominated by gradients ~1e-1. (Measured on an AMD EPYC: ~2 u * |S|, against
    # a bound of 2 * 192 u * |S|; summing instead of averaging micro-batches gives ~|S|.)
    n = big["start"].size * (big["q_ids"].shape[-1] + big["p_ids"].shape[-1])
    gamma = n * U / (1 - n * U)
    one, acc = _flat_vector(grads_one), _flat_vector(grads_acc)
    magnitude = _flat_vector(jax.tree.map(lambda g: np.mean(np.abs(g), axis=0), row_grads))
    assert np.linalg.norm(acc - one) <= 2 * gamma * np.linalg.norm(magnitude), (
        np.linalg.norm(acc - one) / (U * np.linalg.norm(magnitude)))
    # The loss: the same argument with the per-row losses as the magnitudes summed.
    loss_magnitude = float(np.mean(np.abs(np.asarray(row_metrics["loss"]))))
    assert abs(float(metrics_acc["loss"]) - float(metrics_one["loss"])) <= (
        2 * gamma * loss_magnitude)


def test_bfloat16_compute_keeps_float32_params():
    mesh, _, state, step = _setup(TINY.replace(dtype="bfloat16"))
    state, metrics = step(state, None, _fixed_batch(mesh, 1, 8), jax.random.key(1))
    assert np.isfinite(float(metrics["loss"]))
    assert {leaf.dtype for leaf in jax.tree.leaves(state.params)} == {jnp.dtype(jnp.float32)}


def test_one_device_equals_eight_forced_host_devices(tmp_path):
    # This process may itself run on forced host devices (XLA_FLAGS set for the whole suite):
    # the subprocess then takes the other side, 1 device, so the test compares 1 with 8 (or
    # with whatever count this process has) either way.
    here = jax.device_count()
    there = 8 if here == 1 else 1
    local = one_step_params(num_train_steps=2)
    out = tmp_path / "other.npz"
    env = subprocess_env(there, PYTHONPATH=str(REPO))
    subprocess.run([sys.executable, "-m", "tests.helpers.training", "one_step",
                    str(out), "2", str(there)], check=True, env=env, cwd=REPO,
                   timeout=SUBPROCESS_TIMEOUT_S)
    other = dict(np.load(out))
    assert other.keys() == local.keys()
    # Same global batch and dropout keys; only the gradient all-reduce order differs.
    assert_same_training(local, other, one_step_config(tmp_path, 2))
    assert max_abs_diff(local, flat_params(_setup()[2].params)) > 1e-4  # it did train


def test_nonfinite_flag_covers_the_loss_the_gradient_and_the_updated_params():
    mesh, _, state, step = _setup()
    batch, rng = _fixed_batch(mesh, 1, 8), jax.random.key(1)
    state, metrics = step(state, None, batch, rng)
    assert not bool(metrics["nonfinite"])  # a fresh model on a fixed batch
    # NaN moments with finite params: the loss and the gradient (read from the params) stay
    # finite, but Adam's update mu / (sqrt(nu) + eps) is NaN, so only the updated params show it.
    nan_moments = jax.tree.map(
        lambda x: x * jnp.nan if jnp.issubdtype(x.dtype, jnp.floating) else x, state.opt_state)
    _, metrics = step(state.replace(opt_state=nan_moments), None, batch, rng)
    assert np.isfinite(float(metrics["loss"])) and np.isfinite(float(metrics["grad_norm"]))
    assert bool(metrics["nonfinite"])
    # A NaN param: the loss reads it.
    _, _, state, _ = _setup()  # (the state above was donated to the step)
    nan_params = jax.tree.map(lambda x: x * jnp.nan, state.params)
    _, metrics = step(state.replace(params=nan_params), None, batch, rng)
    assert not np.isfinite(float(metrics["loss"])) and bool(metrics["nonfinite"])
