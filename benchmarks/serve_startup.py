"""`dil-jax serve` start-up, cold and restarted, for one or more checkouts side by side
(docs/serving.md, "Start-up").

    python3 benchmarks/serve_startup.py --code before=/work/wt-before --code after=. \\
        --index runs/demo-index --rounds 2 --out benchmarks/results/serve_startup

For each round and each checkout in turn (so the checkouts are measured under the same load
from other processes), two starts of `dil-jax serve` (that checkout's code, its own fresh
compilation cache folder): **cold** (the cache empty) and **warm** (the same folder again: a
restart). Each start is timed from the process's launch to the first 200 of /readyz, then one
question is asked of each reader (the answer must be the same for every checkout: printed) and
the server is stopped. Reported per start: seconds to ready, programs at ready and after the
question (/metrics' `dil_jax_compilations_total` by stage: a request must compile nothing),
and the /readyz progress (programs before ready, and those left to the idle warm-up).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUESTION = "Who wrote Pride and Prejudice?"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def get_json(url: str, timeout: float = 5.0) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def commit_of(code: Path) -> str:
    """The checkout's commit (its short hash), or "unknown" outside git: the record names it."""
    result = subprocess.run(["git", "-C", str(code), "rev-parse", "--short=7", "HEAD"],
                            capture_output=True, text=True)
    return result.stdout.strip() or "unknown"


def compilations(url: str) -> dict[str, float]:
    """/metrics' dil_jax_compilations_total by stage."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        if family.name == "dil_jax_compilations":
            return {s.labels["stage"]: s.value for s in family.samples}
    return {}


def ask(url: str, reader: str) -> str:
    body = json.dumps({"question": QUESTION, "reader": reader}).encode()
    request = urllib.request.Request(url + "/v1/answer", body,
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.loads(response.read())["answers"][0]["text"]


def start(code: Path, index: str, cache: Path, extra: list[str], limit: float) -> dict:
    """One start of `dil-jax serve` from `code`: seconds to ready and what it compiled."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = dict(os.environ, PYTHONPATH=str(code), DIL_JAX_COMPILATION_CACHE=str(cache))
    log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
    began = time.monotonic()
    process = subprocess.Popen([sys.executable, "-m", "dil_jax", "serve", "--index", index,
                                "--port", str(port), *extra], cwd=code, env=env, stdout=log,
                               stderr=subprocess.STDOUT)
    try:
        while True:
            if process.poll() is not None:
                raise SystemExit(f"serve from {code} exited {process.returncode}; log: {log.name}")
            if time.monotonic() - began > limit:
                raise SystemExit(f"serve from {code} not ready after {limit:g} s; log: {log.name}")
            try:
                status, ready = get_json(url + "/readyz")
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                status, ready = 0, {}
            if status == 200:
                break
            time.sleep(0.25)
        seconds = time.monotonic() - began
        at_ready = compilations(url)
        answers = {reader: ask(url, reader) for reader in ("full", "delayed")}
        after = compilations(url)
        return {"ready_s": round(seconds, 1), "progress": ready.get("progress"),
                "compiled_at_ready": at_ready, "compiled_after_questions": after,
                "answers": answers, "log": log.name}
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(120)
        except subprocess.TimeoutExpired:
            process.kill()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--code", action="append", required=True, metavar="NAME=DIR",
                        help="a checkout to start serve from (repeat to compare)")
    parser.add_argument("--index", default=str(ROOT / "runs" / "demo-index"))
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--limit", type=float, default=1800.0, help="seconds to ready, at most")
    parser.add_argument("--out", default=None, help="write OUT.json")
    parser.add_argument("serve_args", nargs="*", help="more `dil-jax serve` flags, after --")
    args = parser.parse_args(argv)
    codes = {}
    for item in args.code:
        name, _, folder = item.partition("=")
        if not folder or not (Path(folder) / "dil_jax").is_dir():
            parser.error(f"--code {item!r}: give NAME=DIR, DIR a checkout holding dil_jax/")
        codes[name] = Path(folder).resolve()
    args.codes = codes
    if not Path(args.index, "index.json").is_file():
        parser.error(f"--index {args.index}: no index.json there (build it: dil-jax demo)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    index = str(Path(args.index).resolve())
    rows = []
    for round_ in range(args.rounds):
        for name, code in args.codes.items():
            with tempfile.TemporaryDirectory(prefix="serve-startup-") as cache:
                for kind in ("cold", "warm"):
                    result = start(code, index, Path(cache), args.serve_args, args.limit)
                    rows.append({"round": round_, "code": name, "start": kind, **result})
                    print(f"{name:>8} {kind}: ready in {result['ready_s']:7.1f} s, "
                          f"compiled {result['compiled_at_ready']} -> "
                          f"{result['compiled_after_questions']}, answers {result['answers']}",
                          flush=True)
    record = {"machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
              "command": " ".join(sys.argv), "codes": {k: str(v) for k, v in args.codes.items()},
              "commits": {k: commit_of(v) for k, v in args.codes.items()}, "rows": rows}
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            record["machine"] = next(line.split(":", 1)[1].strip() for line in cpuinfo
                                     if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    if args.out:
        out = Path(args.out + ".json")
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(record, indent=1) + "\n")
        tmp.replace(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
