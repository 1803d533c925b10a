"""Window pruning: read fewer (question, window) pairs, decided before their upper blocks run.

The open-domain reader's answer is `pick_answer` over a question's top-p candidates, one per
retrieved passage. With fusion it maximises mu * z(r) + (1 - mu) * z(b), z standardising the
reader scores r and the BM25 scores b over all the candidates: an unread passage moves every
z, so no candidate can be dropped blindly, and r is a logit with no per-window bound known
before the upper blocks run. What does hold:

- **A bound on every reader score** (`span_head_bounds`). The span head of a post-LayerNorm
  transformer reads a LayerNorm output, whose normalised vector sums to 0 and has norm at most
  sqrt(hidden); so every start and end logit lies in a fixed interval of the reader's weights
  (`layer_norm_logit_bounds`), and so does any reader score (`reader_score_bounds`).
- **An answer that no unread passage can change** (`answer_settled`). The fused ranking is the
  ranking by r + t b for one t >= 0 that depends on the std of all r; given the read scores
  and the bounds, t lies in a known interval. A read candidate that beats every other read one
  and the best an unread one could reach (r at the bound, the highest unread b) at both ends
  of that interval is the answer of the full read, whatever the unread passages score.

`WindowPruning` reads each question's passages in BM25 order, round by round (`stage` first,
then at least doubling: `dil_jax.open_domain.reader.round_depths`), and stops a question once
its answer is settled
(the reader's `_read_until_settled`). With the bound it is exact: the answer (text, passage,
reader score) is that of reading every window, for the span score rule and fusion weight it was
settled for; a candidate list holds the read passages only. With `high` in place of the bound
("stop:H", an assumption calibrated on questions outside the validation set, not a bound) it
stops sooner and may differ. Without fusion no read candidate can beat an unread one's bound,
so the exact stop reads every window.

What it saves, measured: docs/open_domain.md, "Window pruning" (benchmarks/window_pruning.py;
docs/results/window_pruning_log.md).

An H belongs to a reader, a span score rule, a fusion weight and a depth: a reader's calibrated
H are recorded in its manifest (`PruningCalibration`, the `window_pruning` record beside the
abstention thresholds), and --prune-windows calibrated (`CALIBRATED`, serve's default) reads
with the recorded stop:H where it covers the read, else with the exact stop (`resolve_pruning`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from dil_jax.errors import DilJaxError

if TYPE_CHECKING:
    from dil_jax.readers.protocol import Reader

# Added to the bounds, as a share of their half-width: the span head runs in the reader's compute
# dtype, whose rounding (bfloat16: 2^-8 relative) may step past the real-number bound.
BOUND_ROUNDING = 0.01


class WindowPruningError(DilJaxError, ValueError):
    """A window pruning setting that is malformed, or that this reader cannot use."""


@dataclasses.dataclass(frozen=True)
class WindowPruning:
    """Which windows of a question's retrieved passages the upper blocks read.

    Read the passages in BM25 order, `stage` passages a question first, then at least doubling
    the depth each round (`round_depths`), and stop once the answer is settled
    (`answer_settled`) for the fusion weight `mu` (None: the reader alone).
    high: None, the reader's own bound on any reader score (exact); else the reader score no
    unread passage is assumed to exceed (approximate; calibrated: docs/open_domain.md).
    """

    high: float | None = None
    stage: int = 1
    mu: float | None = 0.5

    def __post_init__(self) -> None:
        if self.stage < 1:
            raise WindowPruningError(f"stage {self.stage}: read at least 1 passage a round")
        if self.high is not None and not np.isfinite(self.high):
            raise WindowPruningError(f"high {self.high}: must be a finite reader score")
        if self.mu is not None and not 0 <= self.mu <= 1:
            raise WindowPruningError(f"mu {self.mu}: must be in [0, 1] (or None)")

    @property
    def exact(self) -> bool:
        """Whether the answer is that of reading every window (the bound, not an assumption)."""
        return self.high is None

    @property
    def label(self) -> str:
        """As the flag takes it: "stop" or "stop:H"."""
        return "stop" if self.high is None else f"stop:{self.high:g}"

    @classmethod
    def parse(cls, text: str, mu: float | None = 0.5) -> WindowPruning | None:
        """--prune-windows's value: "all" (None: every window), "stop" (exact) or "stop:H"
        (H a finite reader score). Raises WindowPruningError naming what it takes."""
        wanted = ("'all' (every window), 'stop' (exact early stop) or 'stop:H' (stop assuming no "
                  "unread passage scores above the reader score H, e.g. stop:5)")
        name, _, value = text.strip().partition(":")
        if name == "all" and not value:
            return None
        if name != "stop":
            raise WindowPruningError(f"{text!r}: expected {wanted}")
        if not value:
            return cls(mu=mu)
        try:
            high = float(value)
        except ValueError:
            raise WindowPruningError(f"{text!r}: H must be a number; expected {wanted}") from None
        if not np.isfinite(high):
            raise WindowPruningError(f"{text!r}: H must be finite; expected {wanted}")
        return cls(high=high, mu=mu)

    def with_mu(self, mu: float | None) -> WindowPruning:
        """The same pruning settled for another fusion weight."""
        return dataclasses.replace(self, mu=mu)


@dataclasses.dataclass(frozen=True)
class Calibrated:
    """--prune-windows calibrated: each reader's own setting (`resolve_pruning`), the stop:H
    recorded in its manifest for the span score rule, fusion weight and depth it reads with,
    else the exact stop, else every window (a reader that cannot prune)."""

    label: str = "calibrated"


CALIBRATED = Calibrated()
# What --prune-windows takes: every window (None), a pruning, or each reader's calibrated one.
PruningSetting = WindowPruning | Calibrated | None


def parse_setting(text: str) -> PruningSetting:
    """--prune-windows's value: `WindowPruning.parse`'s, or "calibrated" (`CALIBRATED`).
    Raises WindowPruningError naming what it takes."""
    if text.strip() == CALIBRATED.label:
        return CALIBRATED
    try:
        return WindowPruning.parse(text)
    except WindowPruningError as error:
        raise WindowPruningError(f"{error}, or 'calibrated' (each reader's recorded stop:H, "
                                 "else stop)") from None


def layer_norm_logit_bounds(scale: np.ndarray, bias: np.ndarray, kernel: np.ndarray,
                            head_bias: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(lowest, highest) [outputs] that a linear head (kernel [hidden, outputs], head_bias
    [outputs]) can output on a LayerNorm's output (scale, bias [hidden]), whatever its input.

    Why it is a bound: LayerNorm's normalised vector n = (x - mean(x)) / sqrt(var(x) + eps) sums
    to 0 and has |n|^2 = hidden * var / (var + eps) <= hidden. The head outputs
    w.(scale * n + bias) + b = (w * scale).n + w.bias + b, and over every such n the dot product
    (w * scale).n lies within +-sqrt(hidden) |c|, c the centred w * scale (n sums to 0, so only
    c's part counts; Cauchy-Schwarz). Real-number arithmetic: `span_head_bounds` widens it.
    """
    scale, bias = np.asarray(scale, np.float64), np.asarray(bias, np.float64)
    kernel, head_bias = np.asarray(kernel, np.float64), np.asarray(head_bias, np.float64)
    weighted = kernel * scale[:, None]                                  # [hidden, outputs]
    centred = weighted - weighted.mean(axis=0, keepdims=True)
    reach = np.sqrt(len(scale)) * np.linalg.norm(centred, axis=0)
    middle = kernel.T @ bias + head_bias
    return middle - reach, middle + reach


