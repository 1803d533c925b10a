"""Every program shape `OpenDomainReader.read` can meet in the server, and the warm-up that
compiles them before the first request.

What decides a read's compiled programs (dil_jax/open_domain/reader.py, dil_jax/reading/grid.py):

- the question batch: always padded to the grid's batch size B (`_encode_question_batch`), so
  one question-encoder program whatever the number of questions;
- the passage side: padded to `passage_rows` rows, fixed by the server (`passage_rows`, below),
  so one passage shape whatever a batch retrieves;
- per chunk of pairs, the token widths it reads (`ReusePlan.trims_padding`): the longest real
  question of the chunk rounded up to QUESTION_BUCKET, the longest real passage window rounded
  up to KEPT_BUCKET. Any question width can meet any passage width in some chunk, so the
  widths are a product: every question width up to max_question_len, and every passage width
  up to the windows' length (`POST /v1/read` cuts contexts of any length into windows, so
  the index's own window lengths do not bound them);
- 0 < k < l only: whether the first upper block's q/k/v are projected per question (when a
  batch reads >= min_reads x B pairs) and per passage (>= min_reads x rows pairs: `ReusePlan`),
  or read from the cache (`--cache-reuse` indexes; a context of `POST /v1/read` has none
  cached): `hoist_classes` lists the pair counts that reach each reachable combination.

A QANet / BiDAF reads through `CharPairGrid` (dil_jax/reading/char_grid.py): the same question
batch, passage rows and chunk widths, but nothing hoisted (one class), and its chunks are cut
to their real tokens only where that is exact (`CharPairGrid.trim_padding`): otherwise every
chunk reads the full widths, one program.

The warm-up (`warm_up`) runs each combination through the reader's own helpers
(`_encode_question_batch`, `_passage_side`, `_cached_reuse`) and the grid's chunk loop, so the
arguments have exactly the types, shapes and shardings a real read gives them; one chunk per
combination is computed. tests/serve/test_serve.py checks that reads after it compile nothing.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterator

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


def hoist_classes(plan: ReusePlan, cached_passages: bool, batch_size: int, rows: int,
                  most_pairs: int) -> list[HoistClass]:
    """The reachable combinations of projections, each with the smallest pair count that
    reaches it, by the grid's own rule (`ReusePlan.projects`). cached_passages: the passages'
    projections come from the cache (`reads_cached_reuse`), whatever the count."""
    if not plan.hoists_projections:
        return [HoistClass(1, False, False)]
    classes: dict[tuple[bool, bool], HoistClass] = {}
    for pairs in (1, plan.min_reads * batch_size, plan.min_reads * rows):
        if pairs > most_pairs:
            continue
        questions = plan.projects(pairs, batch_size)
        passages = not cached_passages and plan.projects(pairs, rows)
        classes.setdefault((questions, passages),
                           HoistClass(pairs, questions, passages, cached_passages))
    return list(classes.values())


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


@dataclasses.dataclass(frozen=True)
class WarmUpPlan:
    """The combinations a reader's warm-up compiles."""

    passage_rows: int
    classes: list[HoistClass]
    question_widths: list[int]
    passage_widths: list[int]

    @property
    def size(self) -> int:
        return len(self.classes) * len(self.question_widths) * len(self.passage_widths)

    def combinations(self) -> Iterator[tuple[HoistClass, int, int]]:
        for hoist in self.classes:
            for q_width in self.question_widths:
                for p_width in self.passage_widths:
                    yield hoist, q_width, p_width


def warm_up_plan(reader, questions: int | None = None) -> WarmUpPlan:
    """What `warm_up` compiles for this OpenDomainReader (its passage_rows must be set) when
    it reads at most `questions` questions at once (None: its grid's batch size)."""
    batch, rows = reader.grid.batch_size, reader.passage_rows
    q_len, p_len = reader.reader.config.max_question_len, reader.cache.mask.shape[1]
    if reader.reader.is_char_reader:
        trims = reader.grid.trim_padding
        return WarmUpPlan(passage_rows=rows, classes=[HoistClass(1, False, False)],
                          question_widths=question_widths(q_len) if trims else [q_len],
                          passage_widths=passage_widths(p_len) if trims else [p_len])
    plan = reader.grid.plan
    classes = hoist_classes(plan, reader.reads_cached_reuse, batch, rows,
                            max_pairs(reader.index.windows.counts(reader.top_p),
                                      questions or batch, reader.top_p))
    if reader.reads_cached_reuse:  # a context's windows (at most `rows` pairs) have no cache
        classes += hoist_classes(plan, False, batch, rows, rows)
    return WarmUpPlan(passage_rows=rows, classes=classes,
                      question_widths=question_widths(q_len),
                      passage_widths=passage_widths(p_len))


def warm_up(reader, progress: Callable[[int, int], None] | None = None,
            questions: int | None = None) -> int:
    """Compiles every program a read of at most `questions` questions by this reader can
    meet (`warm_up_plan`); returns the number of combinations run. progress(done, total)
    after each."""
    import jax

    from dil_jax.tokenization import encode_questions

    plan = warm_up_plan(reader, questions)
    config = reader.reader.config

    def mask_of(questions: list[str]) -> np.ndarray:
        return encode_questions(reader.reader.tokenizer, questions, config.max_question_len).mask

    questions = {width: question_of_width(width, config.max_question_len, mask_of)
                 for width in plan.question_widths}
    done = 0
    for hoist, q_width, p_width in plan.combinations():
        q_lower, q_mask = reader._encode_question_batch([questions[q_width]])
        rows = np.zeros(1, np.int64)
        p_source, p_mask = reader._passage_side(rows)
        # A program's shape depends on the width its chunk reads, not on the values: the
        # window's mask is made exactly p_width long (the index may hold no such window).
        p_mask[0] = np.arange(p_mask.shape[1]) < p_width
        # Handed in only when cached: a CharPairGrid takes no such arguments.
        reuse = {}
        if hoist.cached_passages:
            reuse = dict(zip(("p_qkv", "p_stats"), reader._cached_reuse(rows)))
        index = np.zeros(hoist.pairs, np.int64)
        chunks = reader.grid.iter_pair_chunks(reader.reader.params, q_lower, q_mask, p_source,
                                              p_mask, index, index, **reuse)
        # Every chunk of these identical pairs has the same widths: the first compiles them.
        _, outputs = next(chunks)
        jax.block_until_ready(outputs)
        chunks.close()
        done += 1
        if progress is not None:
            progress(done, plan.size)
    return done
