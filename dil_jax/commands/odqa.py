"""Open-domain QA commands that read an index: `ask`, `odqa-eval` (`index` builds it).

    dil-jax ask "Who wrote Pride and Prejudice?" --index runs/index --k 4
    dil-jax ask --index runs/index --k 4 --interactive
    dil-jax odqa-eval --index runs/index --data FILE --k 0 4 --p 29 100 --limit 200
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from dil_jax.commands.arguments import (
    NO_REUSE_HELP,
    add_compilation_cache_arguments,
    add_matmul_argument,
    add_pruning_argument,
    add_reader_arguments,
    add_reading_arguments,
    ask_request,
    cache_storage,
    check_checkpoint_count,
    checked_first,
    local_paths,
    non_negative_int,
    positive_int,
    reader_requests,
    unit_interval,
)
from dil_jax.errors import UsageError

log = logging.getLogger(__name__)

# A reader with sentence prescreening is reported as "<reader> + prescreen <rule>". Results and
# progress files written before named it "<reader> + SEP <rule>" (the seed paper's acronym);
# `odqa-eval` takes such a progress file over under the new name and resumes it.
PRESCREEN_LABEL = "prescreen"
EARLIER_PRESCREEN_LABEL = "SEP"
# A reader with window pruning is reported as "<reader> + prune <rule>" ("stop", "stop:5").
PRUNE_LABEL = "prune"


def _reader_prescreen(args, index):
    """The ReaderPrescreen of --prescreen/--top-m/--mass, or None."""
    from dil_jax.commands.arguments import prescreen_from_args
    from dil_jax.open_domain.index.sentences import SentenceStore
    from dil_jax.open_domain.reader import ReaderPrescreen

    prescreen = prescreen_from_args(args)
    if prescreen is None:
        return None
    return ReaderPrescreen(*prescreen, SentenceStore.open(index, prescreen[0]))


def _check_ask_flags(args: argparse.Namespace) -> None:
    from dil_jax.tokenization import lone_surrogate, surrogate_problem

    if not args.question and not args.interactive:
        raise UsageError("give a question (ask \"...\" --index DIR), or --interactive")
    if args.server is not None:
        _check_server_flags(args)
    elif args.index is None:
        raise UsageError("give --index DIR (read with a reader loaded here) or --server URL "
                         "(ask a running `dil-jax serve`)")
    # A byte of the argument that is not UTF-8 arrives as a lone surrogate: name it before the
    # index and the model are loaded, not as a tokenizer's TypeError after.
    if args.question and (index := lone_surrogate(args.question)) is not None:
        raise UsageError(f"the question {args.question!r}: "
                         f"{surrogate_problem(args.question, index)}")


def _check_server_flags(args: argparse.Namespace) -> None:
    """ask --server reads on the server: a flag choosing what to load here is refused (naming
    it), not silently dropped."""
    from dil_jax.client import check_server_url

    check_server_url(args.server)
    local = [flag for flag, value in (("--index", args.index),
                                      ("--checkpoint", args.checkpoint),
                                      ("--tokenizer", args.tokenizer),
                                      ("--cache-dtype", args.storage),
                                      ("--prescreen", args.prescreen)) if value is not None]
    local += ["--no-cached-reuse"] if args.no_cached_reuse else []
    local += [f"--prune-windows {args.prune_windows.label}"] if args.prune_windows else []
    if local:
        raise UsageError(f"--server {args.server} reads with the server's index and readers: "
                         f"leave out {', '.join(local)}")


def _check_evaluate_flags(args: argparse.Namespace) -> None:
    from dil_jax.atomic import check_output_folder
    from dil_jax.commands.arguments import require_file

    check_checkpoint_count(args)
    require_file(args.data, "--data", "SQuAD file")
    if args.out is not None:
        check_output_folder(args.out, "--out",
                            {"--data": args.data, "--index": args.index,
                             "--checkpoint": local_paths(args.checkpoint)},
                            files=("results.md", "results.json"))


def register(subparsers) -> None:
    ask = subparsers.add_parser("ask", help="answer a question from an index")
    ask.add_argument("question", nargs="?", help="the question (omit with --interactive)")
    ask.add_argument("--index", default=None,
                     help="index folder (dil-jax index --out); required unless --server "
                          "(default: none)")
    ask.add_argument("--server", default=None, metavar="URL",
                     help="ask a running `dil-jax serve` at URL instead of loading a reader "
                          "here (same output; --k picks the server's reader of that split, "
                          "--top-p, --no-fusion and --span-score go with each question; an "
                          "API key from DIL_JAX_API_KEY; default: none, read here)")
    ask.add_argument("--top-p", type=positive_int, default=29,
                     help="passages read per question; 29 is the depth of the open-domain "
                          "protocol (odqa-eval's first --p, docs/open_domain.md), so an "
                          "answer here is read as there (dil-jax demo reads 10: its "
                          "batch-of-one timings stay short on a CPU)")
    ask.add_argument("--mu", type=unit_interval, default=0.5,
                     help="fusion weight of the reader score (1 = reader alone)")
    ask.add_argument("--no-fusion", action="store_true", help="rank by the reader score alone")
    ask.add_argument("--interactive", action="store_true", help="read questions from stdin")
    ask.add_argument("--cache-dtype", dest="storage", type=cache_storage, default=None,
                     metavar="STORAGE",
                     help="the storage the index's cache was built with (default: read from "
                          "the cache; naming one refuses a cache stored otherwise)")
    ask.add_argument("--no-cached-reuse", action="store_true", help=NO_REUSE_HELP)
    add_reader_arguments(ask, many_k=False)
    add_reading_arguments(ask, " (the index needs its sentence embeddings: dil-jax index "
                               "--prescreen)")
    add_pruning_argument(ask, "; settled for the fusion ask answers with (--mu, or the reader "
                              "alone with --no-fusion)")
    add_matmul_argument(ask)
    add_compilation_cache_arguments(ask)
    ask.set_defaults(func=checked_first(_check_ask_flags, run_ask))

    evaluate = subparsers.add_parser(
        "odqa-eval", help="open-domain evaluation (R, EM/F1 with and without IR score)")
    evaluate.add_argument("--index", required=True,
                          help="index folder (dil-jax index --out)")
    evaluate.add_argument("--data", required=True, help="SQuAD v1.1 JSON (questions, answers)")
    evaluate.add_argument("--articles", default=":",
                          help="slice of the file's articles to take questions from, e.g. "
                               "28:35 (the validation articles of the training configs)")
    evaluate.add_argument("--limit", type=positive_int, default=None,
                          help="evaluate a random subset of N questions (seeded; default: all)")
    evaluate.add_argument("--seed", type=non_negative_int, default=0,
                          help="seed of the --limit subset")
    evaluate.add_argument("--p", type=positive_int, nargs="+", default=[29, 100],
                          help="retrieval depths to score (passages read per question): the "
                               "protocol's 29 and 100, read once at the largest (ask reads "
                               "29; dil-jax demo 10, to stay quick)")
    evaluate.add_argument("--mu", type=unit_interval, default=0.5,
                          help="fusion weight of the reader score (1 = reader alone)")
    evaluate.add_argument("--out", default=None,
                          help="write results.md and results.json here, resumable (default: "
                               "print only)")
    evaluate.add_argument("--cache-dtype", dest="storage", type=cache_storage, default=None,
                          metavar="STORAGE",
                          help="the storage the index's cache was built with (default: read "
                               "from the cache)")
    evaluate.add_argument("--no-cached-reuse", action="store_true", help=NO_REUSE_HELP)
    add_reader_arguments(evaluate, many_k=True)
    add_reading_arguments(evaluate, "; each reader is then evaluated without and with it")
    add_pruning_argument(evaluate, "; each reader is then evaluated without and with it, the "
                                   "pruned read settled for --mu at the largest --p (the other "
                                   "columns and depths are what that read gives)")
    add_matmul_argument(evaluate)
    add_compilation_cache_arguments(evaluate)
    evaluate.set_defaults(func=checked_first(_check_evaluate_flags, run_evaluate))


def _open_reader(args, request, top_p, prescreen: bool = True, pruning=None,
                 mu: float | None = None):
    """The `OpenDomainReader` of `request` (a `ReaderRequest`) over --index and its cache, with
    the --prune-windows setting `pruning` (`pruning.PruningSetting`) settled for `mu`."""
    from dil_jax.open_domain.cache.store import CacheMismatchError
    from dil_jax.open_domain.index.folder import open_index
    from dil_jax.open_domain.reader import OpenDomainReader
    from dil_jax.readers.request import load_requested

    # The index first: it is cheap to open and names its own problems (a retriever whose
    # engine cannot run here, e.g. Lucene without Java) before the reader's load.
    index = open_index(args.index)
    reader = load_requested(request)
    try:
        cache = index.open_cache(reader, args.storage)
    except CacheMismatchError as error:
        missing = _missing_cache(args, index, reader)
        if missing is None:  # a cache is there but does not fit: its own message says how
            raise
        raise missing from error
    opened = OpenDomainReader(index, reader, cache, top_p=top_p,
                              batch_size=args.batch_size,
                              prescreen=_reader_prescreen(args, index) if prescreen else None,
                              cached_reuse=not args.no_cached_reuse, span_score=args.span_score)
    _chunk_size(opened, args.chunk_size)
    return _pruned(opened, pruning, request.checkpoint, mu)


def _chunk_size(reader, setting) -> None:
    """Sets the reader's pairs per chunk from --chunk-size (`chunk_size.resolve_chunk_size`:
    N, 'auto', 'measure', or None: the record's, else the platform's); a measurement is
    said on stderr (it takes seconds)."""
    from dil_jax.open_domain.chunk_size import MEASURED, resolve_chunk_size

    choice = resolve_chunk_size(setting, reader, say=lambda line: print(line, file=sys.stderr))
    if choice.source == MEASURED:
        print(f"pairs per chunk for {reader.reader.label}: {choice.reason}", file=sys.stderr)


def _pruned(reader, setting, checkpoint, mu: float | None):
    """`reader` with the --prune-windows `setting` (`pruning.with_setting`: "calibrated" reads
    the calibration recorded in `checkpoint`'s manifest) settled for fusion weight `mu`; a
    reader that cannot prune (no bound on its span scores) is refused naming --prune-windows,
    unless the setting is "calibrated" (it then reads every window)."""
    from dil_jax.open_domain.pruning import (
        Calibrated,
        WindowPruningError,
        calibration_of,
        with_setting,
    )

    if setting is None:
        return reader
    calibration = calibration_of(checkpoint) if isinstance(setting, Calibrated) else None
    try:
        pruned, why = with_setting(reader, setting, calibration, mu)
    except WindowPruningError as error:
        raise UsageError(f"--prune-windows {setting.label}: {error}") from None
    if isinstance(setting, Calibrated):
        shown = pruned.pruning.label if pruned.pruning is not None else "all"
        print(f"window pruning: {shown} for {reader.reader.label} ({why})", file=sys.stderr)
    return pruned


def _missing_cache(args, index, reader):
    """A MissingCacheError listing the index's caches and the command that builds this
    reader's, when the index has no cache folder for it; None when it has one (then the
    original error, about what does not match, stands)."""
    from dil_jax.open_domain.cache.missing import (
        THIS_READER,
        MissingCacheError,
        build_command,
        index_caches,
        missing_cache_message,
    )
    storage = index.storage_to_build(reader, args.storage)  # what `index` would build
    key = index.cache_key(reader, storage)
    folder = index.cache_dir(key)
    # A cache in the index's store (`dil-jax index --cache-store`) is there too.
    if folder.exists() or index.cache_location(key).exists("manifest.json"):
        return None
    checkpoint = reader.checkpoint.name
    k = reader.config.num_lower_layers
    settings = index.settings
    command = build_command(str(args.index), settings.split, settings.max_passage_len,
                            settings.doc_stride, checkpoint, k, storage, args.tokenizer)
    partial = folder.with_name(f".{folder.name}.partial").exists()
    return MissingCacheError(missing_cache_message(
        str(args.index), folder.name, checkpoint, k, storage,
        index_caches(index.directory), {key.model: THIS_READER}, command, partial))


def _asked(args: argparse.Namespace):
    """The questions of `ask`: the one given, or stdin's lines up to an empty one."""
    if not args.interactive:
        return iter([args.question])
    print("Ask a question (empty line or Ctrl-D to quit).", file=sys.stderr)
    return iter(lambda: sys.stdin.readline().strip(), "")


