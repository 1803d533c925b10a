"""Peak resident memory of the BM25 part of `dil-jax index`, per engine and corpus size.

    python tools/make_scale_corpus.py --passages 100000 --out runs/scale/corpus-100000.jsonl
    python benchmarks/bm25_build_memory.py --corpus runs/scale/corpus-100000.jsonl \
        runs/scale/corpus-1000000.jsonl --out benchmarks/results/bm25_build_memory

For each corpus (a JSONL file, as `dil-jax index --corpus jsonl:PATH` reads it) and each engine,
in a child process of its own: `index.folder.stage_passages_and_bm25`, the step of `dil-jax
index` that reads the corpus, writes the passage store and builds and saves bm25/ (the windows
and the passage caches come after it and are not measured). Recorded: the child's peak resident
memory over its whole life (VmHWM: Python, the imports and, for Lucene, the JVM, all
included), its resident memory before the step, the seconds the step took, the passages and
their bytes of text, and the build's peak per byte of text above the memory before it (what
`retrieval.engines.BUILD_BYTES_PER_TEXT_BYTE` states for rank-bm25 and bm25s).

With --append, the rows go after those of an existing OUT.json (its command kept beside this
one), so that the largest size can run apart.

Engines: pyserini, rank-bm25 and bm25s as `dil-jax index --retriever` builds them, and
`pyserini-list`: Lucene fed as `dil-jax index` fed it before it streamed (every passage, its
text and its tokens in Python lists first), for comparison. A row records the commit measured
and, for Lucene, the options its JVM was started with (read back from the JVM) and its RAM
buffer (`DIL_JAX_JAVA_HEAP`, `DIL_JAX_LUCENE_RAM_BUFFER_MB`, `DIL_JAX_JAVA_OPTIONS` change
them). A child that fails (over --memory-limit-gib, or refused by `check_engine_fits` when the
machine has too little memory) is recorded with its reason. Writes OUT.json and OUT.md, the
machine named.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dil_jax.atomic import write_atomic

ENGINES = ("pyserini", "pyserini-list", "rank-bm25", "bm25s")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", nargs="+", required=True, type=Path,
                        help="JSONL corpora (tools/make_scale_corpus.py), smallest first")
    parser.add_argument("--engines", nargs="+", choices=ENGINES, default=list(ENGINES))
    parser.add_argument("--memory-limit-gib", type=float, default=20.0,
                        help="address-space limit of each child (a build that needs more is "
                             "recorded as such instead of swapping the machine)")
    parser.add_argument("--out", required=True,
                        help="output path without extension (OUT.json, OUT.md)")
    parser.add_argument("--append", action="store_true",
                        help="keep the rows of an existing OUT.json and add these after them "
                             "(sizes measured in separate runs)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def status_mib(field: str) -> float:
    """A memory field of /proc/self/status (VmRSS: resident now, VmHWM: its peak), MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def stage_as_before(staging: Path, corpus: str):
    """What `dil-jax index --retriever pyserini` did before it streamed: every passage in a
    list, their texts in another, their tokens in a third, then Lucene fed from it."""
    from dil_jax.open_domain.index.corpus import iter_passages
    from dil_jax.open_domain.index.store import write_passage_store
    from dil_jax.open_domain.retrieval.bm25 import tokenized_passages
    from dil_jax.open_domain.retrieval.lucene import LuceneRetriever, write_lucene_index

    passages = list(iter_passages([corpus]))
    staging.mkdir(parents=True)
    summary = write_passage_store(passages, staging)
    tokenized = tokenized_passages([p.text for p in passages])
    write_lucene_index(tokenized, staging / "lucene", 1.5, 0.75)
    LuceneRetriever(staging / "lucene", len(tokenized), dict(k1=1.5, b=0.75, epsilon=0.25))
    return summary


