"""Open-domain reader speed before and after issue 15's reuses, per phase, on the same questions.

    python benchmarks/odqa_speed.py --checkpoint dil_jax/assets/minilm-squad-k2 --ks 4 5 \\
        --data ../shared/data/squad/dev-v1.1.35-articles.json --articles 28:35 --limit 100 \\
        --out benchmarks/results/odqa_speed
    python benchmarks/odqa_speed.py ... --chunk-sizes 64 32 16 8 --modes before "+ trim"

For each k (the same weights read at each split; a k the reader was not trained for gives worse
answers, not a different cost) it builds the float32 passage cache of the corpus index with the
first upper block's arrays (`--cache-reuse`), then reads the same questions (top-p passages,
every window of each) four ways, side by side in one process:
  before      `PairGrid(reuse=False)`, cache read without its reuse arrays: the reader as it was
              before issue 15 (the q/k/v hoisting of earlier rounds kept);
  pair reuse  the pair program's exact reuses (the last block's span rows only; passage
              statistics where passages are read by several pairs, which never happens here),
              every segment read at its full padded length;
  + trim      and each chunk of pairs cut to its longest real question and passage
              (`ReusePlan.trims_padding`);
  + cache     and the first upper block's passage arrays read from the cache.
`--modes` reads only some of these ways. Each way is read at every chunk size of
`--chunk-sizes` (pairs per step of the pair program; default: the reader's default on this
platform, `dil_jax.defaults.default_pair_chunk_size`), so a chunk sweep is timed side by side too.
Each read runs once untimed (compilation, page faults), then `--repeats` timed passes; the median
pass is reported: the reader's phase times (`OpenDomainReader.read`'s `timings`), wall time and
questions/s. Speed and answers are compared with `before` at the first chunk size listed (so
`before` must be among the modes): questions/s ratio, the share of questions with the same answer
text, and the largest |reader score difference| over all candidates (float32 rounding: the
reuses reorder sums, they do not change what is summed). Writes OUT.json and OUT.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

MODES = {"before": dict(pair_reuse=False, cached_reuse=False, trim_padding=False),
         "pair reuse": dict(pair_reuse=True, cached_reuse=False, trim_padding=False),
         "+ trim": dict(pair_reuse=True, cached_reuse=False, trim_padding=True),
         "+ cache": dict(pair_reuse=True, cached_reuse=True, trim_padding=True)}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from cache_compression import open_domain_parser

    from dil_jax.commands.arguments import positive_int

    parser = open_domain_parser(__doc__)
    parser.add_argument("--ks", type=positive_int, nargs="+", required=True,
                        help="split points to time (each 0 < k < l)")
    parser.add_argument("--limit", type=positive_int, default=100,
                        help="questions: a seeded random N of the articles' questions")
    parser.add_argument("--repeats", type=positive_int, default=3)
    parser.add_argument("--chunk-sizes", type=positive_int, nargs="+", default=None,
                        help="pairs per step, each timed (default: the platform's default)")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES),
                        help="ways to read (default: all); must include `before`")
    parser.add_argument("--work", default="runs/odqa_speed",
                        help="folder for the index and the caches (reused when rerun)")
    parser.add_argument("--out", required=True, help="output stem: writes OUT.json and OUT.md")
    return parser.parse_args(argv)


def timed_passes(reader, questions: Sequence[str], repeats: int) -> tuple[Any, list[float]]:
    """One untimed pass, then `repeats` timed ones: (the result of the median pass, so that its
    phase timings belong to the reported wall time; wall seconds of each pass)."""
    reader.read(questions)
    walls, results = [], []
    for _ in range(repeats):
        started = time.perf_counter()
        results.append(reader.read(questions))
        walls.append(time.perf_counter() - started)
    median_pass = sorted(range(repeats), key=walls.__getitem__)[(repeats - 1) // 2]
    return results[median_pass], walls


def compare_answers(reference, result) -> dict[str, float]:
    """Share of questions answered with the same text (reader score alone) and the largest
    |reader score difference| over every candidate, against the reference read."""
    from dil_jax.open_domain.scoring import pick_answer

    same, largest = 0, 0.0
    for ref_candidates, candidates in zip(reference.candidates, result.candidates, strict=True):
        ref_answer, answer = pick_answer(ref_candidates, None), pick_answer(candidates, None)
        same += (ref_answer.text if ref_answer else "") == (answer.text if answer else "")
        for ref, candidate in zip(ref_candidates, candidates, strict=True):
            largest = max(largest, abs(ref.reader_score - candidate.reader_score))
    return {"same_answer_share": same / max(len(reference.candidates), 1),
            "max_score_difference": largest}


def markdown(rows: list[dict[str, Any]], questions: int, top_p: int) -> str:
    phases = sorted({phase for row in rows for phase in row["timings"]})
    lines = [f"{questions} questions, top-{top_p} passages (every window of each); median of "
             "the timed passes; phase seconds from `OpenDomainReader.read` in that pass. "
             f"`vs before`, answers and scores against `before` at chunk {rows[0]['chunk_size']}"
             " of the same k.", "",
             "| k | reader | chunk | " + " | ".join(f"{phase} s" for phase in phases)
             + " | wall s | questions/s | vs before | same answers | max score diff |",
             "|---" * (len(phases) + 8) + "|"]
    for row in rows:
        lines.append(
            f"| {row['k']} | {row['mode']} | {row['chunk_size']} | "
            + " | ".join(f"{row['timings'].get(phase, 0.0):.2f}" for phase in phases)
            + f" | {row['wall_s']:.2f} | {row['questions_per_s']:.2f} | "
            f"×{row['speedup']:.2f} | {100 * row['same_answer_share']:.1f}% | "
            f"{row['max_score_difference']:.1e} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    args = parse_args(argv)
    if "before" not in args.modes:
        raise SystemExit("--modes: `before` is needed (the other ways are compared with it)")
    from cache_compression import build_scheme_cache, open_or_build_index

    from dil_jax.atomic import write_atomic
    from dil_jax.bench.machine import load_average, machine_record
    from dil_jax.data.squad import load_squad, select_articles
    from dil_jax.defaults import default_pair_chunk_size
    from dil_jax.errors import UsageError
    from dil_jax.open_domain.cache.storage import FLOAT32
    from dil_jax.open_domain.reader import OpenDomainReader
    from dil_jax.readers import load_reader

    base = load_reader(args.checkpoint, None, args.max_question_len, args.tokenizer)
    for k in args.ks:
        if not 0 < k < base.config.num_layers:
            raise UsageError(f"--ks {k}: the reuses need 0 < k < l = {base.config.num_layers}")
    examples = [e for e in select_articles(load_squad(args.data).examples, args.articles)
                if e.answer_texts]
    if args.limit < len(examples):
        chosen = np.random.default_rng(args.seed).choice(len(examples), args.limit,
                                                         replace=False)
        examples = [examples[i] for i in sorted(chosen)]
    questions = [example.question for example in examples]
    work = Path(args.work)
    index = open_or_build_index(work / "index", args.corpus or [f"squad:{args.data}"],
                                base.tokenizer, args.max_passage_len, args.doc_stride)
    import jax

    chunk_sizes = args.chunk_sizes or [default_pair_chunk_size(jax.default_backend())]
    # `before` at the first chunk size first: every other read is compared with it.
    reads = [(chunk, mode) for chunk in chunk_sizes for mode in MODES if mode in args.modes]
    rows = []
    load_before = load_average()
    for k in args.ks:
        loaded = base.with_config(num_lower_layers=k)
        cache = build_scheme_cache(work / "caches" / f"k{k}", index, loaded, FLOAT32, True,
                                   args.batch_size)
        reference, reference_speed = None, None
        for chunk, mode in reads:
            flags = MODES[mode]
            print(f"k={k} {mode}, chunk {chunk}: {len(questions)} questions ...",
                  file=sys.stderr)
            reader = OpenDomainReader(index, loaded, cache, top_p=args.top_p,
                                      batch_size=args.batch_size, chunk_size=chunk, **flags)
            result, walls = timed_passes(reader, questions, args.repeats)
            wall = statistics.median(walls)
            reference = reference or result
            reference_speed = reference_speed or len(questions) / wall
            rows.append(dict(k=k, mode=mode, chunk_size=reader.grid.chunk_size, **flags,
                             walls_s=walls, wall_s=wall, questions_per_s=len(questions) / wall,
                             speedup=len(questions) / wall / reference_speed,
                             timings=result.timings,
                             reads_cached_reuse=reader.reads_cached_reuse,
                             **compare_answers(reference, result)))
    table = markdown(rows, len(questions), args.top_p)
    print(table)
    record = dict(command=" ".join(["python", *sys.argv]), machine=machine_record(),
                  load_before=load_before, load_after=load_average(),
                  checkpoint=args.checkpoint, questions=len(questions), top_p=args.top_p,
                  num_windows=index.settings.num_windows, rows=rows)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out.with_suffix(".json"), json.dumps(record, indent=2, default=str))
    write_atomic(out.with_suffix(".md"), f"`{record['command']}`\n\n" + table)
    return rows


if __name__ == "__main__":
    main()
