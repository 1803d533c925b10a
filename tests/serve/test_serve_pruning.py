"""`dil-jax serve --prune-windows` without a model: which requests a reader's pruned copy reads,
how a batch of both kinds is split, what the answer and /v1/info say, how a reader's setting is
resolved at load (`loading.add_pruning`), and the flag's refusals.

The pruned read itself (the same answer as reading every window, no compilation after ready)
is tested with the bundled readers in tests/serve/test_serve.py.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest
from starlette.testclient import TestClient

from dil_jax.errors import UsageError
from dil_jax.open_domain.pruning import CALIBRATED, WindowPruning, WindowPruningError
from dil_jax.open_domain.scoring import Candidate
from dil_jax.serve.answers import answer_payload, reads_pruned
from dil_jax.serve.app import AppSettings, create_app
from dil_jax.serve.loading import ReadSettings, ServedReader, add_pruning
from dil_jax.serve.schemas import AnswerRequest, Limits

from tests.helpers import run_cli
from tests.helpers.serving import PASSAGES, FakeEngine

LIMITS = Limits(max_p=5)
EXACT = WindowPruning()  # "stop", settled at mu 0.5


def _request(**changes) -> AnswerRequest:
    fields = dict(question="q", reader="delayed", top_k=1, p=5, span_score="logits",
                  use_ir=True)
    return AnswerRequest(**{**fields, **changes})


@pytest.mark.parametrize("changes, pruned", [
    ({}, True),
    ({"use_ir": False}, False),           # the reader-alone answer: not what it settles
    ({"top_k": 2}, False),                # the second answer: a pruned read may lack it
    ({"p": 4}, False),                    # a shallower depth's answer
    ({"span_score": "margin"}, False),    # the other rule's answer
])
def test_only_the_request_the_pruning_settles_is_read_pruned(changes, pruned):
    assert reads_pruned(_request(**changes), EXACT, "logits", 5, 0.5) is pruned


def test_no_pruning_or_another_mu_reads_everything():
    assert not reads_pruned(_request(), None, "logits", 5, 0.5)
    assert not reads_pruned(_request(), EXACT, "logits", 5, 0.7)  # settled for another mu
    assert not reads_pruned(_request(), EXACT.with_mu(None), "logits", 5, 0.5)


def test_the_answer_says_how_it_was_read():
    candidates = [Candidate(0, 0, "HERE", 14, 18, 2.0, 1.0)]
    payload = answer_payload(_request(), candidates, [SimpleNamespace(score=1.0)], PASSAGES,
                             0.5, None, {}, 4, 1, pruning="stop:4.75", pairs_read=3)
    assert (payload["pruning"], payload["pairs_read"]) == ("stop:4.75", 3)
    unpruned = answer_payload(_request(), candidates, [SimpleNamespace(score=1.0)], PASSAGES,
                              0.5, None, {}, 4, 1)
    assert (unpruned["pruning"], unpruned["pairs_read"]) == (None, None)


def _engine_pruning(pruning: WindowPruning | None, **worker) -> FakeEngine:
    """The fake engine with its delayed reader pruning (the full one reads every window)."""
    engine = FakeEngine(LIMITS, **worker)
    delayed = engine.readers["delayed"]
    delayed.pruning, delayed.pruning_reason = pruning, "as given"
    delayed.reader.span_score = "logits"
    return engine


def test_each_request_is_marked_and_says_how_it_was_read():
    """Concurrent requests, some the pruning settles and some not, the same question both
    ways: each job carries its kind, and each answer says how it was read."""
    engine = _engine_pruning(EXACT, max_batch=8, max_wait_s=0.1)
    bodies = [{"question": f"q{i}?", "reader": "delayed", "top_k": 1 + i % 2} for i in range(4)]
    bodies.append({"question": "q0?", "reader": "delayed", "use_ir": False})  # same question
    bodies.append({"question": "q0?", "reader": "full"})  # a reader without pruning
    with TestClient(create_app(engine, AppSettings(request_timeout_s=10))) as client:
        with ThreadPoolExecutor(len(bodies)) as pool:
            payloads = list(pool.map(lambda body: client.post("/v1/answer", json=body).json(),
                                     bodies))
    assert [payload["pruning"] for payload in payloads] == ["stop", None, "stop", None, None,
                                                            None]
    assert [payload["pairs_read"] for payload in payloads] == [2, 5, 2, 5, 5, 5]
    assert [payload["answers"][0]["text"] for payload in payloads] == \
        [body["question"].upper() for body in bodies]
    jobs = {(name, job.question, job.pruned) for name, batch in engine.jobs for job in batch}
    assert jobs == {("delayed", "q0?", True), ("delayed", "q1?", False),
                    ("delayed", "q2?", True), ("delayed", "q3?", False),
                    ("delayed", "q0?", False), ("full", "q0?", False)}


class _Read(SimpleNamespace):
    """An OpenDomainReader as `Engine._answer_jobs` uses it: `read` answers each question with
    its text upper-cased and counts the pairs (fewer when pruned), keeping what it read."""

    def read(self, questions):
        self.reads.append(list(questions))
        candidates = [[Candidate(0, 0, q.upper(), 0, 1, 1.0, 1.0)] for q in questions]
        return SimpleNamespace(by_score={"logits": candidates, "margin": candidates},
                               hits=[[] for _ in questions], timings={"pair_upper": 0.0},
                               pairs_read=[3 if self.pruning else 7] * len(questions))


def test_the_engine_reads_a_batch_in_at_most_two_reads():
    """One read by the pruned copy for the pruned jobs' distinct questions, one by the reader
    for the others' (a question asked both ways is in both), each job its own outcome; a
    question without a token is refused alone."""
    from dil_jax.serve.engine import AnswerJob, Engine
    from dil_jax.serve.metrics import ServeMetrics
    from dil_jax.serve.schemas import RequestError

    def tokenizer(questions, add_special_tokens):
        return {"input_ids": [[1] if q.strip("\u200b") else [] for q in questions]}

    plain = _Read(pruning=None, reads=[], reader=SimpleNamespace(tokenizer=tokenizer))
    pruned = _Read(pruning=EXACT, reads=[])
    served = ServedReader("delayed", "/ckpt", plain, None, {8: plain}, pruning=EXACT,
                          pruned={8: pruned})
    engine = Engine({"delayed": served}, LIMITS, ServeMetrics(), warm=False)
    jobs = [AnswerJob("a", True), AnswerJob("b", False), AnswerJob("a", False),
            AnswerJob("a", True), AnswerJob("c", True), AnswerJob("\u200b", True)]
    outcomes = engine._answer_jobs("delayed", jobs)
    assert pruned.reads == [["a", "c"]] and plain.reads == [["b", "a"]]
    assert [(o.by_score["logits"][0].text, o.pruning, o.pairs_read) for o in outcomes[:5]] == [
        ("A", "stop", 3), ("B", None, 7), ("A", None, 7), ("A", "stop", 3), ("C", "stop", 3)]
    assert isinstance(outcomes[5], RequestError) and outcomes[5].field == "question"


def test_info_shows_each_readers_pruning():
    engine = _engine_pruning(WindowPruning(high=4.75))
    with TestClient(create_app(engine, AppSettings())) as client:
        readers = client.get("/v1/info").json()["readers"]
        page = client.get("/").text
    assert readers["delayed"]["pruning"] == "stop:4.75"
    assert readers["delayed"]["pruning_exact"] is False
    assert readers["delayed"]["pruned_requests"] == {"use_ir": True, "mu": 0.5,
                                                     "span_score": "logits", "p": 5,
                                                     "top_k": 1}
    assert readers["full"]["pruning"] is None and readers["full"]["pruned_requests"] is None
    assert "pruningText" in page and "pairs_read" in page


# ----------------------------------------------------------------------------- at load


class _Reader(SimpleNamespace):
    """An OpenDomainReader's part `add_pruning` uses: with_pruning copies, or refuses like a
    reader whose span head has no bound (`can_prune` False)."""

    def with_pruning(self, pruning):
        if not self.can_prune:
            raise WindowPruningError("a qanet reader does not end with a LayerNorm; read "
                                     "every window (all)")
        return _Reader(**{**vars(self), "pruning": pruning})


def _served(can_prune: bool = True) -> ServedReader:
    reader = _Reader(span_score="logits", top_p=29, can_prune=can_prune, pruning=None)
    small = _Reader(**{**vars(reader), "batch": 1})
    return ServedReader("delayed", "/ckpt/delayed", reader, None, {1: small, 8: reader})


def _calibration(**changes):
    from dil_jax.open_domain.pruning import PruningCalibration

    fields = dict(highs={"logits": 4.75, "margin": 7.0}, mu=0.5, top_p=29,
                  calibrated_on="593 questions")
    return PruningCalibration(**{**fields, **changes})


def test_calibrated_takes_the_recorded_high_for_every_batch_shape():
    served = add_pruning(_served(), ReadSettings(pruning=CALIBRATED, mu=0.5), _calibration())
    assert served.pruning == WindowPruning(high=4.75, mu=0.5)
    assert "593 questions" in served.pruning_reason
    assert sorted(served.pruned) == [1, 8]
    assert all(shaped.pruning == served.pruning for shaped in served.pruned.values())
    assert served.pruned[1].batch == 1  # the shape's own copy
    assert served.for_questions(1, pruned=True) is served.pruned[1]
    assert served.for_questions(1) is served.shapes[1]  # the unpruned one stays as it was


def test_calibrated_falls_back_to_stop_then_to_every_window():
    other_mu = add_pruning(_served(), ReadSettings(pruning=CALIBRATED, mu=0.7), _calibration())
    assert other_mu.pruning == WindowPruning(mu=0.7) and "mu 0.5" in other_mu.pruning_reason
    unrecorded = add_pruning(_served(), ReadSettings(pruning=CALIBRATED), None)
    assert unrecorded.pruning == WindowPruning() and "records no" in unrecorded.pruning_reason
    cannot = add_pruning(_served(can_prune=False), ReadSettings(pruning=CALIBRATED),
                         _calibration())
    assert cannot.pruning is None and cannot.pruned == {} and "qanet" in cannot.pruning_reason
    alone = add_pruning(_served(), ReadSettings(pruning=CALIBRATED, mu=1.0), _calibration())
    assert alone.pruning is None  # no fusion: a stop would read every window anyway


def test_an_explicit_setting_overrides_and_is_refused_for_a_reader_that_cannot_prune():
    served = add_pruning(_served(), ReadSettings(pruning=WindowPruning(high=3.0), mu=0.5),
                         _calibration())
    assert served.pruning == WindowPruning(high=3.0, mu=0.5)
    assert add_pruning(_served(), ReadSettings(pruning=None), _calibration()).pruning is None
    with pytest.raises(UsageError, match=r"^--prune-windows stop: the delayed reader "
                                         r"\(/ckpt/delayed\): a qanet reader"):
        add_pruning(_served(can_prune=False), ReadSettings(pruning=WindowPruning()), None)


def test_serve_refuses_a_bad_flag_value_in_one_line(capsys):
    status, _, err = run_cli(["serve", "--prune-windows", "stop:x"], capsys)
    assert status == 2
    line = [line for line in err.splitlines() if "--prune-windows" in line][-1]
    assert "argument --prune-windows: 'stop:x': H must be a number" in line
    assert "'calibrated'" in line
