"""A bounded load generator for running `dil-jax serve`s, on loopback, and Hugging Face's
pipeline beside them (docs/serving.md, "Measured").

    dil-jax serve --port 8771 &                                # batching on (the defaults)
    dil-jax serve --port 8772 --batch-size 1 --max-wait-ms 0 & # batching off
    python3 benchmarks/serve.py --url on=http://127.0.0.1:8771 --url off=http://127.0.0.1:8772 \\
        --clients 1 16 64 --requests 64 --reader delayed --out benchmarks/results/serve_batching

    python3 benchmarks/serve.py --url http://127.0.0.1:8771 --route read --reader full \\
        --clients 1 16 --requests 64 --peer /work/venv-hf4/bin/python \\
        --peer-model /tmp/serve2/peer-model --out benchmarks/results/serve_read_peer

For each number of concurrent clients, and for each server in turn (so that the servers are
measured side by side, under the same load from other processes), exactly --requests items are
sent by that many threads, each waiting for its answer before sending the next; a level stops
early at --time-limit seconds. Items: the questions of the validation articles 28-34 of the
shared SQuAD dev file in file order, or a seeded sample of them (--sample-seed); with --route
read, each with its paragraph as the context. Reported per level: answered / sent, questions
per second, latency p50/p95/p99, the worker's batch sizes (the mean from /metrics'
`dil_jax_batch_size`, the largest from the responses), the worker's seconds in each phase of a
read (from /metrics' `dil_jax_phase_seconds`, queue wait excluded) and the pair phase's share
of them, each status's count and how many 503s carried Retry-After (0 errors expected below the
queue limit; only 503s above it). A refused item is not sent again: what was sent is answered
or refused, nothing else.

--peer PYTHON runs benchmarks/serve_peer.py under that interpreter (a venv with transformers
4.x) on the same items after the servers' levels: /v1/read's items one pipeline call each, or
(--route answer) each question's --p passages as the server's index retrieves them, read in
one call. Its answers are compared with the first server's.

Only 127.0.0.1 / localhost / ::1 URLs are accepted: this drives load, it must not leave the
machine. A server started with --api-key (or DIL_JAX_API_KEY) needs the same key here:
--api-key, or DIL_JAX_API_KEY in the environment (kept out of the recorded command); every
server's /v1/info is read first, so a missing or wrong key stops the run in one line before
any level.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SQUAD = ROOT.parent / "shared" / "data" / "squad" / "dev-v1.1.35-articles.json"
LOOPBACK = ("127.0.0.1", "localhost", "::1")
API_KEY_ENV = "DIL_JAX_API_KEY"  # what `dil-jax serve` and dil_jax.client read too


@dataclasses.dataclass(frozen=True)
class Server:
    name: str
    url: str


@dataclasses.dataclass(frozen=True)
class Item:
    """One request's content: a question, and its context for /v1/read; the SQuAD answers
    it is scored against (none: not scored)."""

    question: str
    context: str
    answers: tuple[str, ...] = ()


def server_arg(text: str) -> Server:
    """NAME=URL or URL (named by its port); loopback only."""
    name, _, url = text.partition("=") if "=" in text.split("://")[0] else ("", "", text)
    parsed = urllib.parse.urlparse(url)
    if parsed.hostname not in LOOPBACK:
        raise argparse.ArgumentTypeError(f"{url}: only a loopback address is allowed")
    return Server(name or str(parsed.port), url.rstrip("/"))


def auth_headers(api_key: str | None) -> dict[str, str]:
    """The header a keyed server (`dil-jax serve --api-key`) accepts; none without a key."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def server_info(server: Server, api_key: str | None) -> dict:
    """The server's /v1/info, read with the key (a keyed server refuses it without one); a
    refusal or an unreachable server is one line naming the URL."""
    from dil_jax.client import Client, ServiceError

    try:
        return Client(server.url, api_key or "", timeout=60).info()
    except ServiceError as error:
        hint = (f" (give its key: --api-key or {API_KEY_ENV})" if error.status == 401 else "")
        raise SystemExit(f"benchmarks/serve.py: {error}{hint}") from None


