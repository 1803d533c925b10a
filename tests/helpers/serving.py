"""An `Engine` without a model, for the service's HTTP and worker tests
(tests/serve/test_serve_app.py) and the SIGTERM test's server process (run as
`python -m tests.helpers.serving PORT [DELAY_S]` from the repository root); `serving` puts an
engine's app on a loopback port (tests/serve/test_serve_ask.py, tests/serve/test_serve_bench.py).

Its "answer" jobs answer each question with its own text upper-cased (so a test sees whose
answer came back), after `delay_s`, a job marked pruned (`AnswerJob.pruned`) with its reader's
pruning label and fewer pairs read (`jobs` keeps each handler call's jobs); a question "fail"
makes the handler raise; the "read" jobs
answer the first word of the context. `gate` (a threading.Event), when set up, holds every
job until the test opens it: the queue then fills deterministically; `entered` is set once a
batch reached the handler.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from types import SimpleNamespace

from dil_jax.open_domain.scoring import Candidate
from dil_jax.serve.app import (
    AppSettings,
    bind_sockets,
    create_app,
    run_server,
    server_config,
)
from dil_jax.serve.engine import Engine, Outcome
from dil_jax.serve.loading import ServedReader
from dil_jax.serve.metrics import ServeMetrics
from dil_jax.serve.schemas import Limits

from tests.helpers import free_port

PASSAGES = [SimpleNamespace(passage_id="doc0-p0", title="T0", text="the answer is HERE")]


def fake_reader(k: int):
    config = SimpleNamespace(num_lower_layers=k, num_layers=6)
    capabilities = SimpleNamespace(null_score=True)
    return SimpleNamespace(reader=SimpleNamespace(config=config, capabilities=capabilities,
                                                  kind="encoder"),
                           index=SimpleNamespace(passages=PASSAGES))


class FakeEngine(Engine):
    def __init__(self, limits: Limits | None = None, delay_s: float = 0.0, **worker_args):
        readers = {name: ServedReader(name, f"/ckpt/{name}", fake_reader(k), None)
                   for name, k in (("full", 0), ("delayed", 4))}
        self.delay_s = delay_s
        self.gate: threading.Event | None = None
        self.entered = threading.Event()
        self.setup_gate: threading.Event | None = None  # holds the "warm-up" until set
        self.batches: list[tuple[str, list[str]]] = []
        self.jobs: list[tuple[str, list]] = []  # each handler call's `AnswerJob`s
        super().__init__(readers, limits or Limits(max_p=5), ServeMetrics(), **worker_args)

    def _setup(self) -> None:
        if self.setup_gate is not None:
            self.setup_gate.wait(30)
        self.metrics.mark_ready()
        self.progress = {"stage": "ready", "done": 0, "total": 0}

    def _hold(self) -> None:
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(30)
        time.sleep(self.delay_s)

    def _answer_jobs(self, name, jobs):
        self._hold()
        questions = [job.question for job in jobs]  # `AnswerJob`s
        self.batches.append((name, list(questions)))
        self.jobs.append((name, list(jobs)))
        if "fail" in questions:
            raise RuntimeError("the fake reader failed")
        pruning = self.readers[name].pruning
        outcomes = []
        for job in jobs:
            answer = job.question.upper()
            candidate = Candidate(0, 0, answer, 14, 18, 2.0, 1.0)
            label = pruning.label if job.pruned and pruning is not None else None
            outcomes.append(Outcome({"logits": [candidate], "margin": [candidate]},
                                    [SimpleNamespace(passage_index=0, score=1.0)],
                                    {"retrieval": 0.001, "question_lower": 0.002,
                                     "pair_upper": 0.003, "decode": 0.0005},
                                    label, 2 if label else 5))
        return outcomes

    def _read_jobs(self, name, requests):
        self._hold()
        return [[{"score": 0.5, "start": 0, "end": len(r.context.split()[0]),
                  "answer": r.context.split()[0]}] for r in requests]


@contextlib.contextmanager
def serving(engine: FakeEngine, settings: AppSettings | None = None):
    """The app of `engine` on a free loopback port, as `dil-jax serve` configures uvicorn
    (`server_config`); yields its URL."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(server_config(create_app(engine, settings or AppSettings()),
                                          "127.0.0.1", port))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        for _ in range(500):  # up to ~5 s for the socket to listen
            if server.started:
                break
            threading.Event().wait(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)


def main() -> int:
    """Serves a FakeEngine whose jobs take 2 s on 127.0.0.1:PORT (the SIGTERM test), on a
    socket bound first, as `dil-jax serve` binds it (`bind_sockets`)."""
    engine = FakeEngine(delay_s=float(sys.argv[2]) if len(sys.argv) > 2 else 2.0)
    port = int(sys.argv[1])
    run_server(create_app(engine, AppSettings()), "127.0.0.1", port, graceful_s=30,
               sockets=bind_sockets("127.0.0.1", port))
    print("exited cleanly", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

