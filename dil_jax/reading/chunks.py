"""How a list of pairs is cut into chunks, and the shape each chunk's program runs at.

A grid (`PairGrid`, `CharPairGrid`) reads pairs `chunk_size` at a time through one jitted
program per chunk shape: its rows (pairs, real or padding) and, where the plan trims padding,
the question and passage widths it reads (`chunk_width`). Two rules here:

- **A short chunk runs short.** The last chunk of a list is padded only to the smallest row
  count of `chunk_row_choices` that holds it (powers of two times the device count, up to
  `chunk_size`), not to `chunk_size`: one window of `POST /v1/read` runs one row, not eight.
  Pairs are independent rows of the program, so the rows a chunk is padded to change no pair's
  scores beyond float rounding. The short chunk comes first (`chunk_spans`), so a warm-up that
  runs one chunk of a list compiles the short shape (dil_jax.serve.shapes).
- **Pairs of unequal widths may be split** (`width_spans`, a short list only: at most one
  chunk of pairs, e.g. a context's windows or a lone question's round). A chunk is as wide as
  its widest pair, so a context of a full window and a short tail read in one chunk reads the
  tail at the full width; two chunks read each at its own width but pay a second program call.
  The cut with the least rows x widths, each call counted as CHUNK_CALL_TOKENS more, is taken;
  pairs of equal widths are never split (a list of identical pairs, as the server's warm-up
  reads, is cut as `chunk_spans` cuts it).
- **A served chunk runs at a compiled shape** (`ShapeBook`). A server compiles the widest shapes
  first, says it is ready, and compiles the others while idle; until then a chunk runs at the
  cheapest compiled shape that holds it (more rows, wider widths: padding, masked as padding
  is), so no request compiles. Outside a server there is no book and every chunk runs at its
  own shape.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Iterator, Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class ChunkShape:
    """The static shape of one chunk program: rows (pairs) and the question and passage
    widths it reads (None: the full lengths, for a grid that does not trim padding)."""

    rows: int
    q_width: int | None = None
    p_width: int | None = None

    def holds(self, other: ChunkShape) -> bool:
        """Whether a chunk of shape `other` can run at this shape (as many rows or more, each
        width as wide or wider; untrimmed widths only hold untrimmed ones)."""
        return (self.rows >= other.rows and _wider(self.q_width, other.q_width)
                and _wider(self.p_width, other.p_width))

    @property
    def cost(self) -> int:
        """A proxy of the program's work, to choose among shapes that hold a chunk: rows times
        the tokens read (the full lengths count as one unit: they are never compared with
        trimmed widths)."""
        return self.rows * max((self.q_width or 0) + (self.p_width or 0), 1)


def _wider(mine: int | None, theirs: int | None) -> bool:
    if mine is None or theirs is None:
        return mine is None and theirs is None
    return mine >= theirs


def chunk_row_choices(chunk_size: int, num_devices: int = 1) -> list[int]:
    """The row counts a chunk program runs at: num_devices x 1, 2, 4, ... below chunk_size, and
    chunk_size (a multiple of num_devices: every device gets an equal slice)."""
    if chunk_size < 1 or num_devices < 1 or chunk_size % num_devices:
        raise ValueError(f"chunk_size {chunk_size} must be a positive multiple of the device "
                         f"count {num_devices}")
    rows, choices = num_devices, []
    while rows < chunk_size:
        choices.append(rows)
        rows *= 2
    return choices + [chunk_size]


def chunk_rows(pairs: int, chunk_size: int, num_devices: int = 1) -> int:
    """The rows a chunk of `pairs` (1..chunk_size) real pairs is padded to: the smallest choice
    of `chunk_row_choices` that holds them."""
    if not 1 <= pairs <= chunk_size:
        raise ValueError(f"a chunk holds 1..{chunk_size} pairs, got {pairs}")
    return next(rows for rows in chunk_row_choices(chunk_size, num_devices) if rows >= pairs)


def padded_pairs(num_pairs: int, chunk_size: int, num_devices: int = 1) -> int:
    """The program rows a list of num_pairs pairs runs at (`chunk_spans`, `chunk_rows`):
    whole chunks, and the short remainder at the smallest row choice that holds it."""
    short = num_pairs % chunk_size
    return (num_pairs - short) + (chunk_rows(short, chunk_size, num_devices) if short else 0)


def chunk_spans(num_pairs: int, chunk_size: int) -> Iterator[slice]:
    """The chunks of a list of num_pairs pairs, as slices of it: the short remainder first (if
    any), then whole chunks of chunk_size."""
    short = num_pairs % chunk_size
    if short:
        yield slice(0, short)
    for start in range(short, num_pairs, chunk_size):
        yield slice(start, start + chunk_size)


# What one more chunk program call costs beyond its rows x widths, in tokens of one row: the
# dispatch and every op's fixed overhead, whatever the rows read. Sized for MiniLM-sized
# readers on a CPU, where a lone pair's program is mostly per-token work; a wider model's
# token costs more, so there the same call is worth fewer tokens and this errs toward one
# chunk (docs/serving.md, "Measured": what the cut gained on /v1/read).
CHUNK_CALL_TOKENS = 16


def width_spans(widths: Sequence[Hashable], chunk_cost: Callable[[int, int], int],
                chunk_size: int) -> list[slice]:
    """The cheapest cut of a short list of pairs (at most chunk_size, in the order they are
    read, widest last) into chunks, cut only between pairs of unequal widths.

    widths: [num_pairs] each pair's (question, passage) widths; chunk_cost(start, end): the
    cost of reading pairs start..end as one chunk (its rows x widths at the shape it runs at),
    to which each chunk adds CHUNK_CALL_TOKENS. Dynamic programming over the cut points; the
    chunks come in list order.
    """
    num_pairs = len(widths)
    if not 1 <= num_pairs <= chunk_size:
        raise ValueError(f"width_spans cuts 1..{chunk_size} pairs, got {num_pairs}")
    cuts = [0] + [end for end in range(1, num_pairs) if widths[end] != widths[end - 1]]
    cuts.append(num_pairs)
    best = {0: (0, 0)}  # cut -> (least cost of pairs before it, the cut before it)
    for end in cuts[1:]:
        best[end] = min((best[start][0] + chunk_cost(start, end) + CHUNK_CALL_TOKENS, start)
                        for start in cuts if start < end)
    spans, end = [], num_pairs
    while end:
        start = best[end][1]
        spans.append(slice(start, end))
        end = start
    return spans[::-1]


def padded_chunk(index: np.ndarray, rows: int) -> np.ndarray:
    """A chunk's pair indices [n] padded to [rows] by repeating its last pair (the caller
    drops the padding rows' outputs)."""
    index = np.asarray(index, np.int32)
    return np.pad(index, (0, rows - len(index)), mode="edge")


