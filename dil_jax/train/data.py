"""Training windows from SQuAD-style features, in a resumable, per-process order.

The featurizer (`dil_jax.data.features`) encodes each question once and each passage window once:

  q_ids, q_mask            [n_questions, Lq]   `[CLS] q [SEP]`
  p_ids, p_mask            [n_windows, Lp]     `p_window [SEP]`
  example_index            [n_windows]         row of q_ids asked about this window (its example)
  start_positions,
  end_positions            [n_windows]         token index inside the window, -1 = no answer here
  is_distractor            [n_windows]         optional: a retrieved passage of another paragraph
                                               (`dil_jax.train.distractors`), always -1 / -1
  is_unlabelled            [n_windows]         optional: a window of a distillation-only question
                                               (`dil_jax.train.squad_data`, data.distill_file):
                                               -1 / -1, and no span cross-entropy; only the
                                               teacher's KD and LRS train on it
  start_candidates,
  end_candidates           [n_windows, C]      optional: every correct span of the window
                                               (`dil_jax.train.answer_candidates`), -1 padded;
                                               the span loss then accepts any of them

Anything with those attributes (`FeaturesLike`) trains; tests build them synthetically. A training
unit is a window; its question ids are gathered per batch, so questions are stored once. With
shared normalisation (`Windows.grouped`) a unit is instead a question's group of exactly G
windows: its own windows (those holding the answer first), then its distractors, then padding
windows (all-zero mask, `valid` 0) up to G.

Order: epoch `e` visits units in `permutation(seed, e)`, and global step `s` takes units
`[j * U, (j + 1) * U)` of epoch `s // steps_per_epoch` (j = s mod steps_per_epoch, U = units per
global batch: the global batch in windows, divided by G when grouped; the remainder of each epoch
is dropped, a different one each epoch). The data position is therefore a pure function of
(seed, step): a resumed run needs only the step and the seed to continue exactly where it
stopped, and every process computes the same global batch and takes its own rows of it.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Protocol

import ml_collections
import numpy as np

from dil_jax.data.features import NO_ANSWER, FeaturizationError
from dil_jax.errors import UsageError

if TYPE_CHECKING:  # jax-free at run time: the data order runs without a model
    from dil_jax.train.teacher_logits import TeacherLogits


class FeaturesLike(Protocol):
    """What training needs from the SQuAD featurizer's `Features` (numpy arrays)."""

    q_ids: np.ndarray
    q_mask: np.ndarray
    p_ids: np.ndarray
    p_mask: np.ndarray
    start_positions: np.ndarray
    end_positions: np.ndarray
    example_index: np.ndarray


@dataclasses.dataclass
class TrainingFeatures:
    """Training windows as plain arrays: the `FeaturesLike` fields, plus `is_distractor` when
    retrieved passages of other paragraphs were added (dil_jax.train.distractors) and
    `is_unlabelled` when distillation-only questions were (`append_unlabelled`). Built by the
    synthetic featurizer (tests, smoke runs) and by the distractor step. Not the featurizer's
    `dil_jax.data.features.Features`, which also holds character offsets, max-context flags and
    window starts, so that predictions map back to answer text (a distractor window's offsets
    would point into another text, and training needs none).
      q_ids, q_mask: [n_questions, Lq]; p_ids, p_mask: [n_windows, Lp];
      start_positions, end_positions, example_index: [n_windows];
      is_distractor: [n_windows] bool (True: an added window, always -1 / -1) or None;
      is_unlabelled: [n_windows] bool (True: no span label, distillation only) or None;
      start_candidates, end_candidates: [n_windows, C] int32 every correct span, -1 padded
        (column 0 the window's own label), or None.
    """

    q_ids: np.ndarray
    q_mask: np.ndarray
    p_ids: np.ndarray
    p_mask: np.ndarray
    start_positions: np.ndarray
    end_positions: np.ndarray
    example_index: np.ndarray
    is_distractor: np.ndarray | None = None
    is_unlabelled: np.ndarray | None = None
    start_candidates: np.ndarray | None = None
    end_candidates: np.ndarray | None = None


