"""The service's edges (issue 59): hostile bodies, the error path, abandoned requests, slow
and cross-origin clients, and the start-up checks (port, abstention thresholds).

The reader is the fake of tests/helpers/serving.py; the slow-client tests talk raw sockets to a
real uvicorn on loopback (Starlette's TestClient has no socket to stall), each in seconds.
"""

from __future__ import annotations

import json
import math
import shutil
import threading
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from dil_jax.errors import CheckpointError
from dil_jax.open_domain.abstention import Abstention, abstention_of
from dil_jax.serve.app import AppSettings, create_app
from dil_jax.serve.schemas import Limits

from tests.helpers import ASSETS, free_port, run_cli
from tests.helpers.serving import FakeEngine

LIMITS = Limits(max_question_chars=50, max_context_chars=200, max_top_k=4, max_p=5)
JSON = {"Content-Type": "application/json"}


def _requests_by_status(text: str) -> dict[tuple[str, str], float]:
    families = {family.name: family for family in text_string_to_metric_families(text)}
    return {(s.labels["route"], s.labels["status"]): s.value
            for s in families["dil_jax_requests"].samples if s.name.endswith("_total")}


@pytest.fixture
def client():
    engine = FakeEngine(LIMITS)
    with TestClient(create_app(engine, AppSettings(request_timeout_s=5))) as test_client:
        test_client.engine = engine
        yield test_client


# ----------------------------------------------------------------------------- bodies

@pytest.mark.parametrize("raw,status,field,words", [
    (b'{"question": "q", "top_k": NaN}', 422, "top_k", "must be an integer"),
    (b'{"question": "q", "top_k": 1e400}', 422, "top_k", "must be an integer"),
    (b'{"question": "q", "top_k": -Infinity}', 422, "top_k", "must be an integer"),
    (b'{"question": "q", "top_k": ' + b"9" * 5000 + b"}", 422, "top_k", "5000 digits"),
    (b'{"question": NaN}', 422, "question", "must be a string"),
    (b"[" * 30000 + b"]" * 30000, 400, "body", "nested"),
    (b'{"question": ' + b"[" * 30000 + b"]" * 30000 + b"}", 400, "body", "nested"),
], ids=["nan", "1e400", "-infinity", "5000-digits", "nan-question", "30000-arrays",
        "30000-arrays-in-a-field"])
def test_hostile_json_gets_4xx_naming_the_field_and_is_counted(client, raw, status, field,
                                                               words):
    # Before: a plain-text 500 (NaN and inf do not serialize back, a 5,000-digit integer
    # exceeds Python's int conversion limit, 30,000 nested arrays exhaust the recursion).
    response = client.post("/v1/answer", content=raw, headers=JSON)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["field"] == field and words in error["message"], error
    assert _requests_by_status(client.get("/metrics").text)[("/v1/answer", str(status))] == 1


# ----------------------------------------------------------------------------- sockets

def _wait_for(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def test_a_cancelled_job_leaves_the_queue_and_is_never_read():
    from dil_jax.serve.worker import Worker

    gate, read = threading.Event(), []

    def handler(reader, payloads):
        gate.wait(10)
        read.extend(payloads)
        return list(payloads)

    worker = Worker({"echo": handler}, max_batch=1, max_wait_s=0.0, max_queue=3)
    worker.start()
    assert worker.ready.wait(10)
    first = worker.submit("echo", "r", "first")
    assert _wait_for(lambda: worker.depth == 0, 5)  # taken, held by the gate
    queued = [worker.submit("echo", "r", f"gone {i}") for i in range(3)]
    assert worker.depth == 3
    for future in queued:
        assert future.cancel()
    # Before: cancelled jobs kept their places (a full queue refused new ones) until read.
    assert worker.depth == 0
    kept = worker.submit("echo", "r", "kept")
    gate.set()
    assert kept.result(10).value == "kept" and first.result(10).value == "first"
    assert worker.stop(10) and read == ["first", "kept"]


# ----------------------------------------------------------------------------- start-up

def _reader_with_abstention(folder: Path, **threshold) -> Path:
    """A copy of the bundled k = 4 reader's manifest whose logits thresholds are changed
    (`threshold` and `threshold_ir`; a value None removes the key)."""
    folder.mkdir(parents=True)
    manifest = json.loads((ASSETS / "minilm-squad-k4" / "dil_jax_manifest.json").read_text())
    rule = manifest["abstention"]["by_rule"]["logits"]
    for key, value in threshold.items():
        if value is None:
            rule.pop(key)
        else:
            rule[key] = value
    # json.dumps writes NaN / Infinity as Python's json module reads them back.
    (folder / "dil_jax_manifest.json").write_text(json.dumps(manifest))
    return folder


BAD_THRESHOLDS = [
    ({"threshold": "abc"}, "abstention.by_rule.logits.threshold", "'abc'"),
    ({"threshold_ir": None}, "abstention.by_rule.logits.threshold_ir", "missing"),
    ({"threshold": math.nan}, "abstention.by_rule.logits.threshold", "nan"),
    ({"threshold_ir": math.inf}, "abstention.by_rule.logits.threshold_ir", "inf"),
    ({"threshold": True}, "abstention.by_rule.logits.threshold", "True"),
]


@pytest.mark.parametrize("change,field,shown", BAD_THRESHOLDS)
def test_a_bad_abstention_threshold_is_named_with_its_file(tmp_path, change, field, shown):
    folder = _reader_with_abstention(tmp_path / "reader", **change)
    with pytest.raises(CheckpointError) as caught:
        abstention_of(str(folder))
    message = str(caught.value)
    assert str(folder / "dil_jax_manifest.json") in message and field in message, message
    assert shown in message, message


def test_abstention_records_that_are_not_objects_are_named(tmp_path):
    path = tmp_path / "dil_jax_manifest.json"
    for record, field in (({"by_rule": []}, "abstention.by_rule"), ([1], "abstention"),
                          ({"by_rule": {"logits": 5.0}}, "abstention.by_rule.logits")):
        with pytest.raises(CheckpointError, match=field.replace(".", r"\.")):
            Abstention.from_manifest({"abstention": record}, path)
    good = Abstention.from_manifest({"abstention": {"by_rule": {
        "logits": {"threshold": 4, "threshold_ir": 3.5}}}}, path)
    assert good.threshold("logits", fused=False) == 4.0


@pytest.mark.parametrize("command", ["serve", "demo"])
def test_serve_and_demo_refuse_a_bad_threshold_in_one_line_before_loading(
        capsys, tmp_path, command):
    folder = _reader_with_abstention(tmp_path / "reader", threshold=math.nan)
    argv = [command, "--index", str(tmp_path / "index"), "--delayed-checkpoint", str(folder)]
    if command == "serve":
        argv += ["--port", str(free_port())]
    started = time.monotonic()
    status, _, err = run_cli(argv, capsys)
    assert status == 1, err
    lines = [line for line in err.splitlines() if line.startswith(f"dil-jax {command}: error")]
    assert len(lines) == 1, err
    assert str(folder / "dil_jax_manifest.json") in lines[0]
    assert "abstention.by_rule.logits.threshold" in lines[0]
    assert "Traceback" not in err
    # Nothing loaded (the folder has no weights, so loading would fail on those first).
    assert "safetensors" not in err and time.monotonic() - started < 60
    shutil.rmtree(folder)