class ShapeBook:
    """The chunk shapes compiled so far, per program signature (the shapes of everything else
    the program reads: question and passage counts, which optional inputs it is given).

    While `compiling` (a warm-up running a shape to compile it), a chunk runs at its own shape
    and that shape is recorded; otherwise it runs at the cheapest recorded shape that holds it.
    A signature with no recorded shape that holds the chunk runs at its own shape (a compile:
    the server's warm-up records the widest shape of every signature before it is ready, so
    that this does not happen after /readyz; the server counts such compiles in /metrics).
    Used from the one thread that runs the programs (the serve worker).
    """

    def __init__(self) -> None:
        self.compiling = False
        self._shapes: dict[Hashable, set[ChunkShape]] = {}

    def add(self, signature: Hashable, shape: ChunkShape) -> None:
        self._shapes.setdefault(signature, set()).add(shape)

    def has(self, signature: Hashable, shape: ChunkShape) -> bool:
        return shape in self._shapes.get(signature, ())

    def shape_for(self, signature: Hashable, needed: ChunkShape) -> ChunkShape:
        """The shape a chunk that needs `needed` runs at (see the class docstring); while
        compiling, recorded."""
        if self.compiling:
            self.add(signature, needed)
        return self.would_run_at(signature, needed)

    def would_run_at(self, signature: Hashable, needed: ChunkShape) -> ChunkShape:
        """`shape_for` without recording anything (to price a chunk before reading it)."""
        if self.compiling:
            return needed
        holding = [shape for shape in self._shapes.get(signature, ()) if shape.holds(needed)]
        return min(holding, key=lambda shape: (shape.cost, shape.rows)) if holding else needed
