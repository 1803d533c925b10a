"""Abstention: "no answer found in the corpus" when the picked answer's reader score is below a
threshold calibrated per reader on training questions (tools/abstention.py) and recorded in the
reader's manifest (`abstention`); or, where the record holds one, when a logistic rule over the
reader score and the retrieval match (how well BM25 matched the question at all) gives a
probability that the answer is right below its threshold.

    choose_threshold   the threshold that maximises the decisions right on a calibration set
                       (answered and exact, or refused when the corpus lacks the answer)
    retrieval_match    the best BM25 score over the question's attainable one, in [0, 1)
    fit_logistic       a penalised logistic regression (Newton's method, numpy only)
    choose_combined    the logistic rule of (reader score, retrieval match) and its
                       probability threshold, fitted on a calibration set
    Abstention         a reader's thresholds and rules (per span score rule, without / with
                       the IR score), read from its manifest; `decide` says what decided
    exclude_titles     a retriever's hits without the passages of given articles: how an
                       out-of-corpus question is made from an in-corpus one

Why the reader score and not the fused one: fusion standardises the reader and BM25 scores over
one question's candidates, so the best fused score says how far the top candidate stands out
from the others, not whether any passage holds the answer; a question the corpus cannot answer
still has a best candidate standing out. The reader score is absolute (under `margin` it is the
span's score less the window's no-answer score, which the reader learnt on answer-less windows),
and it is the score of the answer picked with or without fusion.

Why the retrieval match too: a delayed reader's score separates answerable questions from
the others weakly (a confident wrong span is common), and it does not see the corpus as a whole.
BM25 does: when the corpus lacks the question's topic, the best passage shares only its common
words. The best BM25 score alone is not comparable across questions (it grows with the number
and rarity of their words), so it is divided by what the question could attain
(`Retriever.attainable`: idf x (k1 + 1) summed over its terms, a term the corpus lacks at its
largest idf), computed from each engine's own document frequencies and idf, so rank-bm25, bm25s
and Lucene each give it on their own scale.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dil_jax.defaults import SPAN_SCORES
from dil_jax.errors import CheckpointError

MANIFEST_KEY = "abstention"
# A rule's fields in the manifest (`by_rule.<rule>.combined` and `.combined_ir`).
RULE_FIELDS = ("bias", "reader_score", "retrieval_match", "probability")
_FIX = ("re-run tools/abstention.py calibrate --record, or remove the 'abstention' record to "
        "serve every answer as an answer")


def _record_problem(record: Any) -> str | None:
    """What is wrong with a manifest's `abstention` record (the field path and value), or
    None. A threshold is a finite JSON number: NaN refuses nothing and compares false with
    every score, an infinity refuses all or nothing, and neither is JSON a service can send."""
    if not isinstance(record, Mapping):
        return f"'{MANIFEST_KEY}' must be an object, got {record!r:.80}"
    by_rule = record.get("by_rule")
    if not isinstance(by_rule, Mapping):
        return (f"'{MANIFEST_KEY}.by_rule' must be an object of span score rule -> "
                f"thresholds, got {by_rule!r:.80}")
    for rule, value in by_rule.items():
        where = f"{MANIFEST_KEY}.by_rule.{rule}"
        if not isinstance(value, Mapping):
            return f"'{where}' must be an object with threshold and threshold_ir, got " \
                   f"{value!r:.80}"
        for key in ("threshold", "threshold_ir"):
            if key not in value:
                return f"'{where}.{key}' is missing"
            problem = _number_problem(f"{where}.{key}", value[key])
            if problem:
                return problem
        problem = _combined_problem(where, value)
        if problem:
            return problem
    return None


def _number_problem(where: str, number: Any) -> str | None:
    if isinstance(number, bool) or not isinstance(number, (int, float)) \
            or not math.isfinite(number):
        return f"'{where}' must be a finite number, got {number!r:.80}"
    return None


def _combined_problem(where: str, value: Mapping) -> str | None:
    """What is wrong with a rule's `combined` / `combined_ir` records (both or neither; each
    an object of RULE_FIELDS, finite numbers, the probability within [0, 1]), or None."""
    present = [key for key in ("combined", "combined_ir") if key in value]
    if not present:
        return None
    for key in ("combined", "combined_ir"):
        if key not in value:
            return f"'{where}.{key}' is missing (it goes with '{where}.{present[0]}')"
        rule = value[key]
        if not isinstance(rule, Mapping):
            return f"'{where}.{key}' must be an object with {', '.join(RULE_FIELDS)}, got " \
                   f"{rule!r:.80}"
        for field in RULE_FIELDS:
            if field not in rule:
                return f"'{where}.{key}.{field}' is missing"
            problem = _number_problem(f"{where}.{key}.{field}", rule[field])
            if problem:
                return problem
        if not 0.0 <= rule["probability"] <= 1.0:
            return f"'{where}.{key}.probability' must be within [0, 1], got " \
                   f"{rule['probability']!r}"
    return None


@dataclasses.dataclass(frozen=True)
class ThresholdChoice:
    """A threshold and what it does on the calibration set it was chosen on (fractions)."""

    threshold: float         # answer when score >= threshold
    accuracy: float          # right decisions: answered and exact, or refused out of corpus
    coverage: float          # in-corpus questions answered
    answered_exact: float    # exact among the answered in-corpus questions
    refused_out: float       # out-of-corpus questions refused


def choose_threshold(in_scores: Sequence[float | None], in_exact: Sequence[float],
                     out_scores: Sequence[float | None]) -> ThresholdChoice:
    """The threshold maximising right decisions over in-corpus questions (right: answered with
    an exact answer) and out-of-corpus ones (right: refused), the lowest on ties (answer more).

    in_scores / out_scores: the picked answer's reader score per question (None: no candidate,
    always refused); in_exact: 1.0 when the picked answer is exact, else 0.0. Candidate
    thresholds are every observed score and +inf (refuse all); -inf answers all.
    """
    if len(in_scores) != len(in_exact):
        raise ValueError(f"{len(in_scores)} in-corpus scores but {len(in_exact)} exact flags")
    if not in_scores or not out_scores:
        raise ValueError("choosing a threshold needs in-corpus and out-of-corpus questions")
    scores_in = np.asarray([-np.inf if s is None else s for s in in_scores], np.float64)
    scores_out = np.asarray([-np.inf if s is None else s for s in out_scores], np.float64)
    exact = np.asarray(in_exact, np.float64)
    answerable = scores_in > -np.inf
    candidates = np.unique(np.concatenate([scores_in, scores_out, [np.inf]]))
    candidates = candidates[candidates > -np.inf]
    best: ThresholdChoice | None = None
    total = len(scores_in) + len(scores_out)
    for threshold in [-np.inf, *candidates]:
        answered = answerable & (scores_in >= threshold)
        refused_out = ~(scores_out >= threshold) | (scores_out == -np.inf)
        right = float(exact[answered].sum() + refused_out.sum())
        choice = ThresholdChoice(
            threshold=float(threshold), accuracy=right / total,
            coverage=float(answered.mean()),
            answered_exact=float(exact[answered].mean()) if answered.any() else 0.0,
            refused_out=float(refused_out.mean()))
        if best is None or choice.accuracy > best.accuracy:
            best = choice
    return best


def retrieval_match(hits: Sequence, attainable: float) -> float:
    """How well BM25 matched the question at all: the best hit's score (`hits` best first)
    over the question's `attainable` score (`Retriever.attainable`), in [0, 1); 0 without a
    hit or an attainable score."""
    if not hits or attainable <= 0:
        return 0.0
    return float(hits[0].score) / attainable


def sigmoid(x: np.ndarray | float) -> np.ndarray:
    """1 / (1 + exp(-x)), without overflow."""
    return 0.5 * (1.0 + np.tanh(0.5 * np.asarray(x, np.float64)))


@dataclasses.dataclass(frozen=True)
class LogisticFit:
    """log(p / (1 - p)) = bias + weights . features, on the features' own scale."""

    bias: float
    weights: tuple[float, ...]


