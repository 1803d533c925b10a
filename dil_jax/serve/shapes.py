"""Every program shape `OpenDomainReader.read` can meet in the server, and the warm-up that
compiles them: the widest first, before the server says it is ready, the rest while it idles.

What decides a read's compiled programs (dil_jax/open_domain/reader.py, dil_jax/reading/grid.py):

- the question batch: always padded to the grid's batch size B (`_encode_question_batch`), so
  one question-encoder program whatever the number of questions;
- the passage side: padded to `passage_rows` rows, fixed by the server (`passage_rows`, below),
  so one passage shape whatever a batch retrieves;
- per chunk of pairs (dil_jax/reading/chunks.py): its rows (`chunk_rows`: a list's short
  remainder runs at the smallest power of two that holds it, the others at the chunk size)
  and the token widths it reads (`ReusePlan.trims_padding`): the longest real question of the
  chunk rounded up to QUESTION_BUCKET, the longest real passage window rounded up to
  KEPT_BUCKET. Any question width can meet any passage width in some chunk, so the widths are
  a product: every question width up to max_question_len, and every passage width up to the
  windows' length (`POST /v1/read` cuts contexts of any length into windows, so the index's
  own window lengths do not bound them);
- 0 < k < l only: whether the first upper block's q/k/v are projected per question (when a
  batch reads >= min_reads x B pairs) and per passage (>= min_reads x rows pairs: `ReusePlan`),
  or read from the cache (`--cache-reuse` indexes; a context of `POST /v1/read` has none
  cached): `pair_counts_by_rows` finds a pair count for each reachable class and row count.

A QANet / BiDAF reads through `CharPairGrid` (dil_jax/reading/char_grid.py): the same question
batch, passage rows and chunks, but nothing hoisted (one class), and its chunks are cut to
their real tokens only where that is exact (`CharPairGrid.trim_padding`): otherwise every chunk
reads the full widths.

Why the widest first (`WarmUpPlan`): a chunk can run at any compiled shape that holds it (more
rows and wider widths are padding, masked as padding is: the grid's `ShapeBook`), so the widest
shape of each class is enough to answer everything; the server is ready after those few and
compiles the narrower ones, each a speed-up only, between requests (dil_jax.serve.engine).
One narrower program is compiled before ready too: the fewest-row chunk (one row per device)
at the widest widths of the class a single pair falls in (`ready_programs`), the chunk of a
one-window `/v1/read`, which would otherwise run padded to a whole chunk (8 rows on a CPU: 8x
its work) until the idle warm-up reaches it. Of the rest, the widest program of each row count
comes first: the rows a chunk is padded to cost far more than its widths (up to 8x against
~1.5x).

The warm-up (`warm_up`) runs each program through the reader's own helpers
(`_encode_question_batch`, `_passage_side`, `_cached_reuse`) and the grid's chunk loop, so the
arguments have exactly the types, shapes and shardings a real read gives them; at most two
chunks per program are computed. tests/serve/test_serve.py checks that no request compiles.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import Callable

import numpy as np

from dil_jax.open_domain.index.windows import WindowCounts
from dil_jax.reading.pairs import KEPT_BUCKET, QUESTION_BUCKET, chunk_width, real_lengths
from dil_jax.reading.plan import ReusePlan
from dil_jax.rounding import round_up

log = logging.getLogger(__name__)


def _counts(window_counts: np.ndarray | WindowCounts, top_p: int) -> WindowCounts:
    """The window counts of an index's passages (every one, or `PassageWindows.counts`)."""
    if isinstance(window_counts, WindowCounts):
        return window_counts
    return WindowCounts.of([np.asarray(window_counts)], top_p)


def passage_rows(window_counts: np.ndarray | WindowCounts, batch_size: int, top_p: int) -> int:
    """The passage rows every batch is padded to: the most distinct windows one batch can
    read (B questions, each reading every window of its top_p passages: at most the top_p
    passages with the most windows, and at most every window of the index), rounded up to
    whole B x top_p blocks as `OpenDomainReader._padded_rows` rounds."""
    counts = _counts(window_counts, top_p)
    most = min(counts.total, batch_size * int(counts.largest[:top_p].sum()))
    return round_up(max(most, 1), batch_size * top_p)


def max_pairs(window_counts: np.ndarray | WindowCounts, batch_size: int, top_p: int) -> int:
    """The most (question, window) pairs one batch can read."""
    return batch_size * int(_counts(window_counts, top_p).largest[:top_p].sum())


def question_widths(max_question_len: int) -> list[int]:
    """Every width a chunk can read of its questions (`chunk_width` over real lengths
    1..max_question_len)."""
    return sorted({chunk_width(np.array([n]), QUESTION_BUCKET, max_question_len)
                   for n in range(1, max_question_len + 1)})


def passage_widths(passage_len: int) -> list[int]:
    """Every width a chunk can read of its passage windows (`chunk_width` over real lengths
    1..passage_len)."""
    return sorted({chunk_width(np.array([n]), KEPT_BUCKET, passage_len)
                   for n in range(1, passage_len + 1)})


