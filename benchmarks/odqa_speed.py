"""Open-domain reader speed before and after issue 15's reuses, per phase, on the same questions.

    python benchmarks/odqa_speed.py --checkpoint dil_jax/assets/minilm-squad-k2 --ks 4 5 \\
        --data ../shared/data/squad/dev-v1.1.35-articles.json --articles 28:35 --limit 100 \\
        --out benchmarks/results/odqa_speed
    python benchmarks/odqa_speed.py ... --chunk-sizes 64 32 16 8 --modes before "+ trim"

For each k (the same weights read at each split; a k the reader was not trained for gives worse
answers, not a different cost) it builds the float32 passage cache of the corpus index with the
first upper block's arrays (`--cache-reuse`; at k = 0, the full reader, a cache of token ids
without them: its `+ cache` reads as `+ trim` does), then reads the same questions (top-p passages,
every window of each) four ways, side by side in one process:
  before      `PairGrid(reuse=False)`, cache read without its reuse arrays: the reader as it was
              before issue 15 (the q/k/v hoisting of earlier rounds kept);
  pair reuse  the pair program's exact reuses (the last block's span rows only; passage
              statistics where passages are read by several pairs, which never happens here),
              every segment read at its full padded length;
  + trim      and each chunk of pairs cut to its longest real question and passage
              (`ReusePlan.trims_padding`);
  + cache     and the first upper block's passage arrays read from the cache;
  stop        + cache, and window pruning (`dil_jax.open_domain.pruning`, issue 63): each
              question's passages in BM25 order, `--prune-stage` at a time, until no unread one
              can change the fused answer (mu = `--mu`, the reader's `--span-score`): exact;
  stop:H      the same, assuming no unread passage scores above H = `--prune-high` (the
              reader's calibrated value: docs/open_domain.md, "Window pruning"): approximate.
`--modes` reads only some of these ways. Each way is read at every chunk size of
`--chunk-sizes` (pairs per step of the pair program; default: the reader's default on this
platform, `dil_jax.defaults.default_pair_chunk_size`), so a chunk sweep is timed side by side too.
Each read runs once untimed (compilation, page faults), then `--repeats` timed passes; the median
pass is reported: the reader's phase times (`OpenDomainReader.read`'s `timings`), wall time and
questions/s. Speed and answers are compared with `before` at the first chunk size listed (so
`before` must be among the modes): questions/s ratio, the share of questions with the same answer
text (the reader alone, and fused with BM25 at `--mu`), and the largest |reader score
difference| over the candidates both read (float32 rounding: the reuses reorder sums, they do
not change what is summed); the pairs a question's upper blocks read, and the passage tokens of
each; and SQuAD EM / F1 of each read's answers, without and with the IR score (fused at `--mu`).
Writes OUT.json and OUT.md.

    # issue 63's rows: the served k = 4 reader and the full one, exact and calibrated window
    # pruning (H: docs/open_domain.md, "Window pruning"; the readers' default rule, logits;
    # the full reader with --span-score margin: --prune-high 6.75)
    python benchmarks/odqa_speed.py --checkpoint dil_jax/assets/minilm-squad-k4 --ks 4 \\
        --data ../shared/data/squad/dev-v1.1.35-articles.json --articles 28:35 --limit 100 \\
        --corpus squad:../shared/data/squad/dev-v1.1.35-articles.json --corpus wikipedia \\
        --modes before "+ cache" stop stop:H --prune-high 4.75 \\
        --out benchmarks/results/odqa_prune_k4
    python benchmarks/odqa_speed.py --checkpoint dil_jax/assets/minilm-squad-full --ks 0 \\
        --data ../shared/data/squad/dev-v1.1.35-articles.json --articles 28:35 --limit 100 \\
        --corpus squad:../shared/data/squad/dev-v1.1.35-articles.json --corpus wikipedia \\
        --modes before "+ cache" stop stop:H --prune-high 5.25 \\
        --out benchmarks/results/odqa_prune_full
    # and the default delayed reader (k = 2 after the open-domain stage), calibrated H 5.75
    python benchmarks/odqa_speed.py --checkpoint dil_jax/assets/minilm-squad-k2-open --ks 2 \\
        ... --modes before "+ cache" stop stop:H --prune-high 5.75 \\
        --out benchmarks/results/odqa_prune_k2-open
"""

from __future__ import annotations

