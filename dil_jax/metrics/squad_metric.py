"""The official SQuAD metric: exact match and token F1, v1.1 and v2.0.

Written from the behaviour of the official evaluation scripts, and reproducing them to the last
printed digit (tests check against the published scores):

- normalization (both): lowercase, drop ASCII punctuation, drop the words a/an/the, collapse
  whitespace;
- v1.1: a question's score is its best over the gold answers (duplicates included); F1 is 0 when
  nothing is shared; scores are summed in file order and reported as 100 * sum / total;
- v2.0: gold answers that normalize to "" are dropped and an unanswerable question's only gold is
  ""; F1 of an empty prediction or gold is 1 when both are empty, else 0; adds the HasAns_ and
  NoAns_ breakdown (exact, f1, total).

One deliberate difference: a question without a prediction scores 0 and counts in `total` in both
versions (v1.1 does this; v2.0 leaves it out of the overall total and fails on the breakdown);
`missing` then says how many.

Plain mappings in, no data loader: the gold answers are {question id: answer texts} in file
order (`dil_jax.data.squad.gold_answers` makes them from examples), predictions {question id:
answer text}.
"""

from __future__ import annotations

import math
import re
import string
from collections import Counter
from collections.abc import Mapping, Sequence

from dil_jax.errors import InputFileError, UsageError

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(text: str) -> str:
    """Lowercase, no punctuation, no articles, single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_score(prediction: str, gold: str) -> int:
    return int(normalize_answer(prediction) == normalize_answer(gold))


def f1_score_v1(prediction: str, gold: str) -> float:
    """v1.1 token F1: 0 when no token is shared (so also when either side is empty)."""
    return _f1(normalize_answer(prediction).split(), normalize_answer(gold).split())


def f1_score_v2(prediction: str, gold: str) -> float:
    """v2.0 token F1: an empty side scores 1 if both are empty, else 0."""
    pred_tokens = normalize_answer(prediction).split() if prediction else []
    gold_tokens = normalize_answer(gold).split() if gold else []
    if not pred_tokens or not gold_tokens:
        return int(pred_tokens == gold_tokens)
    return _f1(pred_tokens, gold_tokens)


def _f1(pred_tokens: list[str], gold_tokens: list[str]) -> float:
    shared = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if shared == 0:
        return 0
    precision = 1.0 * shared / len(pred_tokens)
    recall = 1.0 * shared / len(gold_tokens)
    return (2 * precision * recall) / (precision + recall)


def squad_scores(gold_answers: Mapping[str, Sequence[str]], predictions: Mapping[str, str],
                 version: str) -> dict[str, float | int]:
    """The official scores of `predictions` (qid -> answer text) against `gold_answers` (qid ->
    gold answer texts, in file order; none for an unanswerable v2.0 question).

    version: "1.1" or "2.0". v1.1 -> {exact, f1, total}; v2.0 -> also HasAns_exact/f1/total and
    NoAns_exact/f1/total (a breakdown only for kinds present). `missing` is added when
    predictions lack questions.
    """
    if version not in ("1.1", "2.0"):
        raise UsageError(f"version must be '1.1' or '2.0', got {version!r}")
    exact: list[int] = []
    f1: list[float] = []
    has_answer: list[bool] = []
    missing = 0
    for qid, golds in gold_answers.items():
        prediction = predictions.get(qid)
        has_answer.append(bool(golds))
        if prediction is None:
            missing += 1
            exact.append(0)
            f1.append(0)
            continue
        question_exact, question_f1 = question_scores(golds, prediction, version)
        exact.append(question_exact)
        f1.append(question_f1)
    result = _summary(exact, f1)
    if version == "2.0":
        for name, wanted in (("HasAns", True), ("NoAns", False)):
            rows = [i for i, flag in enumerate(has_answer) if flag == wanted]
            if rows:
                part = _summary([exact[i] for i in rows], [f1[i] for i in rows])
                result.update({f"{name}_{key}": value for key, value in part.items()})
    if missing:
        result["missing"] = missing
    return result


def question_scores(gold_texts: Sequence[str], prediction: str, version: str
                    ) -> tuple[int, float]:
    """(exact, F1) of one question's prediction: its best over the gold answers `gold_texts`.

    v2.0: gold answers that normalize to "" are dropped, and an unanswerable question's only
    gold is "" (so "" scores 1 there, anything else 0).
    """
    if version == "1.1":
        golds = list(gold_texts)
        score_f1 = f1_score_v1
    else:
        golds = [text for text in gold_texts if normalize_answer(text)] or [""]
        score_f1 = f1_score_v2
    return (max(exact_score(prediction, gold) for gold in golds),
            max(score_f1(prediction, gold) for gold in golds))


def best_null_threshold(gold_answers: Mapping[str, Sequence[str]],
                        span_answers: Mapping[str, str],
                        null_differences: Mapping[str, float]) -> tuple[float, float]:
    """(threshold, F1 in %) of the SQuAD v2.0 null threshold that maximises F1 on the questions
    of `gold_answers` (qid -> gold texts).

    span_answers: qid -> the best span's text, the answer when the question is not nulled;
    null_differences: qid -> null_score - best_span_score. A question answers "" when its
    difference > threshold (the rule of `dil_jax.data.decoding`).

    The official v2.0 script's `find_best_thresh`: start with every question answered "" (the
    F1 of the unanswerable ones), answer them in increasing order of difference, each adding
    F1(span) - F1(""), and keep the difference where the running F1 is highest (the first, i.e.
    lowest, such). Two deliberate differences: questions with EQUAL differences are answered
    together (no threshold separates them, so the official one-by-one sum can report an F1 that
    its threshold does not give), and when answering nothing is best the threshold is 1 below
    the smallest difference (the official 0.0 is a probability; a score difference of 0.0
    would answer some).
    """
    scored = [qid for qid in gold_answers if qid in null_differences]
    if not scored:
        raise UsageError("no questions with a null score difference to choose a threshold on")
    base = 0.0  # F1 sum with every question answered ""
    gains: list[tuple[float, float]] = []  # (difference, F1 gained by answering the span)
    for qid in scored:
        difference = float(null_differences[qid])
        if math.isnan(difference):
            raise UsageError(f"question {qid!r}: the null score difference is NaN")
        golds = gold_answers[qid]
        empty_f1 = question_scores(golds, "", "2.0")[1]
        base += empty_f1
        span_f1 = question_scores(golds, span_answers.get(qid, ""), "2.0")[1]
        gains.append((difference, span_f1 - empty_f1))
    gains.sort(key=lambda pair: pair[0])
    finite = [difference for difference, _ in gains if math.isfinite(difference)]
    threshold = min(finite) - 1.0 if finite else 0.0
    best = current = base
    for i, (difference, gain) in enumerate(gains):
        current += gain
        last_of_tie = i + 1 == len(gains) or gains[i + 1][0] != difference
        # A threshold of +inf would answer questions no span was allowed for: never chosen.
        if last_of_tie and math.isfinite(difference) and current > best:
            best, threshold = current, difference
    return threshold, 100.0 * best / len(scored)


def _summary(exact: list[int], f1: list[float]) -> dict[str, float | int]:
    """100 * sum / total, summing left to right in file order as the official scripts do."""
    total = len(exact)
    if total == 0:
        raise InputFileError("no questions to score (the SQuAD data holds none)")
    exact_sum = 0
    f1_sum = 0
    for e, f in zip(exact, f1):
        exact_sum += e
        f1_sum += f
    return {"exact": 100.0 * exact_sum / total, "f1": 100.0 * f1_sum / total, "total": total}