@dataclasses.dataclass(frozen=True)
class HoistClass:
    """A pair count of a batch, and which first-upper-block projections it makes the chunk
    loop compute (`PairGrid.iter_pair_chunks`)."""

    pairs: int
    questions_projected: bool
    passages_projected: bool
    cached_passages: bool = False  # the passages' projections handed in from the cache


def question_of_width(width: int, max_question_len: int,
                      encode: Callable[[list[str]], np.ndarray]) -> str:
    """A question whose encoded real length rounds up to `width` (QUESTION_BUCKET); encode:
    questions -> their [n, max_question_len] mask. Words are added until it does."""
    for words in range(1, 2 * max_question_len + 1):
        text = " ".join(["who"] * words) + "?"
        real = int(real_lengths(encode([text]))[0])
        if chunk_width(np.array([real]), QUESTION_BUCKET, max_question_len) == width:
            return text
    raise ValueError(f"no question of width {width} found (max_question_len "
                     f"{max_question_len})")


def pair_counts_by_rows(plan: ReusePlan, cached_passages: bool, batch_size: int, rows: int,
                        most_pairs: int, chunk_size: int, row_choices: list[int]
                        ) -> dict[tuple[HoistClass, int], int]:
    """(hoist class, chunk rows) -> a pair count whose chunk list holds a chunk of those rows
    in that class, for every reachable combination (`chunk_spans`: a count's short remainder,
    then whole chunks). The classes change at the thresholds of `ReusePlan.projects`; within
    a class, every remainder is met within two chunks of its first count."""
    edges = {1}
    if plan.hoists_projections:
        edges |= {plan.min_reads * batch_size, plan.min_reads * rows}
    edges = sorted(edge for edge in edges if edge <= most_pairs) + [most_pairs + 1]
    counts: dict[tuple[HoistClass, int], int] = {}
    for first, end in itertools.pairwise(edges):
        hoist = hoist_class_of(plan, cached_passages, batch_size, rows, first)
        for pairs in range(first, min(end, first + 2 * chunk_size)):
            short = pairs % chunk_size
            reached = ([next(r for r in row_choices if r >= short)] if short else []) + \
                ([chunk_size] if pairs >= chunk_size else [])
            for chunk_rows in reached:
                counts.setdefault((hoist, chunk_rows), pairs)
    return counts


def hoist_class_of(plan: ReusePlan, cached_passages: bool, batch_size: int, rows: int,
                   pairs: int) -> HoistClass:
    """The hoist class of a batch of `pairs` pairs, by the grid's own rule
    (`ReusePlan.projects`), keyed with pairs = 1 (the class, not one of its counts).
    cached_passages: the passages' projections come from the cache, whatever the count."""
    if not plan.hoists_projections:
        return HoistClass(1, False, False)
    return HoistClass(1, plan.projects(pairs, batch_size),
                      not cached_passages and plan.projects(pairs, rows), cached_passages)


@dataclasses.dataclass(frozen=True)
class ChunkProgram:
    """One chunk program a warm-up compiles: a list of `pairs` identical pairs, in a hoist
    class, whose chunks include one of `rows` rows reading q_width question and p_width
    passage tokens (None: the full lengths, a grid that does not trim)."""

    hoist: HoistClass
    pairs: int
    rows: int
    q_width: int | None
    p_width: int | None


@dataclasses.dataclass(frozen=True)
class WarmUpPlan:
    """The chunk programs a reader can meet, the first `ready_count` of them compiled before
    the server says it is ready: the widest shape of each hoist class (most rows, widest
    widths), which holds every chunk of that class (`ShapeBook`); the rest are compiled while
    the server is idle, each then used by the chunks it fits best."""

    passage_rows: int
    programs: list[ChunkProgram]
    ready_count: int
    question_widths: list[int | None]
    passage_widths: list[int | None]

    @property
    def size(self) -> int:
        return len(self.programs)


def ready_programs(counts: dict[tuple[HoistClass, int], int], q_width: int | None,
                   p_width: int | None, lone: HoistClass, fewest_rows: int
                   ) -> list[ChunkProgram]:
    """The programs compiled before ready, from `pair_counts_by_rows`' counts: the widest
    (most rows, the widest widths q_width x p_width) of each hoist class, which holds every
    chunk of its class, then the program of `lone`, the class of a single pair (a one-window
    context), at the fewest rows a chunk runs at (`chunk_row_choices`' first: one per device),
    when that is not one of them already."""
    widest: dict[HoistClass, tuple[int, int]] = {}
    for (hoist, chunk_rows), pairs in counts.items():
        if chunk_rows > widest.get(hoist, (0, 0))[0]:
            widest[hoist] = (chunk_rows, pairs)
    programs = [ChunkProgram(hoist, pairs, chunk_rows, q_width, p_width)
                for hoist, (chunk_rows, pairs) in widest.items()]
    one_row = ChunkProgram(lone, counts[lone, fewest_rows], fewest_rows, q_width, p_width)
    return programs + [one_row] * (one_row not in programs)


