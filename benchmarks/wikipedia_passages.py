"""What one Wikipedia passage costs here: its tokens, its line in the passage store, the
files of a real index per passage and window, and the cache build's windows per second on
this machine. The inputs of `tools/wikipedia_projection.py`.

    python benchmarks/wikipedia_passages.py --index-folder runs/demo-index \\
        --rate-checkpoint dil_jax/assets/minilm-squad-k4 --rate-windows 64 \\
        --out benchmarks/results/wikipedia_passages

Measured and recorded (OUT.json, OUT.md, the machine named):
  sample      the bundled Wikipedia leads (`--corpus wikipedia`), each cut as DPR cuts an
              article: consecutive 100-word blocks; the full 100-word blocks are the sample
              (a lead's shorter remainder is left out: DPR's passages are 100 words but an
              article's last one). Per passage: the default tokenizer's real tokens, its
              windows of `dil-jax index`'s defaults (192 token slots, stride 96), the real
              tokens of those windows (`p [SEP]`, the mask's ones: what a ragged cache stores),
              and its line in passages.jsonl as the index writes it (`index.store.passage_line`,
              the lead's title and ids as the index names them);
  index       --index-folder (read only): each file's bytes that its index.json records,
              with the folder's passages and windows;
  rate        --rate-checkpoint's lower states (the cache build's work: `encode_passages`,
              batches of `OPEN_DOMAIN_BATCH_SIZE` windows) of --rate-windows sample windows,
              after one warm-up batch (compilation): windows/s, and the analytical FLOPs of
              those windows (`dil_jax.bench.flops`) per second.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

BLOCK_WORDS = 100  # DPR's passages
MAX_PASSAGE_LEN, DOC_STRIDE = 192, 96  # `dil-jax index`'s defaults


def full_blocks(text: str, words: int = BLOCK_WORDS) -> list[tuple[int, int]]:
    """Character spans of the consecutive `words`-word blocks of `text` that hold `words`
    words (a shorter remainder is left out)."""
    # Words as `corpus.split_windows` counts them: runs of non-space characters.
    found = [(m.start(), m.end()) for m in re.finditer(r"\S+", text)]
    return [(found[i][0], found[i + words - 1][1])
            for i in range(0, len(found) - words + 1, words)]


def sample_passages(documents) -> list:
    """The Passages (as the index names them) of every full block of every document."""
    from dil_jax.open_domain.index.corpus import Passage

    return [Passage(f"{doc.doc_id}#{n}", doc.doc_id, doc.title, doc.text[a:b], a, b)
            for doc in documents for n, (a, b) in enumerate(full_blocks(doc.text))]


def token_counts(tokenizer, texts: Sequence[str]) -> tuple[dict[str, float], Any]:
    """(per passage: real tokens of the text, windows, real tokens of the windows; the
    windows themselves)."""
    from dil_jax.data.features import window_contexts

    windows = window_contexts(tokenizer, list(texts), max_passage_len=MAX_PASSAGE_LEN,
                              doc_stride=DOC_STRIDE)
    text_tokens = sum(len(ids) for ids in tokenizer(list(texts), add_special_tokens=False)
                      ["input_ids"])
    n = len(texts)
    return dict(passages=n, text_tokens_per_passage=text_tokens / n,
                windows_per_passage=windows.ids.shape[0] / n,
                real_tokens_per_window=float(np.asarray(windows.mask).sum()) /
                windows.ids.shape[0],
                max_passage_len=MAX_PASSAGE_LEN, doc_stride=DOC_STRIDE), windows


def index_files(folder: Path) -> dict[str, Any]:
    """The bytes of each file an index folder's index.json records, and its counts."""
    settings = json.loads((folder / "index.json").read_text(encoding="utf-8"))
    extra = {}
    if settings["format"] != "dil_jax.odqa_index/1":  # windows.npz of real tokens only
        from dil_jax.open_domain.index.windows import window_member

        starts = window_member(folder / "windows.npz", "row_start")
        extra["real_tokens"] = int(starts[len(starts) - 1])
    return dict(folder=str(folder), format=settings["format"], **extra,
                split=settings.get("split"), num_passages=settings["num_passages"],
                num_windows=settings["num_windows"], retriever=settings["retriever"],
                max_passage_len=settings["max_passage_len"],
                file_bytes={name: entry["bytes"] for name, entry in settings["files"].items()})