def span_head_bounds(reader: Reader) -> tuple[np.ndarray, np.ndarray]:
    """(lowest, highest) [2] (start, end) logits the reader's span head can output on any input,
    widened by BOUND_ROUNDING. Raises WindowPruningError for a reader whose span head does not
    read a LayerNorm output it can find (not the BERT family, or XLNet)."""
    from dil_jax.model.bert import param_block_of_layer

    config = reader.config
    if reader.kind != "encoder" or config.architecture == "xlnet":
        raise WindowPruningError(
            f"window pruning bounds the span head's logits by the LayerNorm it reads, which a "
            f"{config.architecture if reader.kind == 'encoder' else reader.kind} reader does "
            f"not end with; read every window (all)")
    params = reader.params
    if config.reversible:
        norm = params["reversible_norm"]
    else:
        norm = params[f"block_{param_block_of_layer(config, config.num_layers - 1)}"][
            "output_norm"]
    low, high = layer_norm_logit_bounds(norm["scale"], norm["bias"],
                                        params["qa_outputs"]["kernel"],
                                        params["qa_outputs"]["bias"])
    slack = BOUND_ROUNDING * (high - low) / 2
    return low - slack, high + slack


def reader_score_bounds(logit_bounds: tuple[np.ndarray, np.ndarray], rule: str
                        ) -> tuple[float, float]:
    """(lowest, highest) reader score (a `Candidate`'s: the rule's score / 2) of any passage
    with an allowed span, from the (start, end) logit bounds: "logits" (s_start + s_end) / 2,
    "margin" that less (s_null_start + s_null_end) / 2 (the null is the same head's)."""
    from dil_jax.defaults import SPAN_SCORES

    low, high = (np.asarray(bound, np.float64).sum() for bound in logit_bounds)
    if rule == "logits":
        return float(low) / 2, float(high) / 2
    if rule == "margin":
        return float(low - high) / 2, float(high - low) / 2
    raise WindowPruningError(f"unknown span score rule {rule!r}; rules are {list(SPAN_SCORES)}")


