"""Distillation-only questions (data.distill_file): windows without labels that the span CE skips
and the teacher's KD and LRS train on."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dil_jax.data.features import FeaturizationError
from dil_jax.errors import UsageError
from dil_jax.model.delayed import DelayedInteractionModel
from dil_jax.model.span_reader import ReaderOutput
from dil_jax.readers import EncoderReader
from dil_jax.train import losses
from dil_jax.train.config_files import load_config_file
from dil_jax.train.config_rules import config_problems
from dil_jax.train.data import (
    TrainingFeatures,
    append_unlabelled,
    synthetic_features,
    windows_from_features,
)
from dil_jax.train.default_config import base_config
from dil_jax.train.squad_data import distillation_examples, split_examples
from dil_jax.train.step import compute_losses

from tests.helpers import REPO, V11, V20, squad_file
from tests.helpers.training import tiny_encoder

TINY = tiny_encoder(num_layers=3, hidden_dropout=0.0, attention_dropout=0.0)


def _features(num_questions: int, seed: int) -> TrainingFeatures:
    return synthetic_features(num_questions=num_questions, windows_per_question=2,
                              question_len=8, passage_len=16, vocab_size=128, seed=seed,
                              null_fraction=0.0)


def test_appended_questions_follow_with_offset_rows_and_no_labels():
    base, extra = _features(3, seed=0), _features(2, seed=1)
    joined = append_unlabelled(base, extra)
    # 3 + 2 questions; 6 + 4 windows; the extra windows ask the extra questions (rows 3, 4).
    assert joined.q_ids.shape == (5, 8) and joined.p_ids.shape == (10, 16)
    np.testing.assert_array_equal(joined.q_ids[3:], extra.q_ids)
    np.testing.assert_array_equal(joined.p_ids[6:], extra.p_ids)
    assert joined.example_index.tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    assert joined.start_positions[6:].tolist() == [-1] * 4
    assert joined.end_positions[6:].tolist() == [-1] * 4
    np.testing.assert_array_equal(joined.start_positions[:6], base.start_positions)
    assert joined.is_unlabelled.tolist() == [False] * 6 + [True] * 4
    assert joined.is_distractor.tolist() == [False] * 10

    windows = windows_from_features(joined)
    assert windows.labelled.tolist() == [True] * 6 + [False] * 4
    batch = windows.batch(np.array([[0, 7], [9, 1]]))
    assert batch["labelled"].tolist() == [[1, 0], [0, 1]]
    # Window 7 asks extra question 0 (row 3), window 9 extra question 1 (row 4).
    np.testing.assert_array_equal(batch["q_ids"][0, 1], extra.q_ids[0])
    np.testing.assert_array_equal(batch["q_ids"][1, 0], extra.q_ids[1])


def test_appending_refuses_other_lengths_and_unlabelled_windows_with_labels():
    base = _features(2, seed=0)
    longer = synthetic_features(num_questions=2, question_len=8, passage_len=20, seed=1)
    with pytest.raises(FeaturizationError, match="p_ids"):
        append_unlabelled(base, longer)
    joined = append_unlabelled(base, _features(1, seed=1))
    joined.start_positions[-1] = joined.end_positions[-1] = 3
    with pytest.raises(FeaturizationError, match="unlabelled"):
        windows_from_features(joined)


def test_cross_entropy_averages_over_labelled_rows_only():
    rng = np.random.default_rng(0)
    start, end = rng.normal(size=(3, 5)), rng.normal(size=(3, 5))
    null_start, null_end = rng.normal(size=3), rng.normal(size=3)
    out = ReaderOutput(*(jnp.asarray(x, jnp.float32) for x in (start, end, null_start, null_end)))
    labels_start, labels_end = np.array([2, -1, 0]), np.array([4, -1, 1])

    def hand_ce(logits, null, label):  # -log softmax([null ; logits])[label + 1]
        classes = np.concatenate([[null], logits])
        return np.log(np.sum(np.exp(classes))) - classes[label + 1]

    rows = [(hand_ce(start[i], null_start[i], labels_start[i])
             + hand_ce(end[i], null_end[i], labels_end[i])) / 2 for i in range(3)]
    labelled = jnp.array([1, 0, 1])
    got = losses.span_cross_entropy(out, jnp.asarray(labels_start), jnp.asarray(labels_end),
                                    labelled)
    # float32 log-softmax over 6 classes of O(1) logits: a few ulps of O(1) values.
    np.testing.assert_allclose(float(got), (rows[0] + rows[2]) / 2, rtol=1e-5)
    every = losses.span_cross_entropy(out, jnp.asarray(labels_start), jnp.asarray(labels_end))
    np.testing.assert_allclose(float(every), np.mean(rows), rtol=1e-5)
    # The unlabelled row's logits get no CE gradient; a batch without labels gives 0.
    grad = jax.grad(lambda s: losses.span_cross_entropy(
        out.replace(start_logits=s), jnp.asarray(labels_start), jnp.asarray(labels_end),
        labelled))(out.start_logits)
    assert np.all(np.asarray(grad[1]) == 0) and np.any(np.asarray(grad[0]) != 0)
    assert float(losses.span_cross_entropy(out, jnp.asarray(labels_start),
                                           jnp.asarray(labels_end), jnp.zeros(3))) == 0.0


def test_unlabelled_windows_train_through_kd_and_lrs_only():
    student = DelayedInteractionModel(TINY)
    teacher = DelayedInteractionModel(TINY.replace(num_lower_layers=0))
    params = student.init(jax.random.key(0), passage_len=16)
    teacher_params = teacher.init(jax.random.key(1), passage_len=16)
    windows = windows_from_features(append_unlabelled(_features(2, seed=0), _features(1, seed=1)))
    weights = losses.LossWeights(ce=1.0, kd=1.0, lrs=1.0, temperature=2.0)

    @jax.jit
    def loss_terms(batch):
        return compute_losses(EncoderReader(student, None), teacher, weights, params,
                              teacher_params, batch, None, deterministic=True)[1]

    def terms(rows):
        metrics = loss_terms(windows.batch(np.asarray(rows)))
        return {name: float(value) for name, value in metrics.items()}

    labelled, unlabelled, mixed = terms([0, 1]), terms([4, 5]), terms([0, 1, 4, 5])
    # Rows 4, 5 have no labels: no CE of their own, and the mixed batch's CE is rows 0, 1's.
    # KD is a mean over rows, so the mixed batch's is the mean of the two halves': the unlabelled
    # rows count as the labelled ones do. Tolerance: KD sums p_t (log p_t - log p_s), a
    # difference of log-probabilities of size ~log(17) ~ 3 whose float32 ulp is 2.4e-7, a
    # batch of another size may round each differently, and T^2 = 4 scales it: 4e-6 absolute.
    assert unlabelled["ce"] == 0.0
    np.testing.assert_allclose(mixed["ce"], labelled["ce"], rtol=1e-5)
    assert unlabelled["kd"] > 0 and unlabelled["lrs"] > 0
    np.testing.assert_allclose(mixed["kd"], (labelled["kd"] + unlabelled["kd"]) / 2, atol=4e-6)


def test_distillation_questions_are_the_training_articles_unanswerable_ones():
    v1_file, v2_file = str(squad_file(V11)), str(squad_file(V20))
    config = base_config()
    config.data.squad_file, config.data.distill_file = v1_file, v2_file
    training = split_examples(config.data, "train")
    chosen = distillation_examples(config.data, training)
    # Independently, from the raw JSON: the v2.0 questions of the v1.1 file's first 28 articles
    # whose id v1.1 does not have. (v2.0 dev keeps v1.1's answerable questions and ids.)
    with open(v1_file) as f1, open(v2_file) as f2:
        v1, v2 = json.load(f1)["data"][:28], json.load(f2)["data"]
    titles = {article["title"] for article in v1}
    v1_ids = {qa["id"] for a in v1 for p in a["paragraphs"] for qa in p["qas"]}
    expected = [qa["id"] for a in v2 if a["title"] in titles for p in a["paragraphs"]
                for qa in p["qas"] if qa["id"] not in v1_ids]
    assert [example.qid for example in chosen] == expected
    assert len(expected) > 4000  # the training articles' unanswerable questions
    assert all(example.is_impossible for example in chosen)
    validation_titles = {e.title for e in split_examples(config.data, "validation")}
    assert not validation_titles & {example.title for example in chosen}
    # A learning-curve subset does not get its cut questions back as unlabelled ones.
    config.data.max_questions = 100
    assert [e.qid for e in distillation_examples(config.data, training)] == expected
    config.data.max_distill_questions = 7
    assert len(distillation_examples(config.data, training)) == 7


def test_a_file_without_new_training_questions_is_refused_by_key():
    config = base_config()
    config.data.squad_file = config.data.distill_file = str(squad_file(V11))
    with pytest.raises(UsageError, match="config.data.distill_file"):
        distillation_examples(config.data, split_examples(config.data, "train"))


def test_config_refuses_distill_file_without_teacher_loss_or_with_shared_norm():
    config = base_config()
    config.data.distill_file = "x.json"
    assert any("config.data.distill_file" in p and "kd_weight" in p
               for p in config_problems(config))
    config.loss.kd_weight = 1.0
    assert config_problems(config) == []
    config.loss.shared_norm, config.data.windows_per_question = True, 2
    assert any("shared_norm" in p and "distill_file" in p for p in config_problems(config))


def test_minilm_extra_suffix():
    config_file = f"{REPO}/configs/minilm_squad.py"
    config = load_config_file(f"{config_file}:k4_warm,extra")
    assert config.data.distill_file.endswith("dev-v2.0.json")
    assert config.workdir == "runs/minilm_squad_k4_warm_extra"
    assert config.teacher.checkpoint == "dil_jax/assets/minilm-squad-full"
    assert config_problems(config) == []
    for spec in ("full,extra", "k4,extra", "k4_warm,v2,extra"):
        with pytest.raises(UsageError, match="extra"):
            load_config_file(f"{config_file}:{spec}")


def test_minilm_cloze_suffix():
    config_file = f"{REPO}/configs/minilm_squad.py"
    config = load_config_file(f"{config_file}:k5_warm,extra,cloze")
    assert config.data.cloze_per_paragraph == 30
    assert config.data.distill_file.endswith("dev-v2.0.json")
    assert config.workdir == "runs/minilm_squad_k5_warm_extra_cloze"
    assert config_problems(config) == []
    assert load_config_file(f"{config_file}:k4_distill,cloze").data.distill_file == ""
    for spec in ("full,cloze", "k4,cloze", "k4_warm,v2,cloze"):
        with pytest.raises(UsageError, match="cloze"):
            load_config_file(f"{config_file}:{spec}")
