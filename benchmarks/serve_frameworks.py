"""Per-request overhead of Starlette and FastAPI on uvicorn, on loopback (docs/serving.md).

    python3 benchmarks/serve_frameworks.py [--requests 500] [--rounds 3]

For each framework a uvicorn server (one process, one event loop, as `dil-jax serve` runs)
is started on 127.0.0.1 with two trivial routes: `GET /ping` (a constant JSON) and `POST /echo`
(a small JSON body parsed and validated: Starlette `json.loads` plus a hand check, FastAPI a
pydantic model; what `/v1/answer` does before its question reaches the worker). One
keep-alive client then sends the requests one after another and records each round trip.
Rounds alternate the frameworks, so load from other processes falls on both; the table is the
median over rounds of each round's median and 99th percentile. A raw ASGI app (no framework)
is the floor: the difference to it is the framework's own cost.

Loopback only, a fixed number of requests, each server stopped at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator

APPS = {
    "raw ASGI": "raw",
    "starlette": "starlette",
    "fastapi": "fastapi",
}

# The apps, as a module the server subprocess imports (kept here so one file is the benchmark).
APP_SOURCE = r'''
import json

BODY = b'{"ok":true}'


async def raw(scope, receive, send):
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    if scope["path"] == "/echo":
        data = json.loads(body)
        out = json.dumps({"question": data["question"], "top_k": data.get("top_k", 1)}).encode()
    else:
        out = BODY
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(out)).encode())]})
    await send({"type": "http.response.body", "body": out})


def _starlette():
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def ping(request):
        return JSONResponse({"ok": True})

    async def echo(request):
        data = json.loads(await request.body())
        question = data["question"]
        if not isinstance(question, str) or not question:
            return JSONResponse({"error": "question"}, status_code=422)
        return JSONResponse({"question": question, "top_k": int(data.get("top_k", 1))})

    return Starlette(routes=[Route("/ping", ping), Route("/echo", echo, methods=["POST"])])


def _fastapi():
    from fastapi import FastAPI
    from pydantic import BaseModel, Field

    app = FastAPI()

    class Echo(BaseModel):
        question: str = Field(min_length=1)
        top_k: int = 1

    @app.get("/ping")
    async def ping():
        return {"ok": True}

    @app.post("/echo")
    async def echo(body: Echo):
        return {"question": body.question, "top_k": body.top_k}

    return app


starlette = _starlette()
fastapi = _fastapi()
'''


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def server(app: str, folder: str) -> Iterator[str]:
    """A uvicorn process serving `app` of the apps module on a free loopback port."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", f"bench_apps:{app}", "--host", "127.0.0.1",
         "--port", str(port), "--log-level", "warning", "--app-dir", folder],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(url, process)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


def wait_until_up(url: str, process: subprocess.Popen, timeout: float = 60.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited: {process.stderr.read().decode()}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(url + "/ping", timeout=1.0).status_code == 200:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up in {timeout} s")


def round_trips(url: str, requests: int) -> dict[str, list[float]]:
    """Seconds of each of `requests` GET /ping and POST /echo round trips (after 20 of each
    unmeasured, so connection set-up and first-call imports are not counted)."""
    import httpx

    body = {"question": "Who wrote Pride and Prejudice?", "top_k": 3}
    times: dict[str, list[float]] = {"GET /ping": [], "POST /echo": []}
    with httpx.Client(base_url=url) as client:
        for index in range(requests + 20):
            for name, call in (("GET /ping", lambda: client.get("/ping")),
                               ("POST /echo", lambda: client.post("/echo", json=body))):
                clock = time.perf_counter()
                response = call()
                elapsed = time.perf_counter() - clock
                assert response.status_code == 200, response.text
                if index >= 20:
                    times[name].append(elapsed)
    return times


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=500, help="measured requests per route")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=None, help="write the JSON record here")
    args = parser.parse_args()
    import tempfile

    results: dict[str, dict[str, list[tuple[float, float]]]] = {}
    with tempfile.TemporaryDirectory() as folder:
        with open(os.path.join(folder, "bench_apps.py"), "w") as handle:
            handle.write(APP_SOURCE)
        for _ in range(args.rounds):
            for label, app in APPS.items():
                with server(app, folder) as url:
                    for route, times in round_trips(url, args.requests).items():
                        results.setdefault(label, {}).setdefault(route, []).append(
                            (statistics.median(times), percentile(times, 0.99)))
    print(f"{args.requests} requests per route and round, {args.rounds} rounds, one keep-alive "
          f"client, 127.0.0.1; load average {os.getloadavg()[0]:.1f}")
    print("| app | route | median (µs) | p99 (µs) |")
    print("|---|---|---|---|")
    for label, routes in results.items():
        for route, rounds in routes.items():
            median = statistics.median(r[0] for r in rounds) * 1e6
            p99 = statistics.median(r[1] for r in rounds) * 1e6
            print(f"| {label} | {route} | {median:.0f} | {p99:.0f} |")
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(dict(requests=args.requests, rounds=args.rounds, results=results,
                           loadavg=os.getloadavg()), handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