def fit_logistic(features: np.ndarray, labels: np.ndarray, l2: float = 1.0,
                 iterations: int = 100) -> LogisticFit:
    """The logistic regression of `labels` (0/1) on `features` [n, d]: the coefficients
    minimising the summed log loss plus l2 / 2 x |weights|^2 on standardised features (the
    bias unpenalised; l2 = 1 is scikit-learn's default C = 1), by Newton's method (IRLS),
    returned on the features' own scale. With l2 = 0 it is the maximum likelihood fit, which
    exists only when the classes overlap; l2 > 0 keeps separable data finite.

    ValueError: labels of one class only, or no convergence within `iterations`."""
    x = np.asarray(features, np.float64)
    y = np.asarray(labels, np.float64)
    if x.ndim != 2 or len(x) != len(y):
        raise ValueError(f"features {x.shape} and labels {y.shape} do not match")
    if not (y.min(initial=1) == 0 and y.max(initial=0) == 1):
        raise ValueError("fitting a logistic rule needs labels of both classes (right and "
                         "wrong answers)")
    mean, scale = x.mean(axis=0), x.std(axis=0)
    scale[scale == 0] = 1.0
    design = np.column_stack([np.ones(len(x)), (x - mean) / scale])
    penalty = np.diag([0.0] + [l2] * x.shape[1])
    w = np.zeros(design.shape[1])
    for _ in range(iterations):
        p = sigmoid(design @ w)
        gradient = design.T @ (p - y) + penalty @ w
        hessian = design.T @ (design * (p * (1 - p))[:, None]) + penalty
        step = np.linalg.solve(hessian, gradient)
        w = w - step
        if np.max(np.abs(step)) < 1e-10:
            weights = w[1:] / scale
            return LogisticFit(float(w[0] - np.sum(weights * mean)),
                               tuple(float(v) for v in weights))
    raise ValueError(f"the logistic fit did not converge in {iterations} Newton steps")