def run_child(spec: dict) -> dict:
    """One (corpus, engine) in this process (module docstring)."""
    from dil_jax.open_domain.index.corpus import iter_passages
    from dil_jax.open_domain.index.folder import stage_passages_and_bm25
    from dil_jax.open_domain.retrieval.engines import check_engine_available

    engine = spec["engine"]
    check_engine_available("pyserini" if engine == "pyserini-list" else engine)
    before = status_mib("VmRSS")
    staging = Path(spec["folder"]) / "staging"
    started = time.perf_counter()
    if engine == "pyserini-list":
        summary = stage_as_before(staging, f"jsonl:{spec['corpus']}")
    else:
        summary = stage_passages_and_bm25(staging, iter_passages([f"jsonl:{spec['corpus']}"]),
                                          engine)
    seconds = time.perf_counter() - started
    peak = status_mib("VmHWM")
    row = dict(engine=engine, passages=summary.count, text_mib=summary.text_bytes / 2**20,
               peak_mib=peak, before_mib=before, seconds=seconds,
               bytes_per_text_byte=(peak - before) * 2**20 / summary.text_bytes,
               commit=git_commit())
    if engine.startswith("pyserini"):
        from dil_jax.open_domain.retrieval.lucene import ram_buffer_mb, running_java_arguments

        row.update(java_options=running_java_arguments(), ram_buffer_mb=ram_buffer_mb())
    return row


def git_commit() -> str:
    """The checkout's commit (short), "+dirty" when its tracked files differ from it."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True,
                              cwd=Path(__file__).parent).stdout.strip()

    return git("rev-parse", "--short", "HEAD") + ("+dirty" if git("status", "--porcelain",
                                                                    "--untracked-files=no")
                                                   else "")


def measure(corpus: Path, engine: str, limit_gib: float) -> dict:
    """run_child in a fresh process under the memory limit; a failure is recorded, not raised."""
    folder = Path(tempfile.mkdtemp(prefix=f"bm25-memory-{engine}-"))
    spec = dict(corpus=str(corpus), engine=engine, folder=str(folder))
    limit = int(limit_gib * 2**30)
    try:
        completed = subprocess.run(
            [sys.executable, __file__, "--corpus", str(corpus), "--out", "-",
             "--child", json.dumps(spec)], capture_output=True, text=True,
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if completed.returncode != 0:
        last = (completed.stderr.strip().splitlines() or ["(no output)"])[-1]
        reason = (f"over the {limit_gib:g} GiB limit" if "MemoryError" in completed.stderr
                  else f"failed: {last}")
        return dict(corpus=str(corpus), engine=engine, error=reason)
    return dict(corpus=str(corpus), **json.loads(completed.stdout.strip().splitlines()[-1]))


def machine() -> str:
    """The CPU's model name (lscpu), else the platform's processor string."""
    try:
        lines = subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
    except OSError:
        lines = []
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("Model name")]
    return names[0] if names else platform.processor()


def markdown(rows: list[dict], header: dict) -> str:
    """The rows as a markdown table under a line naming the machine."""
    lines = [f"Machine: {header['machine']}, {header['cpus']} CPUs, "
             f"{header['memory_gib']:.0f} GiB; {header['date']}.", "",
             "| passages | engine | peak RSS MiB | RSS before MiB | build s | text MiB | "
             "bytes per text byte | commit |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        if "error" in row:
            lines.append(f"| {Path(row['corpus']).name} | {row['engine']} | "
                         f"{row['error']} | | | | | {row.get('commit', '')} |")
            continue
        lines.append(f"| {row['passages']:,} | {row['engine']} | {row['peak_mib']:,.0f} | "
                     f"{row['before_mib']:,.0f} | {row['seconds']:,.1f} | "
                     f"{row['text_mib']:,.0f} | {row['bytes_per_text_byte']:.1f} | "
                     f"{row.get('commit', '')} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child is not None:
        print(json.dumps(run_child(json.loads(args.child))))
        return 0
    for corpus in args.corpus:
        if not corpus.is_file():
            raise SystemExit(f"--corpus {corpus}: no such file")
    header = dict(machine=machine(), cpus=os.cpu_count(),
                  memory_gib=os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30,
                  date=time.strftime("%Y-%m-%d"), command=" ".join(sys.argv))
    rows = []
    if args.append and Path(f"{args.out}.json").is_file():
        earlier = json.loads(Path(f"{args.out}.json").read_text())
        rows = earlier["rows"]
        header["command"] = f"{earlier['command']}; {header['command']}"
    for corpus in args.corpus:
        for engine in args.engines:
            rows.append(measure(corpus, engine, args.memory_limit_gib))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
            write_atomic(f"{args.out}.json", json.dumps(dict(header, rows=rows), indent=2))
            write_atomic(f"{args.out}.md", markdown(rows, header))
    return 0


if __name__ == "__main__":
    sys.exit(main())