def run_ask(args: argparse.Namespace) -> int:
    from dil_jax.open_domain.abstention import abstention_of
    from dil_jax.open_domain.reader import format_answer

    mu = None if args.no_fusion else args.mu
    if args.server is not None:
        from dil_jax.client import AskOptions, ask_server

        return ask_server(args.server, _asked(args),
                          AskOptions(p=args.top_p, k=args.k, mu=mu, span_score=args.span_score))
    request = ask_request(args)
    reader = _open_reader(args, request, args.top_p, pruning=args.prune_windows, mu=mu)
    abstention = abstention_of(request.checkpoint)
    for number, question in enumerate(_asked(args)):
        if number == 0:  # seconds of silence otherwise, on a small CPU
            print(f"reading {reader.top_p} passages (the first question compiles the reader's "
                  "programs, or reads them from the compilation cache) ...", file=sys.stderr,
                  flush=True)
        result = reader.read([question])
        print(format_answer(reader, question, result.candidates[0], result.hits[0],
                            result.timings, mu, abstention))
        sys.stdout.flush()
    return 0


def _slug(name: str) -> str:
    """A reader's name as a file name: "DIL k=4" -> "dil_k4"."""
    return "".join(c if c.isalnum() else "_" for c in name.lower().replace("=", "")).strip("_")


