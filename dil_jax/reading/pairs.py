"""The host-side parts of reading pairs: which tokens a chunk reads, how wide it is, the scores.

`kept_positions`, `real_lengths` and `chunk_width` (with KEPT_BUCKET and QUESTION_BUCKET) pick
the tokens and widths of a chunk on the host; `SpanScores` holds the span scores of any set of
pairs. None of it compiles or runs a device program, so it is apart from `reading.grid`
(`PairGrid`, the jitted pair program and its chunk loop), which imports from here, never the
reverse; callers that only select tokens or hold scores need not touch the grid.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from dil_jax.rounding import round_up

# Kept-token sequences (sentence prescreening), and passages trimmed of their padding
# (`trims_padding`), are padded to a multiple of this many tokens: few compiled widths.
KEPT_BUCKET = 32
# Questions trimmed of their padding are padded to a multiple of this many tokens (questions are
# short: a coarser bucket would keep most of the padding it removes).
QUESTION_BUCKET = 8


def kept_positions(keep: np.ndarray, bucket: int = KEPT_BUCKET) -> np.ndarray:
    """[n, kept_len] int32: the indices of each row's kept tokens, in order, padded with p_len.

    keep: [n, p_len] bool. kept_len is the most kept tokens of a row rounded up to `bucket`
    (at most p_len), so a few shapes (one compilation each) cover every selection.
    """
    keep = np.asarray(keep, bool)
    p_len = keep.shape[1]
    kept_len = min(round_up(max(int(keep.sum(axis=1).max(initial=0)), 1), bucket), p_len)
    # A stable sort of "not kept" brings each row's kept indices first, in order.
    order = np.argsort(~keep, axis=1, kind="stable")[:, :kept_len]
    return np.where(np.take_along_axis(keep, order, axis=1), order, p_len).astype(np.int32)


def real_lengths(mask: np.ndarray) -> np.ndarray:
    """[n, seq] mask -> [n] int: one past each row's last real token (0 for an empty row), so
    that every real token lies before it even if padding sat between real tokens."""
    mask = np.asarray(mask) != 0
    last = mask.shape[1] - np.argmax(mask[:, ::-1], axis=1)
    return np.where(mask.any(axis=1), last, 0)


def chunk_width(real: np.ndarray, bucket: int, full: int) -> int:
    """The tokens a chunk reads of a side: its longest real segment (`real`: [chunk] lengths)
    rounded up to `bucket`, at most the side's `full` length."""
    return min(round_up(max(int(real.max()), 1), bucket), full)


@dataclasses.dataclass
class SpanScores:
    """Span scores of a set of (question, passage) pairs, as numpy arrays.

    start_logits, end_logits: [*lead, passage_len], over the passage's tokens.
    null_start_logits, null_end_logits: [*lead], the `[CLS]` (no-answer) scores.
    The leading axes say which pairs: [num_pairs] for a list of pairs, in the list's order
    (`PairGrid.read_pairs`; a SQuAD window is one pair: [num_windows]), or
    [num_questions, num_passages] for every pair of a grid (`PairGrid.read_grid`).
    """

    start_logits: np.ndarray
    end_logits: np.ndarray
    null_start_logits: np.ndarray
    null_end_logits: np.ndarray

    @classmethod
    def full(cls, lead: int | tuple[int, ...], passage_len: int, span_value: float,
             null_value: float) -> SpanScores:
        """float32 scores of shape [*lead, passage_len] / [*lead], filled with these values."""
        lead = (lead,) if isinstance(lead, int) else tuple(lead)
        return cls(np.full(lead + (passage_len,), span_value, np.float32),
                   np.full(lead + (passage_len,), span_value, np.float32),
                   np.full(lead, null_value, np.float32), np.full(lead, null_value, np.float32))

    @property
    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(start_logits, end_logits, null_start_logits, null_end_logits)."""
        return self.start_logits, self.end_logits, self.null_start_logits, self.null_end_logits

    def set_rows(self, rows: np.ndarray, values: SpanScores) -> None:
        """Writes `values` (scores [len(rows), ...]) into these rows of the first leading
        axis, in place."""
        for target, value in zip(self.arrays, values.arrays, strict=True):
            target[rows] = value

    def reshape(self, *lead: int) -> SpanScores:
        """The same scores with other leading axes, e.g. [nq * np] pairs -> a
        [nq, np] grid (`read_grid`)."""
        passage_len = self.start_logits.shape[-1]
        return SpanScores(self.start_logits.reshape(*lead, passage_len),
                          self.end_logits.reshape(*lead, passage_len),
                          self.null_start_logits.reshape(lead),
                          self.null_end_logits.reshape(lead))


def every_pair(num_questions: int, num_passages: int) -> tuple[np.ndarray, np.ndarray]:
    """(q_index, p_index) [nq * np] of every (question, passage) pair, question-major: the
    pair list a grid reads (`SpanScores.reshape(nq, np)` gives it back as a grid)."""
    q_index, p_index = np.meshgrid(np.arange(num_questions), np.arange(num_passages),
                                   indexing="ij")
    return q_index.ravel(), p_index.ravel()


def collect_chunks(chunks: Iterable[tuple[np.ndarray, Sequence[Any]]], num_pairs: int,
                   passage_len: int, on_chunk: Callable[[int], None] | None = None
                   ) -> SpanScores:
    """The span scores of a pair list from a grid's chunks ((indices into the list, the
    chunk's device outputs: start, end [chunk, p_len], null start, end [chunk]), the first
    len(indices) rows real), copied off the devices. on_chunk: called with each chunk's
    number of pairs once it is read (a progress bar)."""
    # NaN until read: every pair is written, so none may stay NaN.
    out = SpanScores.full(num_pairs, passage_len, np.nan, np.nan)
    for pairs, outputs in chunks:
        out.set_rows(pairs, SpanScores(*(np.asarray(value)[:len(pairs)] for value in outputs)))
        if on_chunk is not None:
            on_chunk(len(pairs))
    return out