def warm_up_plan(reader, questions: int | None = None) -> WarmUpPlan:
    """What `warm_up` compiles for this OpenDomainReader (its passage_rows must be set) when
    it reads at most `questions` questions at once (None: its grid's batch size)."""
    grid = reader.grid
    batch, rows = grid.batch_size, reader.passage_rows
    q_len, p_len = reader.reader.config.max_question_len, reader.cache.mask.shape[1]
    most = max_pairs(reader.index.windows.counts(reader.top_p), questions or batch,
                     reader.top_p)
    # A context of POST /v1/read fills at most the passage rows (`context_groups`).
    most = max(most, rows)
    # A reader without a ReusePlan (QANet / BiDAF) has one hoist class and its grid's trimming.
    pair_reuse = reader.reader.capabilities.pair_reuse
    trims = grid.plan.trims_padding if pair_reuse else grid.trim_padding
    q_widths = question_widths(q_len) if trims else [None]
    p_widths = passage_widths(p_len) if trims else [None]
    if not pair_reuse:
        plan, variants = None, [False]
    else:
        plan = grid.plan
        # A context's windows have no cache: a --cache-reuse index's reader meets both.
        variants = [reader.reads_cached_reuse] + [False] * reader.reads_cached_reuse
    counts: dict[tuple[HoistClass, int], int] = {}
    for cached in variants:
        found = pair_counts_by_rows(plan or _NO_HOIST, cached, batch, rows, most,
                                    grid.chunk_size, grid.chunk_row_choices())
        for key, pairs in found.items():
            counts.setdefault(key, pairs)
    # A context's windows are never cached: a single pair's class is the uncached one.
    lone = hoist_class_of(plan or _NO_HOIST, False, batch, rows, 1)
    first = ready_programs(counts, q_widths[-1], p_widths[-1], lone,
                           grid.chunk_row_choices()[0])
    # The rest: the widest of each row count first (rows cost most), then whole chunks (the
    # answer route's), then the shorter ones (a context of /v1/read holds few), narrow before
    # wide.
    rest = [ChunkProgram(hoist, pairs, chunk_rows, q_width, p_width)
            for (hoist, chunk_rows), pairs in sorted(counts.items(),
                                                     key=lambda item: -item[0][1])
            for q_width in q_widths for p_width in p_widths]
    rest = sorted((program for program in rest if program not in first),
                  key=lambda program: (program.q_width, program.p_width)
                  != (q_widths[-1], p_widths[-1]))
    return WarmUpPlan(passage_rows=rows, programs=first + rest, ready_count=len(first),
                      question_widths=q_widths, passage_widths=p_widths)


# The plan of a reader that never hoists (QANet / BiDAF): one class.
_NO_HOIST = ReusePlan(plain_upper=True, reads_passage_ids=False, hoists_projections=False,
                      span_rows_only=False, passage_stats=False, trims_padding=False,
                      reads_kept_tokens=False)


def warm_up_questions(reader) -> dict[int | None, str]:
    """Question width -> a question that reads it (None: the full length), for `warm_up`."""
    from dil_jax.tokenization import encode_questions

    q_len = reader.reader.config.max_question_len

    def mask_of(questions: list[str]) -> np.ndarray:
        return encode_questions(reader.reader.tokenizer, questions, q_len).mask

    widths = question_widths(q_len)
    texts: dict[int | None, str] = {width: question_of_width(width, q_len, mask_of)
                                    for width in widths}
    texts[None] = texts[widths[-1]]
    return texts


def warm_up(reader, program: ChunkProgram, questions: dict[int | None, str]) -> None:
    """Compiles one chunk program of this OpenDomainReader (and whatever the chunk loop
    computes before it: the hoisted projections of its class), recording the shapes it ran
    in the grid's `shape_book`. questions: `warm_up_questions(reader)`."""
    import jax

    q_lower, q_mask = reader._encode_question_batch([questions[program.q_width]])
    rows = np.zeros(1, np.int64)
    p_source, p_mask = reader._passage_side(rows)
    # A program's shape depends on the width its chunk reads, not on the values: the window's
    # mask is made exactly that long (the index may hold no such window).
    p_mask[0] = np.arange(p_mask.shape[1]) < (program.p_width or p_mask.shape[1])
    # Handed in only when cached: a CharPairGrid takes no such arguments.
    reuse = {}
    if program.hoist.cached_passages:
        reuse = dict(zip(("p_qkv", "p_stats"), reader._cached_reuse(rows)))
    index = np.zeros(program.pairs, np.int64)
    book = reader.grid.shape_book
    if book is not None:
        book.compiling = True
    try:
        chunks = reader.grid.iter_pair_chunks(reader.reader.params, q_lower, q_mask, p_source,
                                              p_mask, index, index, **reuse)
        # Identical pairs: the chunks differ in rows only; the short one comes first.
        for _, outputs in chunks:
            jax.block_until_ready(outputs)
            if np.shape(outputs[0])[0] == program.rows:
                break
        chunks.close()
    finally:
        if book is not None:
            book.compiling = False