def recorded_command(argv: list[str]) -> str:
    """The command line as the results record it, an --api-key's value replaced by '***'."""
    shown, hide_next = [], False
    for arg in argv:
        if hide_next:
            shown.append("***")
        elif arg.startswith("--api-key="):
            shown.append("--api-key=***")
        else:
            shown.append(arg)
        hide_next = arg == "--api-key"
    return " ".join(shown)


def squad_items(count: int, path: Path = SQUAD, seed: int | None = None) -> list[Item]:
    """`count` questions of articles 28-34, each with its paragraph: the first ones in file
    order, or (seed) a seeded sample spread over every article (the first ones are all of
    article 28: one BM25 neighbourhood, which window pruning may settle unusually early)."""
    data = json.loads(path.read_text())["data"][28:35]
    items = [Item(qa["question"], paragraph["context"],
                  tuple(answer["text"] for answer in qa["answers"])) for article in data
             for paragraph in article["paragraphs"] for qa in paragraph["qas"]]
    if count > len(items):
        raise SystemExit(f"--requests {count}: articles 28-34 hold {len(items)} questions")
    if seed is None:
        return items[:count]
    import numpy as np

    chosen = np.random.default_rng(seed).permutation(len(items))[:count]
    return [items[i] for i in sorted(chosen)]


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@dataclasses.dataclass(frozen=True)
class MetricTotals:
    """Running totals of one server's /metrics, read before and after a level: their
    difference is that level's share."""

    batch_sums: dict[str, float]                  # kind ("answer", "read") -> sum of batch sizes
    batch_counts: dict[str, float]                # kind -> batches
    phase_seconds: dict[tuple[str, str], float]   # (reader, phase) -> seconds


def metric_totals(text: str) -> MetricTotals:
    """The batch-size and phase totals of a Prometheus text page (`dil-jax serve`'s /metrics)."""
    from prometheus_client.parser import text_string_to_metric_families

    sums: dict[str, float] = collections.defaultdict(float)
    counts: dict[str, float] = collections.defaultdict(float)
    phases: dict[tuple[str, str], float] = collections.defaultdict(float)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if family.name == "dil_jax_batch_size" and sample.name.endswith("_sum"):
                sums[sample.labels["kind"]] += sample.value
            elif family.name == "dil_jax_batch_size" and sample.name.endswith("_count"):
                counts[sample.labels["kind"]] += sample.value
            elif family.name == "dil_jax_phase_seconds" and sample.name.endswith("_sum"):
                phases[sample.labels["reader"], sample.labels["phase"]] += sample.value
    return MetricTotals(dict(sums), dict(counts), dict(phases))


def fetch_totals(url: str) -> MetricTotals:
    import httpx

    return metric_totals(httpx.get(url + "/metrics", timeout=30).text)


def level_work(before: MetricTotals, after: MetricTotals, reader: str | None) -> dict[str, float]:
    """Seconds the worker spent in each phase of a read during a level (every phase but the
    queue wait, which is not work), for `reader` (None: every reader). The phases are observed
    once per batch, so with batching on a batch's work is counted once, not per question."""
    work: dict[str, float] = collections.defaultdict(float)
    for (name, phase), seconds in after.phase_seconds.items():
        if phase != "queue" and (reader is None or name == reader):
            work[phase] += seconds - before.phase_seconds.get((name, phase), 0.0)
    return dict(sorted(work.items()))


def batch_mean(before: MetricTotals, after: MetricTotals, kind: str) -> float | None:
    """Mean batch size of the batches of `kind` read during a level (None: no batch)."""
    batches = after.batch_counts.get(kind, 0.0) - before.batch_counts.get(kind, 0.0)
    if batches <= 0:
        return None
    return (after.batch_sums.get(kind, 0.0) - before.batch_sums.get(kind, 0.0)) / batches


