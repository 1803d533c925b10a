"""`dil-jax bench`: time a question x passage grid (full model, delayed interaction, HF peer).

QANet and BiDAF (`--suite qanet`, `bidaf`): the whole reader on every pair against the delayed
one (questions and passages encoded once, passages cacheable), side by side; they have one
fixed split, so --ks and --no-reuse do not apply to them.

Writes `<name>.json` (the record), `<name>.md` (tables) and `<name>.png` (speedup vs k) to
`--out`. `benchmarks/speed_grid.py` is the same command as a script.
"""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from dil_jax.commands.arguments import (
    add_compilation_cache_arguments,
    int_list,
    non_negative_int,
    positive_int,
)
from dil_jax.defaults import (
    BENCH_CHAR_SUITES,
    BENCH_DEFAULT_LENGTHS,
    BENCH_SUITE_GRIDS,
    BENCH_SUITE_LENGTHS,
    BENCH_SUITES,
)

log = logging.getLogger(__name__)

DEFAULT_SUITES = ("minilm", "bert-base")
# Other processes keeping this many cores busy on average mark the run as shared.
SHARED_THRESHOLD_CORES = 0.2


def _stem(text: str) -> str:
    """A file stem: the outputs are --out/STEM.{json,md,png}, so no folder part."""
    if not text or text in (".", "..") or "/" in text or "\\" in text:
        raise argparse.ArgumentTypeError(f"must be a file name without a folder, got {text!r}")
    return text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The benchmark's flags (shared by the CLI and benchmarks/speed_grid.py)."""
    parser.add_argument("--suite", action="append", choices=BENCH_SUITES, dest="suites",
                        help=f"model to time, repeatable (default: {', '.join(DEFAULT_SUITES)})")
    def per_suite(index: int) -> str:
        return ", ".join(f"{name} {grid[index]}" for name, grid in BENCH_SUITE_GRIDS.items())

    parser.add_argument("--questions", type=positive_int,
                        help=f"q, questions in the grid (default per suite: {per_suite(0)})")
    parser.add_argument("--passages", type=positive_int,
                        help=f"p, passages in the grid (default per suite: {per_suite(1)})")
    parser.add_argument("--paper", action="store_true",
                        help="the paper's grid, q = p = 100 (hours on 2 CPU cores)")
    def per_suite_len(index: int) -> str:
        return ", ".join(f"{name} {lengths[index]}"
                         for name, lengths in BENCH_SUITE_LENGTHS.items())

    parser.add_argument("--question-len", type=positive_int,
                        help=f"padded `[CLS] q [SEP]` tokens (default {BENCH_DEFAULT_LENGTHS[0]};"
                             f" {per_suite_len(0)})")
    parser.add_argument("--passage-len", type=positive_int,
                        help=f"padded `p [SEP]` tokens (default {BENCH_DEFAULT_LENGTHS[1]}; "
                             f"{per_suite_len(1)})")
    parser.add_argument("--ks", type=int_list(non_negative_int),
                        help="splits k to time besides the full model, e.g. 8,10,11 "
                             "(default l-2,l-1; not for the QANet / BiDAF suites)")
    parser.add_argument("--repeats", type=positive_int, default=3, help="timed passes (median)")
    parser.add_argument("--chunk-size", type=positive_int,
                        help=f"pairs per program call (default per suite: {per_suite(2)})")
    parser.add_argument("--batch-size", type=positive_int, help="segments per lower-block call "
                        f"(default per suite: {per_suite(3)})")
    parser.add_argument("--no-hf", action="store_true", help="skip the PyTorch peer")
    parser.add_argument("--no-reuse", dest="reuse", action="store_false",
                        help="time the reference pair program: without the exact reuses (the "
                             "last block on every row, the first upper block's passage "
                             "attention in every pair; docs/architecture.md; not for the "
                             "QANet / BiDAF suites)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"),
                        help="output folder")
    parser.add_argument("--name", type=_stem, default="speed_grid", help="output file stem")
    parser.add_argument("--seed", type=non_negative_int, default=0, help="random ids and weights")
    parser.add_argument("--no-retain-memory", dest="retain_memory", action="store_false",
                        help="leave glibc's malloc as it is (by default freed memory is kept for "
                             "reuse so that calls do not re-fault their temporaries; see "
                             "dil_jax.bench.machine.retain_freed_memory)")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "bench", help="time a question x passage grid: full model, delayed interaction, HF peer",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    add_compilation_cache_arguments(parser)
    parser.set_defaults(func=run)


