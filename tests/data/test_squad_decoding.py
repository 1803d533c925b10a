"""Span decoding: exact n-best per window, max-context, original text, SQuAD 2.0 null score."""

from __future__ import annotations

import numpy as np
import pytest

from dil_jax.data.decoding import decode_predictions, window_nbest
from dil_jax.data.features import featurize
from dil_jax.data.squad import SquadExample


def test_window_nbest_matches_brute_force():
    rng = np.random.default_rng(0)
    n, p_len, max_len, n_best = 7, 12, 4, 5
    start, end = rng.normal(size=(2, n, p_len))
    valid_end = rng.random((n, p_len)) < 0.8
    valid_start = valid_end & (rng.random((n, p_len)) < 0.8)
    valid_start[3] = False  # a window without any allowed span
    scores, starts, ends = window_nbest(start, end, valid_start, valid_end, n_best=n_best,
                                        max_answer_length=max_len, chunk_size=3)
    for w in range(n):
        spans = sorted(((start[w, s] + end[w, e], s, e) for s in range(p_len)
                        for e in range(s, min(s + max_len, p_len))
                        if valid_start[w, s] and valid_end[w, e]), reverse=True)[:n_best]
        got = [(scores[w, i], starts[w, i], ends[w, i]) for i in range(n_best)
               if np.isfinite(scores[w, i])]
        np.testing.assert_allclose([g[0] for g in got], [s[0] for s in spans], rtol=1e-6)
        assert [(g[1], g[2]) for g in got] == [(s[1], s[2]) for s in spans]
    assert (starts[3] == -1).all() and np.isneginf(scores[3]).all()


def _one_example(tokenizer, context: str, question: str = "Who?", **lengths):
    example = SquadExample("q", "t", context, question, (context.split()[0],), (0,))
    return [example], featurize([example], tokenizer, max_question_len=16, **lengths)


def _logits_at(features, window: int, start: int, end: int, value: float = 5.0):
    start_logits = np.zeros(features.p_ids.shape, np.float32)
    end_logits = np.zeros(features.p_ids.shape, np.float32)
    start_logits[window, start] = value
    end_logits[window, end] = value
    return start_logits, end_logits


def test_text_comes_from_the_original_context(tokenizer):
    context = "Café Müller's  Opening (1990s) drew CROWDS."
    examples, f = _one_example(tokenizer, context, max_passage_len=32, doc_stride=8)
    tokens = tokenizer.convert_ids_to_tokens(f.p_ids[0][:f.p_mask[0].sum()].tolist())
    assert tokens[0] == "cafe"  # the uncased tokenizer lowercases and strips accents
    start, end = _logits_at(f, 0, 0, tokens.index("opening"))
    prediction = decode_predictions(examples, f, start, end)["q"]
    assert prediction.text == "Café Müller's  Opening"  # casing, accents, spacing kept
    assert (prediction.char_start, prediction.char_end) == (0, len("Café Müller's  Opening"))


def test_spans_respect_max_context_and_max_answer_length(tokenizer):
    context = " ".join(f"w{i}" for i in range(30))
    examples, f = _one_example(tokenizer, context, max_passage_len=12, doc_stride=4)
    assert f.num_windows > 2
    # Token 1 of window 1 sits at its left edge: max-context in window 0, so not a start here.
    w, s = 1, 1
    assert not f.max_context[w, s]
    start, end = _logits_at(f, w, s, s + 1, value=50.0)
    prediction = decode_predictions(examples, f, start, end)["q"]
    assert prediction.window != w or prediction.char_start != f.offsets[w, s, 0]
    # Too long a span is never chosen.
    start, end = _logits_at(f, 0, 0, 8, value=50.0)
    prediction = decode_predictions(examples, f, start, end, max_answer_length=3)["q"]
    assert prediction.text.count(" ") <= 2


def test_best_window_and_null_threshold(tokenizer):
    context = "Alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi."
    examples, f = _one_example(tokenizer, context, max_passage_len=10, doc_stride=3)
    last = f.num_windows - 1
    s = int(np.nonzero(f.max_context[last])[0][-1])
    start, end = _logits_at(f, last, s, s, value=4.0)  # best span: score 8 in the last window
    null_start = np.zeros(f.num_windows, np.float32)
    null_end = np.zeros(f.num_windows, np.float32)
    null_start[0] = 6.0
    null_end[:] = 3.0  # null score = min over windows of (start + end) = 3
    predictions = decode_predictions(examples, f, start, end, null_start, null_end)
    best = predictions["q"]
    assert best.window == last and best.score == pytest.approx(8.0)
    assert best.null_score == pytest.approx(3.0) and best.text
    no_answer = decode_predictions(examples, f, start, end, null_start + 10, null_end,
                                   null_threshold=0.0)["q"]
    assert no_answer.text == "" and no_answer.null_score == pytest.approx(13.0)
    # null 13 - span 8 = 5: answered again with a threshold above 5.
    kept = decode_predictions(examples, f, start, end, null_start + 10, null_end,
                              null_threshold=5.5)["q"]
    assert kept.text == best.text
