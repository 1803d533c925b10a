"""Span CE labels, DeFormer KD/LRS, the optimizer's decay mask and schedule."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dil_jax.model.delayed import DelayedInteractionModel
from dil_jax.model.span_reader import ReaderOutput
from dil_jax.readers import EncoderReader
from dil_jax.train import losses
from dil_jax.train.data import synthetic_features, windows_from_features
from dil_jax.train.optim import warmup_linear_decay, weight_decay_mask
from dil_jax.train.step import compute_losses

from tests.helpers.training import tiny_encoder

TINY = tiny_encoder(num_layers=3, num_lower_layers=0)


def _batch(n=6):
    windows = windows_from_features(synthetic_features(num_questions=n // 2, question_len=8,
                                                       passage_len=16, vocab_size=128))
    return {k: jnp.asarray(v) for k, v in windows.batch(np.arange(n)).items()}


def test_labels_map_minus_one_to_the_null_logit():
    assert losses.span_labels(jnp.array([-1, 0, 5])).tolist() == [0, 1, 6]


def test_cross_entropy_is_over_null_and_passage():
    # Passage logits favour token 2; null favoured by a huge [CLS] score.
    passage = jnp.array([[0.0, 0.0, 9.0, -1e9]])
    null = jnp.array([20.0])
    out = ReaderOutput(passage, passage, null, null)
    assert float(losses.span_cross_entropy(out, jnp.array([-1]), jnp.array([-1]))) < 1e-4
    assert float(losses.span_cross_entropy(out, jnp.array([2]), jnp.array([2]))) > 10.0


def test_kd_and_lrs_vanish_for_the_same_full_model_and_not_otherwise():
    params = DelayedInteractionModel(TINY).init(jax.random.key(0))
    batch = _batch()
    full = DelayedInteractionModel(TINY.replace(num_lower_layers=0))
    weights = losses.LossWeights(ce=1.0, kd=1.0, lrs=1.0, temperature=2.0)
    def terms_of(student):
        reader = EncoderReader(student, None)
        return jax.jit(lambda p: compute_losses(reader, full, weights, p, p, batch, None,
                                                deterministic=True)[1])(params)

    same = terms_of(full)
    assert abs(float(same["kd"])) < 1e-6 and abs(float(same["lrs"])) < 1e-10
    assert float(same["ce"]) > 0
    for k in (1, 2):  # the decomposed student differs from its full-model teacher
        student = DelayedInteractionModel(TINY.replace(num_lower_layers=k))
        terms = terms_of(student)
        assert float(terms["kd"]) > 1e-6 and float(terms["lrs"]) > 1e-6, (k, terms)
        expected = terms["ce"] + terms["kd"] + terms["lrs"]
        assert float(terms["loss"]) == pytest.approx(float(expected), rel=1e-6)


def test_teacher_gets_no_gradient():
    params = DelayedInteractionModel(TINY).init(jax.random.key(0))
    teacher_params = DelayedInteractionModel(TINY).init(jax.random.key(1))
    batch = _batch()
    student = DelayedInteractionModel(TINY.replace(num_lower_layers=1))
    full = DelayedInteractionModel(TINY.replace(num_lower_layers=0))
    weights = losses.LossWeights(ce=0.0, kd=1.0, lrs=1.0)

    def loss(p, t):
        return compute_losses(EncoderReader(student, None), full, weights, p, t, batch, None,
                              deterministic=True)[0]

    g_student, g_teacher = jax.jit(jax.grad(loss, argnums=(0, 1)))(params, teacher_params)
    assert max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(g_teacher)) == 0.0
    assert max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(g_student)) > 0.0


def test_lrs_compares_only_upper_layers_on_real_tokens():
    states_s = tuple(jnp.full((1, 3, 2), float(i)) for i in range(4))
    states_t = tuple(jnp.full((1, 3, 2), float(i)) for i in range(4))
    states_t = states_t[:2] + (states_t[2] + 1.0, states_t[3] + 3.0)
    mask = jnp.array([[1, 1, 0]])
    # k = 1: layers 2 and 3 compared, MSE 1 and 9.
    assert float(losses.distillation_lrs(states_s, states_t, mask, 1)) == pytest.approx(5.0)
    # k = 3 (all blocks lower): nothing to compare.
    assert float(losses.distillation_lrs(states_s, states_t, mask, 3)) == 0.0
    # Padding is ignored.
    padded = states_t[:3] + (states_t[3].at[0, 2].set(1e6),)
    assert float(losses.distillation_lrs(states_s, padded, mask, 1)) == pytest.approx(5.0)


def test_weight_decay_skips_biases_and_layer_norms():
    params = DelayedInteractionModel(TINY).init(jax.random.key(0))
    mask = weight_decay_mask(params)
    assert mask["block_0"]["attention"]["query"]["kernel"] is True
    assert mask["embeddings"]["word_embeddings"]["embedding"] is True
    assert mask["block_0"]["attention"]["query"]["bias"] is False
    assert mask["block_0"]["output_norm"]["scale"] is False
    assert mask["embeddings"]["norm"]["bias"] is False


def test_schedule_warms_up_then_decays_to_zero():
    schedule = warmup_linear_decay(1.0, total_steps=10, warmup_steps=2)
    values = [float(schedule(s)) for s in range(11)]
    assert values[0] == 0.0 and values[2] == pytest.approx(1.0)
    assert values[10] == pytest.approx(0.0, abs=1e-7)
    assert all(a >= b for a, b in itertools.pairwise(values[2:]))


def test_frozen_params_do_not_move():
    import jax
    import jax.numpy as jnp

    from dil_jax.train.optim import make_optimizer

    params = {"embeddings": {"word_embeddings": {"embedding": jnp.ones((3, 2))},
                             "norm": {"scale": jnp.ones(2)}},
              "block_0": {"ffn_in": {"kernel": jnp.ones((2, 2))}}}
    grads = jax.tree.map(jnp.ones_like, params)
    tx, _ = make_optimizer(0.1, 10, 0, weight_decay=0.5,
                           frozen=("embeddings/word_embeddings",))
    state = tx.init(params)
    updates, _ = tx.update(grads, state, params)
    assert float(jnp.abs(updates["embeddings"]["word_embeddings"]["embedding"]).max()) == 0.0
    assert float(jnp.abs(updates["block_0"]["ffn_in"]["kernel"]).min()) > 0
    assert float(jnp.abs(updates["embeddings"]["norm"]["scale"]).min()) > 0