def largest_std(known: np.ndarray, unknown: int, low: float, high: float) -> float:
    """The largest population std of `known` values [n] and `unknown` more, each anywhere in
    [low, high]: the variance is convex in each unknown, so its maximum puts every unknown at
    low or high, and only how many at high matters (every count is tried)."""
    known = np.asarray(known, np.float64)
    counts = np.arange(unknown + 1)
    total = len(known) + unknown
    sums = known.sum() + counts * high + (unknown - counts) * low
    squares = (known ** 2).sum() + counts * high ** 2 + (unknown - counts) * low ** 2
    variance = squares / total - (sums / total) ** 2
    return float(np.sqrt(max(variance.max(), 0.0)))


def answer_settled(read_r: np.ndarray, read_b: np.ndarray, unread_b: np.ndarray,
                   bounds: tuple[float, float], mu: float | None) -> bool:
    """Whether the answer over every candidate is decided by the read ones, whatever reader
    scores within `bounds` the unread ones have, and is the one `pick_answer` picks among the
    read ones alone.

    read_r, read_b [n]: the read candidates' reader and BM25 scores, in candidate order;
    unread_b [m]: the BM25 scores of the passages not read, each a candidate (each has an
    allowed span). mu: the fusion weight (None or 1: the reader alone).

    mu * z(r) + (1 - mu) * z(b) ranks the candidates as key(t) = r + t b does, with t = c s:
    s the std of all N candidates' r, c = (1 - mu) / (mu std(b)) (every b is known). s lies in
    [sqrt(n / N) std(read r), `largest_std`] (the low end: the unread r all at the read ones'
    mean); key is linear in t, so a read candidate that beats every other read one, and the
    best an unread one can reach (r = high, the highest unread b), at both ends of t's interval
    beats them all at the true t. The reader alone is t = 0. Ties are never settled (which one
    `pick_answer` takes depends on the order of candidates not read yet).
    """
    from dil_jax.open_domain.scoring import fusion_scores

    read_r, read_b = np.asarray(read_r, np.float64), np.asarray(read_b, np.float64)
    unread_b = np.asarray(unread_b, np.float64)
    if not len(read_r):
        return False
    alone = fusion_scores(read_r, read_b, mu)
    leader = int(np.argmax(alone))
    if np.sum(alone >= alone[leader]) > 1:
        return False
    if not len(unread_b):
        return True
    low, high = bounds
    if mu is None or mu >= 1:
        multipliers = [0.0]
    else:
        std_b = np.concatenate([read_b, unread_b]).std()
        if std_b == 0:
            return False
        c = (1 - mu) / (mu * std_b)
        everything = len(read_r) + len(unread_b)
        multipliers = [c * np.sqrt(len(read_r) / everything) * read_r.std(),
                       c * largest_std(read_r, len(unread_b), low, high)]
    best_unread_b = unread_b.max()
    for t in multipliers:
        keys = read_r + t * read_b
        if np.sum(keys >= keys[leader]) > 1 or keys[leader] <= high + t * best_unread_b:
            return False
    return True


