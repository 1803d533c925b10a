"""Abstention: "no answer found in the corpus" when the picked answer's reader score is below a
threshold calibrated per reader on training questions (tools/abstention.py) and recorded in the
reader's manifest (`abstention`).

    choose_threshold   the threshold that maximises the decisions right on a calibration set
                       (answered and exact, or refused when the corpus lacks the answer)
    Abstention         a reader's thresholds (per span score rule, without / with the IR
                       score), read from its manifest
    exclude_titles     a retriever's hits without the passages of given articles: how an
                       out-of-corpus question is made from an in-corpus one

Why the reader score and not the fused one: fusion standardises the reader and BM25 scores over
one question's candidates, so the best fused score says how far the top candidate stands out
from the others, not whether any passage holds the answer; a question the corpus cannot answer
still has a best candidate standing out. The reader score is absolute (under `margin` it is the
span's score less the window's no-answer score, which the reader learnt on answer-less windows),
and it is the score of the answer picked with or without fusion.
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
            number = value[key]
            if isinstance(number, bool) or not isinstance(number, (int, float)) \
                    or not math.isfinite(number):
                return f"'{where}.{key}' must be a finite number, got {number!r:.80}"
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


@dataclasses.dataclass(frozen=True)
class Abstention:
    """A reader's thresholds: rule -> (without IR, with IR). A score below the rule's
    threshold means "no answer found in the corpus"."""

    thresholds: Mapping[str, tuple[float, float]]
    chosen_on: str = ""  # what the thresholds were chosen on (the calibration's description)

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
        thresholds = {rule: (float(value["threshold"]), float(value["threshold_ir"]))
                      for rule, value in record["by_rule"].items() if rule in SPAN_SCORES}
        return cls(thresholds, str(record.get("chosen_on", "")))

    def threshold(self, rule: str, fused: bool) -> float | None:
        """The threshold of `rule` (with the IR score fused or not), None if not calibrated."""
        pair = self.thresholds.get(rule)
        return None if pair is None else pair[1 if fused else 0]

    def refuses(self, score: float, rule: str, fused: bool) -> bool:
        threshold = self.threshold(rule, fused)
        return threshold is not None and score < threshold


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
