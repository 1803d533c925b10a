"""A bounded load generator for a running `dil-jax serve`, on loopback (docs/serving.md).

    dil-jax serve --port 8000 &            # wait for GET /readyz
    python3 benchmarks/serve.py --url http://127.0.0.1:8000 --clients 1 4 16 --requests 32 \\
        --reader delayed --out benchmarks/results/serve_delayed

For each number of concurrent clients, exactly --requests questions (the first of the
validation articles 28-34 of the shared SQuAD dev file, or --questions FILE, one a line) are
sent by that many threads, each waiting for its answer before sending the next; a level stops
early at --time-limit seconds. Reported per level: questions answered per second, latency
p50/p95/p99, the worker's batch sizes (from each response), and the count of each non-200
status (0 expected below the queue limit; only 503s above it).

Only a 127.0.0.1 / localhost / ::1 URL is accepted: this drives load, it must not leave the
machine. Comparing against Hugging Face's pipeline (issue 41) is not done here yet.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import threading
import time
import urllib.parse
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SQUAD = ROOT.parent / "shared" / "data" / "squad" / "dev-v1.1.35-articles.json"


def questions_of(path: str | None, count: int) -> list[str]:
    if path:
        lines = [line.strip() for line in Path(path).read_text().splitlines() if line.strip()]
    else:
        data = json.loads(SQUAD.read_text())["data"][28:35]
        lines = [qa["question"] for article in data for paragraph in article["paragraphs"]
                 for qa in paragraph["qas"]]
    if len(lines) < count:
        lines = (lines * (count // len(lines) + 1))
    return lines[:count]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run_level(url: str, questions: list[str], clients: int, body_extra: dict,
              time_limit: float) -> dict:
    """Sends every question once, `clients` at a time; the level's record."""
    import httpx

    pending = collections.deque(questions)
    lock = threading.Lock()
    latencies: list[float] = []
    batches: list[int] = []
    statuses: collections.Counter = collections.Counter()
    deadline = time.monotonic() + time_limit

    def client_loop() -> None:
        with httpx.Client(base_url=url, timeout=max(60.0, time_limit)) as http:
            while time.monotonic() < deadline:
                with lock:
                    if not pending:
                        return
                    question = pending.popleft()
                started = time.perf_counter()
                response = http.post("/v1/answer", json={"question": question, **body_extra})
                elapsed = time.perf_counter() - started
                with lock:
                    statuses[response.status_code] += 1
                    if response.status_code == 200:
                        latencies.append(elapsed)
                        batches.append(response.json()["batch_size"])

    started = time.perf_counter()
    threads = [threading.Thread(target=client_loop) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    return {"clients": clients, "sent": sum(statuses.values()), "answered": len(latencies),
            "wall_s": wall, "questions_per_s": len(latencies) / wall if wall else 0.0,
            "p50_s": percentile(latencies, 0.5) if latencies else None,
            "p95_s": percentile(latencies, 0.95) if latencies else None,
            "p99_s": percentile(latencies, 0.99) if latencies else None,
            "batch_mean": statistics.mean(batches) if batches else None,
            "batch_max": max(batches) if batches else None,
            "statuses": {str(k): v for k, v in sorted(statuses.items())}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--requests", type=int, default=32, help="questions per level")
    parser.add_argument("--time-limit", type=float, default=600.0, help="seconds per level")
    parser.add_argument("--reader", default=None)
    parser.add_argument("--p", type=int, default=None)
    parser.add_argument("--questions", default=None, help="file of questions, one a line")
    parser.add_argument("--out", default=None, help="write OUT.json and OUT.md")
    args = parser.parse_args()
    host = urllib.parse.urlparse(args.url).hostname
    if host not in ("127.0.0.1", "localhost", "::1"):
        parser.error(f"--url {args.url}: only a loopback address is allowed")
    extra = {key: value for key, value in (("reader", args.reader), ("p", args.p))
             if value is not None}
    questions = questions_of(args.questions, args.requests)
    load_before = os.getloadavg()
    levels = [run_level(args.url, questions, clients, extra, args.time_limit)
              for clients in args.clients]
    header = ("| clients | answered | q/s | p50 (s) | p95 (s) | p99 (s) | batch mean / max | "
              "statuses |\n|---|---|---|---|---|---|---|---|")
    rows = [f"| {r['clients']} | {r['answered']} / {r['sent']} | {r['questions_per_s']:.2f} | "
            f"{r['p50_s']:.2f} | {r['p95_s']:.2f} | {r['p99_s']:.2f} | "
            f"{r['batch_mean']:.2f} / {r['batch_max']} | {r['statuses']} |" for r in levels]
    table = "\n".join([header, *rows])
    print(table)
    print(f"load average before {load_before[0]:.1f}, after {os.getloadavg()[0]:.1f}; "
          f"{os.cpu_count()} CPUs")
    if args.out:
        record = {"command": " ".join(sys.argv), "url": args.url, "extra": extra,
                  "levels": levels, "loadavg_before": load_before,
                  "loadavg_after": os.getloadavg(), "cpus": os.cpu_count()}
        Path(args.out + ".json").write_text(json.dumps(record, indent=1) + "\n")
        Path(args.out + ".md").write_text(f"`{record['command']}`\n\n{table}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
