"""The readers behind the worker: what an "answer" job and a "read" job run, and the warm-up.

Runs in the worker thread only (dil_jax.serve.worker): every JAX call and every tokenizer call
of the service happens there, so no two threads ever share a device program or a Rust
tokenizer (whose concurrent use raises "Already borrowed").
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dil_jax.readers.protocol import TokenRows
from dil_jax.serve.loading import ServedReader
from dil_jax.serve.metrics import CompileCounter, ServeMetrics
from dil_jax.serve.schemas import AnswerRequest, Limits, ReadRequest, RequestError
from dil_jax.serve.worker import Worker
from dil_jax.tokenization import Segments

log = logging.getLogger(__name__)

# Read once per reader at the end of the warm-up: the whole request path, retrieval and
# decoding included; it must compile nothing more (logged if it does).
CHECK_QUESTIONS = ("Who wrote Pride and Prejudice?", "What is the capital of France?")
CHECK_CONTEXT = ("Pride and Prejudice is an 1813 novel of manners written by Jane Austen. It "
                 "follows Elizabeth Bennet as she deals with matters of upbringing.")


# The idle warm-up stops once the process holds this share of the kernel's memory-map limit:
# every compiled XLA:CPU program holds its own maps (about a hundred for a MiniLM chunk
# program), and a process past the limit fails its next allocation (LLVM: "Cannot allocate
# memory") and dies. The programs left would only have been faster shapes for some chunks.
IDLE_MAP_SHARE = 0.8


def memory_map_share() -> float | None:
    """The share of the kernel's per-process memory-map limit (`vm.max_map_count`) this process
    holds, or None where either cannot be read (not Linux)."""
    try:
        limit = int(Path("/proc/sys/vm/max_map_count").read_text())
        with open("/proc/self/maps", "rb") as maps:
            held = sum(1 for _ in maps)
    except (OSError, ValueError):
        return None
    return held / limit if limit > 0 else None


def several_window_context(window_count: Callable[[str], int], rows: int,
                           most: int = 8) -> str | None:
    """The warm-up's context of several windows: CHECK_CONTEXT repeated the most times (at most
    `most`) whose windows, counted by `window_count`, fit the `rows` passage rows a request may
    fill; None when no repetition fits (a request then holds one window at most)."""
    for repeats in range(most, 1, -1):
        context = " ".join([CHECK_CONTEXT] * repeats)
        count = window_count(context)
        if 2 <= count <= rows:
            return context
    return None


@dataclasses.dataclass(frozen=True)
class AnswerJob:
    """An "answer" job's payload: the question, and whether it is read by its reader's pruned
    copy (`answers.reads_pruned`, decided per request: a batch's questions are read in at most
    two reads, pruned and not)."""

    question: str
    pruned: bool = False


@dataclasses.dataclass
class Outcome:
    """One question's read: its candidates under every span score rule, its BM25 hits, and
    the phase seconds of the batch it was read in (`OpenDomainReader.read`'s timings);
    pruning: the label of the window pruning it was read with (None: every window);
    pairs_read: the (question, window) pairs read for it (`ReadResult.pairs_read`)."""

    by_score: dict[str, list]
    hits: list
    timings: dict[str, float]
    pruning: str | None = None
    pairs_read: int | None = None


@dataclasses.dataclass(frozen=True)
class PreparedContext:
    """A `/v1/read` request and its context's windows (`window_contexts`), ready to read;
    question: its question encoded (`encode_questions`, [1, q_len]: the check that it has a
    token, kept for the read); chars: what the reader reads of each window token beside its
    id (`Reader.characters`, from the context through the tokens' offsets, as the index's
    cache builder reads a passage's text: a QANet / BiDAF's characters [n_windows, p_len,
    max_chars]), else None."""

    request: ReadRequest
    windows: Any  # dil_jax.data.features.ContextWindows
    question: Any  # dil_jax.tokenization.Segments of the question alone
    chars: np.ndarray | None = None


def no_null_score(reader_name: str, kind: str) -> RequestError:
    """The refusal of handle_impossible_answer by a QANet / BiDAF, as `predict` refuses a
    SQuAD 2.0 file and --null-threshold for one."""
    return RequestError(422, "handle_impossible_answer",
                        f"the {reader_name} reader is a {kind} reader, which has no no-answer "
                        "score (trained on SQuAD v1.1: it always answers with a span); leave "
                        "handle_impossible_answer false", True)


def context_groups(prepared: Sequence[tuple[int, PreparedContext]], max_questions: int,
                   max_windows: int) -> list[list[tuple[int, PreparedContext]]]:
    """The contexts in arrival order, cut into groups read together: at most max_questions
    contexts (one question each: the question batch) and max_windows windows (the passage
    rows) per group."""
    groups: list[list[tuple[int, PreparedContext]]] = []
    windows = 0
    for item in prepared:
        count = item[1].windows.ids.shape[0]
        if not groups or len(groups[-1]) == max_questions or windows + count > max_windows:
            groups.append([])
            windows = 0
        groups[-1].append(item)
        windows += count
    return groups


class Engine:
    """Loaded readers + the worker that reads with them."""

    def __init__(self, readers: Mapping[str, ServedReader], limits: Limits, metrics: ServeMetrics,
                 *, mu: float = 0.5, max_batch: int = 8, max_wait_s: float = 0.005,
                 max_queue: int = 64, warm: bool = True):
        self.readers = dict(readers)
        self.limits, self.metrics, self.mu = limits, metrics, mu
        self.warm = warm
        self.progress: dict[str, Any] = {"stage": "starting", "done": 0, "total": 0}
        self._idle_jobs: collections.deque = collections.deque()
        self.worker = Worker({"answer": self._answer_jobs, "read": self._read_jobs},
                             max_batch=max_batch, max_wait_s=max_wait_s, max_queue=max_queue,
                             setup=self._setup, on_batch=self._batch_done,
                             on_depth=metrics.queue_depth.set, idle=self._compile_while_idle)

    @property
    def names(self) -> list[str]:
        return list(self.readers)

    # ------------------------------------------------------------------ warm-up

    def _setup(self) -> None:
        """Compiles the widest chunk program of every reader, batch shape and hoist class
        (`WarmUpPlan`: enough to read anything) and the one-row one of a one-window context,
        reads the whole request path once per reader (`_check_path`), and leaves the narrower
        programs to `_compile_while_idle`."""
        from dil_jax.reading.chunks import ShapeBook
        from dil_jax.serve.shapes import warm_up, warm_up_plan, warm_up_questions

        started = time.perf_counter()
        shaped_readers = [(name, count, shaped) for name, served in self.readers.items()
                          for count, shaped in (served.shapes or {0: served.reader}).items()]
        first, rest = [], []
        if self.warm:
            for name, count, shaped in shaped_readers:
                # One plan per reader and batch shape (question count): each pads its passage
                # side to its own rows, so each has its own pair programs.
                shaped.grid.shape_book = shaped.grid.shape_book or ShapeBook()
                plan = warm_up_plan(shaped, count or None)
                questions = warm_up_questions(shaped)
                jobs = [(name, shaped, program, questions) for program in plan.programs]
                first += jobs[:plan.ready_count]
                rest += jobs[plan.ready_count:]
        self.progress = {"stage": "compiling", "done": 0, "total": len(first),
                         "background": {"done": 0, "total": len(rest)}}
        log.info("warm-up: %d chunk programs before ready (the widest of each reader, batch "
                 "shape and class, and a one-window context's), %d more while idle",
                 len(first), len(rest))
        for name, shaped, program, questions in first:
            warm_up(shaped, program, questions)
            self.progress["done"] += 1
            log.info("warm-up: %d of %d programs (%s reader, %d-row chunks)",
                     self.progress["done"], len(first), name, program.rows)
        if self.warm:
            # Each read writes its passage rows into buffers kept on the devices: one small
            # program per power-of-two row count, compiled here rather than by a request.
            for _, _, shaped in shaped_readers:
                shaped.compile_resident_writes()
        for name, served in self.readers.items():
            self._check_path(name, served)
        self._idle_jobs = collections.deque(rest)
        self.metrics.mark_ready()
        self.progress["stage"] = "ready"
        log.info("ready: %d programs compiled or read from the compilation cache in %.1f s; "
                 "%d narrower chunk programs follow while idle", CompileCounter.count,
                 time.perf_counter() - started, len(rest))

    def _compile_while_idle(self) -> bool:
        """Compiles one narrower chunk program (the worker calls this when its queue is
        empty; a request that arrives meanwhile waits for this one program only). True while
        more remain. Stops for good, with a warning, once the process holds more than
        IDLE_MAP_SHARE of the kernel's memory-map limit (`memory_map_share`)."""
        from dil_jax.serve.shapes import warm_up

        if not self._idle_jobs:
            return False
        share = memory_map_share()
        if share is not None and share > IDLE_MAP_SHARE:
            background = self.progress["background"]
            background["stopped"] = (f"memory maps: {share:.0%} of vm.max_map_count held, "
                                     f"{len(self._idle_jobs)} programs left")
            log.warning("background warm-up stopped with %d narrower chunk programs left: this "
                        "process holds %.0f%% of the kernel's memory-map limit "
                        "(/proc/sys/vm/max_map_count; each compiled program holds its own maps, "
                        "and past the limit the process dies). The chunks they would have run "
                        "read at wider compiled shapes: slower, the same scores. Serve fewer "
                        "--batch-shapes, or raise vm.max_map_count", len(self._idle_jobs),
                        100 * share)
            self._idle_jobs.clear()
            return False
        _, shaped, program, questions = self._idle_jobs.popleft()
        with CompileCounter.in_background():
            warm_up(shaped, program, questions)
        background = self.progress["background"]
        background["done"] += 1
        if not self._idle_jobs:
            log.info("background warm-up done: %d narrower chunk programs",
                     background["total"])
        return bool(self._idle_jobs)

    def _check_path(self, name: str, served: ServedReader) -> None:
        """One whole answer and context reads: compiles what lies outside the pair programs
        (the passage encoder of /v1/read, for one window and for several), then logs any
        program the enumeration missed (a question or context after this must compile
        nothing)."""
        # Contexts of 1 and of 2+ windows, alone and two together: the context encoder's
        # [1, p_len] and [batch, p_len] programs of each shape a group can take. The longer
        # one as long as a request may be (a small index's batches hold few passage rows);
        # none where a request may hold one window only.
        long_context = several_window_context(
            lambda text: self._window_count(served, text), served.reader.passage_rows)
        one, *several = (ReadRequest(CHECK_QUESTIONS[0], context, name, 1, 15, False)
                         for context in (CHECK_CONTEXT, *filter(None, [long_context])))
        together = [[one, *several]] if several and served.reader.grid.batch_size > 1 else []
        for group in [[one], *([request] for request in several), *together]:
            self._read_group(served, [self._prepare_context(served, r) for r in group])
        before = CompileCounter.count
        for count, shaped in (served.shapes or {len(CHECK_QUESTIONS): served.reader}).items():
            shaped.read(list(CHECK_QUESTIONS[:count]))
        # A pruned read reads each question's passages in rounds of fewer pairs, through the
        # same programs (its copies share the grid and the passage padding): it must compile
        # nothing more either.
        for count, shaped in served.pruned.items():
            shaped.read(list(CHECK_QUESTIONS[:count]))
        # A reader without a no-answer score refuses handle_impossible_answer (`no_null_score`).
        impossible = served.reader.reader.capabilities.null_score
        self._read_context(served, ReadRequest(CHECK_QUESTIONS[1], CHECK_CONTEXT, name, 2, 15,
                                               impossible))
        if self.warm and CompileCounter.count != before:
            log.warning("the %s reader compiled %d more program(s) after its warm-up: a shape "
                        "the warm-up did not enumerate (dil_jax/serve/shapes.py)", name,
                        CompileCounter.count - before)

    def _window_count(self, served: ServedReader, context: str) -> int:
        """How many windows `context` makes for `served` (as `_prepare_context` cuts it)."""
        from dil_jax.data.features import window_contexts

        p_len = served.reader.cache.mask.shape[1]
        windows = window_contexts(served.reader.reader.tokenizer, [context],
                                  max_passage_len=p_len,
                                  doc_stride=int(served.reader.index.settings.doc_stride))
        return int(windows.ids.shape[0])

    # ------------------------------------------------------------------ jobs

    def _batch_done(self, kind: str, reader: str, size: int, seconds: float) -> None:
        self.metrics.batch_size.labels(kind, reader).observe(size)

    def reads_pruned(self, request: AnswerRequest) -> bool:
        """Whether `request` is read by its reader's pruned copy (`answers.reads_pruned`)."""
        from dil_jax.serve.answers import reads_pruned

        served = self.readers[request.reader]
        return served.pruning is not None and reads_pruned(
            request, served.pruning, served.reader.span_score, self.limits.max_p, self.mu)

    def _answer_jobs(self, name: str, jobs: Sequence[AnswerJob]) -> list[Any]:
        """Reads these jobs' questions: the distinct ones of the pruned jobs together with the
        reader's pruned copy, the others together with the reader itself (at most two reads);
        one Outcome (or a RequestError, for a question that has no token) per job."""
        served = self.readers[name]
        distinct = list(dict.fromkeys(job.question for job in jobs))
        token_ids = served.reader.reader.tokenizer(distinct, add_special_tokens=False)["input_ids"]
        empty = {q for q, ids in zip(distinct, token_ids) if not ids}
        refused = {q: RequestError(422, "question", f"question {q!r} has no token this reader "
                                                    "knows", q) for q in empty}
        outcomes: dict[tuple[str, bool], Any] = {}
        for pruned in (False, True):
            readable = list(dict.fromkeys(job.question for job in jobs
                                          if job.pruned == pruned and job.question not in empty))
            if readable:
                read = self._read_questions(name, served.for_questions(len(readable), pruned),
                                            readable)
                outcomes.update({(q, pruned): outcome for q, outcome in read.items()})
        return [refused[job.question] if job.question in refused
                else outcomes[job.question, job.pruned] for job in jobs]

    def _read_questions(self, name: str, reader: Any, questions: list[str]
                        ) -> dict[str, Outcome]:
        """Each question's Outcome, read together by `reader` (an OpenDomainReader)."""
        result = reader.read(questions)
        for phase, seconds in result.timings.items():
            self.metrics.phases.labels(name, phase).observe(seconds)
        label = None if reader.pruning is None else reader.pruning.label
        return {question: Outcome(
            {rule: candidates[i] for rule, candidates in result.by_score.items()},
            result.hits[i], dict(result.timings), label, result.pairs_read[i])
            for i, question in enumerate(questions)}

    def _read_jobs(self, name: str, requests: Sequence[ReadRequest]) -> list[Any]:
        """The contexts of these jobs read together: every window of every context is one
        pair with its own question, through one pair read per group of contexts that fits a
        batch (at most batch-size questions, at most the batch's passage rows), so that
        concurrent contexts fill the pair chunks a lone one leaves mostly empty. A context
        that cannot be read (too long, no token) is refused alone."""
        from dil_jax.errors import DilJaxError

        served = self.readers[name]
        results: list[Any] = [None] * len(requests)
        prepared: list[tuple[int, PreparedContext]] = []
        for position, request in enumerate(requests):
            try:
                prepared.append((position, self._prepare_context(served, request)))
            except RequestError as error:
                results[position] = error
            except DilJaxError as error:  # e.g. a question with no token: this request only
                results[position] = RequestError(422, "question", str(error), request.question)
        for group in context_groups(prepared, served.reader.grid.batch_size,
                                    served.reader.passage_rows):
            try:
                answers = self._read_group(served, [context for _, context in group])
            except DilJaxError as error:
                answers = [RequestError(422, "question", str(error), context.request.question)
                           for _, context in group]
            for (position, _), answer in zip(group, answers):
                results[position] = answer
        return results

    def _read_context(self, served: ServedReader, request: ReadRequest) -> list[dict]:
        """One context alone (the warm-up's check)."""
        return self._read_group(served, [self._prepare_context(served, request)])[0]

    @staticmethod
    def _prepare_context(served: ServedReader, request: ReadRequest) -> PreparedContext:
        """`POST /v1/read`'s context cut into the index's windows (with their characters for
        a QANet / BiDAF); a RequestError naming the context when it makes more windows than
        the server reads or has no token, or handle_impossible_answer for a reader without a
        no-answer score."""
        from dil_jax.data.features import window_contexts
        from dil_jax.tokenization import encode_questions

        reader = served.reader.reader
        if request.handle_impossible_answer and not reader.capabilities.null_score:
            raise no_null_score(served.name, reader.kind)
        tokenizer = reader.tokenizer
        # A question the tokenizer reads as nothing raises here, for this request alone.
        question = encode_questions(tokenizer, [request.question],
                                    served.reader.reader.config.max_question_len)
        p_len = served.reader.cache.mask.shape[1]
        windows = window_contexts(tokenizer, [request.context], max_passage_len=p_len,
                                  doc_stride=int(served.reader.index.settings.doc_stride))
        count = windows.ids.shape[0]
        if count > served.reader.passage_rows:
            raise RequestError(422, "context",
                               f"context of {len(request.context)} characters makes {count} "
                               f"windows of {p_len} tokens; this server reads at most "
                               f"{served.reader.passage_rows} per request", request.context)
        if not windows.length.any():
            raise RequestError(422, "context", "context has no token this reader knows",
                               request.context)
        chars = reader.characters([request.context] * count, windows.offsets, windows.mask)
        return PreparedContext(request, windows, question, chars)

    def _read_group(self, served: ServedReader, contexts: list[PreparedContext]
                    ) -> list[list[dict]]:
        """The answers of each context, their windows read as pairs (window, its context's
        question) through the same pair programs as the open-domain reads (the passage side
        padded to the smallest batch shape that holds them), scored as Hugging Face's
        pipeline scores (dil_jax.serve.pipeline)."""
        counts = [context.windows.ids.shape[0] for context in contexts]
        reader = served.for_contexts(len(contexts), sum(counts))
        rows = TokenRows.join([TokenRows(context.windows.ids, context.windows.mask, context.chars)
                               for context in contexts])
        questions = Segments(*(np.concatenate([getattr(context.question, field)
                                               for context in contexts])
                               for field in ("ids", "mask", "offsets")))
        q_lower, q_mask = reader._encode_question_batch(
            [context.request.question for context in contexts], questions)
        p_source, p_mask = self._context_side(reader, rows)
        scores = reader.grid.read_pairs(reader.reader.params, q_lower, q_mask, p_source, p_mask,
                                        np.repeat(np.arange(len(contexts)), counts),
                                        np.arange(sum(counts)))
        bounds = np.cumsum([0, *counts])
        return [self._context_answers(served, context, scores, bounds[i], bounds[i + 1])
                for i, context in enumerate(contexts)]

    @staticmethod
    def _context_answers(served: ServedReader, context: PreparedContext, scores: Any,
                         first: int, last: int) -> list[dict]:
        """One context's answers from its rows first..last of the group's span scores."""
        from dil_jax.serve.pipeline import pipeline_answers, word_spans

        request, windows = context.request, context.windows
        tokenizer = served.reader.reader.tokenizer
        encoding = tokenizer(request.context, add_special_tokens=False,
                             return_offsets_mapping=True)
        token_chars = np.asarray(encoding["offset_mapping"], np.int64).reshape(-1, 2)
        if getattr(tokenizer, "is_fast", False):
            spans = word_spans(encoding.word_ids(), lambda w: tuple(encoding.word_to_chars(w)),
                               token_chars)
        else:  # no word ids: token offsets, the pipeline's own fallback
            spans = word_spans([None] * len(token_chars), lambda w: (0, 0), token_chars)
        starts = windows.window_start

        def char_span(window: int, start: int, end: int) -> tuple[int, int]:
            return spans(int(starts[window]) + start, int(starts[window]) + end)

        allowed = windows.offsets[..., 0] >= 0
        rows = slice(first, last)
        return pipeline_answers(scores.start_logits[rows], scores.end_logits[rows],
                                scores.null_start_logits[rows], scores.null_end_logits[rows],
                                allowed, char_span, request.context, request.top_k,
                                request.max_answer_len, request.handle_impossible_answer)

    @staticmethod
    def _context_side(reader, windows: TokenRows) -> tuple[np.ndarray, np.ndarray]:
        """(p_source, p_mask) of a context's windows, as `OpenDomainReader._passage_side`
        gives them for cache rows: the same dtypes, padded to the same `passage_rows`. Where
        the reader's passage side is a state (`cacheable_passage_side`): encoded one batch at
        a time in the grid's fixed [batch, p_len] program (`Reader.encode_passage_batch`, as
        its cache builder encodes them) and joined on the host (device-side joins would
        compile one program per window count); else the ids themselves."""
        rows = reader.passage_rows
        cached = reader.cache.passage_side(np.zeros(1, np.int64))
        mask = windows.mask.astype(reader.cache.mask.dtype)
        if not reader.reader.cacheable_passage_side:
            source = windows.ids.astype(cached.dtype)
        else:
            # A lone window is encoded alone rather than padded to the grid's batch (8x the
            # lower blocks' work for one window): two programs, [1, p_len] and [B, p_len].
            count = len(windows)
            batch = 1 if count == 1 else reader.grid.batch_size
            padded = TokenRows(windows.ids, mask, windows.chars).take(
                slice(None), -(-count // batch) * batch)
            parts = [np.asarray(reader.reader.encode_passage_batch(
                reader.grid, padded.take(slice(i, i + batch), batch)))
                for i in range(0, len(padded), batch)]
            source = np.concatenate(parts)[:count].astype(cached.dtype)
        return _pad_rows(source, rows), _pad_rows(mask, rows)

def _pad_rows(array: np.ndarray, rows: int) -> np.ndarray:
    """array [n, ...] zero-padded to [rows, ...]."""
    return np.pad(array, ((0, rows - len(array)),) + ((0, 0),) * (array.ndim - 1))