def body_of(route: str, item: Item, extra: dict) -> dict:
    if route == "read":
        return {"question": item.question, "context": item.context, **extra}
    return {"question": item.question, **extra}


def answer_of(route: str, payload: dict) -> dict | None:
    """The response's best answer as {answer, start, end, score}."""
    if route == "read":
        return {key: payload[key] for key in ("answer", "start", "end", "score")}
    if not payload["answers"]:
        return None
    best = payload["answers"][0]
    return {"answer": best["text"], "start": best["start"], "end": best["end"],
            "score": best["reader_score"], "passage_id": best["passage_id"]}


def answer_scores(items: list[Item], answers: dict[int, dict | None]) -> dict[str, float] | None:
    """EM and F1 (the official SQuAD v1.1 rules, in %) of the answered items against their
    answers, an item answered with nothing scoring 0; None when no item has answers."""
    from dil_jax.metrics.squad_metric import exact_score, f1_score_v1

    scored = [(number, items[number]) for number in answers if items[number].answers]
    if not scored:
        return None
    texts = [(answers[number] or {}).get("answer", "") for number, _ in scored]
    em = sum(max(exact_score(text, gold) for gold in item.answers)
             for text, (_, item) in zip(texts, scored))
    f1 = sum(max(f1_score_v1(text, gold) for gold in item.answers)
             for text, (_, item) in zip(texts, scored))
    return {"EM": 100 * em / len(scored), "F1": 100 * f1 / len(scored), "scored": len(scored)}


def resident_mib(pid: int) -> float | None:
    """The process's resident memory (VmRSS) in MiB, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


class RssSampler:
    """Samples a server process's VmRSS every `every_s` seconds while a level runs, so a
    level's record says whether its memory stayed flat (first, largest and last sample)."""

    def __init__(self, pid: int | None, every_s: float = 0.5):
        self.pid, self.every_s = pid, every_s
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while True:
            rss = resident_mib(self.pid)
            if rss is not None:
                self.samples.append(rss)
            if self._stop.wait(self.every_s):
                return

    def __enter__(self) -> RssSampler:
        if self.pid is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.pid is not None:
            self._stop.set()
            self._thread.join()

    def summary(self) -> dict[str, float] | None:
        if not self.samples:
            return None
        return {"first_mib": self.samples[0], "max_mib": max(self.samples),
                "last_mib": self.samples[-1], "samples": len(self.samples)}


def run_level(server: Server, route: str, items: list[Item], clients: int, extra: dict,
              time_limit: float, api_key: str | None = None, pid: int | None = None) -> dict:
    """Sends every item once, `clients` at a time (with `api_key`, for a keyed server; with
    `pid`, the server's process, its memory sampled meanwhile); the level's record."""
    import httpx

    pending = collections.deque(enumerate(items))
    lock = threading.Lock()
    latencies: list[float] = []
    batches: list[int] = []
    answers: dict[int, dict | None] = {}
    statuses: collections.Counter = collections.Counter()
    retry_after = crossed = 0
    deadline = time.monotonic() + time_limit
    kind = "read" if route == "read" else "answer"
    totals_before = fetch_totals(server.url)

    def client_loop() -> None:
        nonlocal retry_after, crossed
        with httpx.Client(base_url=server.url, timeout=max(60.0, time_limit),
                          headers=auth_headers(api_key)) as http:
            while time.monotonic() < deadline:
                with lock:
                    if not pending:
                        return
                    number, item = pending.popleft()
                started = time.perf_counter()
                response = http.post(f"/v1/{route}", json=body_of(route, item, extra))
                elapsed = time.perf_counter() - started
                with lock:
                    statuses[response.status_code] += 1
                    retry_after += "retry-after" in response.headers
                    if response.status_code == 200:
                        payload = response.json()
                        latencies.append(elapsed)
                        answers[number] = answer_of(route, payload)
                        # /v1/answer names the question it answers: another's is a crossing.
                        crossed += route == "answer" and payload["question"] != item.question
                        if route == "answer":
                            batches.append(payload["batch_size"])

    started = time.perf_counter()
    threads = [threading.Thread(target=client_loop) for _ in range(clients)]
    with RssSampler(pid) as rss:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    wall = time.perf_counter() - started
    totals_after = fetch_totals(server.url)
    work = level_work(totals_before, totals_after, extra.get("reader"))
    return {"server": server.name, "url": server.url, "reader": extra.get("reader"),
            "clients": clients,
            "sent": sum(statuses.values()), "answered": len(latencies), "wall_s": wall,
            "questions_per_s": len(latencies) / wall if wall else 0.0,
            "p50_s": percentile(latencies, 0.5), "p95_s": percentile(latencies, 0.95),
            "p99_s": percentile(latencies, 0.99),
            "batch_mean": batch_mean(totals_before, totals_after, kind),
            "work_s": work,
            "batch_max": max(batches) if batches else None,
            "statuses": {str(k): v for k, v in sorted(statuses.items())},
            "retry_after": retry_after, "crossed": crossed, "server_rss": rss.summary(),
            "scores": answer_scores(items, answers),
            "answers": {str(k): v for k, v in sorted(answers.items())}}


