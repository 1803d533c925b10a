"""Featurization for delayed interaction, and the gold-label round trip through the decoder."""

from __future__ import annotations

import collections
import errno
import time

import numpy as np
import pytest

from dil_jax.data import features as features_module
from dil_jax.data.decoding import answers, decode_predictions
from dil_jax.data.features import FeaturizationError, featurize
from dil_jax.data.squad import SquadExample
from dil_jax.metrics.squad_metric import squad_scores

from tests.helpers.squad import P_LEN, Q_LEN, STRIDE, explain_failures, gold_logits


@pytest.fixture(scope="module")
def v11_features(tokenizer, v11):
    featurize(v11.examples[:50], tokenizer)  # warm the tokenizer before timing
    # CPU seconds of this process (all its threads), not wall time: on a shared machine other
    # processes stretch wall time without limit (x9 measured under a load of 10 on 2 cores).
    # The limit catches an algorithmic regression (e.g. windows quadratic in passage length):
    # the file takes ~1 CPU second on an AMD EPYC, so 30 leaves room for slower CPUs.
    started = time.process_time()
    features = featurize(v11.examples, tokenizer, max_question_len=Q_LEN,
                         max_passage_len=P_LEN, doc_stride=STRIDE)
    seconds = time.process_time() - started
    print(f"\nfeaturized {features.num_questions} questions into {features.num_windows} windows "
          f"({len(np.unique(features.window_passage_index))} distinct) in {seconds:.2f} CPU s")
    assert seconds < 30, (f"featurizing the v1.1 file took {seconds:.1f} CPU s; "
                          f"it must take seconds")
    return features


def test_layout_of_the_shared_v11_features(tokenizer, v11, v11_features):
    f = v11_features
    n_q, n_w = f.num_questions, f.num_windows
    assert f.q_ids.shape == (n_q, Q_LEN) == (6013, Q_LEN) and f.p_ids.shape == (n_w, P_LEN)
    assert f.offsets.shape == (n_w, P_LEN, 2) and f.max_context.shape == (n_w, P_LEN)
    assert (f.q_ids[:, 0] == tokenizer.cls_token_id).all()
    q_len = f.q_mask.sum(1)
    assert (f.q_ids[np.arange(n_q), q_len - 1] == tokenizer.sep_token_id).all()
    p_len = f.p_mask.sum(1)
    assert (f.p_ids[np.arange(n_w), p_len - 1] == tokenizer.sep_token_id).all()
    # Offsets exactly on the context tokens; [SEP] and padding have none and are never max-context.
    is_token = np.arange(P_LEN)[None, :] < (p_len - 1)[:, None]
    assert ((f.offsets[..., 0] >= 0) == is_token).all()
    assert not (f.max_context & ~is_token).any()
    # Each context token is max-context in exactly one window of its example.
    for i in (0, 100, 2000):
        rows = np.nonzero(f.example_index == i)[0]
        counts = collections.Counter(
            t for w in rows for t in (f.window_start[w] + np.nonzero(f.max_context[w])[0]))
        assert set(counts.values()) == {1}
    # Windows depend on the context only: same passage index, same ids; indices per example.
    assert (np.diff(f.example_index) >= 0).all()
    _, first = np.unique(f.window_passage_index, return_index=True)
    assert (f.p_ids == f.p_ids[first][np.searchsorted(np.unique(f.window_passage_index),
                                                      f.window_passage_index)]).all()
    same_context = [i for i in range(1, 6) if v11.examples[i].context == v11.examples[0].context]
    assert same_context, "the first paragraph has several questions"
    for i in same_context:
        assert (f.window_passage_index[f.example_index == i]
                == f.window_passage_index[f.example_index == 0]).all()


