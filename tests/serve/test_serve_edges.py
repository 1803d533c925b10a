"""The service's edges (issue 59): hostile bodies, the error path, abandoned requests, slow
and cross-origin clients, and the start-up checks (port, abstention thresholds).

The reader is the fake of tests/helpers/serving.py; the slow-client tests talk raw sockets to a
real uvicorn on loopback (Starlette's TestClient has no socket to stall), each in seconds.
"""

from __future__ import annotations

import json
import math
import shutil
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from dil_jax.errors import CheckpointError
from dil_jax.open_domain.abstention import Abstention, abstention_of
from dil_jax.serve.app import AppSettings, create_app, shown_checkpoint
from dil_jax.serve.schemas import Limits

from tests.helpers import ASSETS, REPO, free_port, run_cli
from tests.helpers.serving import FakeEngine, serving

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


def test_an_unexpected_error_is_a_json_500_naming_the_cause_and_counted(client, monkeypatch):
    import dil_jax.serve.app as app_module

    def broken(*args, **kwargs):
        raise KeyError("a bug")

    monkeypatch.setattr(app_module, "answer_payload", broken)
    response = client.post("/v1/answer", json={"question": "who?"})
    assert response.status_code == 500
    assert response.json()["error"]["field"] == "server"
    assert "KeyError" in response.json()["error"]["message"]
    assert client.post("/v1/read", json={"question": "q", "context": "c d"}).status_code == 200
    assert _requests_by_status(client.get("/metrics").text)[("/v1/answer", "500")] == 1


def test_unknown_routes_and_methods_are_json_and_counted(client):
    missing = client.get("/v2/answer")
    assert missing.status_code == 404 and missing.json()["error"]["field"] == "path"
    assert "/v2/answer" in missing.json()["error"]["message"]
    wrong = client.get("/v1/answer")
    assert wrong.status_code == 405 and wrong.json()["error"]["field"] == "method"
    assert "POST" in wrong.json()["error"]["message"]
    counted = _requests_by_status(client.get("/metrics").text)
    assert counted[("other", "404")] == 1 and counted[("/v1/answer", "405")] == 1