import argparse
import dataclasses
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
         "+ cache": dict(pair_reuse=True, cached_reuse=True, trim_padding=True),
         "stop": dict(pair_reuse=True, cached_reuse=True, trim_padding=True),
         "stop:H": dict(pair_reuse=True, cached_reuse=True, trim_padding=True)}
# The modes that prune windows (`mode_pruning`): read when asked for (`--modes`).
PRUNED_MODES = ("stop", "stop:H")
DEFAULT_MODES = [mode for mode in MODES if mode not in PRUNED_MODES]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from cache_compression import open_domain_parser

    from dil_jax.commands.arguments import positive_int

    parser = open_domain_parser(__doc__)
    parser.add_argument("--ks", type=int, nargs="+", required=True,
                        help="split points to time (each 0 <= k < l; k = 0, the full reader, "
                             "has no cached first-upper-block arrays)")
    parser.add_argument("--limit", type=positive_int, default=100,
                        help="questions: a seeded random N of the articles' questions")
    parser.add_argument("--repeats", type=positive_int, default=3)
    parser.add_argument("--chunk-sizes", type=positive_int, nargs="+", default=None,
                        help="pairs per step, each timed (default: the platform's default)")
    parser.add_argument("--modes", nargs="+", default=DEFAULT_MODES, choices=list(MODES),
                        help="ways to read (default: all but the pruned ones); must include "
                             "`before`")
    parser.add_argument("--mu", type=float, default=0.5,
                        help="fusion weight: the pruned modes settle the fused answer at it, and "
                             "answers are compared fused at it too")
    parser.add_argument("--span-score", default="logits", choices=("logits", "margin"),
                        help="the reader's span score rule (the pruned modes settle its answer)")
    parser.add_argument("--prune-high", type=float, default=None,
                        help="H of the stop:H mode (needed with it)")
    parser.add_argument("--prune-stage", type=positive_int, default=1,
                        help="passages a question reads a round in the pruned modes")
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


def mode_pruning(mode: str, args: argparse.Namespace):
    """The `WindowPruning` of a mode (None: every window)."""
    from dil_jax.open_domain.pruning import WindowPruning

    if mode not in PRUNED_MODES:
        return None
    return WindowPruning(high=args.prune_high if mode == "stop:H" else None,
                         stage=args.prune_stage, mu=args.mu)


def compare_answers(reference, result, mu: float) -> dict[str, float]:
    """Shares of questions answered with the same text, by the reader score alone and fused
    at mu, and the largest |reader score difference| over the candidates (passages) both reads
    have (a pruned read has fewer), against the reference read."""
    from dil_jax.open_domain.scoring import pick_answer

    def text(candidates, weight):
        answer = pick_answer(candidates, weight)
        return answer.text if answer else ""

    same = same_fused = 0
    largest = 0.0
    for ref_candidates, candidates in zip(reference.candidates, result.candidates, strict=True):
        same += text(ref_candidates, None) == text(candidates, None)
        same_fused += text(ref_candidates, mu) == text(candidates, mu)
        theirs = {c.passage_index: c.reader_score for c in ref_candidates}
        for candidate in candidates:
            largest = max(largest, abs(theirs[candidate.passage_index] - candidate.reader_score))
    count = max(len(reference.candidates), 1)
    return {"same_answer_share": same / count, "same_fused_answer_share": same_fused / count,
            "max_score_difference": largest}


def answer_scores(examples, result, mu: float) -> dict[str, float]:
    """SQuAD EM / F1 (percent, best over each question's gold answers) of a read's answers,
    by the reader score alone and fused with BM25's at mu (the open-domain protocol's
    "without" and "with the IR score"); examples: the questions read, in order."""
    from dil_jax.metrics.squad_metric import exact_score, f1_score_v1
    from dil_jax.open_domain.scoring import pick_answer

    totals = {"em": 0.0, "f1": 0.0, "em_ir": 0.0, "f1_ir": 0.0}
    for example, candidates in zip(examples, result.candidates, strict=True):
        for suffix, weight in (("", None), ("_ir", mu)):
            answer = pick_answer(candidates, weight)
            text = answer.text if answer else ""
            totals["em" + suffix] += max(exact_score(text, gold) for gold in example.answer_texts)
            totals["f1" + suffix] += max(f1_score_v1(text, gold)
                                         for gold in example.answer_texts)
    return {name: 100 * total / max(len(examples), 1) for name, total in totals.items()}