def with_candidates(features: FeaturesLike, start_candidates: np.ndarray,
                    end_candidates: np.ndarray) -> TrainingFeatures:
    """`features` with answer candidates for its first windows ([n, C], n <= its windows); the
    windows after them (distractors, distillation-only questions, appended later than the
    windows the candidates were computed on) get none (-1)."""
    total = len(features.p_ids)
    if start_candidates.shape != end_candidates.shape or start_candidates.shape[0] > total:
        raise FeaturizationError(f"answer candidates {start_candidates.shape} / "
                                 f"{end_candidates.shape} do not fit {total} windows")

    def padded(values: np.ndarray) -> np.ndarray:
        tail = np.full((total - values.shape[0], values.shape[1]), NO_ANSWER, np.int32)
        return np.concatenate([values.astype(np.int32), tail])

    fields = {name: getattr(features, name, None)
              for name in (f.name for f in dataclasses.fields(TrainingFeatures))}
    fields.update(start_candidates=padded(start_candidates), end_candidates=padded(end_candidates))
    return TrainingFeatures(**fields)


def append_unlabelled(features: FeaturesLike, extra: FeaturesLike) -> TrainingFeatures:
    """`features` followed by the questions and windows of `extra`, the latter marked unlabelled
    (their span labels become -1 / -1 and the span cross-entropy skips them; the teacher's KD
    and LRS still train on them). Both must be featurized at the same question and window
    lengths. Distractor marks of `features` are kept; `extra`'s windows are not distractors."""
    for name in ("q_ids", "p_ids"):
        base, added = np.asarray(getattr(features, name)), np.asarray(getattr(extra, name))
        if base.shape[1:] != added.shape[1:]:
            raise FeaturizationError(f"unlabelled questions' {name} rows are {added.shape[1:]}, "
                                     f"the labelled ones' {base.shape[1:]}: featurize both at "
                                     "the same lengths")
    n_base, n_added = len(features.p_ids), len(extra.p_ids)

    def flag(source: FeaturesLike, name: str, n: int) -> np.ndarray:
        values = getattr(source, name, None)
        return np.zeros(n, bool) if values is None else np.asarray(values, bool)

    def joined(name: str) -> np.ndarray:
        return np.concatenate([np.asarray(getattr(features, name)),
                               np.asarray(getattr(extra, name))])

    return TrainingFeatures(
        q_ids=joined("q_ids").astype(np.int32), q_mask=joined("q_mask").astype(np.int32),
        p_ids=joined("p_ids").astype(np.int32), p_mask=joined("p_mask").astype(np.int32),
        start_positions=np.concatenate([features.start_positions,
                                        np.full(n_added, NO_ANSWER)]).astype(np.int32),
        end_positions=np.concatenate([features.end_positions,
                                      np.full(n_added, NO_ANSWER)]).astype(np.int32),
        example_index=np.concatenate([
            features.example_index,
            np.asarray(extra.example_index) + len(features.q_ids)]).astype(np.int32),
        is_distractor=np.concatenate([flag(features, "is_distractor", n_base),
                                      np.zeros(n_added, bool)]),
        is_unlabelled=np.concatenate([flag(features, "is_unlabelled", n_base),
                                      np.ones(n_added, bool)]))


