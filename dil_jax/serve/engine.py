"""The readers behind the worker: what an "answer" job and a "read" job run, and the warm-up.

Runs in the worker thread only (dil_jax.serve.worker): every JAX call and every tokenizer call
of the service happens there, so no two threads ever share a device program or a Rust
tokenizer (whose concurrent use raises "Already borrowed").
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from dil_jax.serve.loading import ServedReader
from dil_jax.serve.metrics import CompileCounter, ServeMetrics
from dil_jax.serve.schemas import Limits, ReadRequest, RequestError
from dil_jax.serve.worker import Worker

log = logging.getLogger(__name__)

# Read once per reader at the end of the warm-up: the whole request path, retrieval and
# decoding included; it must compile nothing more (logged if it does).
CHECK_QUESTIONS = ("Who wrote Pride and Prejudice?", "What is the capital of France?")
CHECK_CONTEXT = ("Pride and Prejudice is an 1813 novel of manners written by Jane Austen. It "
                 "follows Elizabeth Bennet as she deals with matters of upbringing.")


@dataclasses.dataclass
class Outcome:
    """One question's read: its candidates under every span score rule, its BM25 hits, and
    the phase seconds of the batch it was read in (`OpenDomainReader.read`'s timings)."""

    by_score: dict[str, list]
    hits: list
    timings: dict[str, float]


class Engine:
    """Loaded readers + the worker that reads with them."""

    def __init__(self, readers: Mapping[str, ServedReader], limits: Limits, metrics: ServeMetrics,
                 *, mu: float = 0.5, max_batch: int = 8, max_wait_s: float = 0.005,
                 max_queue: int = 64, warm: bool = True):
        self.readers = dict(readers)
        self.limits, self.metrics, self.mu = limits, metrics, mu
        self.warm = warm
        self.progress = {"stage": "starting", "done": 0, "total": 0}
        self.worker = Worker({"answer": self._answer_jobs, "read": self._read_jobs},
                             max_batch=max_batch, max_wait_s=max_wait_s, max_queue=max_queue,
                             setup=self._setup, on_batch=self._batch_done,
                             on_depth=metrics.queue_depth.set)

    @property
    def names(self) -> list[str]:
        return list(self.readers)

    # ------------------------------------------------------------------ warm-up

    def _setup(self) -> None:
        from dil_jax.serve.shapes import warm_up, warm_up_plan

        started = time.perf_counter()
        plans = {name: warm_up_plan(served.reader) for name, served in self.readers.items()}
        self.progress = {"stage": "compiling", "done": 0,
                         "total": sum(plan.size for plan in plans.values()) if self.warm else 0}
        for name, served in self.readers.items():
            if self.warm:
                log.info("warm-up of the %s reader: %d programs (%s)", name, plans[name].size,
                         plans[name])
                base = self.progress["done"]

                def progress(done: int, _total: int, base: int = base) -> None:
                    self.progress["done"] = base + done

                warm_up(served.reader, progress)
            self._check_path(name, served)
        self.metrics.mark_ready()
        self.progress["stage"] = "ready"
        log.info("ready: %d programs compiled in %.1f s", CompileCounter.count,
                 time.perf_counter() - started)

    def _check_path(self, name: str, served: ServedReader) -> None:
        """One whole answer and one context read: compiles what lies outside the pair
        programs (the passage encoder of /v1/read), then logs any program the enumeration
        missed (a question or context after this must compile nothing)."""
        self._read_context(served, ReadRequest(CHECK_QUESTIONS[0], CHECK_CONTEXT, name, 1, 15,
                                               False))
        before = CompileCounter.count
        served.reader.read(list(CHECK_QUESTIONS))
        self._read_context(served, ReadRequest(CHECK_QUESTIONS[1], CHECK_CONTEXT, name, 2, 15,
                                               True))
        if self.warm and CompileCounter.count != before:
            log.warning("the %s reader compiled %d more program(s) after its warm-up: a shape "
                        "the warm-up did not enumerate (dil_jax/serve/shapes.py)", name,
                        CompileCounter.count - before)

    # ------------------------------------------------------------------ jobs

    def _batch_done(self, kind: str, reader: str, size: int, seconds: float) -> None:
        self.metrics.batch_size.labels(kind, reader).observe(size)

    def _answer_jobs(self, name: str, questions: Sequence[str]) -> list[Any]:
        """Reads the distinct questions of these jobs together; one Outcome (or a
        RequestError, for a question that has no token) per job."""
        served = self.readers[name]
        distinct = list(dict.fromkeys(questions))
        token_ids = served.reader.reader.tokenizer(distinct, add_special_tokens=False)["input_ids"]
        empty = {q for q, ids in zip(distinct, token_ids) if not ids}
        readable = [q for q in distinct if q not in empty]
        outcomes: dict[str, Any] = {
            q: RequestError(422, "question", f"question {q!r} has no token this reader knows",
                            q) for q in empty}
        if readable:
            result = served.reader.read(readable)
            for phase, seconds in result.timings.items():
                self.metrics.phases.labels(name, phase).observe(seconds)
            for i, question in enumerate(readable):
                outcomes[question] = Outcome(
                    {rule: candidates[i] for rule, candidates in result.by_score.items()},
                    result.hits[i], dict(result.timings))
        return [outcomes[q] for q in questions]

    def _read_jobs(self, name: str, requests: Sequence[ReadRequest]) -> list[Any]:
        """Each context alone (a failure is that request's only)."""
        from dil_jax.errors import DilJaxError

        results: list[Any] = []
        for request in requests:
            try:
                results.append(self._read_context(self.readers[name], request))
            except RequestError as error:
                results.append(error)
            except DilJaxError as error:  # e.g. a question with no token: this request only
                results.append(RequestError(422, "question", str(error), request.question))
        return results

    def _read_context(self, served: ServedReader, request: ReadRequest) -> list[dict]:
        """`POST /v1/read`: the context cut into the index's windows, read against the
        question through the same pair programs as the open-domain reads (its passage side
        padded to the same rows), scored as Hugging Face's pipeline scores
        (dil_jax.serve.pipeline)."""
        from dil_jax.data.features import window_contexts
        from dil_jax.serve.pipeline import pipeline_answers, word_spans

        reader = served.reader
        tokenizer = reader.reader.tokenizer
        p_len = reader.cache.mask.shape[1]
        windows = window_contexts(tokenizer, [request.context], max_passage_len=p_len,
                                  doc_stride=int(reader.index.settings["doc_stride"]))
        count = windows.ids.shape[0]
        if count > reader.passage_rows:
            raise RequestError(422, "context",
                               f"context of {len(request.context)} characters makes {count} "
                               f"windows of {p_len} tokens; this server reads at most "
                               f"{reader.passage_rows} per request", request.context)
        if not windows.length.any():
            raise RequestError(422, "context", "context has no token this reader knows",
                               request.context)
        q_lower, q_mask = reader._encode_question_batch([request.question])
        p_source, p_mask = self._context_side(reader, windows.ids, windows.mask)
        scores = reader.grid.read_pairs(reader.reader.params, q_lower, q_mask, p_source, p_mask,
                                        np.zeros(count, np.int64), np.arange(count))
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
        return pipeline_answers(scores.start_logits, scores.end_logits,
                                scores.null_start_logits, scores.null_end_logits, allowed,
                                char_span, request.context, request.top_k,
                                request.max_answer_len, request.handle_impossible_answer)

    @staticmethod
    def _context_side(reader, ids: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(p_source, p_mask) of a context's windows, as `OpenDomainReader._passage_side`
        gives them for cache rows: the same dtypes, padded to the same `passage_rows`. k > 0:
        the lower states, encoded in the grid's fixed [batch, p_len] program and joined on
        the host (device-side joins would compile one program per window count)."""
        import jax

        from dil_jax.model.span_reader import PASSAGE_SEGMENT
        from dil_jax.reading.plan import ReusePlan

        rows = reader.passage_rows
        cached = reader.cache.passage_side(np.zeros(1, np.int64))
        mask = mask.astype(reader.cache.mask.dtype)
        if ReusePlan.of(reader.reader.config).reads_passage_ids:
            source = ids.astype(cached.dtype)
        else:
            grid, batch = reader.grid, reader.grid.batch_size
            padded = -(-len(ids) // batch) * batch
            ids_p = np.pad(ids, ((0, padded - len(ids)), (0, 0)))
            mask_p = np.pad(mask, ((0, padded - len(mask)), (0, 0)))
            parts = [np.asarray(grid._lower_fn(reader.reader.params,
                                               jax.device_put(ids_p[i:i + batch], grid.sharded),
                                               jax.device_put(mask_p[i:i + batch], grid.sharded),
                                               PASSAGE_SEGMENT))
                     for i in range(0, padded, batch)]
            source = np.concatenate(parts)[:len(ids)].astype(cached.dtype)

        def pad(array: np.ndarray) -> np.ndarray:
            return np.pad(array, ((0, rows - len(array)),) + ((0, 0),) * (array.ndim - 1))

        return pad(source), pad(mask)