def check_suite_flags(args: argparse.Namespace) -> None:
    """UsageError for a flag that no chosen suite takes: --ks and --no-reuse are the BERT
    family's (QANet and BiDAF have one fixed split and no reuse plan); and for a question length
    QANet / BiDAF refuse (their config's max_question_len). Before any model."""
    from dil_jax.errors import UsageError
    from dil_jax.options import OPTIONS

    names = args.suites or DEFAULT_SUITES
    wanted = OPTIONS["max_question_len"](args.question_len)
    if args.question_len is not None and wanted and any(n in BENCH_CHAR_SUITES for n in names):
        raise UsageError(f"--question-len {args.question_len}: QANet / BiDAF read "
                         f"`[CLS] q [SEP]` segments of {wanted} tokens")
    if all(name in BENCH_CHAR_SUITES for name in names):
        chosen = ", ".join(names)
        if args.ks is not None:
            raise UsageError(f"--ks: suite {chosen} has no split k (QANet / BiDAF: one fixed "
                             "split, timed as whole vs delayed); --ks is for the BERT-family "
                             "suites")
        if not args.reuse:
            raise UsageError(f"--no-reuse: suite {chosen} has no pair-program reuses to turn "
                             "off; --no-reuse is for the BERT-family suites")


def build_suites(args: argparse.Namespace) -> list[Any]:
    """SuiteSpecs (CharSuiteSpecs for QANet / BiDAF) from the flags, each suite's defaults
    filling what was not given."""
    from dil_jax import bench
    from dil_jax.errors import UsageError

    suites = []
    for name in args.suites or DEFAULT_SUITES:
        questions, passages, chunk, batch = bench.SUITE_GRIDS[name]
        q_len, p_len = BENCH_SUITE_LENGTHS.get(name, BENCH_DEFAULT_LENGTHS)
        if args.paper:
            questions = passages = 100
        grid = bench.GridSpec(args.questions or questions, args.passages or passages,
                              args.question_len or q_len, args.passage_len or p_len)
        if name in BENCH_CHAR_SUITES:
            reader, weights = bench.char_suite_model(name, grid.question_len, args.seed)
            suites.append(bench.CharSuiteSpec(
                name=name, reader=reader, grid=grid, weights=weights,
                repeats=args.repeats, batch_size=args.batch_size or batch,
                chunk_size=args.chunk_size or chunk, seed=args.seed))
            continue
        reader, weights = bench.suite_model(name, grid.question_len, args.seed)
        config = reader.config
        ks = args.ks or bench.default_ks(config.num_layers)
        bad = [k for k in ks if not 0 <= k < config.num_layers]
        if bad:
            l = config.num_layers  # noqa: E741 (the paper's name)
            raise UsageError(f"--ks {','.join(map(str, bad))}: out of range for suite {name} "
                             f"(l = {l} blocks, so k in 0..{l - 1})")
        suites.append(bench.SuiteSpec(
            name=name, reader=reader, grid=grid, ks=tuple(ks), weights=weights,
            repeats=args.repeats, batch_size=args.batch_size or batch,
            chunk_size=args.chunk_size or chunk, with_hf=not args.no_hf, seed=args.seed,
            reuse=args.reuse))
    return suites


def run(args: argparse.Namespace) -> int:
    """Runs every suite, writes the JSON, Markdown and PNG, prints the Markdown."""
    from dil_jax import bench
    from dil_jax.atomic import check_output_folder, write_atomic
    from dil_jax.bench import report
    from dil_jax.compilation_cache import active_folder
    from dil_jax.errors import UsageError

    if args.repeats < 1:  # argparse checks it; benchmarks/speed_grid.py's callers may not
        raise UsageError(f"--repeats must be >= 1, got {args.repeats}")
    check_suite_flags(args)
    # Minutes to hours of timing must not end in an unwritable --out.
    check_output_folder(args.out, "--out",
                        files=[f"{args.name}{suffix}" for suffix in (".json", ".md", ".png")])
    # Before any suite builds its models: the allocator setting must precede XLA's first call.
    retained = args.retain_memory and bench.retain_freed_memory()
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    load_before, cpu_before, start = bench.load_average(), bench.cpu_snapshot(), time.time()
    suites = [bench.run_char_suite(suite, log.info) if isinstance(suite, bench.CharSuiteSpec)
              else bench.run_suite(suite, log.info) for suite in build_suites(args)]
    wall = time.time() - start
    others = bench.others_cpu_share(cpu_before, bench.cpu_snapshot(), wall)
    record = {
        "command": " ".join(shlex.quote(a) for a in sys.argv) or "dil-jax bench",
        "started": started, "wall_s": wall, "machine": bench.machine_record(),
        "threads": suites[0]["threads"], "load_before": load_before,
        "load_after": bench.load_average(), "others_cpu_cores": others,
        "shared": others is not None and others > SHARED_THRESHOLD_CORES,
        "malloc": ("glibc, freed memory retained (mallopt arena_max=1, mmap_max=0, "
                   "trim_threshold=2 GiB)") if retained else "as the process found it",
        "suites": suites,
        "compilation_cache": active_folder(),
    }
    stem = args.out / args.name
    bench.write_json(record, stem.with_suffix(".json"))
    markdown = report.render_markdown(record)
    write_atomic(stem.with_suffix(".md"), markdown)
    try:
        report.plot_speedups(record, stem.with_suffix(".png"))
    except ImportError:
        log.warning("matplotlib is not installed (pip install 'dil_jax[bench]'); no plot")
    print(markdown)
    log.info("wrote %s.{json,md,png}", stem)
    return 0
