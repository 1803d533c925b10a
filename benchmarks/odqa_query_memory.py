"""Resident memory of `dil-jax ask`, `serve` and `odqa-eval` over indexes of growing corpora:
what a question reads must not grow with the corpus (issue 60: at most 1.2x from 10k to 1M).

    python tools/make_scale_corpus.py --passages 10000 --out runs/scale/corpus-10000.jsonl
    python tools/make_scale_corpus.py --passages 300000 --out runs/scale/corpus-300000.jsonl
    python benchmarks/odqa_query_memory.py --work runs/scale/odqa \\
        --corpus runs/scale/corpus-10000.jsonl runs/scale/corpus-300000.jsonl \\
        --out benchmarks/results/odqa_query_memory

The reader is configs/tiny.py's encoder (2 blocks, hidden 32, 2 heads, FFN 64, 64 positions),
drawn at random (seed 0) with the MiniLM vocabulary so that it reads real text (its answers mean
nothing: memory is what is measured), saved once under WORK/tiny-reader. For each corpus (a
JSONL file of `tools/make_scale_corpus.py`, smallest first):

  index     `dil-jax index --retriever pyserini --k 0 1 --cache-dtype CACHE_DTYPE` into
            WORK/index-<corpus name>, kept for reruns (windows of 48 tokens, stride 24,
            questions of 8: the tiny reader's 64 positions); built once, its time recorded
  ask       `dil-jax ask --interactive` of QUESTIONS (5 SQuAD dev questions) at k = 1, p = 29
  odqa-eval `dil-jax odqa-eval` of the first 20 answerable questions of the shared SQuAD dev
            file, p = 29, at k = 1
  serve     `dil-jax serve` (full reader at k = 0, delayed at k = 1): until /readyz says ready,
            then the 5 questions to /v1/answer one after another

each in a fresh child process, --repeats times (the row is the run of median peak). Recorded
per command: the child's peak resident memory over its whole life (VmHWM: Python, JAX, the
JVM of Lucene, everything) and, at its end, its resident memory split into anonymous (RssAnon:
what the process allocated) and file-backed pages (RssFile: mapped files it touched, the page
cache's, reclaimable). Written: OUT.json and OUT.md,
the machine named, each command's ratio between the largest and the smallest corpus.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SQUAD_DEV = REPO.parent / "shared" / "data" / "squad" / "dev-v1.1.35-articles.json"
QUESTIONS = ["Which NFL team represented the AFC at Super Bowl 50?",
             "Where did Super Bowl 50 take place?",
             "What is the name of the university in Warsaw?",
             "Who wrote Pride and Prejudice?",
             "When did Apollo 11 land on the Moon?"]
COMMANDS = ("ask", "odqa-eval", "serve")
# The tiny reader's lengths: 8 question tokens + 48 passage tokens within its 64 positions.
LENGTHS = ["--max-passage-len", "48", "--doc-stride", "24", "--max-question-len", "8"]
STATUS_FIELDS = ("VmHWM", "VmRSS", "RssAnon", "RssFile")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", nargs="+", type=Path, required=True,
                        help="JSONL corpora (tools/make_scale_corpus.py), smallest first")
    parser.add_argument("--work", type=Path, required=True,
                        help="folder of the tiny reader and the indexes (kept for reruns)")
    parser.add_argument("--out", required=True, help="OUT.json and OUT.md are written")
    parser.add_argument("--commands", nargs="+", choices=COMMANDS, default=list(COMMANDS))
    parser.add_argument("--cache-dtype", default="int8",
                        help="the passage cache's storage (dil-jax index --cache-dtype)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="runs of each command per corpus; the row is the run of median "
                             "peak RSS (all runs' peaks are recorded)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def status_mib(pid: int | str = "self") -> dict[str, float]:
    """STATUS_FIELDS of /proc/PID/status, MiB."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        field, _, rest = line.partition(":")
        if field in STATUS_FIELDS:
            values[field] = int(rest.split()[0]) / 1024
    return values


def run_child(argv: list[str]) -> int:
    """`dil-jax ARGV` in this process; its memory printed as the last line (JSON)."""
    from dil_jax.cli import main

    status = main(argv)
    print(json.dumps(dict(status=status, **status_mib())), flush=True)
    return 0


