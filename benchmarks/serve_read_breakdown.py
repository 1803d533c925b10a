"""Where the time of one `POST /v1/read` goes (issue 63): a real `dil-jax serve` app on
loopback, in this process, read by one client one request at a time, every stage of the
request timed inside the server (docs/serving.md, "One context, one client").

    python3 benchmarks/serve_read_breakdown.py --index runs/demo-index --reader full delayed \\
        --requests 32 --out benchmarks/results/serve_read_breakdown

Per request, as the client and the worker thread see it (milliseconds, median over the
requests; wall clock, and the process's CPU time beside it where it says something under load):

- client: the request's latency at the client (httpx, keep-alive);
- queue: from the job's arrival in the worker's queue to its handler's start, split into
  `compile` (the worker busy with an idle warm-up program when the job came: it waits for it)
  and `gather` (the rest: the batching deadline, --max-wait-ms);
- the handler's stages: `prepare` (the context cut into windows, the question tokenized),
  `question` (its lower states), `context` (the windows' passage side: ids, or their lower
  states), `pairs` (the pair program), `answers` (the pipeline's span scoring);
- http: client − queue − handler (uvicorn, Starlette, JSON, the event loop, loopback);
- the chunk shape the pair program ran at (rows x question width x passage width) against the
  shape the chunk needed, and how many programs the idle warm-up had compiled by then.

--start ready (default) sends the first request as soon as /readyz is 200, as a benchmark
started after the server is ready does; --start idle waits until the idle warm-up has compiled
every narrower program first. Runs with whichever dil_jax is on PYTHONPATH, so two checkouts
can be compared with the same script.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SQUAD = ROOT.parent / "shared" / "data" / "squad" / "dev-v1.1.35-articles.json"
STAGES = ("prepare", "question", "context", "pairs", "answers")


@dataclasses.dataclass
class Clock:
    """Wall and process CPU seconds of one stage."""

    wall: float = 0.0
    cpu: float = 0.0


@dataclasses.dataclass
class Trace:
    """What the server did for the requests so far: idle-compile intervals, and per handler
    call its start, the jobs' arrivals, its stages and the chunk shapes its pairs ran at."""

    compiles: list[tuple[float, float]] = dataclasses.field(default_factory=list)
    calls: list[dict] = dataclasses.field(default_factory=list)
    current: dict | None = None


def timed(trace: Trace, stage: str, function):
    """`function` with its wall and CPU time added to the current handler call's `stage`."""

    def wrapper(*args, **kwargs):
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            return function(*args, **kwargs)
        finally:
            if trace.current is not None:
                clock = trace.current["stages"].setdefault(stage, Clock())
                clock.wall += time.perf_counter() - wall
                clock.cpu += time.process_time() - cpu

    return wrapper


def instrument(engine, trace: Trace) -> None:
    """Wraps the engine's and its readers' stages (instance attributes shadow the class's)."""
    worker = engine.worker
    process, idle = worker._process, worker._idle

    def traced_process(jobs):
        started = time.monotonic()
        trace.current = {"start": started, "arrivals": [job.enqueued for job in jobs],
                         "stages": {}, "shapes": [], "background_done":
                             engine.progress.get("background", {}).get("done")}
        clock = time.perf_counter()
        try:
            return process(jobs)
        finally:
            trace.current["handler"] = time.perf_counter() - clock
            trace.calls.append(trace.current)
            trace.current = None

    def traced_idle():
        started = time.monotonic()
        try:
            return idle()
        finally:
            trace.compiles.append((started, time.monotonic()))

    worker._process = traced_process
    if idle is not None:
        worker._idle = traced_idle
    engine._prepare_context = timed(trace, "prepare", engine._prepare_context)
    engine._context_side = timed(trace, "context", engine._context_side)
    engine._context_answers = timed(trace, "answers", engine._context_answers)
    for served in engine.readers.values():
        for reader in {id(r): r for r in [served.reader, *served.shapes.values()]}.values():
            reader._encode_question_batch = timed(trace, "question",
                                                  reader._encode_question_batch)
            grid = reader.grid
            grid.read_pairs = timed(trace, "pairs", grid.read_pairs)
            chunk_shape = grid.chunk_shape

            def traced_shape(signature, pairs, q_width, p_width, book=True, record=True,
                             chunk_shape=chunk_shape, grid=grid):
                shape = chunk_shape(signature, pairs, q_width, p_width, book, record)
                # Chunks read, not the prices `width_spans` asks before cutting a list.
                if trace.current is not None and record:
                    needed = chunk_shape(signature, pairs, q_width, p_width, False)
                    trace.current["shapes"].append(
                        {"ran": [shape.rows, shape.q_width, shape.p_width],
                         "needed": [needed.rows, needed.q_width, needed.p_width]})
                return shape

            grid.chunk_shape = traced_shape


