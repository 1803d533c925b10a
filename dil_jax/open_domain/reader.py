"""The open-domain reader: BM25 top-p passages, cached passage states, pair grid, score fusion.

For a batch of questions:
  1. retrieval: BM25 top-p passages of each question;
  2. question lower: each question once through `encode_lower`;
  3. pair upper: every (question, window of a retrieved passage) pair through the upper blocks,
     spread over all devices in fixed-size chunks (`dil_jax.reading.grid.PairGrid`); the passage
     side (`PassageCache.passage_side`: lower states, or at k = 0 the tokens, embedded per pair) is
     read from the passage cache, only for the retrieved windows, and so, when the cache holds them
     (`dil-jax index --cache-reuse`), are the first upper block's passage q/k/v and attention
     statistics (`dil_jax.open_domain.cache.reuse`; not for prescreened pairs);
  4. each pair's best span (the SQuAD decoding rule: max-context start, span length limit), text
     sliced from the passage's original characters.

With window pruning (`pruning=`, `dil_jax.open_domain.pruning`), step 3 reads each question's
passages in BM25 order, a few at a time, and stops once no unread passage can change its answer
(exact with the reader's bound on any score; approximate with an assumed one).

With sentence prescreening (`prescreen=`), between 1 and 3 the prescreener scores each retrieved
passage's stored sentence embeddings against the question's, a `SentenceRule` keeps some, and each
pair's upper blocks read only the kept sentences' tokens (the cached lower states of the whole
passage, gathered; `dil_jax.reading.pairs.kept_positions`). Spans stay in passage characters.

Scores: a passage's reader score s_r is that of its best span, by one of two rules
(`SPAN_SCORES`): "logits", the DilBert paper's (s_start + s_end) / 2, or "margin", the same less
the window's no-answer score, (s_start + s_end - s_null_start - s_null_end) / 2. A reader trained
on one window at a time learns each window's softmax, which is unchanged by adding a constant to
all of that window's logits: its raw logits carry an offset per window that nothing in training
fixes, and "logits" compares those offsets across passages; "margin" cancels the offset (it is a
difference of two logits of the same softmax), so it compares how far each passage's answer
stands above that passage's own "no answer". (A reader trained with shared normalisation across a
question's windows learns comparable raw logits; both rules then have a meaning.) The best span
of a window is the same under both rules; the best window of a passage, and so the scores, may
differ. With fusion the answer maximises mu * z(s_r) + (1 - mu) * z(s_bm25), where z()
standardises a score over the question's p candidates (subtract their mean, divide by their
standard deviation). Why: BM25 scores grow with query length and term rarity, reader logits have
a model-specific scale; over the same candidate set both become unitless "how many deviations
above the other candidates", so mu weighs comparable quantities, and mu = 1 is the reader alone.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import jax
import numpy as np

from dil_jax.data.decoding import window_nbest
from dil_jax.defaults import SPAN_SCORES
from dil_jax.errors import DilJaxError
from dil_jax.model.attention import QKV, PassageAttentionStats
from dil_jax.model.delayed import InputError
from dil_jax.open_domain.abstention import Abstention, Decision, retrieval_match
from dil_jax.open_domain.answer_text import answer_lines, passage_context
from dil_jax.open_domain.cache.reuse import pair_inputs
from dil_jax.open_domain.cache.store import PassageCache
from dil_jax.open_domain.index.folder import OpenDomainIndex, PassageWindows, window_arrays
from dil_jax.open_domain.pruning import (
    WindowPruning,
    reader_score_bounds,
    settled_questions,
    span_head_bounds,
)
from dil_jax.open_domain.scoring import (
    Candidate,
    best_pair_of_each_hit,
    pair_span_scores,
    pick_answer,
)
from dil_jax.readers.protocol import TokenRows
from dil_jax.reading.chunks import padded_pairs
from dil_jax.reading.pairs import SpanScores, kept_positions
from dil_jax.rounding import round_up
from dil_jax.tokenization import Segments, encode_questions

if TYPE_CHECKING:
    from dil_jax.open_domain.index.sentences import SentenceStore
    from dil_jax.prescreening.prescreener import SentencePrescreener
    from dil_jax.prescreening.screen import SentenceRule
    from dil_jax.readers.protocol import Reader


class ReaderScoreError(DilJaxError, ValueError):
    """The reader produced NaN or infinite span scores; names the question and passage."""


def _pad_rows(array: np.ndarray, rows: int) -> np.ndarray:
    """array [n, ...] zero-padded to [rows, ...]."""
    return np.pad(array, ((0, rows - array.shape[0]),) + ((0, 0),) * (array.ndim - 1))


@functools.partial(jax.jit, donate_argnums=0)
def _write_first_rows(buffers, values):
    """`buffers` (a tree of [rows, ...] arrays) with their first n rows replaced by `values`'
    ([n, ...] each, n <= rows), in place: the buffers are donated, so only n rows are written."""
    return jax.tree.map(
        lambda buffer, new: jax.lax.dynamic_update_slice_in_dim(buffer, new.astype(buffer.dtype),
                                                                0, axis=0), buffers, values)


# The buffers of `ResidentRows`: the passage side and the cached first-upper-block arrays.
PASSAGE_SIDE, CACHED_REUSE = "passage_side", "cached_reuse"


class ResidentRows:
    """A served reader's passage side, kept on its devices at the fixed `passage_rows`.

    A server pads every read's passage side to one row count, so that its pair programs have one
    passage shape (dil_jax.serve.shapes). Padding a fresh copy each read costs a whole
    [passage_rows, p_len, hidden] array of float32 written and placed on the devices: for a lone
    question's pruned round of a few windows that was much of its time (measured in
    docs/serving.md). Here each read writes only its own rows, packed first, into buffers
    that stay on the devices (`_write_first_rows`, donated: in place). Rows past them hold an
    earlier read's values, which no pair reads (a pair's passage index is one of this read's
    rows) and which the mask, built fresh each read, marks as padding. A write of n rows runs
    at n rounded up to a power of two (`write_rows`), so a reader has log2(passage_rows)
    programs of it (`compile_writes`). Shared by a reader's copies (`with_pruning`), used from
    the one thread that reads (the server's worker): not thread-safe."""

    def __init__(self, rows: int, sharding) -> None:
        self.rows, self.sharding = rows, sharding
        self._buffers: dict[str, object] = {}

    def write_rows(self, name: str, values):
        """The `name` buffers (a tree of [rows, ...] device arrays) with `values` (the same tree
        of [n, ...] numpy arrays, 0 <= n <= rows) as their first rows. The arrays returned by an
        earlier call for `name` are deleted (donated): hold only the latest."""
        n = jax.tree.leaves(values)[0].shape[0]
        if n > self.rows:
            raise ValueError(f"{n} rows to write: the passage side holds at most {self.rows}")
        buffers = self._buffers.get(name)
        if buffers is None:
            buffers = jax.tree.map(lambda array: jax.device_put(
                np.zeros((self.rows, *np.shape(array)[1:]), np.asarray(array).dtype),
                self.sharding), values)
        if n == 0:  # a read with nothing retrieved: no pair reads the passage side
            self._buffers[name] = buffers
            return buffers
        padded = min(self.rows, 1 << (n - 1).bit_length())
        values = jax.tree.map(lambda array: _pad_rows(np.asarray(array), padded), values)
        self._buffers[name] = _write_first_rows(buffers, jax.device_put(values, self.sharding))
        return self._buffers[name]

    def compile_writes(self, name: str, example) -> None:
        """Compiles every write size of the `name` buffers (`example`: a tree of [n, ...]
        arrays of their dtypes and trailing shapes), so that no read compiles one."""
        n = 1
        while True:
            size = min(n, self.rows)
            self.write_rows(name, jax.tree.map(
                lambda array, size=size: np.zeros((size, *np.shape(array)[1:]),
                                                  np.asarray(array).dtype), example))
            if size == self.rows:
                return
            n *= 2


def check_read_lengths(reader: Reader, max_passage_len: int) -> None:
    """Raises InputError unless questions of the reader's `max_question_len` tokens and index
    windows of `max_passage_len` tokens fit the reader's position table (k = 0: together;
    `Reader.check_lengths`: nothing to check without one).

    Called when an index is built (before hours of caching) and when a reader opens one.
    """
    reader.check_lengths(
        reader.config.max_question_len, max_passage_len,
        fix="lower --max-question-len, or build the index with a smaller --max-passage-len "
            "(dil-jax index)")


def _check_finite(start_logits: np.ndarray, end_logits: np.ndarray,
                  pair_hit: Sequence[tuple[int, int]], questions: Sequence[str], hits,
                  passages) -> None:
    """Raises ReaderScoreError at the first pair with a NaN or +inf score. (-inf is allowed:
    tokens dropped by prescreening score -inf on purpose.) Why: a NaN span score compares
    false with everything, so the pair would silently drop out and, if all did, the question
    would read as "no passage" instead of a broken reader."""
    bad = np.isnan(start_logits) | np.isnan(end_logits) | (start_logits == np.inf) | \
        (end_logits == np.inf)
    rows = np.nonzero(bad.any(axis=1))[0]
    if not len(rows):
        return
    pair = int(rows[0])
    qi, hi = pair_hit[pair]
    passage = passages[hits[qi][hi].passage_index]
    raise ReaderScoreError(
        f"the reader produced non-finite span scores (NaN or inf) for question "
        f"{questions[qi]!r} on passage {passage.passage_id} ({passage.title!r}), and "
        f"{len(rows) - 1} more pair(s); the checkpoint's weights may hold NaN/inf, or its "
        f"position table is shorter than the question + passage lengths")


@dataclasses.dataclass
class ReadResult:
    """Candidates of each question, in retrieval order (best BM25 first), and phase times (s).

    candidates: under the reader's own rule (`OpenDomainReader.span_score`); by_score: the same
    read's candidates under every rule of SPAN_SCORES (decoding only: the read is shared).
    pairs_read, tokens_read: per question, the (question, window) pairs its upper blocks read
    and the passage tokens those pairs held (real tokens; kept ones under prescreening).
    kept_texts: under prescreening, per question, each retrieved passage's kept sentences as
    one text (the seed's P(SEP): does the kept text still hold the answer?)."""

    candidates: list[list[Candidate]]
    hits: list[list]  # BM25 hits of each question, best first
    timings: dict[str, float]
    by_score: dict[str, list[list[Candidate]]] = dataclasses.field(default_factory=dict)
    pairs_read: list[int] = dataclasses.field(default_factory=list)
    tokens_read: list[int] = dataclasses.field(default_factory=list)
    # Under prescreening, per question and retrieved passage (BM25 order), the text its kept
    # sentences hold (what the upper blocks may answer from); empty without prescreening.
    kept_texts: list[list[str]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class ReaderPrescreen:
    """Sentence prescreening for the open-domain reader: the model, its rule, the index's
    stored sentence embeddings (dil_jax.open_domain.index.sentences)."""

    prescreener: SentencePrescreener
    rule: SentenceRule
    store: SentenceStore


@contextlib.contextmanager
def _timed(timings: dict[str, float], phase: str) -> Iterator[None]:
    """Adds the seconds the `with` body takes to timings[phase]."""
    clock = time.perf_counter()
    yield
    timings[phase] += time.perf_counter() - clock


@dataclasses.dataclass
class RetrievedPairs:
    """The (question, window) pairs of a batch: every window of every retrieved passage.

    One entry per pair, in the same order in each list: question: the question's number in the
    batch; row: the window's index (and cache) row; hit: (question number, BM25 rank) of the
    retrieved passage the window belongs to.
    """

    question: list[int]
    row: list[int]
    hit: list[tuple[int, int]]

    @classmethod
    def of_hits(cls, windows: PassageWindows, hits: Sequence[Sequence]) -> RetrievedPairs:
        """Pairs for every window of every hit, question by question, in retrieval order."""
        pairs = cls([], [], [])
        keys = [(qi, hi) for qi, question_hits in enumerate(hits)
                for hi in range(len(question_hits))]
        if not keys:
            return pairs
        # Every hit's first row and window count in one read each (not a read per passage).
        passages = np.asarray([hits[qi][hi].passage_index for qi, hi in keys], np.int64)
        firsts, counts = np.asarray(windows.first[passages]), np.asarray(windows.count[passages])
        for (qi, hi), first, count in zip(keys, firsts.tolist(), counts.tolist(), strict=True):
            pairs.question += [qi] * count
            pairs.row += range(first, first + count)
            pairs.hit += [(qi, hi)] * count
        return pairs

    def subset(self, read: np.ndarray) -> RetrievedPairs:
        """The pairs whose entry of `read` ([n_pairs] bool) is true, in order."""
        return RetrievedPairs(*([v for v, r in zip(values, read, strict=True) if r]
                                for values in (self.question, self.row, self.hit)))

    def per_question(self, values: np.ndarray, num_questions: int) -> list[int]:
        """[num_questions] the sum of `values` ([n_pairs]) over each question's pairs."""
        sums = np.zeros(num_questions, np.int64)
        np.add.at(sums, np.asarray(self.question, np.int64), np.asarray(values, np.int64))
        return sums.tolist()


def _take_scores(scores: SpanScores, rows: np.ndarray) -> SpanScores:
    """The scores of these pairs ([n] indices or bool mask of the first axis)."""
    return SpanScores(*(np.asarray(values)[rows] for values in scores.arrays))


def passage_windows(pair_question: np.ndarray, pair_rank: np.ndarray) -> np.ndarray:
    """[n_questions, max_hits] each question's passages' window counts in BM25 order (0 past
    its last), from its pairs' questions and passage ranks [n_pairs] (a pair is a window)."""
    pair_question = np.asarray(pair_question, np.int64)
    pair_rank = np.asarray(pair_rank, np.int64)
    windows = np.zeros((int(pair_question.max(initial=-1)) + 1,
                        int(pair_rank.max(initial=-1)) + 1), np.int64)
    np.add.at(windows, (pair_question, pair_rank), 1)
    return windows


def round_depths(depth: np.ndarray, unsettled: Sequence[int], windows: np.ndarray,
                 stage: int, chunk_size: int, num_devices: int = 1) -> np.ndarray:
    """The depths (passages read in BM25 order, [n_questions]) after the next round of a
    pruned read.

    windows [n_questions, max_hits]: the window count of each question's passages in BM25
    order (0 past its last). Each `unsettled` question at least doubles what it has read
    (`stage` passages in its first round): a question that settles on its first passages (most
    do, with fusion) reads few pairs, one that does not takes log2(p) rounds, not p. The round
    then takes more passages, one per question in turn, while its pairs still fit the program
    rows it runs at anyway (`padded_pairs`: the rest would be padding rows, computed and
    dropped), so a batch of questions fills its chunks as a lone question fills its small one.
    """
    depth = np.asarray(depth, np.int64).copy()
    windows = np.asarray(windows, np.int64)
    # A passage past the last one with windows is not there (prescreening may leave a passage
    # with none: it is read, for free, on the way to the next).
    passages = np.where(windows > 0, np.arange(windows.shape[1]) + 1, 0).max(axis=1, initial=0)
    questions = np.asarray(unsettled, np.int64)
    before = depth[questions]
    depth[questions] = np.minimum(before + np.maximum(stage, before), passages[questions])
    pairs = sum(int(windows[q, b:d].sum()) for q, b, d in zip(questions, before,
                                                              depth[questions]))
    rows = padded_pairs(pairs, chunk_size, num_devices) if pairs else 0
    filling = True
    while filling:
        filling = False
        for q in questions:
            if depth[q] < passages[q] and pairs + windows[q, depth[q]] <= rows:
                pairs += int(windows[q, depth[q]])
                depth[q] += 1
                filling = True
    return depth


class OpenDomainReader:
    """Reads the top-p passages of questions with one Reader (one k) over one index."""

    def __init__(self, index: OpenDomainIndex, reader: Reader, cache: PassageCache, *,
                 top_p: int = 29, batch_size: int = 8, chunk_size: int | None = None,
                 max_answer_length: int = 30, mesh=None,
                 prescreen: ReaderPrescreen | None = None, cached_reuse: bool = True,
                 pair_reuse: bool = True, trim_padding: bool = True,
                 span_score: str = "logits", passage_rows: int | None = None,
                 pruning: WindowPruning | None = None):
        """cached_reuse: read the first upper block's passage q/k/v and attention statistics
        from the cache when it holds them (`reads_cached_reuse`); False reads the cache as if it
        did not (the reference, for timing and tests). pair_reuse: the pair program's exact
        reuses (`PairGrid(reuse=...)`); False with cached_reuse False is the reference pair
        program (for timing). trim_padding: `PairGrid(trim_padding=...)` (False: for
        timing). chunk_size: pairs per step (`PairGrid`; None = its default for the
        platform). span_score: how passages' best spans compare (SPAN_SCORES).
        passage_rows: pad every batch's passage side to exactly this many cache rows, so the
        pair program has one passage shape whatever a batch retrieves (a server compiles every
        shape before its first request: dil_jax.serve.shapes); None: whole top-p batches
        (`_padded_rows`), which compiles a new shape the first time a batch reads more rows.
        pruning: read each question's passages until its answer is settled
        (`dil_jax.open_domain.pruning`; None: every window of every retrieved passage). A
        reader whose span head has no bound (`span_head_bounds`) is refused."""
        if span_score not in SPAN_SCORES:
            raise ValueError(f"span_score {span_score!r}: rules are {list(SPAN_SCORES)}")
        if passage_rows is not None and passage_rows < 1:
            raise ValueError(f"passage_rows {passage_rows}: must be at least 1 (or None)")
        self.span_score = span_score
        self.index, self.reader = index, reader
        self.cached_reuse = cached_reuse
        self.cache, self.top_p = cache, top_p
        self.max_answer_length = max_answer_length
        arrays = window_arrays(index)
        check_read_lengths(reader, arrays["mask"].shape[1])
        if prescreen is not None and not reader.capabilities.prescreening:
            raise InputError(f"sentence prescreening reads BERT-family readers only, not a "
                             f"{reader.kind}")
        self.grid = reader.pair_grid(mesh, batch_size, chunk_size, reuse=pair_reuse,
                                     trim_padding=trim_padding)
        self.passage_rows = passage_rows
        # [n_rows, p_len, 2] and [n_rows, p_len], read by rows: a batch reads its rows' only.
        self.offsets, self.max_context = arrays["offsets"], arrays["max_context"]
        self.prescreen = prescreen
        self.pruning: WindowPruning | None = None
        self._logit_bounds: tuple[np.ndarray, np.ndarray] | None = None
        self._set_pruning(pruning)

    @property
    def passage_rows(self) -> int | None:
        """The rows every read's passage side is padded to (None: `_padded_rows`' rule)."""
        return self._passage_rows

    @passage_rows.setter
    def passage_rows(self, rows: int | None) -> None:
        # A fixed passage side stays on the devices, each read writing its own rows into it.
        self._passage_rows = rows
        self._resident = None if rows is None else ResidentRows(rows, self.grid.replicated)

    def compile_resident_writes(self) -> None:
        """Compiles the writes of every row count into the resident passage side (and the
        cached first-upper-block arrays, `reads_cached_reuse`), so that no read compiles one
        (a server calls this before it is ready); nothing without `passage_rows`."""
        if self._resident is None:
            return
        rows = np.zeros(1, np.int64)
        self._resident.compile_writes(PASSAGE_SIDE, self.cache.passage_side(rows))
        if self.reads_cached_reuse:
            self._resident.compile_writes(CACHED_REUSE, self._reuse_inputs(rows))

    def _set_pruning(self, pruning: WindowPruning | None) -> None:
        """Sets `pruning`, after the bounds it reads (raises WindowPruningError for a reader
        without them; computed once per reader)."""
        if pruning is not None and self._logit_bounds is None:
            self._logit_bounds = span_head_bounds(self.reader)
        self.pruning = pruning

    @property
    def pruning_bounds(self) -> tuple[float, float]:
        """(lowest, highest) reader score the pruning assumes a passage not read can have: the
        reader's bounds under its span score rule, the highest replaced by the pruning's
        `high` when it has one."""
        low, high = reader_score_bounds(self._logit_bounds, self.span_score)
        return low, high if self.pruning.high is None else self.pruning.high

    @property
    def reads_cached_reuse(self) -> bool:
        """Whether pairs read their passage's first-upper-block q/k/v and statistics from the
        cache: it holds them, `cached_reuse` is on and the pair program uses statistics
        (0 < k < l). Never for prescreened pairs (`positions`): they read only kept tokens,
        which attend only kept keys, so the whole passage's statistics do not apply (and the
        kept tokens' projections are gathered inside the pair program)."""
        return (self.reader.capabilities.pair_reuse and self.cached_reuse
                and self.cache.has_reuse and self.grid.plan.passage_stats)

    def with_prescreen(self, prescreen: ReaderPrescreen | None) -> OpenDomainReader:
        """The same reader (model, cache, compiled steps) with another prescreening setting."""
        other = copy.copy(self)
        other.prescreen = prescreen
        return other

    def with_pruning(self, pruning: WindowPruning | None) -> OpenDomainReader:
        """The same reader (model, cache, compiled steps) with another window pruning."""
        other = copy.copy(self)
        other._set_pruning(pruning)
        return other

    def retrieve(self, questions: Sequence[str]) -> list[list]:
        return self.index.retriever.search_batch(questions, self.top_p)

    def read(self, questions: Sequence[str]) -> ReadResult:
        """Candidates for every question (batched by `batch_size`)."""
        timings = dict(retrieval=0.0, question_lower=0.0, pair_upper=0.0, decode=0.0)
        if self.prescreen is not None:
            timings["prescreen"] = 0.0
        if self.pruning is not None:
            timings["prune"] = 0.0
        result = ReadResult([], [], timings, {rule: [] for rule in SPAN_SCORES})
        step = self.grid.batch_size
        for start in range(0, len(questions), step):
            batch = list(questions[start:start + step])
            clock = time.perf_counter()
            hits = self.retrieve(batch)
            timings["retrieval"] += time.perf_counter() - clock
            self._read_batch(batch, hits, result)
            result.hits += hits
        result.candidates = result.by_score[self.span_score]
        return result

    def _read_batch(self, questions: list[str], hits: list[list], result: ReadResult) -> None:
        """Adds the candidates of one batch of questions (at most `grid.batch_size`) under each
        span score rule, given their BM25 hits, to `result` (`by_score`, the pairs and tokens
        read), and each phase's seconds to its timings."""
        timings = result.timings
        with _timed(timings, "question_lower"):
            q_lower, q_mask = self._encode_question_batch(questions)
        pairs = RetrievedPairs.of_hits(self.index.windows, hits)
        positions = None
        if self.prescreen is not None:
            with _timed(timings, "prescreen"):
                pairs, positions, kept_texts = self._prescreen_pairs(questions, hits, pairs)
            result.kept_texts += kept_texts
        if self.pruning is None:
            with _timed(timings, "pair_upper"):
                scores, tokens = self._read_pairs(q_lower, q_mask, pairs, positions)
        else:
            pairs, scores, tokens = self._read_until_settled(q_lower, q_mask, pairs, positions,
                                                             hits, timings)
        _check_finite(scores.start_logits, scores.end_logits, pairs.hit, questions, hits,
                      self.index.passages)
        with _timed(timings, "decode"):
            for rule, candidates in self._candidates(hits, pairs, scores).items():
                result.by_score[rule] += candidates
        result.pairs_read += pairs.per_question(np.ones(len(pairs.row)), len(questions))
        result.tokens_read += pairs.per_question(tokens, len(questions))

    def _read_until_settled(self, q_lower: jax.Array, q_mask: np.ndarray,
                            pairs: RetrievedPairs, positions: np.ndarray | None,
                            hits: list[list], timings: dict[str, float]
                            ) -> tuple[RetrievedPairs, SpanScores, np.ndarray]:
        """The pairs `pruning` reads, their span scores and passage tokens [n_read].

        Round after round, every question not settled yet reads its next passages in BM25 order
        (all their windows: a passage is read whole), until `settled_questions` says no unread
        passage can change its answer under the reader's span score rule, or it has none left.
        Each round at least doubles what a question has read and fills the program rows it runs
        at (`round_depths`): a lone question reads its first passages at a one- or two-row
        program and stops there when they settle it, a batch fills whole chunks. Pair program
        time is added to timings["pair_upper"], the decisions' (best spans, the settle test) to
        timings["prune"]."""
        n_pairs = len(pairs.row)
        question = np.asarray(pairs.question, np.int64)
        rank = np.asarray([h for _, h in pairs.hit], np.int64)
        bm25 = np.asarray([hits[q][h].score for q, h in pairs.hit], np.float64)
        scores = SpanScores.full(n_pairs, self.offsets.shape[1], np.nan, np.nan)
        reader_scores = np.full(n_pairs, -np.inf)
        tokens = np.zeros(n_pairs, np.int64)
        read = np.zeros(n_pairs, bool)
        unsettled = sorted(set(question.tolist()))
        windows = passage_windows(question, rank)
        depth = np.zeros(len(windows), np.int64)  # passages read, by question
        while unsettled:
            depth = round_depths(depth, unsettled, windows, self.pruning.stage,
                                 self.grid.chunk_size, self.grid.mesh.devices.size)
            chosen = ~read & np.isin(question, unsettled) & (rank < depth[question])
            if chosen.any():
                new = pairs.subset(chosen)
                with _timed(timings, "pair_upper"):
                    new_scores, tokens[chosen] = self._read_pairs(
                        q_lower, q_mask, new, None if positions is None else positions[chosen])
                scores.set_rows(np.flatnonzero(chosen), new_scores)
                read |= chosen
                with _timed(timings, "prune"):
                    reader_scores[chosen] = self._reader_scores(new.row, new_scores)
            with _timed(timings, "prune"):
                settled = set(settled_questions(question, rank, reader_scores, bm25, read,
                                                self.pruning_bounds, self.pruning.mu,
                                                unsettled))
            unsettled = [q for q in unsettled
                         if q not in settled and (~read[question == q]).any()]
        return pairs.subset(read), _take_scores(scores, read), tokens[read]

    def _encode_question_batch(self, questions: list[str], encoded: Segments | None = None
                               ) -> tuple[jax.Array, np.ndarray]:
        """(lower states [batch_size, q_len, hidden], mask [batch_size, q_len]) of the
        questions, padded to a whole batch (one compiled shape). encoded: the questions'
        `encode_questions` when the caller has it already (a server's request check)."""
        q = encoded if encoded is not None else encode_questions(
            self.reader.tokenizer, questions, self.reader.config.max_question_len)
        rows = TokenRows(q.ids, q.mask, self.reader.characters(list(questions), q.offsets,
                                                                q.mask))
        rows = rows.take(slice(None), self.grid.batch_size)
        # Block so the question phase's time is not counted in the pair phase.
        q_lower = jax.block_until_ready(self.reader.encode_questions(self.grid, rows))
        return q_lower, rows.mask

    def _prescreen_pairs(self, questions: list[str], hits: list[list], pairs: RetrievedPairs
                         ) -> tuple[RetrievedPairs, np.ndarray, list[list[str]]]:
        """The pairs that read at least one kept token, their kept positions
        [n_read, kept_len] (`kept_positions`), and each question's retrieved passages' kept
        text (`ReadResult.kept_texts`)."""
        keep, kept_texts = self._screen(questions, hits, pairs.hit,
                                        np.asarray(pairs.row, np.int64))
        read = keep.any(axis=1)  # a window with no kept sentence is not read at all
        return pairs.subset(read), kept_positions(keep[read]), kept_texts

    def _padded_rows(self, rows: np.ndarray) -> int:
        """Rows the passage side of these distinct cache rows is padded to: whole top-p batches
        (few distinct shapes, each compiled once), or exactly `passage_rows` when set. A pruned
        read's round reads a few windows: a power of two of at least a chunk (not top-p batches:
        that padding would be most of what a round reads)."""
        if self.passage_rows is not None:
            if len(rows) > self.passage_rows:
                raise ValueError(f"{len(rows)} distinct windows retrieved, more than "
                                 f"passage_rows={self.passage_rows}")
            return self.passage_rows
        if self.pruning is None:
            return round_up(max(len(rows), 1), self.grid.batch_size * self.top_p)
        # A round reads a few windows (`round_depths`): a power of two from the chunk size up
        # gives its rounds one or two shapes, not one per row count.
        return max(self.grid.chunk_size, 1 << (max(len(rows), 1) - 1).bit_length())

    def _passage_side(self, rows: np.ndarray) -> tuple[np.ndarray | jax.Array, np.ndarray]:
        """(p_source, p_mask) of these distinct cache rows, from the cache, zero-padded to
        `_padded_rows`: [padded, p_len(, hidden)] and [padded, p_len]. With `passage_rows`
        p_source is the resident buffer (`ResidentRows`: these rows first, on the devices)."""
        padded = self._padded_rows(rows)
        p_mask = _pad_rows(np.asarray(self.cache.mask[rows]), padded)
        if self._resident is not None:
            return self._resident.write_rows(PASSAGE_SIDE, self.cache.passage_side(rows)), p_mask
        return _pad_rows(self.cache.passage_side(rows), padded), p_mask

    def _reuse_inputs(self, rows: np.ndarray) -> tuple[QKV, PassageAttentionStats]:
        """(p_qkv, p_stats) of these distinct cache rows, from the cache, as numpy arrays
        [n, ...] (`pair_inputs`)."""
        config = self.reader.config
        return pair_inputs(self.cache.read_reuse(rows), config.num_heads, config.compute_dtype)

    def _cached_reuse(self, rows: np.ndarray) -> tuple[QKV, PassageAttentionStats]:
        """(p_qkv, p_stats) of these distinct cache rows, from the cache, padded like
        `_passage_side` and placed on the devices once (replicated, as the pair program reads
        them)."""
        values = self._reuse_inputs(rows)
        if self._resident is not None:
            return self._resident.write_rows(CACHED_REUSE, values)
        padded = self._padded_rows(rows)
        return jax.device_put(jax.tree.map(lambda array: _pad_rows(array, padded), values),
                              self.grid.replicated)

    def _read_pairs(self, q_lower: jax.Array, q_mask: np.ndarray, pairs: RetrievedPairs,
                    positions: np.ndarray | None) -> tuple[SpanScores, np.ndarray]:
        """(span scores [n_pairs, p_len] of every pair, the passage tokens each read [n_pairs]:
        its window's real tokens, or its kept ones under prescreening); each distinct window's
        passage side (and first-upper-block arrays, `reads_cached_reuse`) is read from the cache
        once, however many questions read it."""
        rows, pair_p = np.unique(np.asarray(pairs.row, np.int64), return_inverse=True)
        pair_p = pair_p.reshape(-1)
        p_source, p_mask = self._passage_side(rows)
        p_qkv = p_stats = None
        if positions is None and self.reads_cached_reuse:
            p_qkv, p_stats = self._cached_reuse(rows)
        scores = self.grid.read_pairs(self.reader.params, q_lower, q_mask, p_source, p_mask,
                                      np.asarray(pairs.question, np.int64), pair_p, positions,
                                      p_qkv=p_qkv, p_stats=p_stats)
        if positions is None:
            tokens = (p_mask != 0).sum(axis=1)[pair_p]
        else:
            tokens = (np.asarray(positions) < p_mask.shape[1]).sum(axis=1)
        return scores, tokens

    def _best_spans(self, pair_rows: np.ndarray, scores: SpanScores
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Each pair's best allowed span (the SQuAD decoding rule: max-context starts, the
        length limit): (s_start + s_end [n_pairs] (-inf: none), start and end tokens [n_pairs],
        the windows' offsets [n_windows, p_len, 2] and each pair's window among them
        [n_pairs]). Offsets and max-context flags are read once per distinct window."""
        rows, pair_window = np.unique(np.asarray(pair_rows, np.int64), return_inverse=True)
        offsets = np.asarray(self.offsets[rows])                  # [n_windows, p_len, 2]
        valid_end = offsets[..., 0] >= 0
        valid_start = valid_end & np.asarray(self.max_context[rows])
        pair_window = pair_window.reshape(-1)
        span_scores, starts, ends = window_nbest(
            scores.start_logits, scores.end_logits, valid_start[pair_window],
            valid_end[pair_window], n_best=1, max_answer_length=self.max_answer_length)
        return span_scores[:, 0], starts[:, 0], ends[:, 0], offsets, pair_window

    def _reader_scores(self, pair_rows: Sequence[int], scores: SpanScores) -> np.ndarray:
        """[n_pairs] each pair's reader score under the reader's rule (a `Candidate`'s: the
        rule's score of its best span, halved; -inf: no allowed span)."""
        span_scores = self._best_spans(np.asarray(pair_rows, np.int64), scores)[0]
        rule_scores = pair_span_scores(span_scores, scores, self.span_score)
        return np.where(np.isfinite(span_scores), rule_scores / 2, -np.inf)

    def _candidates(self, hits: list[list], pairs: RetrievedPairs, scores: SpanScores
                    ) -> dict[str, list[list[Candidate]]]:
        """Each question's candidates under each span score rule: per retrieved passage, the
        best span of its best window by that rule (text sliced from the passage's characters);
        passages with no allowed span are left out. The BM25 score rides along for fusion
        (`pick_answer`)."""
        span_scores, starts, ends, offsets, pair_window = self._best_spans(
            np.asarray(pairs.row, np.int64), scores)
        by_score = {}
        for rule in SPAN_SCORES:
            rule_scores = pair_span_scores(span_scores, scores, rule)
            best = best_pair_of_each_hit(rule_scores, pairs.hit)
            results = []
            for qi, question_hits in enumerate(hits):
                question_candidates = []
                for hi, hit in enumerate(question_hits):
                    pair = best.get((qi, hi))
                    if pair is None or not np.isfinite(span_scores[pair]):
                        continue  # no allowed span (an empty passage, or nothing kept)
                    passage = self.index.passages[hit.passage_index]
                    window = pair_window[pair]
                    char_start = int(offsets[window, starts[pair], 0])
                    char_end = int(offsets[window, ends[pair], 1])
                    question_candidates.append(Candidate(
                        hit.passage_index, hi, passage.text[char_start:char_end], char_start,
                        char_end, float(rule_scores[pair]) / 2, hit.score))
                results.append(question_candidates)
            by_score[rule] = results
        return by_score

    def _screen(self, questions: list[str], hits: list[list], pair_hit: list[tuple[int, int]],
                pair_row: np.ndarray) -> tuple[np.ndarray, list[list[str]]]:
        """([n_pairs, p_len] bool: the tokens each pair reads (kept sentences and [SEP]),
        per question and retrieved passage the text of its kept sentences, joined by spaces)."""
        from dil_jax.prescreening.screen import window_keep

        prescreener, rule, store = (self.prescreen.prescreener, self.prescreen.rule,
                                    self.prescreen.store)
        # One row per (question, retrieved passage), numbered in retrieval order.
        hit_number, hit_question, hit_passage = {}, [], []
        for qi, question_hits in enumerate(hits):
            for hi, hit in enumerate(question_hits):
                hit_number[(qi, hi)] = len(hit_number)
                hit_question.append(qi)
                hit_passage.append(hit.passage_index)
        if not hit_number:
            return np.zeros((0, self.offsets.shape[1]), bool), [[] for _ in hits]
        question_vectors = prescreener.embed(questions)
        max_sentences = prescreener.config.max_sentences
        sentences, mask = store.matrix(hit_passage, max_sentences)
        texts = [self.index.passages[p].text for p in hit_passage]
        hit_sentences = [[text[a:b] for a, b in spans] for text, spans in
                         zip(texts, store.spans_of(np.asarray(hit_passage), max_sentences),
                             strict=True)]
        overlap = None
        if prescreener.config.overlap:
            overlap = prescreener.overlap([questions[q] for q in hit_question], hit_sentences)
        logits = prescreener.score(question_vectors[hit_question], sentences, mask, overlap)
        kept = rule.select(logits, mask)                          # [n_hits, S]
        kept_texts: list[list[str]] = [[] for _ in hits]
        for (qi, _), number in hit_number.items():  # retrieval order within each question
            kept_texts[qi].append(" ".join(
                sentence for sentence, keep in zip(hit_sentences[number], kept[number])
                if keep))
        pair_kept = kept[[hit_number[key] for key in pair_hit]]
        return window_keep(self._token_sentences(pair_row), pair_kept,
                           np.asarray(self.cache.mask[pair_row])), kept_texts

    def _token_sentences(self, rows: np.ndarray) -> np.ndarray:
        """[len(rows), p_len] the sentence of each token of these windows (`token_sentences`),
        from their passages' stored sentence spans only."""
        from dil_jax.prescreening.screen import token_sentences

        passages, owner = np.unique(np.asarray(self.index.windows.passage_of_row[rows]),
                                    return_inverse=True)
        spans = self.prescreen.store.spans_of(passages,
                                              self.prescreen.prescreener.config.max_sentences)
        return token_sentences(np.asarray(self.offsets[rows]), owner.reshape(-1), spans)


def abstention_decision(abstention: Abstention, reader: OpenDomainReader, question: str,
                        hits: Sequence, score: float, mu: float | None) -> Decision:
    """`abstention.decide` for the picked answer (reader score `score`) of `question`, whose
    BM25 `hits` (best first) came from `reader`'s index: the retrieval match is asked of the
    retriever only when a logistic rule needs it."""
    fused = mu is not None
    match = None
    if abstention.uses_retrieval(reader.span_score, fused):
        match = retrieval_match(hits, reader.index.retriever.attainable(question))
    return abstention.decide(score, reader.span_score, fused, match)


def format_answer(reader: OpenDomainReader, question: str, candidates: Sequence[Candidate],
                  hits: Sequence, timings: dict[str, float], mu: float | None,
                  abstention: Abstention | None = None) -> str:
    """The answer of `pick_answer(candidates, mu)` shown for a person: the question, the
    answer, its passage around it (marked [[...]]), ranks, scores and the phase times. With
    the reader's `abstention` thresholds, an answer scoring below them is shown as "no answer
    found in the corpus", with the best guess, its score and the threshold beside it."""
    answer = pick_answer(candidates, mu)
    lines = [f"Q: {question}"]
    if answer is None:
        # Why no answer (non-finite reader scores are an error upstream, never reported here).
        if not hits:
            lines.append("A: (no answer: no passage shares a word with the question)")
        else:
            lines.append(f"A: (no answer: none of the {len(hits)} retrieved passages has an "
                         f"allowed span)")
        return "\n".join(lines)
    passage = reader.index.passages[answer.passage_index]
    decision = (None if abstention is None else
                abstention_decision(abstention, reader, question, hits, answer.reader_score, mu))
    lines += answer_lines(
        text=answer.text, title=passage.title, passage_id=passage.passage_id,
        rank=answer.rank + 1, retrieved=len(hits), span_score=reader.span_score,
        reader_score=answer.reader_score, bm25_score=answer.bm25_score, mu=mu,
        threshold=decision and decision.threshold,
        retrieval_match=decision and decision.retrieval_match,
        probability=decision and decision.probability,
        probability_threshold=decision and decision.probability_threshold,
        context=passage_context(passage.text, answer.char_start, answer.char_end, answer.text))
    lines.append("   time: " + ", ".join(f"{name} {1e3 * seconds:.0f} ms"
                                        for name, seconds in timings.items()))
    return "\n".join(lines)