def encode_rate(checkpoint: str, ids: np.ndarray, mask: np.ndarray, windows: int
                ) -> dict[str, Any]:
    """Windows/s of the checkpoint's passage lower states over the first `windows` rows,
    after one warm-up batch, and the analytical FLOP/s."""
    from dil_jax.bench.flops import block_flops, embedding_flops
    from dil_jax.defaults import OPEN_DOMAIN_BATCH_SIZE
    from dil_jax.readers.loading import load_reader

    reader = load_reader(checkpoint)
    batch = OPEN_DOMAIN_BATCH_SIZE
    grid = reader.local_grid(batch)
    np.asarray(grid.encode_passages(reader.params, ids[:batch], mask[:batch]))  # compile
    started = time.perf_counter()
    for first in range(0, windows, batch):
        np.asarray(grid.encode_passages(reader.params, ids[first:first + batch],
                                        mask[first:first + batch]))
    seconds = time.perf_counter() - started
    config = reader.config
    per_window = (embedding_flops(config, 1, ids.shape[1])
                  + config.num_lower_layers * block_flops(config, 1, ids.shape[1]))
    return dict(checkpoint=checkpoint, k=config.num_lower_layers, layers=config.num_layers,
                hidden=config.hidden_size, num_heads=config.num_heads,
                intermediate_size=config.intermediate_size, batch_size=batch, windows=windows,
                seconds=seconds,
                windows_per_s=windows / seconds, flops_per_window=per_window,
                flop_per_s=per_window * windows / seconds, niceness=os.nice(0))


def markdown(record: dict[str, Any]) -> str:
    sample, lines = record["sample"], [f"`{record['command']}`", "",
                                       f"Machine: {record['machine']['cpu']}, "
                                       f"{record['machine']['cpu_count']} CPUs; "
                                       f"{record['date']}.", ""]
    lines += ["| sample | passages | text tokens / passage | windows / passage | "
              "real tokens / window | passages.jsonl line B |", "|---|---|---|---|---|---|",
              f"| {sample['source']} | {sample['passages']:,} | "
              f"{sample['text_tokens_per_passage']:.1f} | {sample['windows_per_passage']:.3f} | "
              f"{sample['real_tokens_per_window']:.1f} | {sample['line_bytes_per_passage']:.1f} |"]
    if "index" in record:
        index = record["index"]
        lines += ["", f"Index folder {index['folder']} ({index['num_passages']:,} passages, "
                      f"{index['num_windows']:,} windows):", "", "| file | bytes |", "|---|---|"]
        lines += [f"| {name} | {size:,} |" for name, size in index["file_bytes"].items()]
    if "rate" in record:
        rate = record["rate"]
        lines += ["", f"Cache build (lower states) of {rate['checkpoint']} (k = {rate['k']}): "
                      f"{rate['windows']} windows of {MAX_PASSAGE_LEN} slots in "
                      f"{rate['seconds']:.1f} s = {rate['windows_per_s']:.2f} windows/s, "
                      f"{rate['flop_per_s'] / 1e9:.1f} GFLOP/s (analytical), niceness "
                      f"{rate['niceness']}, load average {record['load_average']}."]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--index-folder", type=Path, help="a built index folder (read only)")
    parser.add_argument("--rate-checkpoint", help="the reader whose cache build is timed")
    parser.add_argument("--rate-windows", type=int, default=64)
    parser.add_argument("--out", type=Path, required=True, help="output path, no extension")
    args = parser.parse_args(argv)
    from dil_jax.atomic import write_atomic
    from dil_jax.bench.machine import load_average, machine_record
    from dil_jax.open_domain.index.corpus import WIKIPEDIA_PACKAGE, read_wikipedia_leads
    from dil_jax.open_domain.index.store import passage_line
    from dil_jax.tokenization import load_tokenizer

    leads = read_wikipedia_leads()
    passages = sample_passages(leads)
    counts, windows = token_counts(load_tokenizer("default"), [p.text for p in passages])
    sample = dict(source=f"the bundled Wikipedia leads ({WIKIPEDIA_PACKAGE}): full "
                         f"{BLOCK_WORDS}-word blocks", leads=len(leads), **counts,
                  line_bytes_per_passage=sum(len(passage_line(p)) for p in passages)
                  / len(passages))
    record: dict[str, Any] = dict(command=" ".join(["python", *sys.argv]),
                                  date=time.strftime("%Y-%m-%d"), machine=machine_record(),
                                  sample=sample)
    if args.index_folder is not None:
        record["index"] = index_files(args.index_folder)
    if args.rate_checkpoint is not None:
        record["rate"] = encode_rate(args.rate_checkpoint, np.asarray(windows.ids),
                                     np.asarray(windows.mask), args.rate_windows)
    record["load_average"] = load_average()
    write_atomic(args.out.with_suffix(".json"), json.dumps(record, indent=2, default=float))
    write_atomic(args.out.with_suffix(".md"), markdown(record))
    print(markdown(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
