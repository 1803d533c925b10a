"""Training windows from SQuAD-style features, in a resumable, per-process order.

The featurizer (`dil_jax.data.features`) encodes each question once and each passage window once:

  q_ids, q_mask            [n_questions, Lq]   `[CLS] q [SEP]`
  p_ids, p_mask            [n_windows, Lp]     `p_window [SEP]`
  example_index            [n_windows]         row of q_ids asked about this window (its example)
  start_positions,
  end_positions            [n_windows]         token index inside the window, -1 = no answer here

Anything with those attributes (`FeaturesLike`) trains; tests build them synthetically. A training
example is a window; its question ids are gathered per batch, so questions are stored once.

Order: epoch `e` visits windows in `permutation(seed, e)`, and global step `s` takes rows
`[j * G, (j + 1) * G)` of epoch `s // steps_per_epoch` (j = s mod steps_per_epoch, G = global
batch; the remainder of each epoch is dropped, a different one each epoch). The data position is
therefore a pure function of (seed, step): a resumed run needs only the step and the seed to
continue exactly where it stopped, and every process computes the same global batch and takes its
own rows of it.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

import ml_collections
import numpy as np

from dil_jax.data.features import NO_ANSWER, FeaturizationError
from dil_jax.errors import UsageError


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
class SyntheticFeatures:
    """Synthetic training windows: only the `FeaturesLike` fields, as random arrays (tests, smoke
    runs). Not the featurizer's `dil_jax.data.features.Features`, which also holds character
    offsets, max-context flags and window starts, so that predictions map back to answer text."""

    q_ids: np.ndarray
    q_mask: np.ndarray
    p_ids: np.ndarray
    p_mask: np.ndarray
    start_positions: np.ndarray
    end_positions: np.ndarray
    example_index: np.ndarray


@dataclasses.dataclass(frozen=True)
class Windows:
    """Checked training windows; `batch(rows)` builds model inputs for any rows."""

    q_ids: np.ndarray  # [n_questions, Lq] int32
    q_mask: np.ndarray  # [n_questions, Lq] int32
    p_ids: np.ndarray  # [n_windows, Lp] int32
    p_mask: np.ndarray  # [n_windows, Lp] int32
    question_index: np.ndarray  # [n_windows] int
    start: np.ndarray  # [n_windows] int32, -1 = null
    end: np.ndarray  # [n_windows] int32, -1 = null

    def __len__(self) -> int:
        return self.p_ids.shape[0]

    def batch(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """rows: int array of any shape S -> dict of arrays [*S, ...] (ids, masks, labels)."""
        rows = np.asarray(rows)
        q = self.question_index[rows]
        return {
            "q_ids": self.q_ids[q], "q_mask": self.q_mask[q],
            "p_ids": self.p_ids[rows], "p_mask": self.p_mask[rows],
            "start": self.start[rows], "end": self.end[rows],
        }


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
    for name, array in (("example_index", q_index), ("start_positions", start),
                        ("end_positions", end)):
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
    return Windows(q_ids.astype(np.int32), q_mask.astype(np.int32), p_ids.astype(np.int32),
                   p_mask.astype(np.int32), q_index.astype(np.int64), start.astype(np.int32),
                   end.astype(np.int32))


# ----------------------------------------------------------------------------- order


def steps_per_epoch(num_windows: int, global_batch: int) -> int:
    """Full global batches per epoch (the remainder is dropped)."""
    return num_windows // global_batch


def epoch_permutation(num_windows: int, seed: int, epoch: int) -> np.ndarray:
    """The visiting order of epoch `epoch`; identical on every process."""
    return np.random.default_rng([seed, epoch]).permutation(num_windows)


def data_position(step: int, per_epoch: int) -> tuple[int, int]:
    """(epoch, batch index inside the epoch) of global step `step`."""
    return step // per_epoch, step % per_epoch


def global_batch_rows(step: int, num_windows: int, global_batch: int, seed: int) -> np.ndarray:
    """Window rows [global_batch] of global step `step` (see the module docstring)."""
    per_epoch = steps_per_epoch(num_windows, global_batch)
    if per_epoch == 0:
        raise UsageError(f"{num_windows} training windows cannot fill one global batch of "
                         f"{global_batch}: lower config.batch_size or add training data")
    epoch, index = data_position(step, per_epoch)
    order = epoch_permutation(num_windows, seed, epoch)
    return order[index * global_batch:(index + 1) * global_batch]


# ----------------------------------------------------------------------------- synthetic


def synthetic_features(num_questions: int = 16, windows_per_question: int = 2,
                       question_len: int = 8, passage_len: int = 16, vocab_size: int = 100,
                       seed: int = 0, null_fraction: float = 0.25) -> SyntheticFeatures:
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
    return SyntheticFeatures(q_ids, q_mask, p_ids, p_mask, start, end, q_index)


SPLIT_SEEDS = {"train": 0, "validation": 1}


def synthetic(data_cfg: ml_collections.ConfigDict, split: str, *,
              max_question_len: int) -> SyntheticFeatures:
    """Synthetic windows sized by the config (validation uses another seed)."""
    s = data_cfg.synthetic
    return synthetic_features(
        num_questions=s.num_questions, windows_per_question=s.windows_per_question,
        question_len=max_question_len, passage_len=data_cfg.max_passage_len,
        vocab_size=s.vocab_size, seed=SPLIT_SEEDS[split], null_fraction=s.null_fraction)