def peer_settings(index: str, max_question_len: int) -> dict:
    """The pipeline's windows as the server's: question tokens + window tokens in all, the
    overlap of windows that start every doc_stride tokens."""
    from dil_jax.open_domain.index.files import read_settings

    settings = read_settings(index)
    window, stride = settings.max_passage_len, settings.doc_stride
    return {"max_seq_len": max_question_len + window, "doc_stride": window - stride - 1,
            "max_question_len": max_question_len, "context_tokens": window - 1}


def retrieved_contexts(index: str, questions: list[str], p: int) -> list[list[str]]:
    """Each question's top-p passages as the server's index retrieves them, in BM25 order."""
    sys.path.insert(0, str(ROOT))
    from dil_jax.open_domain.index.folder import open_index

    opened = open_index(index)
    hits = opened.retriever.search_batch(questions, p)
    return [[opened.passages[hit.passage_index].text for hit in row] for row in hits]


def run_peer(python: str, model: str, work: dict) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        work_path, out_path = Path(folder) / "work.json", Path(folder) / "peer.json"
        work_path.write_text(json.dumps(work))
        subprocess.run([python, str(ROOT / "benchmarks" / "serve_peer.py"), "read", "--model",
                        model, "--work", str(work_path), "--out", str(out_path)], check=True)
        return json.loads(out_path.read_text())


def agreement(ours: dict[str, dict | None], theirs: list[dict]) -> dict:
    """How often the two best answers are the same text, and the same characters."""
    pairs = [(ours[key], theirs[int(key)]) for key in ours if ours[key] is not None]
    same_text = sum(a["answer"].strip() == b["answer"].strip() for a, b in pairs)
    same_span = sum((a["start"], a["end"]) == (b["start"], b["end"]) for a, b in pairs)
    return {"compared": len(pairs), "same_text": same_text, "same_span": same_span,
            "same_text_rate": same_text / len(pairs) if pairs else None,
            "differing": [{"item": key, "ours": ours[key], "peer": theirs[int(key)]}
                          for key in ours if ours[key] is not None
                          and ours[key]["answer"].strip() != theirs[int(key)]["answer"].strip()]}


def _agreed(agreed: dict) -> str:
    rate = agreed["same_text_rate"]
    return (f"{agreed['same_text']} / {agreed['compared']}"
            + ("" if rate is None else f" ({100 * rate:.1f}%)"))


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def pair_share(work: dict[str, float]) -> float | None:
    """The pair phase's share of a level's worker time (None: no work recorded)."""
    total = sum(work.values())
    return work.get("pair_upper", 0.0) / total if total > 0 else None