@dataclasses.dataclass(frozen=True)
class Windows:
    """Checked training windows; `batch(rows)` builds model inputs for any rows, and
    `unit_rows(units)` the rows of training units (windows, or question groups)."""

    q_ids: np.ndarray  # [n_questions, Lq] int32
    q_mask: np.ndarray  # [n_questions, Lq] int32
    p_ids: np.ndarray  # [n_windows, Lp] int32
    p_mask: np.ndarray  # [n_windows, Lp] int32
    question_index: np.ndarray  # [n_windows] int
    start: np.ndarray  # [n_windows] int32, -1 = null
    end: np.ndarray  # [n_windows] int32, -1 = null
    is_distractor: np.ndarray  # [n_windows] bool
    # [n_windows] bool: False on distillation-only windows (no span cross-entropy).
    labelled: np.ndarray
    # [n_windows, C] int32 every correct span of each window (column 0 = start / end when >= 0),
    # -1 padded; None: one label per window.
    start_candidates: np.ndarray | None = None
    end_candidates: np.ndarray | None = None
    # Shared normalisation (`grouped`): [n_groups, G] window rows of each question group and
    # whether each is real; a padding slot repeats the group's first row with valid False.
    # None: every window is its own unit.
    groups: np.ndarray | None = None
    group_valid: np.ndarray | None = None
    # The frozen teacher's scores of each window (train.teacher_logits.TeacherLogits), when KD
    # reads them from config.teacher.logits_file instead of running the teacher; None: it runs.
    teacher_logits: TeacherLogits | None = None

    def __len__(self) -> int:
        return self.p_ids.shape[0]

    @property
    def group_size(self) -> int:
        """G of the question groups; 0 when the units are single windows."""
        return 0 if self.groups is None else self.groups.shape[1]

    @property
    def num_units(self) -> int:
        """What the data order permutes: windows, or question groups."""
        return len(self) if self.groups is None else self.groups.shape[0]

    def grouped(self, group_size: int) -> Windows:
        """These windows with question groups of `group_size` windows (see question_groups)."""
        groups, valid = question_groups(self.question_index, self.start, self.is_distractor,
                                        group_size)
        return dataclasses.replace(self, groups=groups, group_valid=valid)

    def unit_rows(self, units: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """units [U] -> (window rows, valid) [U * max(G, 1)]: each group's windows consecutive."""
        units = np.asarray(units)
        if self.groups is None:
            return units, np.ones(units.shape, bool)
        return self.groups[units].reshape(-1), self.group_valid[units].reshape(-1)

    def batch(self, rows: np.ndarray, valid: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """rows: int array of any shape S -> dict of arrays [*S, ...] (ids, masks, labels, valid,
        labelled).

        valid [*S] (default all true): a row marked invalid becomes a padding window: ids and
        mask all 0 (the model gives its passage logits PADDED_LOGIT), labels -1, valid 0.
        labelled [*S]: 0 on distillation-only windows (the span cross-entropy skips them).
        start_candidates, end_candidates [*S, C]: only when the windows have candidates.
        teacher_*_logits [*S, Lp] / [*S]: only when the teacher's scores are stored.
        """
        rows = np.asarray(rows)
        valid = np.ones(rows.shape, bool) if valid is None else np.asarray(valid, bool)
        q = self.question_index[rows]
        keep = valid[..., None]
        candidates = {} if self.start_candidates is None else {
            "start_candidates": np.where(keep, self.start_candidates[rows],
                                         NO_ANSWER).astype(np.int32),
            "end_candidates": np.where(keep, self.end_candidates[rows],
                                       NO_ANSWER).astype(np.int32)}
        teacher = {} if self.teacher_logits is None else self.teacher_logits.batch(rows, valid)
        return {**candidates, **teacher,
            "q_ids": self.q_ids[q], "q_mask": self.q_mask[q],
            "p_ids": np.where(keep, self.p_ids[rows], 0).astype(np.int32),
            "p_mask": np.where(keep, self.p_mask[rows], 0).astype(np.int32),
            "start": np.where(valid, self.start[rows], NO_ANSWER).astype(np.int32),
            "end": np.where(valid, self.end[rows], NO_ANSWER).astype(np.int32),
            "valid": valid.astype(np.int32),
            "labelled": self.labelled[rows].astype(np.int32),
        }


def question_groups(question_index: np.ndarray, start: np.ndarray, is_distractor: np.ndarray,
                    group_size: int) -> tuple[np.ndarray, np.ndarray]:
    """The shared-normalisation groups: one per question that has windows, in question order.

    question_index, start, is_distractor: [n_windows]. Each group lists the question's own
    windows holding the answer, then its other own windows, then its distractor windows (each
    kind in row order), cut at `group_size`; a shorter group is padded. Own windows go first so
    that a cut never drops the answer for a distractor.
    Returns (rows, valid): [n_groups, group_size] window rows (a padding slot repeats the group's
    first row) and bool, False on padding slots.
    """
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    question_index = np.asarray(question_index)
    kind = np.where(np.asarray(is_distractor, bool), 2, np.where(np.asarray(start) >= 0, 0, 1))
    order = np.lexsort((np.arange(len(kind)), kind, question_index))  # by question, kind, row
    questions, slot_of_window = np.unique(question_index[order], return_inverse=True)
    first = np.searchsorted(question_index[order], questions)  # each question's first in order
    rank = np.arange(len(order)) - first[slot_of_window]
    kept = rank < group_size
    rows = np.repeat(order[first][:, None], group_size, axis=1)
    valid = np.zeros((len(questions), group_size), bool)
    rows[slot_of_window[kept], rank[kept]] = order[kept]
    valid[slot_of_window[kept], rank[kept]] = True
    return rows.astype(np.int64), valid


def windows_from_features(features: FeaturesLike) -> Windows:
    """Validates a featurizer's output and converts it to Windows (raises FeaturizationError,
    a ValueError, naming the field)."""
    q_ids, q_mask = np.asarray(features.q_ids), np.asarray(features.q_mask)
    p_ids, p_mask = np.asarray(features.p_ids), np.asarray(features.p_mask)
    q_index = np.asarray(features.example_index)
    start = np.asarray(features.start_positions)
    end = np.asarray(features.end_positions)
    n = p_ids.shape[0]
    if q_ids.ndim != 2 or q_mask.shape != q_ids.shape:
        raise FeaturizationError(f"q_ids {q_ids.shape} / q_mask {q_mask.shape}: expected equal "
                                 "[nq, Lq]")
    if p_ids.ndim != 2 or p_mask.shape != p_ids.shape:
        raise FeaturizationError(f"p_ids {p_ids.shape} / p_mask {p_mask.shape}: expected equal "
                                 "[nw, Lp]")
    distractor = getattr(features, "is_distractor", None)
    distractor = np.zeros(n, bool) if distractor is None else np.asarray(distractor, bool)
    unlabelled = getattr(features, "is_unlabelled", None)
    unlabelled = np.zeros(n, bool) if unlabelled is None else np.asarray(unlabelled, bool)
    for name, array in (("example_index", q_index), ("start_positions", start),
                        ("end_positions", end), ("is_distractor", distractor),
                        ("is_unlabelled", unlabelled)):
        if array.shape != (n,):
            raise FeaturizationError(f"{name} has shape {array.shape}, expected ({n},)")
    if n and (q_index.min() < 0 or q_index.max() >= q_ids.shape[0]):
        raise FeaturizationError(f"example_index outside 0..{q_ids.shape[0] - 1}")
    lp = p_ids.shape[1]
    if n and (start.min() < NO_ANSWER or start.max() >= lp or end.min() < NO_ANSWER
              or end.max() >= lp):
        raise FeaturizationError("start/end positions must be -1 or inside the window "
                                 f"(0..{lp - 1})")
    if np.any((start == NO_ANSWER) != (end == NO_ANSWER)):
        raise FeaturizationError("a window has a start but no end position (or the reverse)")
    if np.any(distractor & (start != NO_ANSWER)):
        raise FeaturizationError("a distractor window has an answer label; distractors are "
                                 "labelled -1 / -1")
    if np.any(unlabelled & (start != NO_ANSWER)):
        raise FeaturizationError("an unlabelled (distillation-only) window has an answer label; "
                                 "they are labelled -1 / -1")
    start_candidates, end_candidates = _checked_candidates(features, start, end, lp)
    return Windows(q_ids.astype(np.int32), q_mask.astype(np.int32), p_ids.astype(np.int32),
                   p_mask.astype(np.int32), q_index.astype(np.int64), start.astype(np.int32),
                   end.astype(np.int32), distractor, ~unlabelled, start_candidates,
                   end_candidates)


def _checked_candidates(features: FeaturesLike, start: np.ndarray, end: np.ndarray, lp: int
                        ) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The features' answer candidates, checked against the one-label columns: [n, C] each, -1
    or inside the window, start and end -1 together, column 0 the window's own label where it
    has one, and a window without a label holding none. (None, None) when there are none."""
    start_c = getattr(features, "start_candidates", None)
    end_c = getattr(features, "end_candidates", None)
    if start_c is None and end_c is None:
        return None, None
    if start_c is None or end_c is None:
        raise FeaturizationError("start_candidates and end_candidates come together")
    start_c, end_c = np.asarray(start_c), np.asarray(end_c)
    n = len(start)
    if start_c.ndim != 2 or start_c.shape[0] != n or end_c.shape != start_c.shape:
        raise FeaturizationError(f"start_candidates {start_c.shape} / end_candidates "
                                 f"{end_c.shape}: expected equal [{n}, C]")
    if start_c.size and (start_c.min() < NO_ANSWER or start_c.max() >= lp
                         or end_c.min() < NO_ANSWER or end_c.max() >= lp):
        raise FeaturizationError(f"answer candidates must be -1 or inside the window "
                                 f"(0..{lp - 1})")
    if np.any((start_c == NO_ANSWER) != (end_c == NO_ANSWER)):
        raise FeaturizationError("an answer candidate has a start but no end (or the reverse)")
    labelled = start >= 0
    if np.any(start_c[labelled, 0] != start[labelled]) or np.any(
            end_c[labelled, 0] != end[labelled]):
        raise FeaturizationError("answer candidates: column 0 must be the window's own label")
    if np.any(start_c[~labelled] >= 0):
        raise FeaturizationError("answer candidates on a window without a label: label it with "
                                 "one of them (start_positions / end_positions)")
    return start_c.astype(np.int32), end_c.astype(np.int32)


# ----------------------------------------------------------------------------- order


def steps_per_epoch(num_units: int, units_per_batch: int) -> int:
    """Full global batches per epoch (the remainder is dropped)."""
    return num_units // units_per_batch


def epoch_permutation(num_units: int, seed: int, epoch: int) -> np.ndarray:
    """The visiting order of epoch `epoch`; identical on every process."""
    return np.random.default_rng([seed, epoch]).permutation(num_units)


def data_position(step: int, per_epoch: int) -> tuple[int, int]:
    """(epoch, batch index inside the epoch) of global step `step`."""
    return step // per_epoch, step % per_epoch


def global_batch_rows(step: int, num_units: int, units_per_batch: int, seed: int) -> np.ndarray:
    """Units [units_per_batch] of global step `step` (see the module docstring): window rows,
    or question groups with shared normalisation (`Windows.unit_rows` maps them to rows)."""
    per_epoch = steps_per_epoch(num_units, units_per_batch)
    if per_epoch == 0:
        raise UsageError(f"{num_units} training units (windows, or question groups with "
                         f"loss.shared_norm) cannot fill one global batch of {units_per_batch}: "
                         "lower config.batch_size or add training data")
    epoch, index = data_position(step, per_epoch)
    order = epoch_permutation(num_units, seed, epoch)
    return order[index * units_per_batch:(index + 1) * units_per_batch]


# ----------------------------------------------------------------------------- synthetic


def featurizes_text(featurizer: str) -> bool:
    """Whether a run's featurizer (config.data.featurizer) windows real text with
    `config.data.tokenizer` (SQuAD), as opposed to the synthetic windows of tests and smoke runs
    (`:synthetic` featurizers), which have neither a tokenizer nor passage windows to record."""
    return not str(featurizer).endswith(":synthetic")


def synthetic_features(num_questions: int = 16, windows_per_question: int = 2,
                       question_len: int = 8, passage_len: int = 16, vocab_size: int = 100,
                       seed: int = 0, null_fraction: float = 0.25) -> TrainingFeatures:
    """Random token features with a learnable answer rule, for tests and smoke runs.

    The answer of each answerable window starts at the passage token equal to the question's
    second token (planted there), so a model can learn it: loss decreasing is meaningful.
    Ids avoid 0 (padding) and 1..3; special tokens are 101 ([CLS]) and 102 ([SEP]) when the
    vocabulary has them, else 1 and 2.
    """
    rng = np.random.default_rng(seed)
    cls, sep = (101, 102) if vocab_size > 102 else (1, 2)
    low = 4
    nq, nw = num_questions, num_questions * windows_per_question
    q_ids = np.zeros((nq, question_len), np.int32)
    q_mask = np.zeros((nq, question_len), np.int32)
    for i in range(nq):
        n = rng.integers(3, question_len - 1)  # real question tokens
        q_ids[i, 0], q_ids[i, 1:n + 1], q_ids[i, n + 1] = cls, rng.integers(low, vocab_size, n), sep
        q_mask[i, :n + 2] = 1
    p_ids = np.zeros((nw, passage_len), np.int32)
    p_mask = np.zeros((nw, passage_len), np.int32)
    start = np.full(nw, NO_ANSWER, np.int32)
    end = np.full(nw, NO_ANSWER, np.int32)
    q_index = np.repeat(np.arange(nq), windows_per_question)
    for w in range(nw):
        n = rng.integers(passage_len // 2, passage_len)  # real passage tokens before [SEP]
        tokens = rng.integers(low, vocab_size, n)
        key = q_ids[q_index[w], 1]
        tokens[tokens == key] = low if key != low else low + 1  # the key occurs only if planted
        if rng.random() >= null_fraction:
            s = int(rng.integers(0, n - 1))
            tokens[s] = key
            start[w], end[w] = s, min(s + int(rng.integers(0, 3)), n - 1)
        p_ids[w, :n], p_ids[w, n] = tokens, sep
        p_mask[w, :n + 1] = 1
    return TrainingFeatures(q_ids, q_mask, p_ids, p_mask, start, end, q_index)


SPLIT_SEEDS = {"train": 0, "validation": 1}


def synthetic(data_cfg: ml_collections.ConfigDict, split: str, *,
              max_question_len: int) -> TrainingFeatures:
    """Synthetic windows sized by the config (validation uses another seed)."""
    s = data_cfg.synthetic
    return synthetic_features(
        num_questions=s.num_questions, windows_per_question=s.windows_per_question,
        question_len=max_question_len, passage_len=data_cfg.max_passage_len,
        vocab_size=s.vocab_size, seed=SPLIT_SEEDS[split], null_fraction=s.null_fraction)
