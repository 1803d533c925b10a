"""Passage cache storage schemes: bytes per real token and the accuracy each costs.

The table of issue 60 for the bundled k = 2 and k = 4 readers, in one run (2-core CPU: hours;
resumable, see below):

    python benchmarks/cache_compression.py \\
        --checkpoint dil_jax/assets/minilm-squad-k2 dil_jax/assets/minilm-squad-k4 --k 2 4 \\
        --tokenizer default --data ../shared/data/squad/dev-v1.1.35-articles.json \\
        --articles 28:35 --corpus squad:../shared/data/squad/dev-v1.1.35-articles.json \\
        --corpus wikipedia --top-p 29 --batch-size 4 --chunk-size 64 \\
        --schemes float32 bfloat16 int8 pca64 pq64 pq48 pq32 \\
        --out runs/cache_compression_i60

For each reader (`--checkpoint`, with its `--k`) and storage scheme (`--cache-dtype`,
`dil_jax.open_domain.cache.storage`):
  1. builds the passage cache of the corpus index in that storage (`--reuse`: with the first
     upper block's q/k/v and statistics, `dil_jax.open_domain.cache.reuse`) and measures its
     bytes per real token from its files (`bytes_per_real_token`, by `cache_bytes_per_token`:
     states, reuse arrays, tokens, total; a cache without the reuse arrays also gets what they
     would add, `reuse_if_stored`; tools/wikipedia_projection.py reads them). The reader's
     float32 cache is built first, by the reader; every other storage stores those same
     float32 states (read back from it), so a row differs from the float32 row by its storage
     alone, and the corpus is encoded once per reader;
  2. open domain: EM/F1 of the answers over the top-p passages read from that cache, by the
     reader score alone and fused with BM25 (`dil_jax.open_domain.evaluate`, the reader's own
     span score rule; every rule is in the JSON), the questions of `--articles`;
  3. SQuAD predict path: EM/F1 on the same questions, each read against its own (gold)
     paragraph's windows (`featurize`, one pair per window, as `dil-jax predict`), the windows'
     lower states sent through the storage's round trip first (pca<d>, pq<M>: with the basis
     and codebook fitted on the corpus cache), as if read from such a cache.
`--limit N` reads a seeded N of the questions in both (a smoke test); `--corpus-limit N` indexes
the first N documents of each corpus source.

Resumable: a killed run, rerun with the same command, keeps what it finished. Each (reader,
storage) row is written as it finishes (OUT/READER/rows/SCHEME.json, READER = k<k>-<checkpoint
name>) and a rerun reuses it; the index, the caches (`build_passage_cache` resumes a partial
one) and the open-domain questions read so far (OUT/READER/progress/SCHEME.jsonl, a block of 64
at a time, `EvaluationProgress`) are kept too. A row, progress file or cache made with other
settings is refused naming the file and the setting (delete it to redo that part). After every
row: OUT/READER/cache_compression.{json,md} (that reader's record, what
tools/wikipedia_projection.py reads) and OUT/cache_compression.md (every reader's table) are
rewritten from the rows finished so far. No timings are compared: the open-domain phase times
are in the JSON for the record only.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np


def open_domain_parser(description: str, several_readers: bool = False
                       ) -> argparse.ArgumentParser:
    """The flags of the open-domain benchmarks (this one and odqa_speed.py): the reader(s) and
    their lengths, the SQuAD questions, the index's corpus and windows, the read's depth and
    batch. several_readers: --checkpoint takes one or more."""
    from dil_jax.commands.arguments import positive_int
    from dil_jax.defaults import (
        OPEN_DOMAIN_DOC_STRIDE,
        OPEN_DOMAIN_MAX_PASSAGE_LEN,
        OPEN_DOMAIN_MAX_QUESTION_LEN,
    )

    parser = argparse.ArgumentParser(description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True, nargs="+" if several_readers else None,
                        help="the reader" + ("s" if several_readers else "")
                        + " (any `dil-jax` form)")
    parser.add_argument("--tokenizer", default=None)
    parser.add_argument("--max-question-len", type=positive_int,
                        default=OPEN_DOMAIN_MAX_QUESTION_LEN)
    parser.add_argument("--data", required=True, help="SQuAD v1.1 file: questions (answers)")
    parser.add_argument("--articles", default=":", help="article slice of --data, e.g. 28:35")
    parser.add_argument("--corpus", action="append", default=None,
                        help="index source (repeatable, as `dil-jax index`); default "
                             "squad:DATA")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--top-p", type=positive_int, default=29)
    parser.add_argument("--max-passage-len", type=positive_int,
                        default=OPEN_DOMAIN_MAX_PASSAGE_LEN, help="index windows")
    parser.add_argument("--doc-stride", type=positive_int, default=OPEN_DOMAIN_DOC_STRIDE)
    parser.add_argument("--batch-size", type=positive_int, default=8)
    return parser


DEFAULT_SCHEMES = ("float32", "bfloat16", "int8", "pca64", "pq64", "pq48", "pq32")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    from dil_jax.commands.arguments import cache_storage, positive_int, unit_interval
    from dil_jax.defaults import CPU_DOC_STRIDE, CPU_MAX_PASSAGE_LEN

    parser = open_domain_parser(__doc__, several_readers=True)
    parser.add_argument("--k", type=int, nargs="+", default=None,
                        help="split point of each --checkpoint (default: each one's own)")
    parser.add_argument("--schemes", type=cache_storage, nargs="+",
                        default=[cache_storage(name) for name in DEFAULT_SCHEMES])
    parser.add_argument("--reuse", action="store_true",
                        help="store (and read) the first upper block's arrays too")
    parser.add_argument("--limit", type=positive_int, default=None,
                        help="questions (open domain and predict): a seeded random N of them")
    parser.add_argument("--corpus-limit", type=positive_int, default=None,
                        help="index only the first N documents of each --corpus source")
    parser.add_argument("--mu", type=unit_interval, default=0.5)
    parser.add_argument("--predict-max-passage-len", type=positive_int,
                        default=CPU_MAX_PASSAGE_LEN, help="predict-path windows")
    parser.add_argument("--predict-doc-stride", type=positive_int, default=CPU_DOC_STRIDE)
    parser.add_argument("--chunk-size", type=positive_int, default=64)
    parser.add_argument("--out", required=True, help="folder for the index, caches, results")
    args = parser.parse_args(argv)
    if args.k is not None and len(args.k) != len(args.checkpoint):
        parser.error(f"--k: {len(args.k)} values for {len(args.checkpoint)} --checkpoint; give "
                     "one per reader, in the same order")
    names = [reader_name(path, k) for path, k in zip(args.checkpoint, args.k or
                                                     [None] * len(args.checkpoint))]
    if len(set(names)) != len(names):
        parser.error(f"--checkpoint: two readers share the folder name {names}; copy one "
                     "under another name")
    return args


def open_or_build_index(folder: Path, corpus: Sequence[str], tokenizer, max_passage_len: int,
                        doc_stride: int, corpus_limit: int | None = None):
    """The index of the corpus's paragraphs in `folder` (built once, then reopened)."""
    from dil_jax.open_domain.index.corpus import iter_sources, split_documents
    from dil_jax.open_domain.index.folder import build_index, open_index

    if (folder / "index.json").is_file():
        return open_index(folder)
    passages = split_documents(list(iter_sources(corpus, corpus_limit)), "paragraphs")
    return build_index(folder, passages, tokenizer, max_passage_len=max_passage_len,
                       doc_stride=doc_stride,
                       split={"strategy": "paragraphs", "sources": list(corpus),
                              "limit": corpus_limit})