def _work(work: dict[str, float] | None) -> str:
    share = pair_share(work) if work else None
    return "-" if share is None else f"{sum(work.values()):.1f} ({share:.0%})"


def markdown(record: dict) -> str:
    rows = ["| server | reader | clients | answered / sent | q/s | p50 (s) | p95 (s) | "
            "p99 (s) | batch mean / max | worker s (pair share) | statuses | "
            "503 with Retry-After | crossed | server RSS MiB first / max / last | EM / F1 |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in record["levels"]:
        batch = "-" if r["batch_mean"] is None else f"{r['batch_mean']:.2f}"
        rows.append(f"| {r['server']} | {r['reader'] or '-'} | {r['clients']} | "
                    f"{r['answered']} / {r['sent']} | "
                    f"{r['questions_per_s']:.2f} | {_seconds(r['p50_s'])} | "
                    f"{_seconds(r['p95_s'])} | {_seconds(r['p99_s'])} | {batch} / "
                    f"{r['batch_max'] if r['batch_max'] is not None else '-'} | "
                    f"{_work(r.get('work_s'))} | {r['statuses']} | {r['retry_after']} | "
                    f"{r.get('crossed', '-')} | {_rss(r.get('server_rss'))} | "
                    f"{_scores(r.get('scores'))} |")
    peer = record.get("peer")
    if peer:
        versions = ", ".join(f"{k} {v}" for k, v in peer["versions"].items())
        readers = list(record["agreement"])
        rows += ["", f"Peer: Hugging Face `pipeline(\"question-answering\")` ({versions}), "
                     f"windows {peer['settings']}, in-process (no HTTP); same answer text as "
                     "the server's first level of each reader:", "",
                 "| pipeline batch_size | windows | q/s | p50 (s) | p95 (s) | p99 (s) | "
                 + " | ".join(f"same as {reader}" for reader in readers) + " |",
                 "|---|---|---|---|---|---|" + "---|" * len(readers)]
        for position, run in enumerate(peer["runs"]):
            agreed = [record["agreement"][reader][position] for reader in readers]
            rows.append(f"| {run['batch_size']} | {run.get('windows', '-')} | "
                        f"{run['questions_per_s']:.2f} | "
                        f"{_seconds(run['p50_s'])} | {_seconds(run['p95_s'])} | "
                        f"{_seconds(run['p99_s'])} | "
                        + " | ".join(_agreed(a) for a in agreed) + " |")
    machine = record["machine"]
    rows += ["", f"{machine['cpu']}, {machine['cpus']} CPUs, load average "
                 f"{record['loadavg_before'][0]:.1f} before, {record['loadavg_after'][0]:.1f} "
                 "after (other jobs share the machine)."]
    return "\n".join(rows)


def _scores(scores: dict | None) -> str:
    return "-" if not scores else f"{scores['EM']:.1f} / {scores['F1']:.1f}"


def _rss(rss: dict | None) -> str:
    if not rss:
        return "-"
    return f"{rss['first_mib']:.0f} / {rss['max_mib']:.0f} / {rss['last_mib']:.0f}"


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.processor() or "unknown CPU"
    return next((line.split(":", 1)[1].strip() for line in out.splitlines()
                 if line.startswith("Model name")), "unknown CPU")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", dest="servers", type=server_arg, action="append",
                        help="a server, NAME=URL or URL (repeatable; default: "
                             "http://127.0.0.1:8000)")
    parser.add_argument("--route", choices=("answer", "read"), default="answer")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--server-pid", type=int, action="append", default=[], metavar="PID",
                        help="the process of each --url's server, in order: its resident "
                             "memory is sampled during every level (first / largest / last)")
    parser.add_argument("--requests", type=int, default=32, help="items per level")
    parser.add_argument("--sample-seed", type=int, default=None,
                        help="items: a seeded sample of articles 28-34's questions (default: the "
                             "first ones in file order)")
    parser.add_argument("--time-limit", type=float, default=600.0, help="seconds per level")
    parser.add_argument("--reader", nargs="+", default=[None],
                        help="the readers asked, each level in turn (default: the server's "
                             "first)")
    parser.add_argument("--p", type=int, default=None, help="passages read (answer route)")
    parser.add_argument("--peer", default=None, metavar="PYTHON",
                        help="interpreter of a venv with transformers 4.x: run the pipeline "
                             "peer on the same items")
    parser.add_argument("--peer-model", default=None, help="HF folder (serve_peer.py export)")
    parser.add_argument("--peer-batch-sizes", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--index", default=str(ROOT / "runs" / "demo-index"),
                        help="the servers' index (the peer's windows and retrieval)")
    parser.add_argument("--max-question-len", type=int, default=32)
    parser.add_argument("--out", default=None, help="write OUT.json and OUT.md")
    parser.add_argument("--api-key", default=os.environ.get(API_KEY_ENV) or None,
                        help="the servers' key (`dil-jax serve --api-key`; default: "
                             f"${API_KEY_ENV}); not recorded")
    args = parser.parse_args(argv)
    args.servers = args.servers or [server_arg("http://127.0.0.1:8000")]
    if args.peer and not args.peer_model:
        parser.error("--peer needs --peer-model (benchmarks/serve_peer.py export --out DIR)")
    if len(args.server_pid) > len(args.servers):
        parser.error(f"--server-pid given {len(args.server_pid)} times for "
                     f"{len(args.servers)} --url server(s): one per server, in order")
    return args