def child(argv: list[str], stdin: str | None = None) -> dict:
    """`dil-jax ARGV` in a fresh process (`run_child`); its memory, or the reason it failed."""
    started = time.perf_counter()
    completed = subprocess.run([sys.executable, __file__, "--corpus", "-", "--work", "-",
                                "--out", "-", "--child", json.dumps(argv)], input=stdin,
                               capture_output=True, text=True, cwd=REPO)
    seconds = time.perf_counter() - started
    last = (completed.stdout.strip().splitlines() or ["{}"])[-1]
    if completed.returncode != 0 or not last.startswith("{"):
        tail = (completed.stderr.strip().splitlines() or ["(no output)"])[-1]
        return dict(error=f"exit {completed.returncode}: {tail}", seconds=seconds)
    result = json.loads(last)
    if result.pop("status") != 0:
        return dict(error=completed.stderr.strip().splitlines()[-1], seconds=seconds)
    return dict(result, seconds=seconds)


def make_tiny_reader(folder: Path) -> Path:
    """configs/tiny.py's encoder as a random Hugging Face BERT QA model (seed 0) with the
    MiniLM vocabulary and tokenizer, saved in `folder` (once)."""
    if (folder / "model.safetensors").is_file():
        return folder
    import importlib.util

    import torch
    from transformers import BertConfig, BertForQuestionAnswering

    from dil_jax.defaults import default_checkpoint_dir

    spec = importlib.util.spec_from_file_location("tiny", REPO / "configs" / "tiny.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    encoder = module.get_config().model.encoder
    minilm = default_checkpoint_dir()
    vocab = sum(1 for _ in (minilm / "vocab.txt").open(encoding="utf-8"))
    torch.manual_seed(0)
    model = BertForQuestionAnswering(BertConfig(
        vocab_size=vocab, hidden_size=encoder.hidden_size, num_hidden_layers=encoder.num_layers,
        num_attention_heads=encoder.num_heads, intermediate_size=encoder.intermediate_size,
        max_position_embeddings=encoder.max_position_embeddings))
    staging = folder.with_name(folder.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(str(staging), safe_serialization=True)
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json",
                 "special_tokens_map.json"):
        if (minilm / name).is_file():
            shutil.copy(minilm / name, staging / name)
    os.replace(staging, folder)
    return folder


def build_index(corpus: Path, index: Path, reader: Path, cache_dtype: str) -> dict:
    """`dil-jax index` of the corpus (a fresh process). A finished index is reopened (checked)
    and its build time read from INDEX.build.json, which the build that made it wrote."""
    record = index.with_name(index.name + ".build.json")
    built_before = (index / "index.json").is_file()
    started = time.perf_counter()
    completed = subprocess.run(
        ["dil-jax", "index", "--out", str(index), "--corpus", f"jsonl:{corpus}",
         "--retriever", "pyserini", "--checkpoint", str(reader), "--k", "0", "1",
         "--cache-dtype", cache_dtype, *LENGTHS], capture_output=True, text=True, cwd=REPO)
    if completed.returncode != 0:
        raise SystemExit(f"dil-jax index failed for {corpus}:\n{completed.stderr[-3000:]}")
    seconds = time.perf_counter() - started
    if not built_before or not record.is_file():
        record.write_text(json.dumps({"index_seconds": seconds, "reopened": built_before}))
    from dil_jax.open_domain.index.files import read_settings

    settings = read_settings(index)
    cache_bytes = sum(path.stat().st_size for path in index.glob("cache-k1-*/**/*")
                      if path.is_file())
    return dict(json.loads(record.read_text()), passages=settings.num_passages,
                windows=settings.num_windows, cache_k1_bytes=cache_bytes)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def measure_serve(index: Path, reader: Path, cache_dtype: str) -> dict:
    """`dil-jax serve` until ready, then QUESTIONS one at a time; its memory from /proc."""
    port = free_port()
    started = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-m", "dil_jax", "serve", "--index", str(index), "--port", str(port),
         "--full-checkpoint", str(reader), "--delayed-checkpoint", str(reader), "--k", "1",
         "--max-question-len", "8", "--cache-dtype", cache_dtype], cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        while True:
            if process.poll() is not None:
                return dict(error=f"exit {process.returncode}: "
                                  f"{process.stderr.read().strip().splitlines()[-1]}")
            try:
                with urllib.request.urlopen(f"{base}/readyz", timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            time.sleep(2)
        ready = status_mib(process.pid)
        for question in QUESTIONS:
            request = urllib.request.Request(
                f"{base}/v1/answer", data=json.dumps({"question": question}).encode(),
                headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=600) as response:
                json.loads(response.read())
        after = status_mib(process.pid)
        return dict(after, ready_rss_mib=ready["VmRSS"], seconds=time.perf_counter() - started)
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()


def measure(command: str, index: Path, reader: Path, cache_dtype: str) -> dict:
    common = ["--index", str(index), "--max-question-len", "8", "--cache-dtype", cache_dtype]
    if command == "serve":
        return measure_serve(index, reader, cache_dtype)
    if command == "ask":
        return child(["ask", *common, "--checkpoint", str(reader), "--k", "1", "--interactive"],
                     stdin="\n".join(QUESTIONS) + "\n")
    return child(["odqa-eval", *common, "--checkpoint", str(reader), "--k", "1", "--data",
                  str(SQUAD_DEV), "--limit", "20", "--p", "29"])


def median_run(runs: list[dict]) -> dict:
    """The run of median peak RSS, with every run's peak (`peaks_mib`); the first failure if
    any run failed."""
    failed = [run for run in runs if "error" in run]
    if failed:
        return failed[0]
    ordered = sorted(runs, key=lambda run: run["VmHWM"])
    return dict(ordered[(len(ordered) - 1) // 2], peaks_mib=[run["VmHWM"] for run in runs])


def machine() -> str:
    try:
        lines = subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
    except OSError:
        lines = []
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("Model name")]
    return names[0] if names else platform.processor()


def markdown(record: dict) -> str:
    lines = [f"Machine: {record['machine']}, {record['cpus']} CPUs, "
             f"{record['memory_gib']:.0f} GiB; {record['date']}. Reader: configs/tiny.py's "
             f"encoder (random, MiniLM vocabulary), k = 1, p = 29; cache "
             f"{record['cache_dtype']}, BM25 by Lucene (pyserini).", "",
             "| command | passages | windows | peak RSS MiB (VmHWM) | RSS at end MiB | anon MiB "
             "| file-backed MiB | seconds |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in record["rows"]:
        if "error" in row:
            lines.append(f"| {row['command']} | {row['passages']:,} | {row['windows']:,} | "
                         f"{row['error']} | | | | |")
            continue
        lines.append(f"| {row['command']} | {row['passages']:,} | {row['windows']:,} | "
                     f"{row['VmHWM']:,.0f} | {row['VmRSS']:,.0f} | {row['RssAnon']:,.0f} | "
                     f"{row['RssFile']:,.0f} | {row['seconds']:.0f} |")
    lines += ["", "Peak RSS, largest corpus / smallest: " + ", ".join(
        f"{command} {ratio:.3f}x" for command, ratio in record["ratios"].items()), "",
        "Indexes: " + "; ".join(
            f"{built['passages']:,} passages, {built['windows']:,} windows, k = 1 cache "
            f"{built['cache_k1_bytes'] / 2**20:,.0f} MiB, built in {built['index_seconds']:.0f} s"
            + (" (reopened, not built: no build time)" if built.get("reopened") else "")
            for built in record["indexes"]), "", f"Command: {record['command']}"]
    return "\n".join(lines) + "\n"


def write_record(args: argparse.Namespace, argv: list[str] | None, indexes: list[dict],
                 rows: list[dict]) -> str:
    """OUT.json and OUT.md of the rows so far (rewritten after each corpus: a run stopped
    part-way keeps its smaller sizes); returns the markdown."""
    ratios = {}
    for command in args.commands:
        peaks = [row["VmHWM"] for row in rows if row["command"] == command and "VmHWM" in row]
        if len(peaks) > 1:
            ratios[command] = peaks[-1] / peaks[0]
    record = dict(machine=machine(), cpus=os.cpu_count(),
                  memory_gib=os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30,
                  date=time.strftime("%Y-%m-%d"), cache_dtype=args.cache_dtype,
                  command="python " + " ".join([Path(__file__).relative_to(REPO).as_posix(),
                                                *(argv if argv is not None else sys.argv[1:])]),
                  indexes=indexes, rows=rows, ratios=ratios)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(record, indent=2))
    text = markdown(record)
    out.with_suffix(".md").write_text(text)
    return text


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child is not None:
        return run_child(json.loads(args.child))
    args.work.mkdir(parents=True, exist_ok=True)
    reader = make_tiny_reader(args.work / "tiny-reader")
    rows, indexes = [], []
    for corpus in args.corpus:
        index = args.work / f"index-{corpus.stem}"
        built = build_index(corpus, index, reader, args.cache_dtype)
        indexes.append(built)
        print(f"{corpus.name}: {built}", file=sys.stderr)
        for command in args.commands:
            runs = []
            for _ in range(args.repeats):
                runs.append(measure(command, index, reader, args.cache_dtype))
                print(f"{corpus.name} {command}: {runs[-1]}", file=sys.stderr)
            rows.append(dict(command=command, corpus=str(corpus), passages=built["passages"],
                             windows=built["windows"], **median_run(runs)))
        text = write_record(args, argv, indexes, rows)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
