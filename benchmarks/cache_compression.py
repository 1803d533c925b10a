"""Passage cache storage schemes: bytes per token and the accuracy each costs.

    python benchmarks/cache_compression.py --checkpoint dil_jax/assets/minilm-squad-k4 \\
        --tokenizer default --data ../shared/data/squad/dev-v1.1.35-articles.json \\
        --articles 28:35 --corpus squad:../shared/data/squad/dev-v1.1.35-articles.json \\
        --corpus wikipedia --schemes float32 bfloat16 int8 pca64 pq32 --limit 60 \\
        --out runs/cache_compression

For one reader and each storage scheme (`--cache-dtype`, `dil_jax.open_domain.cache.storage`):
  1. builds the passage cache of the corpus index in that storage (`--reuse`: with the first
     upper block's q/k/v and statistics, `dil_jax.open_domain.cache.reuse`) and measures its
     bytes from the files: per token slot (`cache_bytes_per_token`: states, reuse arrays,
     total) and per real token (`bytes_per_real_token`: as a ragged store holds them, padding
     slots left out);
  2. open domain: EM/F1 of the answers over the top-p passages read from that cache (reader
     score alone and fused with BM25, `dil_jax.open_domain.evaluate`), the questions of
     `--articles` (`--limit` of them, seeded);
  3. SQuAD predict path: EM/F1 on every question of `--articles`, each read against its own
     context's windows (`featurize`, one pair per window, as `dil-jax predict`), the windows'
     lower states sent through the scheme's round trip first (pca<d>: with the basis fitted on
     the corpus cache), as if read from such a cache.
The index (passages, BM25) is built once in OUT/index and each cache in OUT/caches/SCHEME
(rerunning reuses both). Writes OUT/cache_compression.json and .md and prints the table. No
timings: this measures storage and accuracy only (the open-domain phase times are in the JSON's
`timings`, for the record, but compare them only from runs made side by side on an idle machine).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np


def open_domain_parser(description: str) -> argparse.ArgumentParser:
    """The flags of the open-domain benchmarks (this one and odqa_speed.py): the reader and its
    lengths, the SQuAD questions, the index's corpus and windows, the read's depth and batch."""
    from dil_jax.commands.arguments import positive_int
    from dil_jax.defaults import (
        OPEN_DOMAIN_DOC_STRIDE,
        OPEN_DOMAIN_MAX_PASSAGE_LEN,
        OPEN_DOMAIN_MAX_QUESTION_LEN,
    )

    parser = argparse.ArgumentParser(description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True, help="the reader (any `dil-jax` form)")
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


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    from dil_jax.commands.arguments import cache_storage, positive_int, unit_interval
    from dil_jax.defaults import CPU_DOC_STRIDE, CPU_MAX_PASSAGE_LEN

    parser = open_domain_parser(__doc__)
    parser.add_argument("--k", type=int, default=None, help="split point (default: the "
                                                             "checkpoint's own)")
    parser.add_argument("--schemes", type=cache_storage, nargs="+",
                        default=[cache_storage(name) for name in ("float32", "bfloat16",
                                                                  "int8", "pca64", "pq32")])
    parser.add_argument("--reuse", action="store_true",
                        help="store (and read) the first upper block's arrays too")
    parser.add_argument("--limit", type=positive_int, default=None,
                        help="open-domain questions: a seeded random N of them")
    parser.add_argument("--mu", type=unit_interval, default=0.5)
    parser.add_argument("--predict-max-passage-len", type=positive_int,
                        default=CPU_MAX_PASSAGE_LEN, help="predict-path windows")
    parser.add_argument("--predict-doc-stride", type=positive_int, default=CPU_DOC_STRIDE)
    parser.add_argument("--chunk-size", type=positive_int, default=64)
    parser.add_argument("--out", required=True, help="folder for the index, caches, results")
    return parser.parse_args(argv)


def open_or_build_index(folder: Path, corpus: Sequence[str], tokenizer, max_passage_len: int,
                        doc_stride: int):
    """The index of the corpus's paragraphs in `folder` (built once, then reopened)."""
    from dil_jax.open_domain.index.corpus import iter_sources, split_documents
    from dil_jax.open_domain.index.folder import build_index, open_index

    if (folder / "index.json").is_file():
        return open_index(folder)
    passages = split_documents(list(iter_sources(corpus)), "paragraphs")
    return build_index(folder, passages, tokenizer, max_passage_len=max_passage_len,
                       doc_stride=doc_stride,
                       split={"strategy": "paragraphs", "sources": list(corpus), "limit": None})


def build_scheme_cache(folder: Path, index, reader, storage, reuse: bool, batch_size: int):
    """The corpus cache of `reader` in `storage` (a Storage; built, resumed or reopened)."""
    from dil_jax.open_domain.build import passage_encoder
    from dil_jax.open_domain.cache.build import build_passage_cache
    from dil_jax.open_domain.cache.reuse import reuse_encoder
    from dil_jax.open_domain.index.folder import window_arrays

    key = index.cache_key(reader, storage)
    arrays = window_arrays(index)
    upper = reuse_encoder(reader, batch_size) if reuse else None
    return build_passage_cache(folder, key, arrays["ids"], arrays["mask"],
                               arrays["offsets"], passage_encoder(reader, batch_size),
                               reuse=upper,
                               num_heads=reader.config.num_heads if upper else None)


