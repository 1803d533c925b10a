"""BM25 engines at scale: build time, peak memory, index size, load time, queries/s, recall.

    python benchmarks/retrieval.py --sizes 10000 100000 1000000 --out benchmarks/results/retrieval

For each corpus size and each engine (`dil-jax index --retriever`), in a child process of its
own (so that peak memory is that engine's alone):
  build   seconds to build the index over the passages, the growth of the process's peak
          resident memory over what the passage texts already held (MiB), and the index's size
          on disk (MiB) once saved;
  load    seconds to open the saved index, and the resident memory it adds (bm25s maps its
          matrix: pages are read as queries touch them);
  query   questions/s, one `search` at a time and through `search_batch`, top-100 each,
          after one untimed pass over the same queries (the first touches of a mapped index).
The corpora are synthetic (`dil_jax.open_domain.index.scale_corpus`: real sentences resampled into
100-word passages, seeded); the queries are the questions of `--data` `--articles`.
Recall: R@p (a gold answer string in one of the top p passages, `odqa-eval`'s R) of every
question of `--articles`, over the real corpus (the SQuAD paragraphs of `--data` and the
Wikipedia leads, split into paragraphs as `dil-jax index` splits them), per engine, and how many
questions get the same top-p set from each engine as from the first one. Engines run one after
another on the same machine; compare timings within one run only. Writes OUT.json and OUT.md.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dil_jax.atomic import write_atomic
from dil_jax.defaults import RETRIEVER_ENGINES

TOP_P = 100
RECALL_P = (29, 100)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--engines", nargs="+", choices=RETRIEVER_ENGINES,
                        default=list(RETRIEVER_ENGINES))
    parser.add_argument("--data", default="../shared/data/squad/dev-v1.1.35-articles.json",
                        help="SQuAD file: the queries, and with --corpus the recall corpus")
    parser.add_argument("--articles", default="28:35", help="article slice of --data")
    parser.add_argument("--queries", type=int, default=500,
                        help="questions timed per (size, engine)")
    parser.add_argument("--memory-limit-gib", type=float, default=16.0,
                        help="address-space limit of each child; a build that needs more is "
                             "reported as such instead of swapping the machine")
    parser.add_argument("--no-recall", action="store_true", help="skip the recall part")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, help="output path without extension")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def status_mib(field: str) -> float:
    """A memory field of /proc/self/status (VmRSS: resident now, VmHWM: its peak), MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def reset_peak_resident() -> None:
    """Resets VmHWM to the resident memory now (Linux >= 4.0), so that a peak measured next
    belongs to what runs next, not to the corpus generation before it."""
    Path("/proc/self/clear_refs").write_text("5")


def folder_mib(folder: Path) -> float:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 2**20


def questions(data: str, articles: str) -> list:
    from dil_jax.data.squad import load_squad, select_articles

    return select_articles(load_squad(data, check_spans=False).examples, articles)


def run_child(spec: dict) -> dict:
    """One (size, engine): build, save, load, query, in this process (see the module doc)."""
    from dil_jax.open_domain.index.corpus import iter_sources
    from dil_jax.open_domain.index.scale_corpus import resampled_passages, sentence_pool
    from dil_jax.open_domain.retrieval.engines import build_retriever, load_retriever

    pool = sentence_pool(list(iter_sources([f"squad:{spec['data']}", "wikipedia"])))
    texts = list(resampled_passages(pool, spec["size"], spec["seed"]))
    queries = [e.question for e in questions(spec["data"], spec["articles"])][:spec["queries"]]
    del pool
    import bm25s  # noqa: F401  (imported before the measurement: both engines' code is
    import rank_bm25  # noqa: F401  not what is measured)

    reset_peak_resident()
    before_build = status_mib("VmRSS")
    started = time.perf_counter()
    retriever = build_retriever(texts, spec["engine"])
    build_s = time.perf_counter() - started
    build_peak = status_mib("VmHWM") - before_build
    folder = Path(spec["folder"]) / "bm25"
    retriever.save(folder)
    del retriever
    before_load = status_mib("VmRSS")
    started = time.perf_counter()
    retriever = load_retriever(folder)
    load_s = time.perf_counter() - started
    load_mib = status_mib("VmRSS") - before_load
    # One untimed pass: a mapped index's pages are faulted in on first touch, which would
    # be charged to whichever timing ran first.
    retriever.search_batch(queries, TOP_P)
    started = time.perf_counter()
    single = [retriever.search(query, TOP_P) for query in queries]
    single_s = time.perf_counter() - started
    started = time.perf_counter()
    batch = retriever.search_batch(queries, TOP_P)
    batch_s = time.perf_counter() - started
    assert batch == single, "search_batch differs from search"
    return dict(size=spec["size"], engine=spec["engine"], build_s=build_s,
                build_peak_mib=build_peak, disk_mib=folder_mib(folder), load_s=load_s,
                load_mib=load_mib, queries=len(queries), single_qps=len(queries) / single_s,
                batch_qps=len(queries) / batch_s,
                passage_words=sum(len(t.split()) for t in texts) / len(texts))