def overlap(start: float, end: float, intervals: list[tuple[float, float]]) -> float:
    """Seconds of [start, end] covered by the intervals."""
    return sum(max(0.0, min(end, b) - max(start, a)) for a, b in intervals)


def squad_items(count: int) -> list[tuple[str, str]]:
    """The first `count` questions of articles 28-34 with their paragraphs (the items of
    benchmarks/serve.py)."""
    data = json.loads(SQUAD.read_text())["data"][28:35]
    items = [(qa["question"], paragraph["context"]) for article in data
             for paragraph in article["paragraphs"] for qa in paragraph["qas"]]
    return items[:count]


def median_ms(values: list[float]) -> float:
    return round(1e3 * statistics.median(values), 1) if values else 0.0


def level(engine, trace: Trace, port: int, reader: str, items: list[tuple[str, str]]) -> dict:
    """One client, one request at a time; per request its client latency and server trace."""
    import httpx

    rows = []
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=600) as http:
        for question, context in items:
            first_call = len(trace.calls)
            started = time.perf_counter()
            response = http.post("/v1/read", json={"question": question, "context": context,
                                                   "reader": reader})
            latency = time.perf_counter() - started
            response.raise_for_status()
            calls = trace.calls[first_call:]
            if len(calls) != 1:
                raise RuntimeError(f"{len(calls)} handler calls for one request")
            call = calls[0]
            arrival = call["arrivals"][0]
            queue = call["start"] - arrival
            compile_wait = overlap(arrival, call["start"], trace.compiles)
            stages = {name: call["stages"].get(name, Clock()) for name in STAGES}
            rows.append({"client": latency, "queue": queue, "compile": compile_wait,
                         "gather": queue - compile_wait, "handler": call["handler"],
                         "http": latency - queue - call["handler"],
                         **{name: clock.wall for name, clock in stages.items()},
                         **{f"{name}_cpu": clock.cpu for name, clock in stages.items()},
                         "shapes": call["shapes"], "background_done": call["background_done"],
                         "answer": response.json()})
    keys = ["client", "queue", "compile", "gather", "handler", "http", *STAGES,
            *(f"{name}_cpu" for name in STAGES)]
    return {"reader": reader, "requests": len(rows),
            "median_ms": {key: median_ms([row[key] for row in rows]) for key in keys},
            "mean_ms": {key: round(1e3 * statistics.fmean(row[key] for row in rows), 1)
                        for key in keys},
            "shapes": sorted({json.dumps(shape) for row in rows for shape in row["shapes"]}),
            "background_done": [rows[0]["background_done"], rows[-1]["background_done"]],
            "rows": rows}