@dataclasses.dataclass(frozen=True)
class LogisticRule:
    """Refuse when the probability that the answer is right, sigmoid(bias + reader_score x
    score + retrieval_match x match), is below `probability`."""

    bias: float
    reader_score: float       # weight of the picked answer's reader score
    retrieval_match: float    # weight of `retrieval_match`
    probability: float        # answer when the probability >= this

    def probability_of(self, score: float, match: float) -> float:
        return float(sigmoid(self.bias + self.reader_score * score
                             + self.retrieval_match * match))

    def to_json(self) -> dict[str, float]:
        return dataclasses.asdict(self)


def choose_combined(in_features: Sequence[tuple[float, float] | None],
                    in_exact: Sequence[float],
                    out_features: Sequence[tuple[float, float] | None],
                    l2: float = 1.0) -> tuple[LogisticRule, ThresholdChoice]:
    """The logistic rule of (reader score, retrieval match) fitted to "the answer shown is
    right" (an in-corpus question's exact answer: 1; an inexact one or any out-of-corpus
    question: 0), with the probability threshold maximising right decisions
    (`choose_threshold` over the probabilities). None: no candidate (always refused, left
    out of the fit)."""
    if len(in_features) != len(in_exact):
        raise ValueError(f"{len(in_features)} in-corpus features but {len(in_exact)} exact "
                         "flags")
    rows = [(f, e) for f, e in zip(in_features, in_exact, strict=True) if f is not None] \
        + [(f, 0.0) for f in out_features if f is not None]
    if not rows:
        raise ValueError("fitting a logistic rule needs questions with a candidate answer")
    fit = fit_logistic(np.asarray([f for f, _ in rows]), np.asarray([e for _, e in rows]), l2)
    rule = LogisticRule(fit.bias, *fit.weights, probability=0.0)

    def probabilities(features):
        return [None if f is None else rule.probability_of(*f) for f in features]

    choice = choose_threshold(probabilities(in_features), in_exact, probabilities(out_features))
    return dataclasses.replace(rule, probability=choice.threshold), choice


@dataclasses.dataclass(frozen=True)
class Decision:
    """Whether an answer is refused and the numbers that decided: the reader score against
    `threshold` (today's rule), or with a logistic rule the retrieval match too and the
    probability against `probability_threshold` (then `threshold` is None)."""

    refused: bool
    reader_score: float
    threshold: float | None = None
    retrieval_match: float | None = None
    probability: float | None = None
    probability_threshold: float | None = None