def test_gold_labels_round_trip_through_the_decoder(tokenizer, v11, v11_features):
    start, end = gold_logits(v11_features)
    predicted = answers(decode_predictions(v11.examples, v11_features, start, end,
                                           max_answer_length=64))
    scores = squad_scores(v11.gold_answers, predicted, v11.version)
    print(f"\nround trip (answers realigned to token boundaries): {scores}")
    reasons = explain_failures(v11.examples, v11_features, predicted)
    print(f"  failures by reason: {dict(reasons)}")
    assert scores["exact"] >= 99.5 and scores["f1"] >= 99.8

    # Without realignment, answer_start as given: this file's starts are each text's first
    # occurrence in its paragraph ("4" inside "1864"), so more labels land on the wrong words.
    raw = featurize(v11.examples, tokenizer, max_question_len=Q_LEN, max_passage_len=P_LEN,
                    doc_stride=STRIDE, realign_answers=False)
    start, end = gold_logits(raw)
    predicted = answers(decode_predictions(v11.examples, raw, start, end, max_answer_length=64))
    raw_scores = squad_scores(v11.gold_answers, predicted, v11.version)
    print(f"round trip with answer_start as given: {raw_scores}")
    reasons = explain_failures(v11.examples, raw, predicted)
    print(f"  failures by reason: {dict(reasons)}")
    assert raw_scores["exact"] >= 99.5


# ----------------------------------------------------------------------------- small cases


def _bert_windows(n_tokens: int, window: int, stride: int) -> list[tuple[int, int]]:
    """Google BERT's run_squad doc spans: (start, length)."""
    spans, start = [], 0
    while start < n_tokens:
        length = min(n_tokens - start, window)
        spans.append((start, length))
        if start + length == n_tokens:
            break
        start += min(length, stride)
    return spans


def _bert_is_max_context(spans, span_index: int, position: int) -> bool:
    best_score, best_index = None, None
    for index, (start, length) in enumerate(spans):
        end = start + length - 1
        if position < start or position > end:
            continue
        score = min(position - start, end - position) + 0.01 * length
        if best_score is None or score > best_score:
            best_score, best_index = score, index
    return span_index == best_index


@pytest.mark.parametrize("p_len,stride", [(8, 3), (8, 7), (6, 1), (40, 10)])
def test_windows_and_max_context_match_bert(tokenizer, p_len, stride):
    context = ("Tesla was born in 1856 in Smiljan, then part of the Austrian Empire, and died "
               "in New York City in 1943.")
    n_tokens = len(tokenizer(context, add_special_tokens=False)["input_ids"])
    examples = [SquadExample("a", "t", context, "When was Tesla born?", ("1856",), (18,)),
                SquadExample("b", "t", context, "Where did he die?", ("New York City",),
                             (context.index("New York"),))]
    f = featurize(examples, tokenizer, max_question_len=16, max_passage_len=p_len,
                  doc_stride=stride)
    spans = _bert_windows(n_tokens, p_len - 1, stride)
    rows = np.nonzero(f.example_index == 0)[0]
    assert [(f.window_start[w], f.p_mask[w].sum() - 1) for w in rows] == spans
    for i, w in enumerate(rows):
        start, length = spans[i]
        expected = [_bert_is_max_context(spans, i, start + j) for j in range(length)]
        assert f.max_context[w, :length].tolist() == expected
    # A label only where the window holds the whole answer, and it points at the answer.
    for w in range(f.num_windows):
        example = examples[f.example_index[w]]
        s, e = f.start_positions[w], f.end_positions[w]
        if s >= 0:
            assert example.context[f.offsets[w, s, 0]:f.offsets[w, e, 1]] == \
                example.answer_texts[0]
    # "New York City" gets a label in exactly the windows that hold all its tokens.
    encoded = tokenizer(context, add_special_tokens=False, return_offsets_mapping=True)
    answer = [t for t, (a, b) in enumerate(encoded["offset_mapping"])
              if a < context.index("New York") + len("New York City") and
              b > context.index("New York")]
    holds = [start <= answer[0] and answer[-1] < start + length for start, length in spans]
    assert (f.start_positions[f.example_index == 1] >= 0).tolist() == holds


def test_unanswerable_and_misaligned_answers(tokenizer):
    context = "Rates of inequality rose; equality fell."
    examples = [
        SquadExample("none", "t", context, "What fell?", (), (), is_impossible=True),
        # answer_start at the first occurrence, inside "inequality"; the word stands at 26.
        SquadExample("mid", "t", context, "What fell?", ("equality",), (11,)),
    ]
    f = featurize(examples, tokenizer, max_question_len=16, max_passage_len=32, doc_stride=8)
    assert f.start_positions[f.example_index == 0].tolist() == [-1]
    w = np.nonzero(f.example_index == 1)[0][0]
    assert context[f.offsets[w, f.start_positions[w], 0]:f.offsets[w, f.end_positions[w], 1]] \
        == "equality"
    raw = featurize(examples, tokenizer, max_question_len=16, max_passage_len=32, doc_stride=8,
                    realign_answers=False)
    w = np.nonzero(raw.example_index == 1)[0][0]
    assert context[raw.offsets[w, raw.start_positions[w], 0]:
                   raw.offsets[w, raw.end_positions[w], 1]] == "inequality"


