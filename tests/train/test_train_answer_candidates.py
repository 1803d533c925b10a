"""Every occurrence of an ambiguous answer as a correct span: candidate labels and the
multi-positive span loss (data.answer_candidates_file)."""

from __future__ import annotations

import json
import math

import jax.numpy as jnp
import numpy as np
import pytest

from dil_jax.data.features import featurize
from dil_jax.data.squad import SquadExample
from dil_jax.errors import InputFileError
from dil_jax.model.span_reader import ReaderOutput
from dil_jax.train import losses
from dil_jax.train.answer_candidates import load_answer_candidates, window_candidates
from dil_jax.train.data import windows_from_features, with_candidates


def test_multi_positive_loss_is_minus_log_of_the_summed_candidate_probability():
    # One window, passage logits [1, 2, 3], null 0: classes [null, t0, t1, t2] = [0, 1, 2, 3].
    logits = jnp.array([[0.0, 1.0, 2.0, 3.0]])
    z = 1 + math.e + math.e ** 2 + math.e ** 3
    # float32 log-softmax + logsumexp over 4 classes: a dozen roundings of 2^-24 each, so results
    # of size 0.3-3.5 agree with the float64 reference to well under 1e-6 relative.
    both = float(losses.multi_positive_nll(logits, jnp.array([[0, 2, -1]]))[0])  # tokens 0 and 2
    assert both == pytest.approx(-math.log((math.e + math.e ** 3) / z), rel=1e-6)
    one = float(losses.multi_positive_nll(logits, jnp.array([[1, -1, -1]]))[0])  # token 1 alone
    assert one == pytest.approx(-math.log(math.e ** 2 / z), rel=1e-6)
    none = float(losses.multi_positive_nll(logits, jnp.array([[-1, -1, -1]]))[0])  # no answer
    assert none == pytest.approx(-math.log(1 / z), rel=1e-6)


def test_span_loss_with_one_candidate_equals_the_plain_cross_entropy():
    rng = np.random.default_rng(0)
    passage = jnp.asarray(rng.normal(size=(3, 5)), jnp.float32)
    null = jnp.asarray(rng.normal(size=3), jnp.float32)
    out = ReaderOutput(passage, passage[:, ::-1], null, -null)
    start, end = jnp.array([2, -1, 0]), jnp.array([3, -1, 4])
    pad = jnp.full((3, 3), -1)
    plain = losses.span_cross_entropy_rows(out, start, end)
    multi = losses.span_cross_entropy_rows(out, start, end,
                                           jnp.concatenate([start[:, None], pad], 1),
                                           jnp.concatenate([end[:, None], pad], 1))
    # Two float32 paths to the same log-probability (take vs logsumexp of one term): a few
    # roundings apart, far under 1e-6 relative.
    np.testing.assert_allclose(np.asarray(multi), np.asarray(plain), rtol=1e-6)


CONTEXT = "the cat sat on the mat and the cat slept near the door of the cat house"


def _example(qid: str, text: str, start: int) -> SquadExample:
    return SquadExample(qid=qid, title="t", context=CONTEXT, question="where?",
                        answer_texts=(text,), answer_starts=(start,))


def test_window_candidates_label_every_whole_occurrence_in_each_window(tokenizer):
    # "the cat" occurs at characters 0, 27 and 58; every word is one WordPiece token here, so
    # token i is word i: occurrences are tokens (0, 1), (7, 8) and (14, 15) of 17.
    assert [i for i in range(len(CONTEXT)) if CONTEXT.startswith("the cat", i)] == [0, 27, 58]
    examples = [_example("a", "the cat", 0), _example("b", "mat", 19)]
    features = featurize(examples, tokenizer, max_question_len=8, max_passage_len=11,
                         doc_stride=5)
    # Windows of 10 context tokens + [SEP], every 5 tokens: tokens 0-9, 5-14, 10-16.
    assert features.window_start.tolist() == [0, 5, 10, 0, 5, 10]
    spans = window_candidates(features, examples, {"a": ("the cat", (0, 27, 58))})
    # Question "a": window 0 holds (0, 1) (its label) and (7, 8); window 1 (tokens 5-14) holds
    # (7, 8) as (2, 3) in its own numbering, and only the first token of (14, 15); window 2
    # (tokens 10-16) holds (14, 15) as (4, 5).
    assert spans.start_candidates[:3, :2].tolist() == [[0, 7], [2, -1], [4, -1]]
    assert spans.end_candidates[:3, :2].tolist() == [[1, 8], [3, -1], [5, -1]]
    # Windows 1 and 2 lacked the first occurrence: they become answer windows.
    assert spans.start_positions[:3].tolist() == [0, 2, 4]
    assert features.start_positions[:3].tolist() == [0, -1, -1]
    # Question "b" has no candidates: its labels are the featurizer's own.
    assert spans.start_positions[3:].tolist() == features.start_positions[3:].tolist()
    assert np.all(spans.start_candidates[3:, 1:] == -1)
    features.start_positions, features.end_positions = spans.start_positions, spans.end_positions
    windows = windows_from_features(with_candidates(features, spans.start_candidates,
                                                    spans.end_candidates))
    batch = windows.batch(np.array([1, 3]), np.array([True, False]))
    assert batch["start_candidates"][0, :2].tolist() == [2, -1]
    assert np.all(batch["start_candidates"][1] == -1)  # an invalid (padding) row has none


def test_candidates_whose_text_differs_are_ignored(tokenizer):
    examples = [_example("a", "the cat", 0)]
    features = featurize(examples, tokenizer, max_question_len=8, max_passage_len=32,
                         doc_stride=16)
    spans = window_candidates(features, examples, {"a": ("the dog", (0, 27))})
    assert np.all(spans.start_candidates[:, 1:] == -1)


def test_a_malformed_candidates_file_is_named(tmp_path):
    path = tmp_path / "candidates.json"
    path.write_text(json.dumps({"q1": {"text": "x", "candidates": "12"}}))
    with pytest.raises(InputFileError, match=r"answer_candidates_file.*'q1'"):
        load_answer_candidates(path)
    with pytest.raises(InputFileError, match="no such file"):
        load_answer_candidates(tmp_path / "missing.json")
    path.write_text(json.dumps({"q1": {"text": "x", "candidates": [3, 7]}}))
    assert load_answer_candidates(path) == {"q1": ("x", (3, 7))}