def build_scheme_cache(folder: Path, index, reader, storage, reuse: bool, batch_size: int,
                       encode: Callable | None = None):
    """The corpus cache of `reader` in `storage` (a Storage; built, resumed or reopened).
    encode: a `WindowBatch` -> [n, p_len, hidden] float32 lower states (`stored_states`), or
    None for the reader's own encoder."""
    from dil_jax.open_domain.cache.build import build_passage_cache
    from dil_jax.open_domain.cache.reuse import reuse_encoder
    from dil_jax.open_domain.index.folder import window_arrays

    key = index.cache_key(reader, storage)
    arrays = window_arrays(index)
    upper = reuse_encoder(reader, batch_size) if reuse else None
    return build_passage_cache(folder, key, arrays["ids"], arrays["mask"],
                               arrays["offsets"], encode or reader.passage_encoder(batch_size),
                               reuse=upper,
                               num_heads=reader.config.num_heads if upper else None)


def stored_states(cache) -> Callable:
    """An encoder that reads the lower states of `cache` (an unsharded float32 cache of the
    index): a WindowBatch -> [n, p_len, hidden] float32, its rows' states as the reader wrote
    them (padding slots 0, never stored)."""
    return lambda windows: cache.read_states(np.asarray(windows.rows))


def reader_name(checkpoint: str, k: int | None) -> str:
    """A reader's folder under OUT: k<k>-<checkpoint folder name> (the folder above a
    training export's params/); k None: `<checkpoint name>` alone, before the reader is
    loaded."""
    path = Path(checkpoint)
    name = path.parent.name if path.name == "params" else path.name
    return name if k is None else f"k{k}-{name}"