@dataclasses.dataclass(frozen=True)
class Abstention:
    """A reader's thresholds: rule -> (without IR, with IR). A score below the rule's
    threshold means "no answer found in the corpus". combined: rule -> (without IR, with IR)
    logistic rules over the reader score and the retrieval match, which decide instead where
    the manifest holds them."""

    thresholds: Mapping[str, tuple[float, float]]
    chosen_on: str = ""  # what the thresholds were chosen on (the calibration's description)
    combined: Mapping[str, tuple[LogisticRule, LogisticRule]] = dataclasses.field(
        default_factory=dict)

    @classmethod
    def from_manifest(cls, manifest: Mapping[str, Any] | None,
                      path: Path | str = "dil_jax_manifest.json") -> Abstention | None:
        """The manifest's `abstention` record, or None when the reader has none; a record
        that cannot be read is a CheckpointError naming `path` (the manifest file), the field
        and its value."""
        record = (manifest or {}).get(MANIFEST_KEY)
        if record is None or (isinstance(record, Mapping) and not record):
            return None
        problem = _record_problem(record)
        if problem:
            raise CheckpointError(f"{path}: {problem}; {_FIX}")
        by_rule = {rule: value for rule, value in record["by_rule"].items()
                   if rule in SPAN_SCORES}
        thresholds = {rule: (float(value["threshold"]), float(value["threshold_ir"]))
                      for rule, value in by_rule.items()}
        combined = {rule: tuple(LogisticRule(**{f: float(value[key][f]) for f in RULE_FIELDS})
                                for key in ("combined", "combined_ir"))
                    for rule, value in by_rule.items() if "combined" in value}
        return cls(thresholds, str(record.get("chosen_on", "")), combined)

    def threshold(self, rule: str, fused: bool) -> float | None:
        """The threshold of `rule` (with the IR score fused or not), None if not calibrated."""
        pair = self.thresholds.get(rule)
        return None if pair is None else pair[1 if fused else 0]

    def refuses(self, score: float, rule: str, fused: bool) -> bool:
        threshold = self.threshold(rule, fused)
        return threshold is not None and score < threshold

    def logistic(self, rule: str, fused: bool) -> LogisticRule | None:
        """The logistic rule of `rule` (with the IR score fused or not), None if not fitted."""
        pair = self.combined.get(rule)
        return None if pair is None else pair[1 if fused else 0]

    def uses_retrieval(self, rule: str, fused: bool) -> bool:
        """Whether `decide` needs the retrieval match (a logistic rule is recorded)."""
        return self.logistic(rule, fused) is not None

    def decide(self, score: float, rule: str, fused: bool, match: float | None) -> Decision:
        """Whether the answer of reader score `score` is refused: by the logistic rule when
        there is one and the retrieval `match` is given, else by the threshold (none: never)."""
        logistic = self.logistic(rule, fused)
        if logistic is not None and match is not None:
            probability = logistic.probability_of(score, match)
            return Decision(probability < logistic.probability, score, None, match,
                            probability, logistic.probability)
        return Decision(self.refuses(score, rule, fused), score, self.threshold(rule, fused))


def normalized_title(title: str) -> str:
    """SQuAD's "Super_Bowl_50" and a Wikipedia lead's "Super Bowl 50" alike."""
    return " ".join(title.replace("_", " ").lower().split())


def exclude_titles(hits: Sequence, passage_titles: Sequence[str], excluded: set[str],
                   top_p: int) -> list:
    """The first `top_p` of `hits` (best first) whose passage's normalised title is not in
    `excluded` (normalised titles). passage_titles: every index passage's title."""
    kept = [hit for hit in hits
            if normalized_title(passage_titles[hit.passage_index]) not in excluded]
    return kept[:top_p]


def abstention_of(checkpoint: str | None) -> Abstention | None:
    """The abstention thresholds recorded in a reader folder's manifest (None: not a folder,
    no manifest, or no record: every answer is shown as an answer); CheckpointError naming
    the manifest and the field when the record cannot be read."""
    from dil_jax.checkpoints import MANIFEST_FILE, ExportManifest

    if not checkpoint or not (Path(checkpoint) / MANIFEST_FILE).is_file():
        return None
    return Abstention.from_manifest(ExportManifest.read(checkpoint).to_json(),
                                    Path(checkpoint) / MANIFEST_FILE)