def read_sizes(result) -> dict[str, float]:
    """Pairs a question's upper blocks read, and passage tokens a pair (`ReadResult`)."""
    pairs = sum(result.pairs_read)
    return {"pairs_per_question": pairs / max(len(result.pairs_read), 1),
            "tokens_per_pair": sum(result.tokens_read) / max(pairs, 1)}


def markdown(rows: list[dict[str, Any]], questions: int, top_p: int) -> str:
    phases = sorted({phase for row in rows for phase in row["timings"]})
    lines = [f"{questions} questions, top-{top_p} passages (every window of each); median of "
             "the timed passes; phase seconds from `OpenDomainReader.read` in that pass. "
             f"`vs before`, answers and scores against `before` at chunk {rows[0]['chunk_size']}"
             " of the same k.", "",
             "| k | reader | chunk | " + " | ".join(f"{phase} s" for phase in phases)
             + " | wall s | questions/s | vs before | pairs / q | tokens / pair | EM / F1 "
             "| EM / F1 (+IR) | same answers | same answers (+IR) | max score diff |",
             "|---" * (len(phases) + 13) + "|"]
    for row in rows:
        lines.append(
            f"| {row['k']} | {row['mode']} | {row['chunk_size']} | "
            + " | ".join(f"{row['timings'].get(phase, 0.0):.2f}" for phase in phases)
            + f" | {row['wall_s']:.2f} | {row['questions_per_s']:.2f} | "
            f"×{row['speedup']:.2f} | {row['pairs_per_question']:.1f} | "
            f"{row['tokens_per_pair']:.0f} | {row['em']:.1f} / {row['f1']:.1f} | "
            f"{row['em_ir']:.1f} / {row['f1_ir']:.1f} | {100 * row['same_answer_share']:.1f}% | "
            f"{100 * row['same_fused_answer_share']:.1f}% | {row['max_score_difference']:.1e} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    args = parse_args(argv)
    if "before" not in args.modes:
        raise SystemExit("--modes: `before` is needed (the other ways are compared with it)")
    if "stop:H" in args.modes and args.prune_high is None:
        raise SystemExit("--modes stop:H: give --prune-high H (the reader's calibrated value)")
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
        if not 0 <= k < base.config.num_layers:
            raise UsageError(f"--ks {k}: the reuses need 0 <= k < l = {base.config.num_layers}")
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
        # The first upper block's arrays exist for 0 < k < l only.
        cache = build_scheme_cache(work / "caches" / f"k{k}", index, loaded, FLOAT32, k > 0,
                                   args.batch_size)
        reference, reference_speed = None, None
        for chunk, mode in reads:
            flags = MODES[mode]
            print(f"k={k} {mode}, chunk {chunk}: {len(questions)} questions ...",
                  file=sys.stderr)
            reader = OpenDomainReader(index, loaded, cache, top_p=args.top_p,
                                      batch_size=args.batch_size, chunk_size=chunk,
                                      span_score=args.span_score,
                                      pruning=mode_pruning(mode, args), **flags)
            result, walls = timed_passes(reader, questions, args.repeats)
            wall = statistics.median(walls)
            reference = reference or result
            reference_speed = reference_speed or len(questions) / wall
            pruning = reader.pruning and dataclasses.asdict(reader.pruning)
            rows.append(dict(k=k, mode=mode, chunk_size=reader.grid.chunk_size, **flags,
                             pruning=pruning, **read_sizes(result),
                             walls_s=walls, wall_s=wall, questions_per_s=len(questions) / wall,
                             speedup=len(questions) / wall / reference_speed,
                             timings=result.timings,
                             reads_cached_reuse=reader.reads_cached_reuse,
                             **answer_scores(examples, result, args.mu),
                             **compare_answers(reference, result, args.mu)))
    table = markdown(rows, len(questions), args.top_p)
    print(table)
    record = dict(command=" ".join(["python", *sys.argv]), machine=machine_record(),
                  load_before=load_before, load_after=load_average(),
                  checkpoint=args.checkpoint, questions=len(questions), top_p=args.top_p,
                  mu=args.mu, span_score=args.span_score,
                  num_windows=index.settings.num_windows, rows=rows)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out.with_suffix(".json"), json.dumps(record, indent=2, default=str))
    write_atomic(out.with_suffix(".md"), f"`{record['command']}`\n\n" + table)
    return rows


if __name__ == "__main__":
    main()
