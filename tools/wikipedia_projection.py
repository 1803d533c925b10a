"""Projects open-domain QA over all of Wikipedia (21M DPR passages) from records measured here.

    python tools/wikipedia_projection.py \\
        --passages-record benchmarks/results/wikipedia_passages.json \\
        --cache-record docs/results/cache_compression_k4.json \\
        --retrieval-record benchmarks/results/retrieval.json \\
        --bm25-build-record benchmarks/results/bm25_build_memory.json \\
        --bm25-bound-record benchmarks/results/bm25_build_memory_pretouch.json \\
        --query-memory-record benchmarks/results/odqa_query_memory.json \\
        --out docs/results/wikipedia_projection

Every number comes from one of these records (named in the output beside what it gives) or
from a definition in the code (the storage schemes' bytes, the accelerators' peaks); every
scaling to 21M passages is linear and stated as such:

  passages   `benchmarks/wikipedia_passages.py`: real 100-word Wikipedia blocks (the bundled
             leads) through the default tokenizer: windows per passage and real tokens per
             window (what a ragged cache stores: no padding slots); each passage's line in
             passages.jsonl; a real index folder's windows.npz bytes per window; the k = 4
             MiniLM cache build's windows/s and FLOP/s on this machine;
  cache      per storage, bytes per real token of the states and of the reuse arrays
             (`--cache-reuse`): from the cache record's row of that storage when it has
             `bytes_per_real_token` (measured), else from the storage's definition
             (`cache/storage.py`'s table; for pq<M> no cache measured here yet: its row
             says so); token ids and offsets: 12 bytes a token (int32 + 2 x int32,
             before the zstd the store applies: an upper bound) + 8 bytes a window
             (token_starts); open-domain EM / F1 (+IR) where the cache record has the storage;
  Lucene     disk bytes per passage of the retrieval record's largest Lucene index; the
             streaming build's (`dil-jax index --retriever pyserini`: one indexing thread)
             seconds and peak RSS from the BM25 build-memory record: the marginal seconds per
             passage between its two largest corpora, and its peak's growth per passage
             between its smallest and largest, both carried on linearly to 21M passages
             (the peak through `--bm25-bound-record`'s rows when given: the same build with
             its heap resident from the start, so the capped heap's filling is not carried);
  build      the analytical matmul FLOPs of the cache build per window at 192 token slots
             (`dil_jax.bench.flops`: embeddings and k lower blocks, + the first upper block's
             projections and attention statistics with --cache-reuse; padding slots are
             computed) x windows, on a TPU v4-32 (16 chips x 275 bf16 TFLOP/s) and 8 x H100 SXM
             (989 dense bf16 TFLOP/s each), at peak and at an assumed 40% of it, and on this
             machine at its measured FLOP/s; a whole `dil-jax index` of the query-memory
             record's largest corpus (a tiny reader: the work besides a reader's FLOPs) per
             passage;
  query      peak RSS of ask / odqa-eval / serve at the query-memory record's smallest and
             largest corpora, and their growth per passage carried on linearly to 21M.
Writes OUT.json and OUT.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dil_jax.bench.flops import (
    block_flops,
    embedding_flops,
    passage_stats_flops,
    projection_flops,
)
from dil_jax.model.encoder_config import EncoderConfig

WIKIPEDIA_PASSAGES = 21_015_324  # the DPR split of English Wikipedia (100-word passages)
MAX_PASSAGE_LEN = 192  # `dil-jax index`'s windows: token slots computed per window
# Accelerators: (chips, bf16 dense FLOP/s per chip).
ACCELERATORS = {"TPU v4-32": (16, 275e12), "8 x H100 SXM": (8, 989e12)}
ASSUMED_UTILISATION = 0.4
# A ragged cache's token arrays (`cache/ragged_store.py`): ids int32 + offsets 2 x int32 per
# token, before zstd; token_starts int64 per window.
TOKEN_BYTES, TOKEN_STARTS_BYTES = 12, 8
PASSAGE_OFFSET_BYTES = 8  # passages.offsets.npy: int64 [passages + 1]
PQ_CENTROIDS = 256
DEFAULT_STORAGES = ("float32", "bfloat16", "int8", "pca64", "pq32", "pq64")
# The second reader shape projected beside the measured one: BERT-base at k = 11.
BERT_BASE = dict(hidden=768, layers=12, num_heads=12, intermediate_size=3072, k=11)
GB, TB, MIB = 1e9, 1e12, 2**20
# What the retrieval record's Lucene index is (its build of 2026-11-25, before the streaming
# one: a TextField, positions indexed); revisit when that record is rerun.
LUCENE_SIZE_NOTE = ("the retrieval record's Lucene index was built with positions (TextField), "
                    "the streaming build indexes terms and frequencies only: an upper bound")


# ----------------------------------------------------------------------------- storage


def _scheme(name: str) -> tuple[str, int | None]:
    """("float32" | "bfloat16" | "int8" | "pca" | "pq", d or M or None); ValueError else."""
    match = re.fullmatch(r"(pca|pq)([1-9][0-9]*)", name)
    if match:
        return match.group(1), int(match.group(2))
    if name in ("float32", "bfloat16", "int8"):
        return name, None
    raise ValueError(f"unknown storage {name!r} (float32, bfloat16, int8, pca<d>, pq<M>)")


def defined_states_bytes(name: str, width: int) -> int:
    """Bytes a token's row of `width` values takes in storage `name`, by its definition:
    float32 4w, bfloat16 2w, int8 w + 4 (a float32 scale), pca<d> d + 4, pq<M> M."""
    kind, size = _scheme(name)
    return {"float32": 4 * width, "bfloat16": 2 * width, "int8": width + 4,
            "pca": (size or 0) + 4, "pq": size or 0}[kind]


def defined_reuse_bytes(name: str, width: int, heads: int) -> int:
    """Bytes a token's reuse arrays take: 4 wide arrays (q, k, v, context) in the storage
    (int8 for pca<d> / pq<M>, which fit no basis of their own) + a float32 log-sum-exp a
    head."""
    kind, _ = _scheme(name)
    wide = "int8" if kind in ("pca", "pq") else name
    return 4 * defined_states_bytes(wide, width) + 4 * heads


def defined_side_bytes(name: str, width: int) -> int:
    """Bytes stored once per cache: pca<d> its mean and basis 4 w (d + 1); pq<M> its mean,
    full-width rotation and codebook 4 w (w + 1) + 4 x 256 w; none for the others."""
    kind, size = _scheme(name)
    if kind == "pca":
        return 4 * width * ((size or 0) + 1)
    if kind == "pq":
        return 4 * width * (width + 1) + 4 * PQ_CENTROIDS * width
    return 0


def storage_row(name: str, measured: dict[str, Any] | None, width: int, heads: int,
                tokens: float, windows: float, source: str) -> dict[str, Any]:
    """One storage's cache at `tokens` real tokens in `windows` windows: bytes per real token
    (from `measured`, a cache record's row with bytes_per_real_token, else the definition),
    and the cache's parts in TB."""
    if measured is not None and "bytes_per_real_token" in measured:
        per_token = measured["bytes_per_real_token"]
        states, reuse, token_bytes = per_token["states"], per_token["reuse"], per_token["tokens"]
        if not measured.get("reuse", True) and "reuse_if_stored" in measured:
            # The run read without storing the reuse arrays: the record gives what they would
            # take (`benchmarks/cache_compression.py`'s "not stored (+N)").
            reuse = measured["reuse_if_stored"]
        # The measured states bytes carry the pca / pq side arrays (basis, rotation, codebook)
        # spread over the measured corpus's tokens: an upper bound at 21M passages.
        side, origin = 0, f"measured ({source})"
    else:
        states, reuse = defined_states_bytes(name, width), defined_reuse_bytes(name, width, heads)
        token_bytes, side = TOKEN_BYTES + TOKEN_STARTS_BYTES * windows / tokens, \
            defined_side_bytes(name, width)
        origin = "definition" + (" (not measured yet)"
                                 if _scheme(name)[0] == "pq" else "")
    row = dict(storage=name, source=origin, states_bytes_per_token=states,
               reuse_bytes_per_token=reuse, token_bytes_per_token=token_bytes,
               side_bytes=side, states_tb=states * tokens / TB, reuse_tb=reuse * tokens / TB,
               tokens_tb=token_bytes * tokens / TB)
    row["cache_tb"] = row["states_tb"] + row["tokens_tb"] + side / TB
    row["cache_with_reuse_tb"] = row["cache_tb"] + row["reuse_tb"]
    if measured is not None and "open_domain" in measured:
        odqa = measured["open_domain"]
        row["accuracy"] = dict(EM_ir=odqa.get("EM_ir"), F1_ir=odqa.get("F1_ir"),
                               EM=odqa.get("EM"), questions=odqa.get("questions"))
    return row


# ----------------------------------------------------------------------------- index files


def windows_bytes(folder: dict[str, Any], windows: float, tokens: float) -> tuple[float, str]:
    """windows.npz's bytes for `windows` windows of `tokens` real tokens, from an index
    folder's: per real token where it stores real tokens only (format /2, whose record counts
    them), else per window (the padded /1 file: every window the same slots)."""
    size = folder["file_bytes"]["windows.npz"]
    if "real_tokens" in folder:
        per_token = size / folder["real_tokens"]
        return per_token * tokens, f"{folder['folder']}: {per_token:,.2f} B a real token"
    per_window = size / folder["num_windows"]
    return per_window * windows, f"{folder['folder']}: {per_window:,.0f} B a window"


def index_files(passages_record: dict[str, Any], retrieval_record: dict[str, Any],
                passages: int, windows: float, tokens: float) -> list[dict[str, Any]]:
    """The index's files besides the cache, GB: passages.jsonl (the sample's line bytes),
    passages.offsets.npy (8 bytes a passage), windows.npz (`windows_bytes`), the Lucene index
    (the retrieval record's largest pyserini row, per passage)."""
    sample, folder = passages_record["sample"], passages_record["index"]
    window_total, window_source = windows_bytes(folder, windows, tokens)
    lucene = max((row for row in retrieval_record["rows"]
                  if row["engine"] == "pyserini" and "error" not in row),
                 key=lambda row: row["size"])
    lucene_bytes = lucene["disk_mib"] * MIB / lucene["size"]
    return [
        dict(file="passages.jsonl", bytes_per_passage=sample["line_bytes_per_passage"],
             gb=sample["line_bytes_per_passage"] * passages / GB,
             source=f"{sample['passages']:,} sample lines"),
        dict(file="passages.offsets.npy", bytes_per_passage=PASSAGE_OFFSET_BYTES,
             gb=PASSAGE_OFFSET_BYTES * (passages + 1) / GB, source="definition (int64)"),
        dict(file="windows.npz", bytes_per_passage=window_total / passages,
             gb=window_total / GB, source=window_source),
        dict(file="Lucene index (bm25/)", bytes_per_passage=lucene_bytes,
             gb=lucene_bytes * passages / GB,
             source=f"pyserini at {lucene['size']:,} passages"),
    ]


# ----------------------------------------------------------------------------- build


def linear_at(x: float, x0: float, y0: float, x1: float, y1: float) -> float:
    """The line through (x0, y0) and (x1, y1) at x."""
    return y1 + (y1 - y0) / (x1 - x0) * (x - x1)


def lucene_build(bm25_record: dict[str, Any], passages: int,
                 bound_record: dict[str, Any] | None = None) -> dict[str, Any]:
    """The streaming Lucene build (the record's pyserini rows): hours at the marginal rate
    between its two largest corpora, and peak RSS on the line through its smallest and largest,
    both at `passages` (linear extrapolations).

    bound_record: the same build with the JVM's heap resident from its start
    (`-XX:+AlwaysPreTouch`). The heap is capped, so most of a plain build's growth is heap pages
    touched up to that cap, which stops at the cap: carried on linearly it overstates. With the
    heap resident in every row, what still grows is what truly grows with the corpus, so the
    peak is projected on the line through that record's rows instead (`peak_from` says which).
    """
    rows = _pyserini_rows(bm25_record)
    before, large = rows[-2], rows[-1]
    seconds = linear_at(passages, before["passages"], before["seconds"], large["passages"],
                        large["seconds"])
    peak_rows = _pyserini_rows(bound_record) if bound_record else rows
    low, high = peak_rows[0], peak_rows[-1]
    peak = linear_at(passages, low["passages"], low["peak_mib"], high["passages"],
                     high["peak_mib"])
    return dict(measured=[dict(passages=row["passages"], seconds=row["seconds"],
                               peak_mib=row["peak_mib"]) for row in rows],
                passages_per_s=(large["passages"] - before["passages"])
                / (large["seconds"] - before["seconds"]),
                hours=seconds / 3600, peak_gib=peak / 1024,
                peak_from="heap resident from the start" if bound_record else "plain build",
                machine=f"{bm25_record['machine']}, {bm25_record['cpus']} CPUs")


def _pyserini_rows(record: dict[str, Any]) -> list[dict[str, Any]]:
    """A build-memory record's pyserini rows that finished, smallest corpus first."""
    return sorted((row for row in record["rows"]
                   if row["engine"] == "pyserini" and "error" not in row),
                  key=lambda row: row["passages"])


def reader_config(hidden: int, layers: int, num_heads: int, intermediate_size: int,
                  k: int) -> EncoderConfig:
    return EncoderConfig(hidden_size=hidden, embedding_size=hidden, num_layers=layers,
                         num_heads=num_heads, intermediate_size=intermediate_size,
                         num_lower_layers=k)


def build_flops_per_window(config: EncoderConfig, reuse: bool) -> int:
    """Matmul FLOPs of one window's cache entry at MAX_PASSAGE_LEN slots."""
    k = config.num_lower_layers
    flops = (embedding_flops(config, 1, MAX_PASSAGE_LEN)
             + k * block_flops(config, 1, MAX_PASSAGE_LEN))
    if reuse:
        flops += (projection_flops(config, 1, MAX_PASSAGE_LEN)
                  + passage_stats_flops(config, 1, MAX_PASSAGE_LEN))
    return flops


def cache_builds(rate: dict[str, Any], windows: float) -> list[dict[str, Any]]:
    """The cache build of `windows` windows, for the timed reader and BERT-base, with and
    without the reuse arrays: minutes per accelerator at peak and at ASSUMED_UTILISATION,
    hours on this machine at the record's measured FLOP/s."""
    timed = dict(hidden=rate["hidden"], layers=rate["layers"], num_heads=rate["num_heads"],
                 intermediate_size=rate["intermediate_size"], k=rate["k"])
    rows = []
    for name, shape in ((f"{rate['checkpoint']} (timed)", timed), ("BERT-base shape",
                                                                     BERT_BASE)):
        config = reader_config(**shape)
        for reuse in (False, True):
            flops = build_flops_per_window(config, reuse) * windows
            minutes = {machine: dict(at_peak=flops / (chips * peak) / 60,
                                     at_assumed=flops / (chips * peak * ASSUMED_UTILISATION)
                                     / 60)
                       for machine, (chips, peak) in ACCELERATORS.items()}
            rows.append(dict(reader=name, hidden=shape["hidden"], layers=shape["layers"],
                             k=shape["k"], reuse=reuse, flops=flops, minutes=minutes,
                             this_machine_hours=flops / rate["flop_per_s"] / 3600))
    return rows


def whole_index(query_record: dict[str, Any], passages: int) -> dict[str, Any]:
    """A whole `dil-jax index` of the query-memory record's largest corpus (tiny reader):
    seconds per passage, and hours at `passages` (linear)."""
    largest = max(query_record["indexes"], key=lambda row: row["passages"])
    per_passage = largest["index_seconds"] / largest["passages"]
    return dict(passages=largest["passages"], windows=largest["windows"],
                seconds=largest["index_seconds"], hours=per_passage * passages / 3600)


# ----------------------------------------------------------------------------- query


def query_memory(query_record: dict[str, Any], passages: int) -> list[dict[str, Any]]:
    """Per command: peak RSS at the record's smallest and largest corpora, their ratio, the
    growth per million passages and the peak at `passages` on that line (linear)."""
    rows = []
    for command in dict.fromkeys(row["command"] for row in query_record["rows"]):
        measured = sorted((row for row in query_record["rows"] if row["command"] == command),
                          key=lambda row: row["passages"])
        small, large = measured[0], measured[-1]
        slope = (large["VmHWM"] - small["VmHWM"]) / (large["passages"] - small["passages"])
        rows.append(dict(command=command, small_passages=small["passages"],
                         small_mib=small["VmHWM"], large_passages=large["passages"],
                         large_mib=large["VmHWM"], ratio=large["VmHWM"] / small["VmHWM"],
                         growth_mib_per_million=slope * 1e6,
                         projected_mib=linear_at(passages, small["passages"], small["VmHWM"],
                                                 large["passages"], large["VmHWM"])))
    return rows


# ----------------------------------------------------------------------------- projection


@dataclasses.dataclass(frozen=True)
class Records:
    """The records read, by role, and the file each came from."""

    passages: dict[str, Any]
    retrieval: dict[str, Any]
    bm25_build: dict[str, Any]
    query_memory: dict[str, Any]
    cache: dict[str, Any] | None
    files: dict[str, str]
    bm25_bound: dict[str, Any] | None = None  # the build with its heap resident from the start


def project(records: Records, storages: Sequence[str] = DEFAULT_STORAGES,
            passages: int = WIKIPEDIA_PASSAGES) -> dict[str, Any]:
    sample, rate = records.passages["sample"], records.passages["rate"]
    windows = sample["windows_per_passage"] * passages
    tokens = sample["real_tokens_per_window"] * windows
    measured = {row["scheme"]: row for row in (records.cache or {}).get("rows", [])}
    cache_source = records.files.get("cache", "")
    cache = [storage_row(name, measured.get(name), rate["hidden"], rate["num_heads"], tokens,
                         windows, cache_source) for name in storages]
    files = index_files(records.passages, records.retrieval, passages, windows, tokens)
    index_tb = sum(row["gb"] for row in files) * GB / TB
    for row in cache:  # the whole index folder with this cache
        row["disk_tb"], row["disk_with_reuse_tb"] = (index_tb + row["cache_tb"],
                                                     index_tb + row["cache_with_reuse_tb"])
    return dict(
        passages=passages, windows=windows, real_tokens=tokens,
        windows_per_passage=sample["windows_per_passage"],
        real_tokens_per_window=sample["real_tokens_per_window"],
        # The reader whose cache the storage rows are of: the cache record's when given (its
        # states have the same width as the timed reader's), else the timed one.
        reader=dict(checkpoint=(records.cache or {}).get("checkpoint", rate["checkpoint"]),
                    hidden=rate["hidden"], num_heads=rate["num_heads"],
                    k=(records.cache or {}).get("k", rate["k"])),
        index_files=files, index_files_gb=sum(row["gb"] for row in files), cache=cache,
        lucene_build=lucene_build(records.bm25_build, passages, records.bm25_bound),
        cache_builds=cache_builds(rate, windows),
        this_machine=dict(windows_per_s=rate["windows_per_s"], flop_per_s=rate["flop_per_s"],
                          cpu=records.passages["machine"]["cpu"],
                          cpus=records.passages["machine"]["cpu_count"]),
        whole_index=whole_index(records.query_memory, passages),
        query_memory=query_memory(records.query_memory, passages),
        assumptions=dict(accelerators={name: dict(chips=chips, peak_per_chip=peak)
                                       for name, (chips, peak) in ACCELERATORS.items()},
                         utilisation=ASSUMED_UTILISATION, max_passage_len=MAX_PASSAGE_LEN,
                         token_bytes=TOKEN_BYTES, token_starts_bytes=TOKEN_STARTS_BYTES),
        inputs=records.files)


def _accuracy(row: dict[str, Any]) -> str:
    accuracy = row.get("accuracy")
    if not accuracy or accuracy.get("EM_ir") is None:
        return "–"
    return f"{accuracy['EM_ir']:.1f} / {accuracy['F1_ir']:.1f} ({accuracy['questions']} q.)"


def markdown(result: dict[str, Any]) -> str:
    files, n = result["inputs"], result["passages"]
    lines = [f"Wikipedia: {n:,} passages x {result['windows_per_passage']:.3f} windows x "
             f"{result['real_tokens_per_window']:.1f} real tokens = "
             f"{result['real_tokens'] / 1e9:.2f} G real tokens ({files['passages']}: real "
             "100-word blocks of the bundled Wikipedia leads, the default tokenizer). Every "
             "size and time at 21M passages is a linear extrapolation of the measured ones.",
             "", f"Index files besides the cache ({files['passages']}, {files['retrieval']}):",
             "", "| file | B / passage | GB | from |", "| --- | --- | --- | --- |"]
    lines += [f"| {row['file']} | {row['bytes_per_passage']:,.0f} | {row['gb']:.1f} | "
              f"{row['source']} |" for row in result["index_files"]]
    lines += [f"| all | | {result['index_files_gb']:.1f} | |", "", f"Lucene: {LUCENE_SIZE_NOTE}.",
              "",
              f"Cache of the {result['reader']['checkpoint']} reader (hidden "
              f"{result['reader']['hidden']}, {result['reader']['num_heads']} heads, k = "
              f"{result['reader']['k']}), per storage (accuracy: "
              f"{files.get('cache', 'no cache record')}):", "",
              "| storage | bytes from | states B / real token | reuse B / real token | "
              "states TB | + ids, offsets TB | cache TB | with reuse arrays TB | index folder TB "
              "(with reuse arrays) | EM / F1 +IR |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {row['storage']} | {row['source']} | {row['states_bytes_per_token']:.1f} | "
              f"{row['reuse_bytes_per_token']:.1f} | {row['states_tb']:.3f} | "
              f"{row['tokens_tb']:.3f} | {row['cache_tb']:.3f} | "
              f"{row['cache_with_reuse_tb']:.3f} | {row['disk_tb']:.3f} "
              f"({row['disk_with_reuse_tb']:.3f}) | {_accuracy(row)} |" for row in result["cache"]]
    lucene = result["lucene_build"]
    measured = ", ".join(f"{row['passages']:,}: {row['seconds']:.0f} s, {row['peak_mib']:.0f} MiB"
                         for row in lucene["measured"])
    lines += ["", f"Streaming Lucene build (one indexing thread; {files['bm25_build']}, "
                  f"{lucene['machine']}; measured {measured}; marginal rate "
                  f"{lucene['passages_per_s']:,.0f} passages/s): {lucene['hours']:.1f} h, peak "
                  f"RSS {lucene['peak_gib']:.2f} GiB at {n:,} passages (on the line through "
                  f"the {lucene['peak_from']} rows"
                  + (f", {files['bm25_bound']}" if "bm25_bound" in files else "") + ").", ""]
    machine = result["this_machine"]
    names = list(result["assumptions"]["accelerators"])
    header = " | ".join(f"{name} min at peak | at {ASSUMED_UTILISATION:.0%}" for name in names)
    lines += [f"Cache build of {result['windows'] / 1e6:.1f}M windows of "
              f"{MAX_PASSAGE_LEN} slots: minutes on accelerators, hours on this machine "
              "(analytical FLOPs; peaks: "
              + ", ".join(f"{name} {chips} x {peak / 1e12:.0f} TFLOP/s" for name, (chips, peak)
                          in ACCELERATORS.items())
              + f" bf16; this machine at its measured {machine['flop_per_s'] / 1e9:.1f} GFLOP/s "
              f"= {machine['windows_per_s']:.2f} windows/s of the timed reader, "
              f"{machine['cpus']} shared CPUs, {files['passages']}):", "",
              f"| reader | k / l | reuse arrays | PFLOP | {header} | this machine h |",
              "| --- | --- | --- | --- | " + "--- | " * (2 * len(names)) + "--- |"]
    for row in result["cache_builds"]:
        minutes = " | ".join(f"{row['minutes'][name]['at_peak']:.1f} | "
                             f"{row['minutes'][name]['at_assumed']:.1f}" for name in names)
        lines.append(f"| {row['reader']} | {row['k']} / {row['layers']} | "
                     f"{'yes' if row['reuse'] else 'no'} | {row['flops'] / 1e15:,.0f} | "
                     f"{minutes} | {row['this_machine_hours']:,.0f} |")
    whole = result["whole_index"]
    lines += ["", f"A whole `dil-jax index` on this machine ({files['query_memory']}: tiny "
                  f"reader, {whole['passages']:,} passages, {whole['windows']:,} windows, "
                  f"{whole['seconds']:.0f} s): {whole['hours']:.1f} h at {n:,} passages.", "",
              f"Query-time peak RSS ({files['query_memory']}; tiny reader):", "",
              "| command | MiB at smallest | MiB at largest | ratio | growth MiB / M passages "
              f"| MiB at {n / 1e6:.0f}M (linear) |", "| --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {row['command']} | {row['small_mib']:.0f} ({row['small_passages']:,}) | "
              f"{row['large_mib']:.0f} ({row['large_passages']:,}) | {row['ratio']:.3f} | "
              f"{row['growth_mib_per_million']:.1f} | {row['projected_mib']:,.0f} |"
              for row in result["query_memory"]]
    return "\n".join(lines) + "\n"


def read_records(paths: dict[str, Path | None]) -> Records:
    """The records at `paths` (role -> file; cache optional); ValueError naming a file that
    is not JSON."""
    loaded: dict[str, Any] = {}
    for role, path in paths.items():
        if path is None:
            continue
        try:
            loaded[role] = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise ValueError(f"{path}: cannot be read as JSON ({error})") from error
    return Records(passages=loaded["passages"], retrieval=loaded["retrieval"],
                   bm25_build=loaded["bm25_build"], query_memory=loaded["query_memory"],
                   cache=loaded.get("cache"), bm25_bound=loaded.get("bm25_bound"),
                   files={role: str(path) for role, path in paths.items() if path is not None})


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--passages-record", type=Path, required=True,
                        help="benchmarks/wikipedia_passages.py's JSON")
    parser.add_argument("--cache-record", type=Path,
                        help="benchmarks/cache_compression.py's JSON (measured storages)")
    parser.add_argument("--retrieval-record", type=Path, required=True,
                        help="benchmarks/retrieval.py's JSON (the Lucene index's size)")
    parser.add_argument("--bm25-build-record", type=Path, required=True,
                        help="benchmarks/bm25_build_memory.py's JSON")
    parser.add_argument("--bm25-bound-record", type=Path,
                        help="the same build with -XX:+AlwaysPreTouch (the peak's bound)")
    parser.add_argument("--query-memory-record", type=Path, required=True,
                        help="benchmarks/odqa_query_memory.py's JSON")
    parser.add_argument("--storages", nargs="+", default=list(DEFAULT_STORAGES))
    parser.add_argument("--out", type=Path, required=True, help="output path, no extension")
    args = parser.parse_args(argv)
    for name in args.storages:
        try:
            _scheme(name)
        except ValueError as error:
            parser.error(f"--storages: {error}")
    try:
        records = read_records(dict(
            passages=args.passages_record, cache=args.cache_record,
            retrieval=args.retrieval_record, bm25_build=args.bm25_build_record,
            bm25_bound=args.bm25_bound_record, query_memory=args.query_memory_record))
    except ValueError as error:
        parser.error(str(error))
    from dil_jax.atomic import write_atomic

    result = project(records, args.storages)
    result["command"] = " ".join(["python", *sys.argv])
    table = markdown(result)
    write_atomic(args.out.with_suffix(".json"), json.dumps(result, indent=2, default=float))
    write_atomic(args.out.with_suffix(".md"), f"`{result['command']}`\n\n{table}")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