def peer_work(args: argparse.Namespace, items: list[Item], p: int) -> dict:
    settings = peer_settings(args.index, args.max_question_len)
    if args.route == "read":
        listed = [{"question": i.question, "context": i.context} for i in items]
    else:
        contexts = retrieved_contexts(args.index, [i.question for i in items], p)
        listed = [{"question": i.question, "contexts": c} for i, c in zip(items, contexts)]
    return {"kind": args.route, "items": listed, "settings": settings,
            "batch_sizes": args.peer_batch_sizes, "exact_windows": args.route == "read"}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    extras = [{key: value for key, value in (("reader", reader), ("p", args.p))
               if value is not None} for reader in args.reader]
    # Read before anything else: a keyed server without its key is named now, not as 401s
    # counted in every level.
    infos = [server_info(server, args.api_key) for server in args.servers]
    items = squad_items(args.requests, seed=args.sample_seed)
    load_before = os.getloadavg()
    pids = dict(zip((server.name for server in args.servers), args.server_pid))
    levels = [run_level(server, args.route, items, clients, extra, args.time_limit, args.api_key,
                        pids.get(server.name))
              for clients in args.clients for server in args.servers for extra in extras]
    record = {"command": recorded_command(["python3", *sys.argv]), "route": args.route,
              "items": len(items), "levels": levels, "loadavg_before": load_before,
              "machine": {"cpu": cpu_model(), "cpus": os.cpu_count(),
                          "python": platform.python_version()}}
    if args.peer:
        p = args.p or infos[0]["limits"]["max_p"]
        record["peer"] = run_peer(args.peer, args.peer_model, peer_work(args, items, p))
        # Each reader's answers of its first level on the first server against each peer run.
        record["agreement"] = {}
        for level in levels:
            name = level["reader"] or "default"
            if level["server"] == args.servers[0].name and name not in record["agreement"]:
                record["agreement"][name] = [agreement(level["answers"], run["answers"])
                                             for run in record["peer"]["runs"]]
    record["loadavg_after"] = os.getloadavg()
    table = markdown(record)
    print(table)
    if args.out:
        Path(args.out + ".json").write_text(json.dumps(record, indent=1) + "\n")
        Path(args.out + ".md").write_text(f"`{record['command']}`\n\n{table}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