def predict_scores(reader, examples, cache, max_passage_len: int, doc_stride: int,
                   batch_size: int) -> dict[str, float]:
    """EM/F1 of the SQuAD predict path with every window's lower states replaced by their
    round trip through `cache`'s storage (its basis, if any). One pair per window."""
    from dil_jax.data.decoding import answers, decode_predictions
    from dil_jax.data.features import featurize
    from dil_jax.data.squad import gold_answers
    from dil_jax.metrics.squad_metric import squad_scores
    from dil_jax.reading.grid import PairGrid

    params = reader.params
    features = featurize(examples, reader.tokenizer,
                         max_question_len=reader.config.max_question_len,
                         max_passage_len=max_passage_len, doc_stride=doc_stride)
    grid = PairGrid(reader.model, batch_size=batch_size, chunk_size=batch_size)
    _, first, p_index = np.unique(features.window_passage_index, return_index=True,
                                  return_inverse=True)
    q_lower = grid.encode_questions(params, features.q_ids, features.q_mask)
    p_mask = features.p_mask[first]
    p_source = grid.passage_side(params, features.p_ids[first], p_mask)
    if cache.states is not None:  # k = 0 reads token ids: nothing is stored
        p_source = cache.states.round_trip(np.asarray(p_source))
    scores = grid.read_pairs(params, q_lower, features.q_mask, p_source, p_mask,
                             features.example_index, p_index.reshape(-1))
    predictions = decode_predictions(examples, features, scores.start_logits, scores.end_logits,
                                     None, None)
    result = squad_scores(gold_answers(examples), answers(predictions), version="1.1")
    return {"EM": float(result["exact"]), "F1": float(result["f1"])}


def reuse_bytes_if_stored(cache, num_heads: int) -> float:
    """Bytes per real token the first-upper-block arrays add to `cache`'s storage when stored
    (`dil-jax index --cache-reuse`), by the storage's formula (`cache_bytes_per_window_token`;
    their zarr overhead not counted)."""
    from dil_jax.open_domain.cache.build import cache_bytes_per_window_token

    manifest = dataclasses.replace(cache.manifest, reuse=True, num_heads=num_heads)
    return float(cache_bytes_per_window_token(manifest, has_states=False))


def row_settings(args: argparse.Namespace, checkpoint: str, k: int, scheme: str, cache,
                 questions: Sequence[str]) -> dict[str, Any]:
    """What decides one row's numbers: a row file or progress file of other settings is not
    reused (`check_settings`). questions: the ids read, as a digest."""
    key = cache.manifest.key
    return dict(checkpoint=str(checkpoint), k=k, scheme=scheme, model=key.model,
                passages=key.passages, max_passage_len=key.max_passage_len,
                reuse=bool(args.reuse), data=str(args.data), articles=args.articles,
                questions=len(questions),
                question_ids=hashlib.sha256("\n".join(questions).encode()).hexdigest()[:16],
                top_p=args.top_p, mu=args.mu, predict_max_passage_len=args.predict_max_passage_len,
                predict_doc_stride=args.predict_doc_stride)