@pytest.mark.parametrize("content_type", [
    "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "text/plain", None])
def test_a_body_not_sent_as_json_is_refused_with_415(client, content_type):
    # A cross-origin page may POST these without a CORS preflight ("simple requests").
    headers = {"Origin": "http://elsewhere.example"}
    if content_type is not None:
        headers["Content-Type"] = content_type
    for route, body in (("/v1/answer", {"question": "who?"}),
                        ("/v1/read", {"question": "who?", "context": "Austen wrote"})):
        response = client.post(route, content=json.dumps(body).encode(), headers=headers)
        assert response.status_code == 415, response.text
        assert response.json()["error"]["field"] == "content-type"
    assert client.engine.batches == []  # nothing was read
    ok = client.post("/v1/answer", content=b'{"question": "who?"}',
                     headers={"Content-Type": "application/json; charset=utf-8"})
    assert ok.status_code == 200


# ----------------------------------------------------------------------------- /v1/info

def test_info_needs_the_key_and_shows_no_absolute_path():
    engine = FakeEngine(LIMITS)
    with TestClient(create_app(engine, AppSettings(api_key="s3cret"))) as client:
        assert client.get("/v1/info").status_code == 401
        info = client.get("/v1/info", headers={"X-API-Key": "s3cret"}).json()
    for reader in info["readers"].values():
        assert not Path(reader["checkpoint"]).is_absolute(), reader
    # The page still learns it needs a key (it reads /v1/info with the key it is given).
    with TestClient(create_app(engine, AppSettings(api_key="s3cret"))) as client:
        assert "api-key" in client.get("/").text


def test_shown_checkpoint_names_bundled_readers_and_paths_under_the_repo(tmp_path,
                                                                          monkeypatch):
    monkeypatch.chdir(REPO)
    assert shown_checkpoint(str(ASSETS / "minilm-squad-k4")) == "minilm-squad-k4 (bundled)"
    assert shown_checkpoint(str(REPO / "runs" / "reader")) == "runs/reader"
    assert shown_checkpoint("runs/reader") == "runs/reader"
    assert shown_checkpoint(str(tmp_path / "my-reader")) == "my-reader"
    assert shown_checkpoint("user/model-on-the-hub") == "user/model-on-the-hub"


# ----------------------------------------------------------------------------- sockets

def _raw_request(path: str, body: bytes) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


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


def test_requests_whose_client_left_are_not_read():
    import httpx

    engine = FakeEngine(LIMITS, max_batch=1, max_wait_s=0.0, max_queue=64)
    engine.gate = threading.Event()
    with serving(engine) as url, ThreadPoolExecutor(2) as pool:
        host, port = url.removeprefix("http://").split(":")
        first = pool.submit(httpx.post, url + "/v1/answer", json={"question": "first"},
                            timeout=30)
        assert engine.entered.wait(10)  # "first" is in the worker, held by the gate
        gone = []
        for i in range(20):
            sock = socket.create_connection((host, int(port)))
            sock.sendall(_raw_request("/v1/answer", json.dumps({"question": f"gone {i}"})
                                      .encode()))
            gone.append(sock)
        assert _wait_for(lambda: engine.worker.depth == 20, 10), engine.worker.depth
        for sock in gone:
            sock.close()
        # Before: the abandoned jobs stayed queued (and were all read, one batch each).
        assert _wait_for(lambda: engine.worker.depth == 0, 5), engine.worker.depth
        engine.gate.set()
        assert first.result(10).status_code == 200
        following = httpx.post(url + "/v1/answer", json={"question": "next"}, timeout=10)
        assert following.status_code == 200
        metrics = httpx.get(url + "/metrics", timeout=10).text
    assert [questions for _, questions in engine.batches] == [["first"], ["next"]]
    assert _requests_by_status(metrics)[("/v1/answer", "499")] == 20


def test_a_truncated_body_gets_408_within_the_read_timeout():
    engine = FakeEngine(LIMITS)
    with serving(engine, AppSettings(read_timeout_s=1.0)) as url:
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(b"POST /v1/answer HTTP/1.1\r\nHost: x\r\nContent-Type: "
                         b"application/json\r\nContent-Length: 1000\r\n\r\n" + b'{"question"')
            sock.settimeout(10)  # before: no answer at all, the socket waits forever
            started = time.monotonic()
            reply = b""
            while chunk := sock.recv(4096):
                reply += chunk
            waited = time.monotonic() - started
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), reply
    assert json.loads(body)["error"]["field"] == "body"
    assert 0.8 < waited < 5


def test_slow_header_sockets_are_closed():
    import httpx

    engine = FakeEngine(LIMITS)
    with serving(engine, AppSettings(read_timeout_s=1.0)) as url:
        host, port = url.removeprefix("http://").split(":")
        sockets = []
        for i in range(30):
            sock = socket.create_connection((host, int(port)))
            if i == 0:  # a kept-alive connection: one whole request, then a slow one
                sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                assert sock.recv(4096).startswith(b"HTTP/1.1 200")
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            sock.setblocking(False)
            sockets.append(sock)
        closed: dict[int, bytes] = {}
        deadline = time.monotonic() + 6
        # Slowloris: a header line now and then, never the blank line that ends them.
        while len(closed) < len(sockets) and time.monotonic() < deadline:
            time.sleep(0.2)
            for i, sock in enumerate(sockets):
                if i in closed:
                    continue
                try:
                    sock.sendall(b"X-Slow: 1\r\n")
                    data = sock.recv(4096)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                closed[i] = data
        for sock in sockets:
            sock.close()
        assert len(closed) == len(sockets), f"{len(sockets) - len(closed)} sockets still open"
        assert httpx.get(url + "/healthz", timeout=5).status_code == 200
        metrics = httpx.get(url + "/metrics", timeout=5).text
    assert any(data.startswith(b"HTTP/1.1 408") for data in closed.values()), closed
    assert _requests_by_status(metrics)[("other", "408")] >= 1


# ----------------------------------------------------------------------------- start-up

def test_serve_on_a_port_in_use_says_so_before_loading(capsys, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        status, _, err = run_cli(["serve", "--port", str(port), "--index",
                                  str(tmp_path / "no-index")], capsys)
    # Before: "serving on ...", the whole warm-up, then uvicorn's bind error and exit 3.
    assert status == 1, err
    lines = [line for line in err.splitlines() if line.startswith("dil-jax serve: error")]
    assert len(lines) == 1 and "--port" in lines[0] and str(port) in lines[0], err
    assert "serving" not in err and "Traceback" not in err


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
