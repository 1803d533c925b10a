"""Projects open-domain QA over all of Wikipedia (21M DPR passages) from costs measured here.

    python tools/wikipedia_projection.py \\
        --cache-record runs/cache_compression_k4/cache_compression.json \\
        --retrieval-record benchmarks/results/retrieval.json \\
        --out docs/results/wikipedia_projection

Measured inputs, and what is projected from each:
  windows   the default tokenizer's windows (`dil-jax index` defaults: 192 tokens, stride 96)
            of 2,000 passages of the synthetic 100-word corpus (`scale_corpus`): windows per
            passage;
  cache     bytes per token slot of each storage scheme, from the files of a built cache
            (`benchmarks/cache_compression.py`'s record): x slots per window x windows per
            passage x passages = the cache's size;
  FLOPs     the analytical matmul FLOPs of the cache build per window (`dil_jax.bench.flops`:
            embeddings and k lower blocks at 192 tokens, plus the first upper block's passage
            projections and attention statistics with --cache-reuse; XLA's count agrees within
            2%, tests/bench/test_bench.py) x windows: the build's time on a TPU v4-32 slice (16
            chips of 275 bf16 TFLOP/s peak) at peak and at an assumed 40% of it;
  BM25      per engine, the largest corpus of the retrieval record: disk and build time per
            passage x passages (linear), and the time of one query x (passages / measured
            passages): a query scores every passage holding one of its terms, whose number
            grows in proportion to the corpus (an extrapolation, stated as such);
  reader    seconds per question of the open-domain reader at p = 29 (phase times: question
            encoding, pair upper blocks, decoding), which do not depend on the corpus size: with
            the BM25 query time, questions/s end to end. From `--speed-record`
            (`benchmarks/odqa_speed.py`, a timing run on an idle machine: its fastest way at the
            cache record's k) when given, else from the cache record's `odqa-eval` read.
Writes OUT.json and OUT.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dil_jax.atomic import write_atomic
from dil_jax.bench.flops import (
    block_flops,
    embedding_flops,
    passage_stats_flops,
    projection_flops,
)
from dil_jax.model.encoder_config import EncoderConfig

WIKIPEDIA_PASSAGES = 21_015_324  # the DPR split of English Wikipedia (100-word passages)
TPU_V4_CHIP_PEAK = 275e12  # bf16 FLOP/s per v4 chip
TPU_V4_32_CHIPS = 16  # a v4-32 slice: 32 TensorCores, 2 per chip
ASSUMED_UTILISATION = 0.4
MAX_PASSAGE_LEN, DOC_STRIDE = 192, 96


def windows_per_passage(sample: int = 2000, seed: int = 0) -> float:
    from dil_jax.data.features import window_contexts
    from dil_jax.open_domain.index.corpus import iter_sources
    from dil_jax.open_domain.index.scale_corpus import resampled_passages, sentence_pool
    from dil_jax.tokenization import load_tokenizer

    pool = sentence_pool(list(iter_sources(
        ["squad:../shared/data/squad/dev-v1.1.35-articles.json", "wikipedia"])))
    texts = list(resampled_passages(pool, sample, seed))
    windows = window_contexts(load_tokenizer("default"), texts, max_passage_len=MAX_PASSAGE_LEN,
                              doc_stride=DOC_STRIDE)
    return windows.ids.shape[0] / len(texts)


def encoder(hidden: int, layers: int, k: int) -> EncoderConfig:
    return EncoderConfig(hidden_size=hidden, embedding_size=hidden, num_layers=layers,
                         num_heads=hidden // 64 if hidden >= 64 else 1,
                         intermediate_size=4 * hidden, num_lower_layers=k)


def build_flops_per_window(config: EncoderConfig, reuse: bool) -> int:
    k = config.num_lower_layers
    flops = embedding_flops(config, 1, MAX_PASSAGE_LEN) + k * block_flops(config, 1,
                                                                            MAX_PASSAGE_LEN)
    if reuse:
        flops += projection_flops(config, 1, MAX_PASSAGE_LEN) + passage_stats_flops(
            config, 1, MAX_PASSAGE_LEN)
    return flops


def reader_seconds_from_speed_record(speed_record: dict, k: int) -> tuple[float, str]:
    """Seconds per question of the fastest way `benchmarks/odqa_speed.py` timed at this k
    (phase times of its median pass, retrieval excluded), and the way's name (with its chunk
    size where the record swept chunk sizes)."""
    rows = [row for row in speed_record["rows"] if row["k"] == k]
    if not rows:
        raise ValueError(f"the speed record has no row at k = {k} (it has k = "
                         f"{sorted({row['k'] for row in speed_record['rows']})})")
    fastest = max(rows, key=lambda row: row["questions_per_s"])
    seconds = sum(v for phase, v in fastest["timings"].items() if phase != "retrieval")
    way = fastest["mode"] + (f" at chunk {fastest['chunk_size']}" if "chunk_size" in fastest
                             else "")
    return seconds / speed_record["questions"], way


def project(cache_record: dict, retrieval_record: dict, windows: float,
            speed_record: dict | None = None) -> dict:
    passages = WIKIPEDIA_PASSAGES
    slots = windows * MAX_PASSAGE_LEN * passages
    cache_rows = []
    for row in cache_record["rows"]:
        per_token = row["bytes_per_token"]
        cache_rows.append(dict(
            scheme=row["scheme"], states_bytes_per_token=per_token["states"],
            states_tb=per_token["states"] * slots / 1e12,
            tokens_tb=per_token["tokens"] * slots / 1e12,
            reuse_tb=per_token["reuse"] * slots / 1e12,
            open_domain_f1=row["open_domain"].get("F1"),
            predict_f1=row["predict"].get("F1")))
    builds = []
    readers = [("the cache's reader", cache_record["hidden"], cache_record["layers"],
                cache_record["k"]), ("BERT-base shape", 768, 12, 11)]
    for name, hidden, layers, k in readers:
        config = encoder(hidden, layers, k)
        for reuse in (False, True):
            total = build_flops_per_window(config, reuse) * windows * passages
            peak = TPU_V4_CHIP_PEAK * TPU_V4_32_CHIPS
            builds.append(dict(reader=name, hidden=hidden, layers=layers, k=k, reuse=reuse,
                               flops=total, seconds_at_peak=total / peak,
                               seconds_at_assumed=total / (peak * ASSUMED_UTILISATION)))
    bm25 = []
    for engine in sorted({row["engine"] for row in retrieval_record["rows"]}):
        measured = [row for row in retrieval_record["rows"]
                    if row["engine"] == engine and "error" not in row]
        if not measured:
            continue
        largest = max(measured, key=lambda row: row["size"])
        scale = passages / largest["size"]
        bm25.append(dict(engine=engine, measured_passages=largest["size"],
                         disk_gb=largest["disk_mib"] * 2**20 * scale / 1e9,
                         build_hours=largest["build_s"] * scale / 3600,
                         build_peak_gb=largest["build_peak_mib"] * 2**20 * scale / 1e9,
                         query_seconds=scale / largest["single_qps"]))
    reader_rows = [row for row in cache_record["rows"] if row["scheme"] == "bfloat16"] or \
        cache_record["rows"][:1]
    if speed_record is not None:
        reader_seconds, way = reader_seconds_from_speed_record(speed_record, cache_record["k"])
        reader_source = f"odqa_speed, {way}, {speed_record['questions']} questions"
        questions = speed_record["questions"]
    else:
        timings = reader_rows[0]["open_domain"]["timings"]
        questions = reader_rows[0]["open_domain"]["questions"]
        reader_seconds = sum(v for phase, v in timings.items() if phase != "retrieval") / questions
        reader_source = f"cache_compression, {reader_rows[0]['scheme']}, {questions} questions"
    end_to_end = [dict(engine=row["engine"], reader_seconds=reader_seconds,
                       questions_per_second=1 / (row["query_seconds"] + reader_seconds))
                  for row in bm25]
    return dict(passages=passages, windows_per_passage=windows, cache=cache_rows,
                build=builds, bm25=bm25, end_to_end=end_to_end,
                reader_source=reader_source, reader_questions=questions,
                assumptions=dict(tpu_v4_chip_peak=TPU_V4_CHIP_PEAK, chips=TPU_V4_32_CHIPS,
                                 utilisation=ASSUMED_UTILISATION,
                                 max_passage_len=MAX_PASSAGE_LEN, doc_stride=DOC_STRIDE))


def markdown(result: dict) -> str:
    lines = [f"Wikipedia: {result['passages']:,} passages x {result['windows_per_passage']:.3f} "
             f"windows of {MAX_PASSAGE_LEN} token slots.", "",
             "| cache scheme | states B/token | states TB | + tokens TB | + reuse arrays TB | "
             "open-domain F1 | predict F1 |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for row in result["cache"]:
        lines.append(f"| {row['scheme']} | {row['states_bytes_per_token']:.1f} | "
                     f"{row['states_tb']:.2f} | {row['tokens_tb']:.2f} | {row['reuse_tb']:.2f} | "
                     f"{row['open_domain_f1']:.2f} | {row['predict_f1']:.2f} |")
    lines += ["", "| cache build on a TPU v4-32 | k / l | --cache-reuse | PFLOP | at peak | "
                  f"at {ASSUMED_UTILISATION:.0%} of peak |",
              "| --- | --- | --- | --- | --- | --- |"]
    for row in result["build"]:
        lines.append(f"| {row['reader']} (hidden {row['hidden']}) | {row['k']} / {row['layers']} "
                     f"| {'yes' if row['reuse'] else 'no'} | {row['flops'] / 1e15:,.0f} | "
                     f"{row['seconds_at_peak'] / 60:.1f} min | "
                     f"{row['seconds_at_assumed'] / 60:.1f} min |")
    lines += ["", "| BM25 engine | extrapolated from | index on disk GB | build h (one core) | "
                  "build peak GB | one query s | questions/s end to end (reader at p = 29 on "
                  f"this CPU: {result['reader_source']}) |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    for row, e2e in zip(result["bm25"], result["end_to_end"]):
        lines.append(f"| {row['engine']} | {row['measured_passages']:,} passages | "
                     f"{row['disk_gb']:.1f} | {row['build_hours']:.1f} | "
                     f"{row['build_peak_gb']:.1f} | {row['query_seconds']:.2f} | "
                     f"{e2e['questions_per_second']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache-record", type=Path, required=True)
    parser.add_argument("--retrieval-record", type=Path, required=True)
    parser.add_argument("--speed-record", type=Path,
                        help="benchmarks/odqa_speed.py's JSON: the reader's seconds per question")
    parser.add_argument("--out", type=Path, required=True, help="output path, no extension")
    args = parser.parse_args(argv)
    records = {}
    for flag, path in (("--cache-record", args.cache_record),
                       ("--retrieval-record", args.retrieval_record),
                       ("--speed-record", args.speed_record)):
        if path is None:
            continue
        try:
            records[flag] = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            parser.error(f"{flag} {path}: cannot be read as JSON ({error})")
    if "--speed-record" in records:  # checked before the slow windows count
        try:
            reader_seconds_from_speed_record(records["--speed-record"],
                                             records["--cache-record"]["k"])
        except (KeyError, ValueError) as error:
            parser.error(f"--speed-record {args.speed_record}: not a matching "
                         f"odqa_speed record ({error})")
    result = project(records["--cache-record"], records["--retrieval-record"],
                     windows_per_passage(), records.get("--speed-record"))
    result["command"] = " ".join(["python", *sys.argv])
    table = markdown(result)
    write_atomic(args.out.with_suffix(".json"), json.dumps(result, indent=2, default=float))
    write_atomic(args.out.with_suffix(".md"), f"`{result['command']}`\n\n{table}")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