def settled_questions(pair_question: np.ndarray, pair_rank: np.ndarray,
                      pair_score: np.ndarray, pair_bm25: np.ndarray, read: np.ndarray,
                      bounds: tuple[float, float], mu: float | None,
                      questions: Sequence[int]) -> list[int]:
    """Which of `questions` have their answer settled by the pairs read so far.

    Per pair [n_pairs]: its question, its passage's BM25 rank and score, its reader score
    (the rule's score / 2 of its best span; -inf: no allowed span) and whether it was `read`.
    A question's candidates are its read passages' best windows (by reader score); a passage
    with a window not read is an unread candidate (its best window may be the unread one; the
    reader reads a passage's windows together, so it never has such a passage).
    """
    settled = []
    for question in questions:
        mine = np.flatnonzero(pair_question == question)
        best_r: dict[int, float] = {}
        bm25: dict[int, float] = {}
        unread: set[int] = set()
        for pair in mine:
            rank = int(pair_rank[pair])
            bm25[rank] = float(pair_bm25[pair])
            if read[pair]:
                best_r[rank] = max(best_r.get(rank, -np.inf), float(pair_score[pair]))
            else:
                unread.add(rank)
        for rank in unread:
            best_r.pop(rank, None)
        ranks = sorted(rank for rank, r in best_r.items() if np.isfinite(r))
        if answer_settled(np.asarray([best_r[r] for r in ranks]),
                          np.asarray([bm25[r] for r in ranks]),
                          np.asarray([bm25[r] for r in sorted(unread)]), bounds, mu):
            settled.append(question)
    return settled


# ----------------------------------------------------------------------------- calibration

# The reader manifest's record of its calibrated H (`PruningCalibration`), beside `abstention`.
MANIFEST_KEY = "window_pruning"
_FIX = ("re-run benchmarks/window_pruning.py record, or remove the 'window_pruning' record "
        "(--prune-windows calibrated then reads with the exact stop)")


def _finite(where: str, value: Any, low: float = -np.inf, high: float = np.inf) -> str | None:
    """What is wrong with a record's number (a finite JSON number within [low, high]), or
    None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not np.isfinite(value) or not low <= value <= high:
        within = "" if (low, high) == (-np.inf, np.inf) else f" within [{low:g}, {high:g}]"
        return f"'{where}' must be a finite number{within}, got {value!r:.80}"
    return None


def _calibration_problem(record: Any) -> str | None:
    """What is wrong with a manifest's `window_pruning` record (the field path and value), or
    None: an H per span score rule (at least one), the fusion weight and depth it was
    calibrated at, and optionally each rule's recall and what it was calibrated on."""
    from dil_jax.defaults import SPAN_SCORES

    if not isinstance(record, Mapping):
        return f"'{MANIFEST_KEY}' must be an object, got {record!r:.80}"
    rules = [rule for rule in SPAN_SCORES if rule in record]
    if not rules:
        return (f"'{MANIFEST_KEY}' records no H: give one of {list(SPAN_SCORES)} "
                f"(rule -> the reader score H of stop:H)")
    problems = [_finite(f"{MANIFEST_KEY}.{rule}", record[rule]) for rule in rules]
    problems.append(_finite(f"{MANIFEST_KEY}.mu", record.get("mu"), 0.0, 1.0))
    top_p = record.get("top_p")
    if isinstance(top_p, bool) or not isinstance(top_p, int) or top_p < 1:
        problems.append(f"'{MANIFEST_KEY}.top_p' must be a positive integer, got {top_p!r:.80}")
    recall = record.get("recall", {})
    if not isinstance(recall, Mapping):
        problems.append(f"'{MANIFEST_KEY}.recall' must be an object of rule -> fraction, got "
                        f"{recall!r:.80}")
    else:
        problems += [_finite(f"{MANIFEST_KEY}.recall.{rule}", value, 0.0, 1.0)
                     for rule, value in recall.items()]
    if not isinstance(record.get("calibrated_on", ""), str):
        problems.append(f"'{MANIFEST_KEY}.calibrated_on' must be a string")
    return next((problem for problem in problems if problem), None)


