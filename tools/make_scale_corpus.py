"""Writes a synthetic corpus of N passages as JSONL (`dil-jax index --corpus jsonl:PATH`).

    python tools/make_scale_corpus.py --passages 1000000 --out runs/scale/corpus-1m.jsonl

Sentences of the shared SQuAD paragraphs and the Wikipedia leads, resampled into 100-word
passages (`dil_jax.open_domain.index.scale_corpus` says how and what it does not reproduce).
The file is written beside its final name and renamed when complete; an existing file is not
replaced.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dil_jax.atomic import write_atomic
from dil_jax.open_domain.index.corpus import iter_sources
from dil_jax.open_domain.index.scale_corpus import resampled_passages, sentence_pool

DEFAULT_SOURCES = ["squad:../shared/data/squad/dev-v1.1.35-articles.json", "wikipedia"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--passages", type=int, required=True, help="how many passages")
    parser.add_argument("--out", type=Path, required=True, help="the JSONL file to write")
    parser.add_argument("--source", action="append", default=None,
                        help=f"sentence sources as `dil-jax index --corpus` (default: "
                             f"{' and '.join(DEFAULT_SOURCES)})")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.passages < 1:
        parser.error(f"--passages must be >= 1, got {args.passages}")
    if args.out.exists():
        parser.error(f"--out {args.out} exists; give another path or delete it")
    pool = sentence_pool(list(iter_sources(args.source or DEFAULT_SOURCES)))
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def write(stream) -> None:
        for number, text in enumerate(resampled_passages(pool, args.passages, args.seed)):
            line = json.dumps({"id": f"s{number}", "title": "", "text": text}) + "\n"
            stream.write(line.encode("utf-8"))

    write_atomic(args.out, write)
    print(f"{args.out}: {args.passages:,} passages resampled from {len(pool):,} sentences",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
