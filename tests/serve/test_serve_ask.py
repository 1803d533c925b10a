"""`dil-jax ask --server URL` against the service with a fake reader (tests/helpers/serving.py)
served by uvicorn on loopback: the output is the local `ask`'s (its renderer,
`open_domain.reader.format_answer`, is the reference), ask's flags become the request's
fields, and a refusal or an unreachable server is one line naming the flag, the URL and the
status. tests/serve/test_serve.py compares it with a local read of the bundled readers.
"""

from __future__ import annotations

import dataclasses
import io
import threading
from types import SimpleNamespace

import pytest

from dil_jax.cli import main
from dil_jax.open_domain.abstention import Abstention
from dil_jax.open_domain.reader import format_answer as local_format_answer
from dil_jax.open_domain.scoring import Candidate
from dil_jax.serve.app import AppSettings
from dil_jax.serve.schemas import Limits

from tests.helpers import free_port
from tests.helpers.serving import PASSAGES, FakeEngine, serving


@pytest.fixture(scope="module")
def fake():
    engine = FakeEngine(Limits(max_p=5), max_wait_s=0.0)
    with serving(engine) as url:
        yield url, engine


def _ask(capsys, *argv: str) -> tuple[int, str, str]:
    status = main(["ask", *argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def _local(question: str, mu: float | None, abstention: Abstention | None = None) -> str:
    """What a local `ask` prints for the fake reader's answer to `question` (the fake answers
    the question upper-cased, at characters 14..18 of its one passage, reader score 2.0, BM25
    1.0, one hit)."""
    reader = SimpleNamespace(index=SimpleNamespace(passages=PASSAGES), span_score="logits")
    candidate = Candidate(0, 0, question.upper(), 14, 18, 2.0, 1.0)
    return local_format_answer(reader, question, [candidate],
                               [SimpleNamespace(passage_index=0, score=1.0)], {}, mu, abstention)


def _without_time(text: str) -> list[str]:
    return [line for line in text.splitlines() if not line.startswith("   time:")]


def test_ask_server_prints_what_a_local_ask_prints(fake, capsys):
    url, _ = fake
    status, out, _ = _ask(capsys, "who wrote it?", "--server", url, "--top-p", "5")
    assert status == 0
    # The reference is the local renderer; spelled out too, so that both could not drift.
    assert _without_time(out) == _without_time(_local("who wrote it?", 0.5)) == [
        "Q: who wrote it?",
        "A: WHO WROTE IT?",
        "   from 'T0' (doc0-p0), BM25 rank 1 of 1; reader score (logits) 2.00, BM25 1.00, "
        "fused with mu=0.5",
        "   passage: the answer is [[WHO WROTE IT?]]"]
    # The time line lists the server's phases, the queue first.
    assert out.splitlines()[-1].startswith("   time: queue ")
    assert "read_pairs 3 ms" in out.splitlines()[-1]


def test_ask_server_flags_become_request_fields(fake, capsys):
    url, engine = fake
    engine.batches.clear()
    status, out, _ = _ask(capsys, "q1?", "--server", url, "--top-p", "5", "--k", "4",
                          "--no-fusion")
    assert status == 0 and engine.batches == [("delayed", ["q1?"])]
    assert _without_time(out) == _without_time(_local("q1?", None))
    assert "fused" not in out


def test_ask_server_interactive_asks_each_line(fake, capsys, monkeypatch):
    url, _ = fake
    monkeypatch.setattr("sys.stdin", io.StringIO("first?\nsecond?\n\nnot asked?\n"))
    status, out, _ = _ask(capsys, "--interactive", "--server", url, "--top-p", "5")
    assert status == 0
    assert [line for line in out.splitlines() if line.startswith("A: ")] == [
        "A: FIRST?", "A: SECOND?"]


def test_ask_server_shows_an_abstention_as_a_local_ask_does(capsys):
    engine = FakeEngine(Limits(max_p=5), max_wait_s=0.0)
    abstention = Abstention({"logits": (3.0, 2.5)})  # the fake's score 2.0 is below both
    engine.readers["full"] = dataclasses.replace(engine.readers["full"], abstention=abstention)
    with serving(engine) as url:
        status, out, _ = _ask(capsys, "who?", "--server", url, "--top-p", "5")
    assert status == 0
    assert _without_time(out) == _without_time(_local("who?", 0.5, abstention))
    assert out.splitlines()[1] == ("A: (no answer found in the corpus: the best answer's reader "
                                   "score 2.00 is below this reader's threshold 2.50; best "
                                   "guess below)")


@pytest.mark.parametrize("argv,words", [
    (["--top-p", "29"], "--top-p: {url}: HTTP 422: p: p 29 is out of range: must be from 1 "
                        "to 5"),
    (["--top-p", "5", "--k", "2"], "--k 2: the server at {url} has no reader of k = 2; it "
                                   "serves full (k = 0), delayed (k = 4)"),
    (["--top-p", "5", "--mu", "0.3"], "--mu 0.3: the server at {url} fuses with mu = 0.5"),
])
def test_ask_server_refusals_name_the_flag_and_url(fake, capsys, argv, words):
    url, _ = fake
    status, out, err = _ask(capsys, "who?", "--server", url, *argv)
    assert status == 1 and out == ""
    assert err.startswith("dil-jax ask: error: " + words.format(url=url)), err
    assert len(err.strip().splitlines()) == 1


def test_ask_server_unreachable_or_refusing_server_is_one_line(capsys):
    nobody = f"http://127.0.0.1:{free_port()}"
    status, _, err = _ask(capsys, "who?", "--server", nobody)
    assert status == 1 and err.startswith(f"dil-jax ask: error: {nobody}: cannot reach the "
                                          "server"), err
    assert len(err.strip().splitlines()) == 1
    engine = FakeEngine(Limits(max_p=5))
    engine.setup_gate = threading.Event()  # the warm-up never ends: not ready, 503
    with serving(engine, AppSettings(api_key="s3cret")) as url:
        status, _, err = _ask(capsys, "who?", "--server", url, "--top-p", "5")
        assert status == 1 and err.startswith(f"dil-jax ask: error: {url}: HTTP 401: api_key: "
                                              "a valid API key is required"), err
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("DIL_JAX_API_KEY", "s3cret")
            status, _, err = _ask(capsys, "who?", "--server", url, "--top-p", "5")
        assert status == 1 and err.startswith(f"dil-jax ask: error: {url}: HTTP 503: "), err
        engine.setup_gate.set()


@pytest.mark.parametrize("argv,words", [
    (["who?"], "give --index DIR (read with a reader loaded here) or --server URL"),
    (["who?", "--server", "localhost:8000"], "--server 'localhost:8000': expected "
                                             "http://HOST:PORT"),
    (["who?", "--server", "http://127.0.0.1:8000", "--index", "runs/x", "--checkpoint", "c"],
     "--server http://127.0.0.1:8000 reads with the server's index and readers: leave out "
     "--index, --checkpoint"),
])
def test_ask_flags_are_checked_before_asking(capsys, argv, words):
    status, _, err = _ask(capsys, *argv)
    assert status == 1 and err.startswith(f"dil-jax ask: error: {words}"), err
    assert len(err.strip().splitlines()) == 1