def _progress_of(args: argparse.Namespace, name: str, settings: dict):
    """The progress file of reader `name` under --out, one written under the reader's earlier
    name (`EARLIER_PRESCREEN_LABEL`) taken over first."""
    from dil_jax.open_domain.evaluate import EvaluationProgress, adopt_renamed_progress

    path = Path(args.out) / "progress" / f"{_slug(name)}.jsonl"
    earlier = name.replace(f" + {PRESCREEN_LABEL} ", f" + {EARLIER_PRESCREEN_LABEL} ")
    if earlier != name:
        adopt_renamed_progress(path, path.with_name(f"{_slug(earlier)}.jsonl"),
                               {"reader": (earlier, name)})
    return EvaluationProgress(path, settings)


def _evaluation_settings(args: argparse.Namespace, name: str, k: int, checkpoint: str,
                         questions: int, storage: str, pruned: bool = False,
                         matmul_dtype: str = "float32") -> dict:
    """What decides an evaluation's per-question results (`checkpoint`: the reader's, as its
    request resolved it): a progress file made under other settings is refused rather than
    mixed in (batch and chunk sizes only change the rounding). A pruned read also depends on
    the span score rule it settles (`pruned`: recorded then only, so that the progress files of
    unpruned readers written before stay valid), and so does a reader's matmul dtype other than
    float32 (the one `--matmul-dtype` resolved to)."""
    pruning = dict(span_score=args.span_score) if pruned else {}
    if matmul_dtype != "float32":
        pruning["matmul_dtype"] = matmul_dtype
    return dict(reader=name, **pruning, data=os.path.abspath(args.data), articles=args.articles,
                limit=args.limit, seed=args.seed, questions=questions,
                index=os.path.abspath(args.index), checkpoint=checkpoint,
                tokenizer=args.tokenizer, k=k, p=sorted(args.p), mu=args.mu,
                max_question_len=args.max_question_len,
                # Its name as progress files have recorded it (a file is refused on a change).
                # The storage of the cache read (--cache-dtype, else the cache's own).
                cache_dtype=storage,
                prescreen=str((args.prescreen, args.top_m, args.mass)))