@dataclasses.dataclass(frozen=True)
class PruningCalibration:
    """A reader's calibrated stop:H (benchmarks/window_pruning.py `simulate --target`, then
    `record`): per span score rule, the H whose stop read the exact pick's window for the
    `recall` share of the calibration questions, at fusion weight `mu` and depth `top_p`.
    H is an assumption about this reader's scores, checked there only: another rule, weight
    or depth is not covered (`high_for`)."""

    highs: Mapping[str, float]
    mu: float
    top_p: int
    calibrated_on: str = ""
    recall: Mapping[str, float] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_manifest(cls, manifest: Mapping[str, Any] | None,
                      path: Path | str = "dil_jax_manifest.json") -> PruningCalibration | None:
        """The manifest's `window_pruning` record, or None when it has none (a manifest written
        before the record existed); a record that cannot be read is a CheckpointError naming
        `path`, the field and its value."""
        from dil_jax.defaults import SPAN_SCORES
        from dil_jax.errors import CheckpointError

        record = (manifest or {}).get(MANIFEST_KEY)
        if record is None:
            return None
        problem = _calibration_problem(record)
        if problem:
            raise CheckpointError(f"{path}: {problem}; {_FIX}")
        return cls({rule: float(record[rule]) for rule in SPAN_SCORES if rule in record},
                   float(record["mu"]), int(record["top_p"]), str(record.get("calibrated_on", "")),
                   {rule: float(value) for rule, value in record.get("recall", {}).items()})

    def to_json(self) -> dict[str, Any]:
        """The manifest record (`from_manifest` reads it back)."""
        record: dict[str, Any] = {**self.highs, "mu": self.mu, "top_p": self.top_p,
                                  "calibrated_on": self.calibrated_on}
        if self.recall:
            record["recall"] = dict(self.recall)
        return record

    def high_for(self, rule: str, mu: float, top_p: int) -> tuple[float | None, str]:
        """(H, why) for a read with this rule, fusion weight and depth: the recorded H when it
        was calibrated for exactly those, else (None, why not)."""
        if rule not in self.highs:
            return None, f"no H recorded for the {rule!r} rule"
        if not np.isclose(mu, self.mu) or top_p != self.top_p:
            return None, (f"H calibrated at mu {self.mu:g}, p {self.top_p}; this reads at mu "
                          f"{mu:g}, p {top_p}")
        return self.highs[rule], (f"calibrated at mu {self.mu:g}, p {self.top_p}"
                                  + (f": {self.calibrated_on}" if self.calibrated_on else ""))


def calibration_of(checkpoint: str | Path | None) -> PruningCalibration | None:
    """The calibration recorded in a reader folder's manifest (None: not a folder, no manifest,
    or no record); CheckpointError naming the manifest and the field when it cannot be read."""
    from dil_jax.checkpoints import MANIFEST_FILE, ExportManifest

    if not checkpoint or not (Path(checkpoint) / MANIFEST_FILE).is_file():
        return None
    return PruningCalibration.from_manifest(ExportManifest.read(checkpoint).to_json(),
                                            Path(checkpoint) / MANIFEST_FILE)


def resolve_pruning(setting: PruningSetting, calibration: PruningCalibration | None,
                    span_score: str, mu: float | None, top_p: int
                    ) -> tuple[WindowPruning | None, str]:
    """(the pruning a reader reads with, why) for --prune-windows `setting`, the reader's
    `calibration` (read for CALIBRATED only), its span score rule, the fusion weight (None:
    the reader alone) and depth. An explicit setting is taken as given (settled for `mu`);
    CALIBRATED is the recorded stop:H when it covers this rule, weight and depth, else the
    exact stop; without fusion every window (the exact stop would read them all anyway, a
    round at a time). Whether the reader can prune at all is `with_setting`'s."""
    if not isinstance(setting, Calibrated):
        return (None if setting is None else setting.with_mu(mu)), "as given"
    if mu is None or mu >= 1:
        return None, "without fusion the exact stop reads every window"
    if calibration is None:
        return WindowPruning(mu=mu), "exact: the reader records no calibrated H"
    high, why = calibration.high_for(span_score, mu, top_p)
    if high is None:
        return WindowPruning(mu=mu), f"exact: {why}"
    return WindowPruning(high=high, mu=mu), why


class PrunableReader(Protocol):
    """What `with_setting` reads of a reader (an `OpenDomainReader`, which imports this
    module: named by its shape, not imported, so the two modules make no circle)."""

    span_score: str
    top_p: int

    def with_pruning(self, pruning: WindowPruning | None) -> PrunableReader: ...


def with_setting(reader: PrunableReader, setting: PruningSetting,
                 calibration: PruningCalibration | None, mu: float | None
                 ) -> tuple[PrunableReader, str]:
    """(`reader` with the pruning `resolve_pruning` gives it, why). A reader that cannot prune
    (no bound on its span head: QANet, BiDAF, XLNet) reads every window under CALIBRATED, and
    raises WindowPruningError under an explicit stop."""
    pruning, why = resolve_pruning(setting, calibration, reader.span_score, mu, reader.top_p)
    if pruning is None:
        return reader, why
    try:
        return reader.with_pruning(pruning), why
    except WindowPruningError as error:
        if not isinstance(setting, Calibrated):
            raise
        return reader, str(error)
