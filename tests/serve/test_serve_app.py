"""`dil-jax serve` without a model: request checks, the worker (batches, routing, backpressure,
failures), the HTTP contract of every route and error, metrics, the API key, SIGTERM.

The reader is a fake (tests/helpers/serving.py): these tests are about the service around it and
take seconds; tests/serve/test_serve.py reads with the bundled readers.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import numpy as np
import pytest
from starlette.testclient import TestClient

from dil_jax.client import format_answer
from dil_jax.open_domain.abstention import Abstention, LogisticRule
from dil_jax.open_domain.scoring import Candidate, pick_answer
from dil_jax.reading.plan import ReusePlan
from dil_jax.serve.answers import answer_payload, ranked
from dil_jax.serve.app import AppSettings, create_app, key_matches
from dil_jax.serve.pipeline import pipeline_answers, window_spans
from dil_jax.serve.schemas import (
    AnswerRequest,
    Limits,
    RequestError,
    parse_answer_request,
    parse_json_body,
    parse_read_request,
)
from dil_jax.serve.shapes import (
    ChunkProgram,
    HoistClass,
    pair_counts_by_rows,
    passage_rows,
    passage_widths,
    question_widths,
    ready_programs,
)
from dil_jax.serve.worker import IDLE, Job, QueueFull, Worker, batch_deadline

from tests.helpers import REPO, free_port
from tests.helpers.serving import FakeEngine

LIMITS = Limits(max_question_chars=50, max_context_chars=200, max_top_k=4, max_p=5,
                max_body_bytes=1000)


# ----------------------------------------------------------------------------- request checks

@pytest.mark.parametrize("body,field,status,words", [
    ({}, "question", 422, "required"),
    ({"question": ""}, "question", 422, "empty"),
    ({"question": "   "}, "question", 422, "empty"),
    ({"question": 7}, "question", 422, "must be a string"),
    ({"question": "x" * 51}, "question", 422, "51 characters"),
    ({"question": "who\ud800?"}, "question", 422, "lone surrogate"),
    ({"question": "q", "top_k": 0}, "top_k", 422, "top_k 0 is out of range"),
    ({"question": "q", "top_k": 5}, "top_k", 422, "from 1 to 4"),
    ({"question": "q", "top_k": True}, "top_k", 422, "must be an integer"),
    ({"question": "q", "top_k": 2.0}, "top_k", 422, "must be an integer"),
    ({"question": "q", "p": 6}, "p", 422, "p 6 is out of range: must be from 1 to 5"),
    ({"question": "q", "p": 2, "top_k": 3}, "top_k", 422, "from 1 to 2"),
    ({"question": "q", "reader": "tiny"}, "reader", 422, "'tiny' is not one of"),
    ({"question": "q", "span_score": "max"}, "span_score", 422, "'max' is not one of"),
    ({"question": "q", "use_ir": "yes"}, "use_ir", 422, "true or false"),
    ({"question": "q", "topk": 2}, "topk", 422, "unknown field"),
])
def test_answer_request_errors_name_the_field_and_value(body, field, status, words):
    with pytest.raises(RequestError) as caught:
        parse_answer_request(body, LIMITS, ["full", "delayed"])
    assert (caught.value.status, caught.value.field) == (status, field)
    assert words in caught.value.message, caught.value.message
    assert field in caught.value.message


def test_answer_request_defaults_and_values():
    parsed = parse_answer_request({"question": "Who?"}, LIMITS, ["full", "delayed"])
    assert parsed == AnswerRequest("Who?", "full", 1, 5, "logits", True)
    parsed = parse_answer_request({"question": "Who?", "reader": "delayed", "top_k": 2, "p": 3,
                                   "span_score": "margin", "use_ir": False}, LIMITS,
                                  ["full", "delayed"])
    assert parsed == AnswerRequest("Who?", "delayed", 2, 3, "margin", False)


def test_read_request_takes_the_pipeline_arguments():
    parsed = parse_read_request({"question": "Who?", "context": "Jane wrote it."}, LIMITS,
                                ["full"])
    assert (parsed.top_k, parsed.max_answer_len, parsed.handle_impossible_answer) == (1, 15, False)
    with pytest.raises(RequestError, match="context has 201 characters"):
        parse_read_request({"question": "Who?", "context": "x" * 201}, LIMITS, ["full"])
    with pytest.raises(RequestError, match="max_answer_len 0 is out of range"):
        parse_read_request({"question": "Who?", "context": "c", "max_answer_len": 0}, LIMITS,
                           ["full"])


@pytest.mark.parametrize("raw,words", [
    (b"", "empty"), (b"{", "not valid JSON"), (b"[1, 2]", "must be a JSON object"),
    (b"\xff\xfe", "not UTF-8"), (b'"question"', "must be a JSON object")])
def test_bodies_that_are_not_a_json_object(raw, words):
    with pytest.raises(RequestError) as caught:
        parse_json_body(raw)
    assert caught.value.status == 400 and words in caught.value.message


# ----------------------------------------------------------------------------- answers

def _candidates() -> list[Candidate]:
    # (passage, rank, text, start, end, reader score, bm25)
    return [Candidate(0, 0, "a", 0, 1, 1.0, 9.0), Candidate(1, 1, "b", 0, 1, 3.0, 5.0),
            Candidate(2, 2, "c", 0, 1, 2.0, 1.0), Candidate(3, 3, "d", 0, 1, 5.0, 0.5)]


@pytest.mark.parametrize("p", [1, 2, 3, 4])
@pytest.mark.parametrize("mu", [None, 0.5, 1.0])
def test_ranked_at_depth_p_picks_what_a_read_at_depth_p_picks(p, mu):
    """Keeping the candidates of the top-p passages equals reading p passages: the first of
    `ranked` is pick_answer over exactly those."""
    candidates = _candidates()
    top = ranked(candidates, p, 3, mu)
    assert top[0][0] is pick_answer(candidates[:p], mu)
    assert len(top) == min(3, p)
    assert [score for _, score in top] == sorted((score for _, score in top), reverse=True)


def test_answer_payload_abstains_below_the_threshold_and_keeps_the_best_guess():
    passages = [type("P", (), {"passage_id": f"d{i}", "title": f"T{i}", "text": "abc"})()
                for i in range(4)]
    request = AnswerRequest("q?", "full", 2, 4, "logits", False)
    abstention = Abstention({"logits": (4.0, 0.0)})
    payload = answer_payload(request, _candidates(), [None] * 4, passages, 0.5, abstention,
                             {"read_pairs": 1.0}, k=0, batch_size=1)
    assert payload["answers"][0]["text"] == "d" and payload["threshold"] == 4.0
    assert not payload["no_answer"]  # 5.0 >= 4.0
    payload = answer_payload(AnswerRequest("q?", "full", 2, 3, "logits", False), _candidates(),
                             [None] * 4, passages, 0.5, abstention, {}, k=0, batch_size=1)
    assert payload["no_answer"] and payload["answers"][0]["text"] == "b"  # 3.0 < 4.0
    assert "below this reader's threshold 4.00" in payload["no_answer_reason"]
    empty = answer_payload(request, [], [], passages, 0.5, None, {}, k=0, batch_size=1)
    assert empty["no_answer"] and empty["answers"] == []
    assert "no passage shares a word" in empty["no_answer_reason"]


def test_answer_payload_decides_by_the_logistic_rule_and_shows_its_numbers():
    passages = [type("P", (), {"passage_id": f"d{i}", "title": f"T{i}", "text": "abc"})()
                for i in range(4)]
    # p = sigmoid(-2 + 0 x score + 10 x match): answered when match >= 0.2 (reader score 5.0
    # of "d" is above the threshold 4.0 either way).
    rule = LogisticRule(-2.0, 0.0, 10.0, 0.5)
    abstention = Abstention({"logits": (4.0, 4.0)}, combined={"logits": (rule, rule)})
    request = AnswerRequest("q?", "full", 1, 4, "logits", False)
    refused = answer_payload(request, _candidates(), [None] * 4, passages, 0.5, abstention,
                             {}, k=0, batch_size=1, match=0.1)
    assert refused["no_answer"] and refused["answers"][0]["text"] == "d"
    assert refused["threshold"] is None and refused["probability_threshold"] == 0.5
    assert refused["retrieval_match"] == 0.1
    assert refused["probability"] == pytest.approx(1 / (1 + math.exp(1.0)))
    assert "probability of being right 0.27 (reader score 5.00, retrieval match 0.10) is " \
           "below this reader's threshold 0.50" in refused["no_answer_reason"]
    answered = answer_payload(request, _candidates(), [None] * 4, passages, 0.5, abstention,
                              {}, k=0, batch_size=1, match=0.3)
    assert not answered["no_answer"] and answered["probability"] == pytest.approx(
        1 / (1 + math.exp(-1.0)))
    shown = format_answer(answered | {"timings_ms": {}})
    assert "retrieval match 0.30 (best BM25 score / attainable) give probability 0.73" in shown
    # A record of thresholds only: as before, and the new fields null.
    old = answer_payload(request, _candidates(), [None] * 4, passages, 0.5,
                         Abstention({"logits": (4.0, 4.0)}), {}, k=0, batch_size=1)
    assert not old["no_answer"] and old["threshold"] == 4.0
    assert old["retrieval_match"] is None and old["probability"] is None


# ----------------------------------------------------------------------------- HF pipeline score

def _reference_spans(start, end, null_start, null_end, allowed, top_k, max_answer_len):
    """Hugging Face's select_starts_ends + decode_spans as written there (a [CLS] q [SEP] c
    [SEP] sequence whose question tokens are masked), spelled out with loops."""
    question = np.array([3.0, -1.0, 2.0])  # logits the pipeline masks: any values
    seq_start = np.concatenate([[null_start], question, start])
    seq_end = np.concatenate([[null_end], question, end])
    undesired = np.concatenate([[False], [True] * 3, ~allowed])
    seq_start = np.where(undesired, -10000.0, seq_start)
    seq_end = np.where(undesired, -10000.0, seq_end)
    p_start = np.exp(seq_start - seq_start.max())
    p_start /= p_start.sum()
    p_end = np.exp(seq_end - seq_end.max())
    p_end /= p_end.sum()
    null = p_start[0] * p_end[0]
    p_start[0] = p_end[0] = 0
    spans = []
    for s in range(len(p_start)):
        for e in range(s, min(len(p_end), s + max_answer_len)):
            if not undesired[s] and not undesired[e] and s > 0:
                spans.append((s - 4, e - 4, p_start[s] * p_end[e]))
    spans.sort(key=lambda span: -span[2])
    return spans[:top_k], null


@pytest.mark.parametrize("seed", range(5))
def test_pipeline_scores_equal_hugging_faces_formula(seed):
    rng = np.random.default_rng(seed)
    start, end = rng.normal(size=12) * 3, rng.normal(size=12) * 3
    allowed = np.array([True] * 9 + [False] * 3)  # [SEP] and padding
    spans, null = window_spans(start, end, 0.5, -0.3, allowed, 4, 3)
    reference, reference_null = _reference_spans(start, end, 0.5, -0.3, allowed, 4, 3)
    assert [(s, e) for s, e, _ in spans] == [(s, e) for s, e, _ in reference]
    np.testing.assert_allclose([score for *_, score in spans],
                               [score for *_, score in reference], rtol=1e-9)
    assert null == pytest.approx(reference_null, rel=1e-9)


def test_pipeline_answers_merge_windows_and_add_the_impossible_answer():
    context = "Jane Austen wrote it"
    start = np.array([[5.0, 1.0, 0.0, 0.0], [0.0, 0.0, 4.0, 0.0]])
    end = np.array([[1.0, 5.0, 0.0, 0.0], [0.0, 0.0, 0.0, 4.0]])
    allowed = np.array([[True, True, False, False], [False, False, True, True]])
    chars = {(0, 0, 1): (0, 11), (1, 2, 3): (12, 20), (0, 0, 0): (0, 4), (0, 1, 1): (5, 11),
             (1, 2, 2): (12, 17), (1, 3, 3): (18, 20)}
    null_start, null_end = np.array([9.0, -9.0]), np.array([9.0, -9.0])
    answers = pipeline_answers(start, end, null_start, null_end, allowed,
                               lambda w, s, e: chars[(w, s, e)], context, 7, 15, True)
    assert answers == sorted(answers, key=lambda a: -a["score"])
    # Window 1's [CLS] takes most of its probability; window 2's does not: the pipeline's
    # null score is the smallest of the windows' (its `min_null_score`).
    nulls = [window_spans(start[w], end[w], null_start[w], null_end[w], allowed[w], 1, 15)[1]
             for w in range(2)]
    impossible = [a for a in answers if a["answer"] == ""]
    assert impossible == [{"score": min(nulls), "start": 0, "end": 0, "answer": ""}]
    assert answers[0]["answer"] == "wrote it"
    assert {a["answer"] for a in answers} - {""} <= set(context[s:e] for s, e in chars.values())


# ----------------------------------------------------------------------------- shapes

def test_passage_rows_is_the_most_a_batch_can_read_in_whole_blocks():
    counts = np.array([1, 1, 3, 1, 2, 1])
    # 2 questions x the 3 passages with most windows (3 + 2 + 1) = 12 rows, all 9 at most.
    assert passage_rows(counts, batch_size=2, top_p=3) == 12  # 9 rounded up to 2 x 3
    assert passage_rows(np.ones(100, int), batch_size=4, top_p=10) == 40


def _plan(hoists: bool) -> ReusePlan:
    return ReusePlan(plain_upper=True, reads_passage_ids=True, hoists_projections=hoists,
                     span_rows_only=True, passage_stats=True, trims_padding=True,
                     reads_kept_tokens=True)


def test_widths_and_the_pair_counts_of_each_class_and_chunk_rows():
    assert question_widths(32) == [8, 16, 24, 32]
    assert question_widths(12) == [8, 12]
    assert passage_widths(48) == [32, 48]
    rows_of_8 = [1, 2, 4, 8]
    # Nothing hoisted: one class; a short remainder of 1..7 pairs, whole chunks from 8.
    counts = pair_counts_by_rows(_plan(False), False, 8, 232, 500, 8, rows_of_8)
    assert counts == {(HoistClass(1, False, False), 1): 1, (HoistClass(1, False, False), 2): 2,
                      (HoistClass(1, False, False), 4): 3, (HoistClass(1, False, False), 8): 5}
    # Hoisting (min_reads 2): questions projected from 2 x 8 = 16 pairs; passages never
    # within 400 pairs (2 x 232 = 464).
    counts = pair_counts_by_rows(_plan(True), False, 8, 232, 400, 8, rows_of_8)
    assert {(c.questions_projected, c.passages_projected, rows): pairs
            for (c, rows), pairs in counts.items()} == {
        (False, False, 1): 1, (False, False, 2): 2, (False, False, 4): 3, (False, False, 8): 5,
        (True, False, 8): 16, (True, False, 1): 17, (True, False, 2): 18, (True, False, 4): 19}
    # A small index read by many pairs: the passages' projections are reachable (from 12).
    small = pair_counts_by_rows(_plan(True), False, 2, 6, 24, 8, rows_of_8)
    assert {(c.questions_projected, c.passages_projected) for c, _ in small} == {
        (False, False), (True, False), (True, True)}
    assert small[HoistClass(1, True, False), 4] == 4  # 4..11 pairs
    assert small[HoistClass(1, True, True), 8] == 12 and small[HoistClass(1, True, True), 4] == 12
    assert all(c.cached_passages and not c.passages_projected
               for c, _ in pair_counts_by_rows(_plan(True), True, 2, 6, 24, 8, rows_of_8))


def test_a_one_window_context_has_its_one_row_program_before_ready():
    """Before ready: the widest program of each class (most rows, widest widths), and the
    fewest-row one of a single pair's class, which a one-window /v1/read runs (else it would
    run padded to a whole chunk: 8x its work on a CPU)."""
    plain = HoistClass(1, False, False)
    counts = pair_counts_by_rows(_plan(False), False, 8, 232, 500, 8, [1, 2, 4, 8])
    assert ready_programs(counts, 32, 192, plain, 1) == [
        ChunkProgram(plain, 5, 8, 32, 192), ChunkProgram(plain, 1, 1, 32, 192)]
    # Hoisting: the widest of both classes, then the lone pair's (unprojected) class at 1 row.
    counts = pair_counts_by_rows(_plan(True), False, 8, 232, 400, 8, [1, 2, 4, 8])
    ready = ready_programs(counts, 32, 192, plain, 1)
    assert [(p.hoist.questions_projected, p.rows, p.pairs) for p in ready] == [
        (False, 8, 5), (True, 8, 16), (False, 1, 1)]
    # A batch of one question projects from 2 pairs: its single pair's class holds one row
    # only, so its widest is the one-row program already (not added twice).
    counts = pair_counts_by_rows(_plan(True), False, 1, 29, 40, 8, [1, 2, 4, 8])
    ready = ready_programs(counts, 32, 192, plain, 1)
    assert [(p.hoist, p.rows) for p in ready].count((plain, 1)) == 1
    # Two devices: chunks run at 2 rows at least.
    counts = pair_counts_by_rows(_plan(False), False, 8, 232, 500, 8, [2, 4, 8])
    assert ready_programs(counts, None, None, plain, 2)[-1] == ChunkProgram(plain, 1, 2, None,
                                                                            None)


# ----------------------------------------------------------------------------- the worker

def test_a_lone_job_after_a_lone_batch_leaves_at_once():
    """The batching deadline: max_wait_s after the oldest job while there is company to wait
    for (several queued, or the last batch held several), else at once."""
    assert batch_deadline(100.0, 0.005, queued=1, last_batch=1) == 100.0
    assert batch_deadline(100.0, 0.005, queued=2, last_batch=1) == 100.005
    assert batch_deadline(100.0, 0.005, queued=1, last_batch=3) == 100.005


class _Waits(threading.Condition):
    """A Condition that records each wait's timeout and, instead of sleeping, runs `then`
    (which queues what the waiter was waiting for)."""

    def __init__(self, then):
        super().__init__()
        self.timeouts: list[float | None] = []
        self.then = then

    def wait(self, timeout=None):
        self.timeouts.append(timeout)
        self.then()
        return True


def _job(payload: str) -> Job:
    from concurrent.futures import Future

    return Job("answer", "full", payload, Future())


def test_gather_waits_for_company_only_when_there_is_some():
    worker = Worker({"answer": lambda reader, payloads: payloads}, max_batch=2,
                    max_wait_s=3600.0)
    worker._cond = _Waits(lambda: worker._queue.append(_job("company")))
    worker._queue.append(_job("alone"))
    # A lone job (the last batch was lone too: a fresh worker): no wait for an hour.
    assert [job.payload for job in worker._gather()] == ["alone"]
    assert worker._cond.timeouts == []
    # Two queued: a batch of two; then a lone job waits for company (which comes).
    worker._queue.extend([_job("a"), _job("b")])
    assert [job.payload for job in worker._gather()] == ["a", "b"]
    worker._queue.append(_job("c"))
    assert [job.payload for job in worker._gather()] == ["c", "company"]
    assert len(worker._cond.timeouts) == 1 and 0 < worker._cond.timeouts[0] <= 3600.0


def test_idle_work_waits_for_a_quiet_queue():
    """The idle warm-up starts only once the queue has been empty for idle_after_s since the
    last batch: a client that sends its next request at once never finds it compiling."""
    worker = Worker({"answer": lambda reader, payloads: payloads}, idle=lambda: True,
                    idle_after_s=3600.0)
    worker._cond = _Waits(lambda: worker._queue.append(_job("next")))
    assert worker._gather() is IDLE  # no batch yet: at once
    worker._process([])  # a batch just ended
    assert [job.payload for job in worker._gather()] == ["next"]  # waited; the job came
    assert len(worker._cond.timeouts) == 1 and 0 < worker._cond.timeouts[0] <= 3600.0


def _echo_worker(**options) -> tuple[Worker, list]:
    batches = []

    def handle(reader, payloads):
        batches.append((reader, list(payloads)))
        return [f"{reader}:{p}" for p in payloads]

    worker = Worker({"answer": handle}, **options)
    worker.start()
    assert worker.ready.wait(5)
    return worker, batches


def test_idle_work_runs_between_jobs_until_done_and_its_failure_stops_only_it():
    pieces: list[float] = []
    gate = threading.Event()

    def idle() -> bool:
        gate.wait(5)  # a job can queue while a piece runs
        pieces.append(time.monotonic())
        return len(pieces) < 3

    worker, _ = _echo_worker(idle=idle, max_wait_s=0.0)
    future = worker.submit("answer", "full", "q")
    gate.set()
    assert future.result(10).value == "full:q"
    deadline = time.monotonic() + 10
    while len(pieces) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    assert len(pieces) == 3  # it said it was done: not called again
    assert worker.submit("answer", "full", "r").result(10).value == "full:r"

    def failing() -> bool:
        raise RuntimeError("compile failed")

    worker, _ = _echo_worker(idle=failing)
    assert worker.submit("answer", "full", "s").result(10).value == "full:s"
    assert worker.accepting


def test_concurrent_jobs_are_batched_and_each_gets_its_own_result():
    worker, batches = _echo_worker(max_batch=8, max_wait_s=0.2, max_queue=64)
    futures = [(reader, q, worker.submit("answer", reader, q))
               for q in range(12) for reader in ("full", "delayed")]
    for reader, q, future in futures:
        assert future.result(10).value == f"{reader}:{q}"
    # Gathered until the deadline or 8 jobs, then grouped by reader: fewer calls than jobs.
    assert len(batches) < len(futures)
    assert max(len(payloads) for _, payloads in batches) > 1
    assert all(len(set(r for r, _ in [b])) == 1 for b in batches)
    assert worker.stop(5)


def test_a_full_queue_refuses_with_retry_after_and_loses_nothing():
    gate = threading.Event()

    def handle(reader, payloads):
        gate.wait(10)
        return list(payloads)

    worker = Worker({"answer": handle}, max_batch=1, max_wait_s=0.0, max_queue=2)
    worker.start()
    assert worker.ready.wait(5)
    first = worker.submit("answer", "full", 0)
    deadline = time.monotonic() + 5
    while worker.depth and time.monotonic() < deadline:  # the worker took it and is held
        time.sleep(0.01)
    queued = [worker.submit("answer", "full", i) for i in (1, 2)]
    with pytest.raises(QueueFull) as full:
        worker.submit("answer", "full", 3)
    assert full.value.retry_after >= 1 and full.value.depth == 2
    gate.set()
    assert [f.result(10).value for f in [first, *queued]] == [0, 1, 2]
    assert worker.stop(5)


def test_a_failing_batch_fails_only_its_jobs_and_the_worker_goes_on():
    def handle(reader, payloads):
        if "bad" in payloads:
            raise ValueError("broken batch")
        return [ValueError("bad one") if p == "odd" else p for p in payloads]

    worker = Worker({"answer": handle}, max_batch=4, max_wait_s=0.05, max_queue=16)
    worker.start()
    assert worker.ready.wait(5)
    bad = worker.submit("answer", "full", "bad")
    with pytest.raises(ValueError, match="broken batch"):
        bad.result(10)
    odd, good = worker.submit("answer", "full", "odd"), worker.submit("answer", "full", "ok")
    with pytest.raises(ValueError, match="bad one"):
        odd.result(10)
    assert good.result(10).value == "ok"
    assert worker.stop(5)


def test_stop_drains_the_queue():
    worker, _ = _echo_worker(max_batch=2, max_wait_s=0.0, max_queue=64)
    futures = [worker.submit("answer", "full", i) for i in range(10)]
    assert worker.stop(10)
    assert [f.result(0).value for f in futures] == [f"full:{i}" for i in range(10)]


# ----------------------------------------------------------------------------- HTTP

@pytest.fixture
def client():
    engine = FakeEngine(LIMITS, max_batch=8, max_wait_s=0.05, max_queue=4)
    with TestClient(create_app(engine, AppSettings(request_timeout_s=5))) as test_client:
        test_client.engine = engine
        yield test_client


def _error_of(response) -> dict:
    return response.json()["error"]


def test_routes(client):
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["ready"]
    response = client.post("/v1/answer", json={"question": "who wrote it?", "top_k": 1})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["answers"][0]["text"] == "WHO WROTE IT?"
    assert set(body["answers"][0]) == {"text", "start", "end", "passage_id", "title", "passage",
                                       "bm25_rank", "reader_score", "bm25_score", "fused_score"}
    assert set(body["timings_ms"]) == {"queue", "retrieve", "encode_question", "read_pairs",
                                       "decode", "fuse"}
    assert body["reader"] == "full" and body["k"] == 0 and body["no_answer"] is False
    read = client.post("/v1/read", json={"question": "who?", "context": "Austen wrote it"})
    assert read.json() == {"score": 0.5, "start": 0, "end": 6, "answer": "Austen"}
    assert client.get("/").status_code == 200 and "<form" in client.get("/").text
    assert "/v1/answer" in client.get("/openapi.json").json()["paths"]
    info = client.get("/v1/info").json()["readers"]["delayed"]
    assert (info["k"], info["kind"]) == (4, "encoder")


@pytest.mark.parametrize("kwargs,status,field,words", [
    (dict(content=b"{not json"), 400, "body", "not valid JSON"),
    (dict(content=b"x" * 1001), 413, "body", "1001 bytes"),
    (dict(json={"question": ""}), 422, "question", "empty"),
    (dict(json={"question": "q", "reader": "tiny"}), 422, "reader", "'tiny'"),
    (dict(json={"question": "q", "top_k": 99}), 422, "top_k", "top_k 99"),
    (dict(json={"question": "q", "p": 0}), 422, "p", "p 0"),
])
def test_bad_requests_get_4xx_naming_the_field(client, kwargs, status, field, words):
    response = client.post("/v1/answer", headers={"Content-Type": "application/json"},
                           **kwargs)
    assert response.status_code == status, response.text
    assert _error_of(response)["field"] == field and words in _error_of(response)["message"]


def test_a_chunked_body_past_the_limit_is_refused():
    engine = FakeEngine(LIMITS)
    with TestClient(create_app(engine, AppSettings())) as client:
        response = client.post("/v1/answer", content=iter([b"{" + b" " * 600, b" " * 600]),
                               headers={"Content-Type": "application/json"})
        assert response.status_code == 413 and "more than the 1000 bytes" in response.text


@pytest.mark.parametrize("attainable, refused", [(4.0, False), (10.0, True)])
def test_the_service_asks_the_retriever_for_the_match_under_a_logistic_rule(attainable,
                                                                             refused):
    # The fake's best hit scores 1.0: match 1 / 4 -> p = sigmoid(-2 + 10 x 0.25) = 0.62,
    # answered; 1 / 10 -> sigmoid(-1) = 0.27 < 0.5, refused (its reader score is 2.0).
    engine = FakeEngine(LIMITS, max_batch=8, max_wait_s=0.05, max_queue=4)
    rule = LogisticRule(-2.0, 0.0, 10.0, 0.5)
    served = engine.readers["delayed"]
    served.abstention = Abstention({"logits": (1.0, 1.0)}, combined={"logits": (rule, rule)})
    asked = []
    served.reader.index.retriever = SimpleNamespace(
        attainable=lambda question: asked.append(question) or attainable)
    with TestClient(create_app(engine, AppSettings(request_timeout_s=5))) as client:
        payload = client.post("/v1/answer", json={"question": "why?", "reader": "delayed"}).json()
        assert client.post("/v1/answer", json={"question": "how?"}).json()["probability"] is None
    assert asked == ["why?"]  # the full reader has no abstention: not asked
    assert payload["no_answer"] is refused
    assert payload["retrieval_match"] == pytest.approx(1 / attainable)
    assert payload["probability"] == pytest.approx(1 / (1 + math.exp(2 - 10 / attainable)))


def test_a_read_failure_is_a_500_and_others_still_answer(client):
    assert client.post("/v1/answer", json={"question": "fail"}).status_code == 500
    assert client.post("/v1/answer", json={"question": "fine"}).json()["answers"][0]["text"] \
        == "FINE"


def test_concurrent_requests_each_get_their_own_answer(client):
    client.engine.delay_s = 0.05
    questions = [f"question number {i}" for i in range(4)]
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda q: client.post("/v1/answer", json={"question": q}),
                                questions))
    assert [a.json()["answers"][0]["text"] for a in answers] == [q.upper() for q in questions]


def test_a_full_queue_gives_503_with_retry_after():
    engine = FakeEngine(LIMITS, max_batch=1, max_wait_s=0.0, max_queue=4)
    engine.gate = threading.Event()
    with TestClient(create_app(engine, AppSettings(request_timeout_s=20))) as client, \
            ThreadPoolExecutor(8) as pool:
        # 1 taken by the worker (held) + 4 queued = full. The first is in the worker before
        # the others are sent: sent together, the worker thread sometimes took none before
        # all five reached the queue, and the fifth was refused instead of "one too many".
        held = [pool.submit(client.post, "/v1/answer", json={"question": "q0"})]
        assert engine.entered.wait(10)
        held += [pool.submit(client.post, "/v1/answer", json={"question": f"q{i}"})
                 for i in range(1, 5)]
        deadline = time.monotonic() + 10
        while engine.worker.depth < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        refused = client.post("/v1/answer", json={"question": "one too many"})
        engine.gate.set()
        results = [f.result(10) for f in held]
    assert refused.status_code == 503, refused.text
    assert int(refused.headers["retry-after"]) >= 1
    assert _error_of(refused)["field"] == "queue"
    # Nothing lost or crossed: every held request got its own answer.
    assert [r.status_code for r in results] == [200] * 5, [r.text for r in results]
    assert sorted(r.json()["answers"][0]["text"] for r in results) == \
        [f"Q{i}" for i in range(5)]


def test_a_request_past_the_timeout_gets_504_and_the_worker_goes_on():
    engine = FakeEngine(LIMITS, delay_s=0.5)
    with TestClient(create_app(engine, AppSettings(request_timeout_s=0.2))) as client:
        response = client.post("/v1/answer", json={"question": "slow"})
        assert response.status_code == 504 and "0.2 s" in _error_of(response)["message"]
        engine.delay_s = 0.0
        time.sleep(0.5)  # a job already running finishes (its answer is dropped)
        assert client.post("/v1/answer", json={"question": "fast"}).status_code == 200


def test_the_api_key_is_required_on_v1_only():
    assert key_matches("s3cret", "s3cret") and not key_matches("s3cre", "s3cret")
    assert not key_matches(None, "s3cret")
    engine = FakeEngine(LIMITS)
    with TestClient(create_app(engine, AppSettings(api_key="s3cret"))) as client:
        body = {"question": "who?"}
        refused = client.post("/v1/answer", json=body)
        assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
        assert client.post("/v1/answer", json=body,
                           headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert client.post("/v1/answer", json=body,
                           headers={"Authorization": "Bearer s3cret"}).status_code == 200
        assert client.post("/v1/read", json={"question": "q", "context": "c d"},
                           headers={"X-API-Key": "s3cret"}).status_code == 200
        assert client.get("/healthz").status_code == 200  # probes stay open


def test_not_ready_is_503():
    engine = FakeEngine(LIMITS)
    started = engine.setup_gate = threading.Event()  # warm-up still running
    with TestClient(create_app(engine, AppSettings())) as client:
        assert client.get("/healthz").status_code == 200
        not_ready = client.get("/readyz")
        assert not_ready.status_code == 503 and not not_ready.json()["ready"]
        response = client.post("/v1/answer", json={"question": "early?"})
        assert response.status_code == 503 and response.headers["retry-after"] == "5"
        started.set()


def test_metrics_are_prometheus_text(client):
    from prometheus_client.parser import text_string_to_metric_families

    client.post("/v1/answer", json={"question": "who?"})
    client.post("/v1/answer", json={"question": ""})
    response = client.get("/metrics")
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    families = {family.name: family for family in text_string_to_metric_families(response.text)}
    requests = {(s.labels["route"], s.labels["status"]): s.value
                for s in families["dil_jax_requests"].samples if s.name.endswith("_total")}
    assert requests[("/v1/answer", "200")] == 1 and requests[("/v1/answer", "422")] == 1
    phases = {s.labels.get("phase") for s in families["dil_jax_phase_seconds"].samples}
    assert "queue" in phases
    for name in ("dil_jax_request_seconds", "dil_jax_batch_size", "dil_jax_queue_depth",
                 "dil_jax_compilations", "dil_jax_ready"):
        assert name in families, sorted(families)


def test_sigterm_answers_the_requests_in_flight_then_exits_0():
    import httpx

    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    server = subprocess.Popen([sys.executable, "-m", "tests.helpers.serving", str(port), "2.0"],
                              cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline and server.poll() is None, server.stderr.read()
            time.sleep(0.1)
        with ThreadPoolExecutor(1) as pool:
            in_flight = pool.submit(httpx.post, url + "/v1/answer",
                                    json={"question": "still answered"}, timeout=30)
            time.sleep(0.5)  # the request is in the worker (2 s)
            server.send_signal(signal.SIGTERM)
            response = in_flight.result(30)
        assert response.status_code == 200
        assert response.json()["answers"][0]["text"] == "STILL ANSWERED"
        assert server.wait(30) == 0
        assert "exited cleanly" in server.stdout.read()
    finally:
        if server.poll() is None:
            server.kill()


def test_openapi_lists_each_field_the_checks_take(client):
    paths = client.get("/openapi.json").json()["paths"]
    schema = paths["/v1/answer"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert json.dumps(schema["properties"]["p"]) == json.dumps(
        {"type": "integer", "minimum": 1, "maximum": 5, "default": 5,
         "description": "passages read"})


def test_the_idle_warm_up_stops_short_of_the_memory_map_limit(monkeypatch, caplog):
    """Each compiled program holds its own memory maps and a process past vm.max_map_count
    dies: with the process past IDLE_MAP_SHARE of the limit, the idle warm-up compiles nothing
    more, drops what is left and says so (in the log and in /readyz's progress)."""
    import collections
    import logging

    from dil_jax.serve import engine as engine_module
    from dil_jax.serve.engine import IDLE_MAP_SHARE, Engine
    from dil_jax.serve.metrics import ServeMetrics

    engine = Engine({}, LIMITS, ServeMetrics(), warm=False)
    engine.progress = {"stage": "ready", "background": {"done": 0, "total": 3}}
    compiled = []
    monkeypatch.setattr("dil_jax.serve.shapes.warm_up", lambda *job: compiled.append(job))
    engine._idle_jobs = collections.deque([("full", "shaped", f"program {i}", {})
                                           for i in range(3)])
    monkeypatch.setattr(engine_module, "memory_map_share", lambda: IDLE_MAP_SHARE / 2)
    assert engine._compile_while_idle() and len(compiled) == 1  # below the share: compiles
    monkeypatch.setattr(engine_module, "memory_map_share", lambda: IDLE_MAP_SHARE + 0.01)
    with caplog.at_level(logging.WARNING, logger="dil_jax.serve.engine"):
        assert not engine._compile_while_idle()
    assert len(compiled) == 1 and not engine._idle_jobs
    assert "2 programs left" in engine.progress["background"]["stopped"]
    assert "max_map_count" in caplog.text and "2 narrower chunk programs left" in caplog.text
    # Read from /proc here (Linux): a share of a positive limit.
    share = engine_module.memory_map_share()
    assert share is None or 0 < share < 1