def run_evaluate(args: argparse.Namespace) -> int:
    import numpy as np

    from dil_jax.data.squad import load_squad, select_articles
    from dil_jax.open_domain.evaluate import dump_json, evaluate_reader, markdown_table
    from dil_jax.progress import CountBar

    requests = reader_requests(args)
    examples = [e for e in select_articles(load_squad(args.data).examples, args.articles)
                if e.answer_texts]
    if args.limit is not None and args.limit < len(examples):
        chosen = np.random.default_rng(args.seed).choice(len(examples), args.limit,
                                                         replace=False)
        examples = [examples[i] for i in sorted(chosen)]
    results = {}
    for k, request in zip(args.k, requests, strict=True):
        base = _open_reader(args, request, max(args.p), prescreen=False)
        matmul = base.reader.matmul_dtype
        # A reader read with rounded matmul operands is named so in the tables.
        readers = {base.reader.label + ("" if matmul == "float32" else f" ({matmul} matmuls)"):
                   base}
        if args.prescreen:
            screened = base.with_prescreen(_reader_prescreen(args, base.index))
            readers[f"{next(iter(readers))} + {PRESCREEN_LABEL} {screened.prescreen.rule}"] = (
                screened)
        if args.prune_windows:
            for name, reader in list(readers.items()):
                pruned = _pruned(reader, args.prune_windows, request.checkpoint, args.mu)
                if pruned.pruning is not None:  # "calibrated" may leave a reader unpruned
                    readers[f"{name} + {PRUNE_LABEL} {pruned.pruning.label}"] = pruned
        for name, reader in readers.items():
            print(f"reading {len(examples)} questions x {max(args.p)} passages with {name} "
                  "(its first block of questions pays the compilation) ...", file=sys.stderr)
            progress = None
            if args.out:
                # Resumable: each finished block of questions is kept under --out, and a rerun
                # of the same command reads only the rest.
                progress = _progress_of(
                    args, name, _evaluation_settings(args, name, k, request.checkpoint,
                                                     len(examples), reader.cache.storage.name,
                                                     pruned=reader.pruning is not None,
                                                     matmul_dtype=reader.reader.matmul_dtype))
                if progress.done:
                    print(f"  resuming: {len(progress.done)} questions already read "
                          f"({progress.path})", file=sys.stderr)
            already = len(progress.done) if progress is not None else 0
            with CountBar(name, len(examples), "question", initial=already) as bar:
                bar(already)  # the bar from the start, not after the first block
                results[name] = evaluate_reader(reader, examples, args.p, args.mu,
                                                progress=progress, on_block=bar)
    table = markdown_table(results)
    print(table)
    if args.out:
        import jax

        from dil_jax.atomic import write_atomic

        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        extra = dict(command=" ".join(["dil-jax", *sys.argv[1:]]), data=args.data,
                     articles=args.articles,
                     index=args.index,
                     # As given (one for all k, or one per k), else the bundled one per k.
                     checkpoint=(args.checkpoint if args.checkpoint is not None
                                 else [request.checkpoint for request in requests]),
                     questions=len(examples), seed=args.seed,
                     device=str(jax.devices()[0].device_kind), cpu_count=os.cpu_count(),
                     jax=jax.__version__)
        for name, text in (("results.md", table + "\n"),
                           ("results.json", dump_json(results, extra))):
            write_atomic(out / name, text)
        print(f"wrote {out / 'results.md'} and {out / 'results.json'}", file=sys.stderr)
    return 0