def test_bad_lengths_are_refused(tokenizer):
    example = [SquadExample("a", "t", "x y", "q?", ("x",), (0,))]
    with pytest.raises(FeaturizationError, match="doc_stride must be in 1..7"):
        featurize(example, tokenizer, max_passage_len=8, doc_stride=8)
    with pytest.raises(FeaturizationError, match="max_passage_len must be >= 2"):
        featurize(example, tokenizer, max_passage_len=1, doc_stride=1)


def test_cache_is_reused_atomic_and_keyed(tokenizer, v11, tmp_path, monkeypatch):
    examples = v11.examples[:40]
    first = featurize(examples, tokenizer, max_passage_len=64, doc_stride=32,
                      cache_dir=tmp_path)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert len(files) == 1 and files[0].startswith("squad-features-")  # no temporary left

    def fail(*args, **kwargs):
        raise AssertionError("featurized again instead of reading the cache")

    monkeypatch.setattr(features_module, "_featurize", fail)
    cached = featurize(examples, tokenizer, max_passage_len=64, doc_stride=32,
                       cache_dir=tmp_path)
    for name, value in first.arrays().items():
        np.testing.assert_array_equal(getattr(cached, name), value, err_msg=name)
    monkeypatch.undo()
    featurize(examples, tokenizer, max_passage_len=64, doc_stride=16, cache_dir=tmp_path)
    changed = [SquadExample(e.qid, e.title, e.context, e.question + " really?", e.answer_texts,
                            e.answer_starts) for e in examples]
    featurize(changed, tokenizer, max_passage_len=64, doc_stride=32, cache_dir=tmp_path)
    assert len(list(tmp_path.iterdir())) == 3
    # A damaged cache file is ignored and rewritten.
    (tmp_path / files[0]).write_bytes(b"not an npz")
    again = featurize(examples, tokenizer, max_passage_len=64, doc_stride=32, cache_dir=tmp_path)
    np.testing.assert_array_equal(again.p_ids, first.p_ids)


@pytest.mark.parametrize("number", [errno.EROFS, errno.EFBIG, errno.ENOSPC])
def test_a_cache_folder_that_refuses_the_write_is_a_warning(tokenizer, v11, tmp_path,
                                                            monkeypatch, caplog, number):
    """A read-only --cache-dir, a file-size limit (ulimit -f) or a full disk ended predict in
    an OSError traceback; the cache only saves the next run's work, so the run goes on."""
    import logging
    import os

    def refuse(path, data):
        raise OSError(number, os.strerror(number), str(path))

    monkeypatch.setattr(features_module, "write_atomic", refuse)
    examples = v11.examples[:5]
    with caplog.at_level(logging.WARNING, logger="dil_jax.data.features"):
        cached = featurize(examples, tokenizer, max_passage_len=64, doc_stride=32,
                           cache_dir=tmp_path)
    plain = featurize(examples, tokenizer, max_passage_len=64, doc_stride=32)
    np.testing.assert_array_equal(cached.p_ids, plain.p_ids)
    assert f"features not cached: cannot write {tmp_path}" in caplog.text
    assert f"({os.strerror(number)}, {errno.errorcode[number]})" in caplog.text


def test_cache_key_ignores_the_tokenizers_call_state(tokenizer, v11):
    """A fast tokenizer keeps the truncation/padding of its last call in its definition; the
    features file's name must not change with it (else a cache written before a call is never
    found after it), while the vocabulary still keys it."""
    examples = v11.examples[:3]
    before = features_module.cache_key(examples, tokenizer, 32, 64, 32)
    tokenizer("a question", "a passage", truncation="only_second", max_length=20,
              padding="max_length")
    assert features_module.cache_key(examples, tokenizer, 32, 64, 32) == before
    assert features_module.tokenizer_identity(tokenizer) != repr(sorted(tokenizer.get_vocab()))