def markdown(record: dict) -> str:
    columns = ["client", "queue", "compile", "gather", "http", *STAGES]
    lines = ["| reader | requests | " + " | ".join(columns) + " | CPU: " +
             " / ".join(STAGES) + " | chunk shapes ran (needed) | idle programs done |",
             "|---|---|" + "---|" * len(columns) + "---|---|---|"]
    for result in record["levels"]:
        median = result["median_ms"]
        shapes = "; ".join(
            "{}x{}x{} ({}x{}x{})".format(*json.loads(s)["ran"], *json.loads(s)["needed"])
            for s in result["shapes"][:4]) + (" ..." if len(result["shapes"]) > 4 else "")
        lines.append(f"| {result['reader']} | {result['requests']} | "
                     + " | ".join(f"{median[c]:.1f}" for c in columns) + " | "
                     + " / ".join(f"{median[s + '_cpu']:.1f}" for s in STAGES)
                     + f" | {shapes} | {result['background_done'][0]} to "
                       f"{result['background_done'][1]} of {record['background_total']} |")
    lines += ["", f"Medians in ms; {record['cpu']}, {record['cpus']} CPUs, load average "
                  f"{record['loadavg_before'][0]:.1f} before, {record['loadavg_after'][0]:.1f} "
                  f"after; --start {record['start']}; code {record['commit']}."]
    return "\n".join(lines)


def cpu_model() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    return next((line.split(":", 1)[1].strip() for line in out.splitlines()
                 if line.startswith("Model name")), "unknown CPU")


def code_commit() -> str:
    import dil_jax

    folder = Path(dil_jax.__file__).resolve().parents[1]
    out = subprocess.run(["git", "-C", str(folder), "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True)
    return out.stdout.strip() or str(folder)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--index", default=str(ROOT / "runs" / "demo-index"))
    parser.add_argument("--reader", nargs="+", default=["full", "delayed"])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--start", choices=("ready", "idle"), default="ready",
                        help="ready: right after /readyz; idle: once the idle warm-up is done")
    parser.add_argument("--out", default=None, help="write OUT.json and OUT.md")
    args = parser.parse_args(argv)

    import uvicorn

    from dil_jax.serve.app import AppSettings, create_app, server_config
    from dil_jax.serve.engine import Engine
    from dil_jax.serve.loading import ReadSettings, default_specs, load_served_readers
    from dil_jax.serve.metrics import ServeMetrics
    from dil_jax.serve.schemas import Limits

    # As `dil-jax serve` with its defaults builds them (dil_jax/commands/serve.py).
    settings = ReadSettings(batch_shapes=(1,))
    readers = load_served_readers(args.index, default_specs(None, None, None), settings)
    engine = Engine(readers, Limits(max_p=settings.top_p), ServeMetrics())
    trace = Trace()
    instrument(engine, trace)
    app = create_app(engine, AppSettings())
    with __import__("socket").socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(server_config(app, "127.0.0.1", port))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    started = time.perf_counter()
    while not engine.worker.accepting:
        if engine.worker.failure is not None:
            raise SystemExit(f"the server failed to start: {engine.worker.failure}")
        time.sleep(0.2)
    background = engine.progress.get("background", {"done": 0, "total": 0})
    print(f"ready in {time.perf_counter() - started:.1f} s; idle warm-up: "
          f"{background['total']} programs", file=sys.stderr)
    while args.start == "idle" and background["done"] < background["total"]:
        time.sleep(1.0)
    items = squad_items(args.requests)
    load_before = os.getloadavg()
    levels = [level(engine, trace, port, reader, items) for reader in args.reader]
    record = {"command": " ".join(["python3", *sys.argv]), "start": args.start,
              "cpu": cpu_model(), "cpus": os.cpu_count(), "commit": code_commit(),
              "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
              "background_total": background["total"], "levels": levels}
    # Stopped before the interpreter exits (its shutdown stops the worker in an executor).
    server.should_exit = True
    thread.join(120)
    table = markdown(record)
    print(table)
    if args.out:
        Path(args.out + ".json").write_text(json.dumps(record, indent=1, default=vars) + "\n")
        Path(args.out + ".md").write_text(f"`{record['command']}`\n\n{table}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