def bytes_per_real_token(cache) -> dict[str, float]:
    """File bytes per real (unmasked) token of each part of a cache (`states`, `reuse`, `tokens`,
    `total`, as `cache_bytes_per_token` parts them), as a store of real tokens only would hold
    them: an array of one row per token slot ([rows, p_len, ...]) counts its header and its real
    tokens' rows, every other file (a basis, a codebook, the manifest) whole. The mask itself
    counts (a ragged store keeps the window lengths instead: 4 bytes a window)."""
    parts = dict(states=0.0, reuse=0.0, tokens=0.0, total=0.0)
    real = 0
    for folder in {path.parent for path in cache.directory.rglob("mask.npy")}:
        mask = np.load(folder / "mask.npy", mmap_mode="r")
        kept = int(np.count_nonzero(mask)) / mask.size
        real += int(np.count_nonzero(mask))
        for path in folder.iterdir():
            size = path.stat().st_size
            if path.suffix == ".npy":
                array = np.load(path, mmap_mode="r")
                if array.shape[:2] == mask.shape:
                    size = size - array.nbytes + array.nbytes * kept
            parts["total"] += size
            if path.name.startswith("states."):
                parts["states"] += size
            elif path.name.startswith("upper_"):
                parts["reuse"] += size
            elif path.name in ("ids.npy", "mask.npy", "offsets.npy"):
                parts["tokens"] += size
    return {name: size / max(real, 1) for name, size in parts.items()}


def predict_scores(reader, examples, cache, max_passage_len: int, doc_stride: int,
                   batch_size: int) -> dict[str, float]:
    """EM/F1 of the SQuAD predict path with every window's lower states replaced by their
    round trip through `cache`'s storage (its PCA basis, if any). One pair per window."""
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


def markdown(rows: list[dict[str, Any]], top_p: int) -> str:
    """The table: bytes per real token (states, reuse arrays, everything) and per token slot
    (everything), EM / F1 three ways, and each EM's difference from the first row's."""
    lines = [f"| storage | states B / real token | reuse B / real token | total B / real token "
             f"(B / slot) | open-domain EM / F1 (p = {top_p}) | EM / F1 (+IR) | predict EM / F1 "
             "| ΔEM open / +IR / predict |",
             "|---|---|---|---|---|---|---|---|"]
    base = rows[0]
    for row in rows:
        odqa, predict, real = row["open_domain"], row["predict"], row["bytes_per_real_token"]
        lines.append(
            f"| {row['scheme']} | {real['states']:.1f} | {real['reuse']:.1f} | "
            f"{real['total']:.1f} ({row['bytes_per_token']['total']:.1f}) | "
            f"{odqa['EM']:.1f} / {odqa['F1']:.1f} | {odqa['EM_ir']:.1f} / {odqa['F1_ir']:.1f} | "
            f"{predict['EM']:.2f} / {predict['F1']:.2f} | "
            f"{odqa['EM'] - base['open_domain']['EM']:+.1f} / "
            f"{odqa['EM_ir'] - base['open_domain']['EM_ir']:+.1f} / "
            f"{predict['EM'] - base['predict']['EM']:+.2f} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    args = parse_args(argv)
    from dil_jax.atomic import write_atomic
    from dil_jax.bench.machine import machine_record
    from dil_jax.checkpoints import load_reader
    from dil_jax.data.squad import load_squad, select_articles
    from dil_jax.open_domain.cache.store import cache_bytes_per_token
    from dil_jax.open_domain.evaluate import evaluate_reader
    from dil_jax.open_domain.reader import OpenDomainReader

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    loaded = load_reader(args.checkpoint, args.k, args.max_question_len, args.tokenizer)
    examples = [e for e in select_articles(load_squad(args.data).examples, args.articles)
                if e.answer_texts]
    asked = examples
    if args.limit is not None and args.limit < len(examples):
        chosen = np.random.default_rng(args.seed).choice(len(examples), args.limit,
                                                         replace=False)
        asked = [examples[i] for i in sorted(chosen)]
    index = open_or_build_index(out / "index", args.corpus or [f"squad:{args.data}"],
                                loaded.tokenizer, args.max_passage_len, args.doc_stride)
    rows = []
    for storage in args.schemes:
        scheme = storage.name
        print(f"{scheme}: caching {index.settings['num_windows']} windows ...", file=sys.stderr)
        cache = build_scheme_cache(out / "caches" / scheme, index, loaded, storage, args.reuse,
                                   args.batch_size)
        reader = OpenDomainReader(index, loaded, cache, top_p=args.top_p,
                                  batch_size=args.batch_size, chunk_size=args.chunk_size)
        print(f"{scheme}: {len(asked)} open-domain questions, {len(examples)} predict "
              "questions ...", file=sys.stderr)
        odqa = evaluate_reader(reader, asked, [args.top_p], args.mu)
        rows.append(dict(
            scheme=scheme, reuse=cache.has_reuse, reads_cached_reuse=reader.reads_cached_reuse,
            bytes_per_token=cache_bytes_per_token(cache),
            bytes_per_real_token=bytes_per_real_token(cache),
            open_domain={**odqa["by_p"][args.top_p], "questions": len(asked),
                         "timings": odqa["timings"]},
            predict=predict_scores(loaded, examples, cache, args.predict_max_passage_len,
                                   args.predict_doc_stride, args.batch_size)))
    table = markdown(rows, args.top_p)
    print(table)
    record = dict(command=" ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]),
                  checkpoint=args.checkpoint, k=loaded.config.num_lower_layers,
                  layers=loaded.config.num_layers, hidden=loaded.config.hidden_size,
                  data=args.data, articles=args.articles, predict_questions=len(examples),
                  corpus=args.corpus, num_windows=index.settings["num_windows"],
                  machine=machine_record(), rows=rows)
    write_atomic(out / "cache_compression.json", json.dumps(record, indent=2, default=str))
    write_atomic(out / "cache_compression.md", table + "\n")
    return rows


if __name__ == "__main__":
    main()