def measure(size: int, engine: str, args: argparse.Namespace) -> dict:
    """run_child in a fresh process under the memory limit; a failure is recorded, not raised."""
    folder = Path(tempfile.mkdtemp(prefix=f"retrieval-{engine}-{size}-"))
    spec = dict(size=size, engine=engine, seed=args.seed, data=args.data,
                articles=args.articles, queries=args.queries, folder=str(folder))
    limit = int(args.memory_limit_gib * 2**30)
    try:
        completed = subprocess.run(
            [sys.executable, __file__, "--out", "-", "--child", json.dumps(spec)],
            capture_output=True, text=True,
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if completed.returncode != 0:
        last = (completed.stderr.strip().splitlines() or ["(no output)"])[-1]
        reason = (f"over the {args.memory_limit_gib:g} GiB limit" if "MemoryError" in
                  completed.stderr else f"failed: {last}")
        return dict(size=size, engine=engine, error=reason)
    return json.loads(completed.stdout.strip().splitlines()[-1])


def recall(args: argparse.Namespace) -> dict:
    """R@p per engine over the real corpus, and the questions both engines give one top-p."""
    from dil_jax.open_domain.evaluate import recall_at_p
    from dil_jax.open_domain.index.corpus import iter_sources, split_documents
    from dil_jax.open_domain.retrieval.engines import build_retriever

    passages = split_documents(list(iter_sources([f"squad:{args.data}", "wikipedia"])),
                               "paragraphs")
    texts = [p.text for p in passages]
    examples = questions(args.data, args.articles)
    tops = {}
    result: dict = dict(passages=len(texts), questions=len(examples))
    for engine in args.engines:
        retriever = build_retriever(texts, engine)
        tops[engine] = retriever.search_batch([e.question for e in examples], TOP_P)
        for p in RECALL_P:
            hits = [recall_at_p(e, [texts[h.passage_index] for h in top[:p]])
                    for e, top in zip(examples, tops[engine])]
            result[f"{engine} R@{p}"] = 100 * sum(hits) / len(hits)
    first = args.engines[0]
    for engine in args.engines[1:]:
        for p in RECALL_P:
            same = sum({h.passage_index for h in a[:p]} == {h.passage_index for h in b[:p]}
                       for a, b in zip(tops[first], tops[engine]))
            result[f"same top-{p} ({engine} vs {first})"] = 100 * same / len(examples)
    return result


def markdown(rows: list[dict], recalls: dict | None) -> str:
    lines = ["| passages | engine | build s | build peak MiB | disk MiB | load s | load MiB | "
             "queries/s (one at a time) | queries/s (batch) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['size']:,} | {row['engine']} | {row['error']} | | | | | | |")
            continue
        lines.append(f"| {row['size']:,} | {row['engine']} | {row['build_s']:.1f} | "
                     f"{row['build_peak_mib']:.0f} | {row['disk_mib']:.1f} | {row['load_s']:.2f} | "
                     f"{row['load_mib']:.0f} | {row['single_qps']:.1f} | {row['batch_qps']:.1f} |")
    if recalls:
        lines += ["", f"Recall over the real corpus ({recalls['passages']:,} passages, "
                      f"{recalls['questions']:,} questions):", "",
                  "| " + " | ".join(k for k in recalls if k not in ("passages", "questions"))
                  + " |",
                  "| " + " | ".join("---" for k in recalls if k not in ("passages", "questions"))
                  + " |",
                  "| " + " | ".join(f"{v:.2f}" for k, v in recalls.items()
                                    if k not in ("passages", "questions")) + " |"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child is not None:
        print(json.dumps(run_child(json.loads(args.child))))
        return 0
    if not Path(args.data).is_file():
        raise SystemExit(f"--data {args.data}: no such file")
    rows = []
    for size in args.sizes:
        for engine in args.engines:
            rows.append(measure(size, engine, args))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    recalls = None if args.no_recall else recall(args)
    from dil_jax.bench.machine import load_average, machine_record

    record = dict(command=" ".join(sys.argv), machine=machine_record(),
                  load_average_end=load_average(), rows=rows, recall=recalls)
    out = Path(args.out)
    write_atomic(out.with_suffix(".json"), json.dumps(record, indent=2))
    table = markdown(rows, recalls)
    write_atomic(out.with_suffix(".md"), table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