def check_settings(path: Path, recorded: dict[str, Any], wanted: dict[str, Any]) -> None:
    """SystemExit naming `path` and the first setting that differs between a finished row's
    record and this run's."""
    for name in sorted(set(recorded) | set(wanted)):
        if recorded.get(name) != wanted.get(name):
            raise SystemExit(f"{path}: made with {name} = {recorded.get(name)!r}, this run has "
                             f"{wanted.get(name)!r}; delete it (or use another --out) to "
                             "measure this row again")


def markdown(rows: Sequence[dict[str, Any]], top_p: int) -> str:
    """The table: bytes per real token (states, reuse arrays, everything), open-domain EM / F1
    without and with the IR score, predict EM / F1, and each EM's difference from the same
    reader's float32 row (its first row when it has none)."""
    lines = [f"| reader | storage | states B / real token | reuse arrays B / real token | "
             f"total B / real token | open-domain EM / F1 (p = {top_p}) | EM / F1 (+IR) | "
             "predict EM / F1 | ΔEM open / +IR / predict |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        mine = [other for other in rows if other["reader"] == row["reader"]]
        base = next((other for other in mine if other["scheme"] == "float32"), mine[0])
        odqa, predict, size = row["open_domain"], row["predict"], row["bytes_per_real_token"]
        reuse = (f"{size['reuse']:.1f}" if row["reuse"] else
                 f"not stored (+{row['reuse_if_stored']:.0f})")
        lines.append(
            f"| {row['reader']} | {row['scheme']} | {size['states']:.1f} | {reuse} | "
            f"{size['total']:.1f} | {odqa['EM']:.2f} / {odqa['F1']:.2f} | "
            f"{odqa['EM_ir']:.2f} / {odqa['F1_ir']:.2f} | "
            f"{predict['EM']:.2f} / {predict['F1']:.2f} | "
            f"{odqa['EM'] - base['open_domain']['EM']:+.2f} / "
            f"{odqa['EM_ir'] - base['open_domain']['EM_ir']:+.2f} / "
            f"{predict['EM'] - base['predict']['EM']:+.2f} |")
    return "\n".join(lines)


def measure_row(args: argparse.Namespace, name: str, loaded, index, cache, asked,
                settings: dict[str, Any], progress_path: Path) -> dict[str, Any]:
    """One (reader, storage) row: the cache's bytes, the open-domain read (resumed from
    `progress_path`) and the predict path."""
    from dil_jax.open_domain.cache.store import cache_bytes_per_token
    from dil_jax.open_domain.evaluate import EvaluationProgress, evaluate_reader
    from dil_jax.open_domain.reader import OpenDomainReader

    scheme = cache.storage.name
    reader = OpenDomainReader(index, loaded, cache, top_p=args.top_p,
                              batch_size=args.batch_size, chunk_size=args.chunk_size)
    print(f"{name} {scheme}: {len(asked)} open-domain questions ...", file=sys.stderr,
          flush=True)
    progress_path.parent.mkdir(parents=True, exist_ok=True)
    odqa = evaluate_reader(reader, asked, [args.top_p], args.mu,
                           progress=EvaluationProgress(progress_path, settings))
    print(f"{name} {scheme}: {len(asked)} predict questions ...", file=sys.stderr, flush=True)
    predict = predict_scores(loaded, asked, cache, args.predict_max_passage_len,
                             args.predict_doc_stride, args.batch_size)
    return dict(
        reader=name, checkpoint=settings["checkpoint"],
        k=loaded.config.num_lower_layers, scheme=scheme, reuse=cache.has_reuse,
        reads_cached_reuse=reader.reads_cached_reuse,
        bytes_per_real_token=cache_bytes_per_token(cache),
        reuse_if_stored=reuse_bytes_if_stored(cache, loaded.config.num_heads),
        open_domain={**odqa["by_p"][args.top_p], "questions": len(asked),
                     "span_score": odqa["span_score"],
                     "by_score": {rule: by_p[args.top_p]
                                  for rule, by_p in odqa["by_score"].items()},
                     "timings": odqa["timings"]},
        predict={**predict, "questions": len(asked)}, settings=settings)


def write_records(out: Path, args: argparse.Namespace, argv: Sequence[str] | None,
                  readers: list[dict[str, Any]], rows: list[dict[str, Any]], index) -> str:
    """Rewrites OUT/READER/cache_compression.{json,md} of every reader with rows and
    OUT/cache_compression.md (all rows); returns that table."""
    from dil_jax.atomic import write_atomic
    from dil_jax.bench.machine import machine_record

    command = " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])])
    for reader in readers:
        mine = [row for row in rows if row["reader"] == reader["name"]]
        if not mine:
            continue
        record = dict(command=command, checkpoint=reader["checkpoint"], k=reader["k"],
                      layers=reader["layers"], hidden=reader["hidden"], data=args.data,
                      articles=args.articles, questions=mine[0]["open_domain"]["questions"],
                      predict_questions=mine[0]["predict"]["questions"], corpus=args.corpus,
                      corpus_limit=args.corpus_limit,
                      num_windows=index.settings.num_windows, machine=machine_record(),
                      rows=mine)
        folder = out / reader["name"]
        write_atomic(folder / "cache_compression.json",
                     json.dumps(record, indent=2, default=str))
        write_atomic(folder / "cache_compression.md", markdown(mine, args.top_p) + "\n")
    table = markdown(rows, args.top_p)
    write_atomic(out / "cache_compression.md", f"{command}\n\n{table}\n")
    return table


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    args = parse_args(argv)
    from dil_jax.atomic import write_atomic
    from dil_jax.data.squad import load_squad, select_articles
    from dil_jax.open_domain.cache.storage import FLOAT32
    from dil_jax.readers import load_reader

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    examples = [e for e in select_articles(load_squad(args.data).examples, args.articles)
                if e.answer_texts]
    asked = examples
    if args.limit is not None and args.limit < len(examples):
        chosen = np.random.default_rng(args.seed).choice(len(examples), args.limit,
                                                         replace=False)
        asked = [examples[i] for i in sorted(chosen)]
    ks = args.k or [None] * len(args.checkpoint)
    index = None
    readers: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    for checkpoint, k in zip(args.checkpoint, ks):
        loaded = load_reader(checkpoint, k, args.max_question_len, args.tokenizer)
        config = loaded.config
        name = reader_name(checkpoint, config.num_lower_layers)
        readers.append(dict(name=name, checkpoint=str(checkpoint), k=config.num_lower_layers,
                            layers=config.num_layers, hidden=config.hidden_size))
        if index is None:
            index = open_or_build_index(out / "index", args.corpus or [f"squad:{args.data}"],
                                        loaded.tokenizer, args.max_passage_len,
                                        args.doc_stride, args.corpus_limit)
        caches = out / name / "caches"
        caches.mkdir(parents=True, exist_ok=True)
        print(f"{name} float32: caching {index.settings.num_windows} windows ...",
              file=sys.stderr, flush=True)
        source = build_scheme_cache(caches / "float32", index, loaded, FLOAT32, args.reuse,
                                    args.batch_size)
        for storage in args.schemes:
            scheme = storage.name
            path = out / name / "rows" / f"{scheme}.json"
            cache = source if scheme == "float32" else build_scheme_cache(
                caches / scheme, index, loaded, storage, args.reuse, args.batch_size,
                encode=stored_states(source))
            settings = row_settings(args, checkpoint, config.num_lower_layers, scheme, cache,
                                    [e.qid for e in asked])
            if path.is_file():
                row = json.loads(path.read_text())
                check_settings(path, row["settings"], settings)
                print(f"{name} {scheme}: finished before ({path})", file=sys.stderr)
            else:
                row = measure_row(args, name, loaded, index, cache, asked, settings,
                                  out / name / "progress" / f"{scheme}.jsonl")
                path.parent.mkdir(parents=True, exist_ok=True)
                write_atomic(path, json.dumps(row, indent=2, default=str))
            rows.append(row)
            table = write_records(out, args, argv, readers, rows, index)
    print(table)
    return rows


if __name__ == "__main__":
    main()
