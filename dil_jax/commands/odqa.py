"""Open-domain QA commands: `index`, `ask`, `odqa-eval`.

    dil-jax index --out runs/index --corpus wikipedia --corpus squad:FILE --k 0 4
    dil-jax index ... --num-processes 2 --process-id I --coordinator-address host:1234
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
    _NO_REUSE_HELP,
    _STORAGE_HELP,
    _check_checkpoint_count,
    _checked_first,
    _local_paths,
    _reader_args,
    add_compilation_cache_arguments,
    add_reading_arguments,
    cache_storage,
    non_negative_int,
    positive_int,
    unit_interval,
    window_len,
)
from dil_jax.defaults import (
    AUTO_BM25S_FROM,
    OPEN_DOMAIN_DOC_STRIDE,
    OPEN_DOMAIN_MAX_PASSAGE_LEN,
    RETRIEVER_ENGINES,
)
from dil_jax.errors import UsageError

log = logging.getLogger(__name__)


def _reader_prescreen(args, index):
    """The ReaderPrescreen of --prescreen/--top-m/--mass, or None."""
    from dil_jax.commands.arguments import prescreen_from_args
    from dil_jax.open_domain.reader import ReaderPrescreen
    from dil_jax.open_domain.sentences import SentenceStore

    prescreen = prescreen_from_args(args)
    if prescreen is None:
        return None
    return ReaderPrescreen(*prescreen, SentenceStore.open(index, prescreen[0]))


def _check_process_flags(args: argparse.Namespace) -> None:
    """--num-processes / --process-id / --coordinator-address / --distributed go together as
    the help says; refused (naming the flag and value) before anything is loaded."""
    if (args.num_processes is None) != (args.process_id is None):
        raise UsageError("--num-processes and --process-id go together (this process's shard "
                         f"of how many): got --num-processes {args.num_processes}, --process-id "
                         f"{args.process_id}")
    if args.num_processes is not None and args.process_id >= args.num_processes:
        raise UsageError(f"--process-id {args.process_id}: must be below --num-processes "
                         f"{args.num_processes} (processes are numbered from 0)")
    if args.distributed and args.num_processes is not None:
        raise UsageError("--distributed finds the process count and id itself (a Cloud TPU "
                         "pod): leave out --num-processes, --process-id and "
                         "--coordinator-address")
    if args.coordinator_address is not None:
        if args.num_processes is None:
            raise UsageError(f"--coordinator-address {args.coordinator_address}: give "
                             "--num-processes and --process-id too")
        host, _, port = args.coordinator_address.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise UsageError(f"--coordinator-address {args.coordinator_address!r}: expected "
                             "HOST:PORT, e.g. localhost:1234")


def _build_process(args: argparse.Namespace):
    """The BuildProcess of the flags; starts jax.distributed when asked (--distributed,
    --coordinator-address), through the trainer's helper, before any other JAX call."""
    import jax
    import ml_collections

    from dil_jax.open_domain.build import BuildProcess
    from dil_jax.train.setup import maybe_initialize_distributed

    distributed = args.distributed or args.coordinator_address is not None
    maybe_initialize_distributed(ml_collections.ConfigDict(dict(
        initialize=distributed, coordinator_address=args.coordinator_address,
        num_processes=args.num_processes, process_id=args.process_id,
        num_cpu_devices=args.num_cpu_devices)))
    if distributed:
        index, count = jax.process_index(), jax.process_count()
    else:  # independent processes (they meet only in --out), or just one
        index, count = args.process_id or 0, args.num_processes or 1
    if count > 1:
        print(f"process {index} of {count}: shard {index} of each cache on "
              f"{jax.local_device_count()} local device(s) ({jax.local_devices()[0].platform})",
              file=sys.stderr, flush=True)
    return BuildProcess(index, count, float(args.wait_timeout))


def _check_index_flags(args: argparse.Namespace) -> None:
    from dil_jax.atomic import check_output_folder
    from dil_jax.commands.arguments import check_window_flags
    from dil_jax.open_domain.corpus import parse_source
    from dil_jax.open_domain.retrieval import check_engine_available

    if args.verify:
        if args.corpus:
            raise UsageError("--verify checks the index in --out as it was built: give it no "
                             "--corpus (or drop --verify to build)")
        return
    if not args.corpus:
        raise UsageError("--corpus is required to build an index (or give --verify to check "
                         "the one in --out)")
    for spec in args.corpus:  # an unknown source type is named now, not after the models load
        parse_source(spec)
    if args.retriever not in (None, "auto"):  # a missing engine or Java: now, not mid-build
        check_engine_available(args.retriever)
    _check_process_flags(args)
    check_window_flags(args.max_passage_len, args.doc_stride)
    _check_checkpoint_count(args)
    corpus_files = [spec.split(":", 1)[1] for spec in args.corpus
                    if spec.split(":", 1)[0] in ("squad", "jsonl") and ":" in spec]
    # The index is built in place under its lock (dil_jax.open_domain.index), which refuses a folder
    # holding anything an index build did not write; here only what needs no model: the
    # folder can be written and is none of the inputs.
    check_output_folder(args.out, "--out",
                        {"--corpus": corpus_files, "--checkpoint": _local_paths(args.checkpoint),
                         "--tokenizer": args.tokenizer,
                         "--prescreen": _local_paths(args.prescreen)})


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
                                      ("--prescreen", args.prescreen)) if value is not None]
    local += ["--no-cached-reuse"] if args.no_cached_reuse else []
    if local:
        raise UsageError(f"--server {args.server} reads with the server's index and readers: "
                         f"leave out {', '.join(local)}")


def _check_evaluate_flags(args: argparse.Namespace) -> None:
    from dil_jax.atomic import check_output_folder
    from dil_jax.commands.arguments import require_file

    _check_checkpoint_count(args)
    require_file(args.data, "--data", "SQuAD file")
    if args.out is not None:
        check_output_folder(args.out, "--out",
                            {"--data": args.data, "--index": args.index,
                             "--checkpoint": _local_paths(args.checkpoint)},
                            files=("results.md", "results.json"))


def register(subparsers) -> None:
    index = subparsers.add_parser(
        "index", help="split a corpus, build BM25 and the passage caches",
        description="Splits documents into passages, builds the BM25 index and, for each k, the "
                    "cache of passage lower states (resumable; rerun to continue).")
    index.add_argument("--out", required=True, help="index folder")
    index.add_argument("--corpus", action="append", default=None,
                       help="source (repeatable): wikipedia, squad:PATH or jsonl:PATH "
                            "(required unless --verify; default: none)")
    index.add_argument("--verify", action="store_true",
                       help="build nothing: check every byte of the index in --out and of its "
                            "passage caches against the digests recorded at build time, "
                            "listing each file that differs (exit status 1); opening an index "
                            "checks the caches only cheaply (docs/open_domain.md, \"Integrity "
                            "checks\")")
    index.add_argument("--corpus-limit", type=positive_int, default=None,
                       help="only the first N documents of each source (default: all)")
    index.add_argument("--split", choices=["paragraphs", "windows"], default="paragraphs",
                       help="passages: paragraphs (split at blank lines) or 100-word windows "
                            "every 50 words")
    index.add_argument("--max-passage-len", type=window_len,
                       default=OPEN_DOMAIN_MAX_PASSAGE_LEN,
                       help="tokens of `passage [SEP]` per cached window (predict's 384 would "
                            "make each cached window twice as large); longer passages get "
                            "several windows")
    index.add_argument("--doc-stride", type=positive_int, default=OPEN_DOMAIN_DOC_STRIDE,
                       help="tokens between window starts (< --max-passage-len)")
    index.add_argument("--cache-dtype", dest="storage", type=cache_storage, default="float32",
                       metavar="STORAGE", help=_STORAGE_HELP)
    index.add_argument("--cache-reuse", action="store_true",
                       help="also store each window's first-upper-block q/k/v and attention "
                            "statistics (0 < k < l): less work per pair, about 4x the "
                            "states' disk (pca<d>: these are int8; docs/open_domain.md)")
    index.add_argument("--retriever", choices=("auto",) + RETRIEVER_ENGINES, default=None,
                       help="BM25 engine: rank-bm25 (small corpora), bm25s (memory-mapped, "
                            "large corpora), pyserini (Lucene, the paper's; needs Java), "
                            f"auto = bm25s from {AUTO_BM25S_FROM:,} passages, else rank-bm25 "
                            "(docs/open_domain.md, \"Retrievers\"); default: the engine of "
                            "the index in --out, else auto")
    index.add_argument("--cache-chunk", type=positive_int, default=256, metavar="WINDOWS",
                       help="windows encoded per step and written per progress record: the "
                            "grid shards are cut on (every process must give the same)")
    shards = index.add_argument_group(
        "several processes (docs/open_domain.md, \"The passage cache across hosts\")",
        "Each process encodes its own shard of every passage cache on its own devices; "
        "process 0 also builds the index and writes each cache's manifest, last. --out must be "
        "a folder every process sees.")
    shards.add_argument("--num-processes", type=positive_int, default=None,
                        help="processes building the caches together (one shard each; default: one "
                             "process)")
    shards.add_argument("--process-id", type=non_negative_int, default=None,
                        help="this process's number, 0 .. --num-processes - 1 (default: the "
                             "only one, 0)")
    shards.add_argument("--coordinator-address", default=None, metavar="HOST:PORT",
                        help="start jax.distributed with process 0's address (without it the "
                             "processes run independently: the build needs no collective; default)")
    shards.add_argument("--distributed", action="store_true",
                        help="jax.distributed.initialize() with no arguments: on a Cloud TPU "
                             "pod it finds the processes itself (launch/tpu_pod.py index)")
    shards.add_argument("--num-cpu-devices", type=non_negative_int, default=0,
                        help="force this many CPU devices (testing several devices per "
                             "process on one machine); 0 = as JAX finds them")
    shards.add_argument("--wait-timeout", type=positive_int, default=86400, metavar="SECONDS",
                        help="how long a process waits for another's work (the index, the "
                             "other shards) before failing")
    _reader_args(index, many_k=True)
    index.add_argument("--prescreen", default=None, metavar="PRESCREENER",
                       help="also store every passage's sentence embeddings for this "
                            "prescreener ('default' = the bundled one, or a folder; default: none "
                            "stored)")
    add_compilation_cache_arguments(index)
    index.set_defaults(func=_checked_first(_check_index_flags, run_index))

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
    ask.add_argument("--cache-dtype", dest="storage", type=cache_storage, default="float32",
                     metavar="STORAGE", help="the storage the index's cache was built with")
    ask.add_argument("--no-cached-reuse", action="store_true", help=_NO_REUSE_HELP)
    _reader_args(ask, many_k=False)
    add_reading_arguments(ask, " (the index needs its sentence embeddings: dil-jax index "
                               "--prescreen)")
    add_compilation_cache_arguments(ask)
    ask.set_defaults(func=_checked_first(_check_ask_flags, run_ask))

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
    evaluate.add_argument("--cache-dtype", dest="storage", type=cache_storage, default="float32",
                          metavar="STORAGE", help="the storage the index's cache was built with")
    evaluate.add_argument("--no-cached-reuse", action="store_true", help=_NO_REUSE_HELP)
    _reader_args(evaluate, many_k=True)
    add_reading_arguments(evaluate, "; each reader is then evaluated without and with it")
    add_compilation_cache_arguments(evaluate)
    evaluate.set_defaults(func=_checked_first(_check_evaluate_flags, run_evaluate))


def _bundled_or_embedded(role: str) -> str:
    """The bundled reader of this role; the raw embedded MiniLM, said loudly, without one."""
    from dil_jax.defaults import bundled_reader

    folder = bundled_reader(role)
    if folder is None:
        log.warning("no bundled %s reader in this install: using the raw embedded MiniLM, "
                    "whose QA head is UNTRAINED; answers are arbitrary spans (pass "
                    "--checkpoint)", role)
        return "default"
    return str(folder)


def _resolve_checkpoints(args: argparse.Namespace) -> None:
    """Replaces --checkpoint's None (not given) by the bundled reader of each k, so that every
    later use (loading, progress records, results.json, error messages) sees one path.

    `ask` without --k reads with the full reader unless the index holds only the delayed
    reader's cache (`default_reader_role`).
    """
    if args.checkpoint is not None:
        return
    from dil_jax.defaults import default_reader_role

    if isinstance(args.k, list):  # index, odqa-eval: one reader per k
        args.checkpoint = [_bundled_or_embedded(default_reader_role(k)) for k in args.k]
        return
    index_ks: set[int] = set()
    delayed_k = None
    if args.k is None:
        from dil_jax.checkpoints.resolved import resolve_reader_checkpoint
        from dil_jax.defaults import bundled_reader
        from dil_jax.open_domain.missing_cache import index_caches

        index_ks = {c.k for c in index_caches(Path(args.index)) if c.k is not None}
        delayed = bundled_reader("delayed")
        delayed_k = (resolve_reader_checkpoint(delayed).trained_k if delayed is not None
                     else None)
    role = default_reader_role(args.k, index_ks, delayed_k)
    args.checkpoint = _bundled_or_embedded(role)
    print(f"reader: the bundled {role} reader ({args.checkpoint})", file=sys.stderr)


def _checkpoint_for(args, position: int) -> str:
    """The checkpoint of the position-th --k (one for all, or one per k)."""
    if isinstance(args.checkpoint, str):
        return args.checkpoint
    if len(args.checkpoint) == 1:
        return args.checkpoint[0]
    return args.checkpoint[position]  # one per k: _check_checkpoint_count ran first


def _load(args, k, position: int = 0):
    from dil_jax.checkpoints import load_reader

    return load_reader(_checkpoint_for(args, position), k, args.max_question_len, args.tokenizer)


# Test hook: exit at once (as a killed process would: no cleanup) after this many chunks of a
# passage cache were written (tests/test_odqa_sharded.py: a killed shard resumes).
EXIT_AFTER_CHUNKS = "DIL_JAX_TEST_EXIT_AFTER_CHUNKS"
_chunks_written = 0


def _exit_hook(step) -> None:
    global _chunks_written
    limit = os.environ.get(EXIT_AFTER_CHUNKS)
    if limit and step.stage.startswith("passage cache") and 0 < step.done < (step.total or 0):
        _chunks_written += 1
        if _chunks_written >= int(limit):
            print(f"{EXIT_AFTER_CHUNKS}={limit}: exiting after {step.done} windows",
                  file=sys.stderr, flush=True)
            os._exit(75)


class _ProgressBars:
    """The `progress` of build_open_domain_index: its notes printed, a tqdm bar per stage."""

    def __init__(self):
        from tqdm.auto import tqdm

        self.tqdm = tqdm
        self.bars = {}

    def __call__(self, step) -> None:
        if step.note:
            print(step.note)
            return
        _exit_hook(step)
        bar = self.bars.get(step.stage)
        if bar is None:
            self.close()  # stages run one after another: the previous one is finished
            unit = "sentence" if step.stage == "sentence embeddings" else "window"
            bar = self.bars[step.stage] = self.tqdm(total=step.total, unit=unit,
                                                    desc=step.stage)
        bar.total = step.total
        bar.update(step.done - bar.n)

    def close(self) -> None:
        for bar in self.bars.values():
            bar.close()
        self.bars = {}


def run_index(args: argparse.Namespace) -> int:
    from dil_jax.open_domain.disk import write_failure

    if args.verify:
        return run_verify(args.out)
    try:
        return _run_build(args)
    except OSError as error:
        # A write not wrapped where it happens (`disk.write_errors`): a full or read-only disk
        # is still one line, naming the file when the error knows it, else --out.
        failure = write_failure(Path(error.filename or args.out), error)
        if failure is None:
            raise
        raise failure from error


def run_verify(out: str) -> int:
    """`index --verify`: every byte of the index in `out` (`open_domain.verify`); each part's
    line on stdout, each differing file on stderr; InputFileError when any differs or could
    not be checked."""
    from dil_jax.errors import InputFileError
    from dil_jax.open_domain.verify import verify_index

    report = verify_index(out)
    for line in report.lines:
        print(line)
    for problem in report.problems:
        print(problem, file=sys.stderr)
    if report.problems:
        raise InputFileError(
            f"{out}: {len(report.problems)} file(s) differ from what the build recorded (listed "
            "above); delete each broken cache folder and rerun `dil-jax index` with the same "
            "--out, settings and its reader to rebuild it (a broken index file: rerun `dil-jax "
            "index` with the same settings to repair it)")
    if report.unchecked:
        raise InputFileError(
            f"{', '.join(str(path) for path in report.unchecked)}: no file digests recorded "
            "(written by an older dil-jax), so not verified; rerun `dil-jax index` with the same "
            "--out, settings and reader to record them, or delete the folder and rerun to "
            "rebuild it")
    return 0


def _run_build(args: argparse.Namespace) -> int:
    from dil_jax.open_domain.index_lock import index_lock

    _resolve_checkpoints(args)
    process = _build_process(args)
    # The lock first: a second build into the same folder fails at once, before loading models.
    with index_lock(args.out, process.index):
        prescreener = None
        if args.prescreen:
            from dil_jax.prescreening.prescreener import SentencePrescreener

            prescreener = SentencePrescreener.load(args.prescreen)
        readers = [_load(args, k, i) for i, k in enumerate(args.k)]
        from dil_jax.open_domain.build import BuildSettings, build_open_domain_index

        settings = BuildSettings(max_passage_len=args.max_passage_len, doc_stride=args.doc_stride,
                                 split=args.split, corpus_limit=args.corpus_limit,
                                 storage=args.storage, cache_reuse=args.cache_reuse,
                                 retriever=args.retriever, chunk_passages=args.cache_chunk)
        bars = _ProgressBars()
        try:
            build_open_domain_index(args.out, args.corpus, readers, settings,
                                    prescreener=prescreener, progress=bars, process=process)
        finally:
            bars.close()
    return 0


def _open_reader(args, k, top_p, position: int = 0, prescreen: bool = True):
    from dil_jax.open_domain.cache import CacheMismatchError
    from dil_jax.open_domain.index import open_index
    from dil_jax.open_domain.reader import OpenDomainReader

    # The index first: it is cheap to open and names its own problems (a retriever whose
    # engine cannot run here, e.g. Lucene without Java) before the reader's load.
    index = open_index(args.index)
    reader = _load(args, k, position)
    try:
        cache = index.open_cache(reader, args.storage)
    except CacheMismatchError as error:
        missing = _missing_cache(args, index, reader)
        if missing is None:  # a cache is there but does not fit: its own message says how
            raise
        raise missing from error
    return OpenDomainReader(index, reader, cache, top_p=top_p,
                            batch_size=args.batch_size, chunk_size=args.chunk_size,
                            prescreen=_reader_prescreen(args, index) if prescreen else None,
                            cached_reuse=not args.no_cached_reuse, span_score=args.span_score)


def _missing_cache(args, index, reader):
    """A MissingCacheError listing the index's caches and the command that builds this
    reader's, when the index has no cache folder for it; None when it has one (then the
    original error, about what does not match, stands)."""
    from dil_jax.open_domain.missing_cache import (
        THIS_READER,
        MissingCacheError,
        build_command,
        index_caches,
        missing_cache_message,
    )

    key = index.cache_key(reader, args.storage)
    folder = index.cache_dir(key)
    if folder.exists():
        return None
    checkpoint = reader.checkpoint.name
    k = reader.config.num_lower_layers
    command = build_command(str(args.index), index.settings, checkpoint, k, args.storage,
                            args.tokenizer)
    partial = folder.with_name(f".{folder.name}.partial").exists()
    return MissingCacheError(missing_cache_message(
        str(args.index), folder.name, checkpoint, k, args.storage,
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
    _resolve_checkpoints(args)
    reader = _open_reader(args, args.k, args.top_p)
    abstention = abstention_of(_checkpoint_for(args, 0))
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


def _evaluation_settings(args: argparse.Namespace, name: str, k: int, position: int,
                         questions: int) -> dict:
    """What decides an evaluation's per-question results: a progress file made under other
    settings is refused rather than mixed in (batch and chunk sizes only change the rounding)."""
    return dict(reader=name, data=os.path.abspath(args.data), articles=args.articles,
                limit=args.limit, seed=args.seed, questions=questions,
                index=os.path.abspath(args.index), checkpoint=_checkpoint_for(args, position),
                tokenizer=args.tokenizer, k=k, p=sorted(args.p), mu=args.mu,
                max_question_len=args.max_question_len,
                # Its name as progress files have recorded it (a file is refused on a change).
                cache_dtype=args.storage.name,
                prescreen=str((args.prescreen, args.top_m, args.mass)))


def run_evaluate(args: argparse.Namespace) -> int:
    import numpy as np

    from dil_jax.data.squad import load_squad, select_articles
    from dil_jax.open_domain.evaluate import (
        EvaluationProgress,
        dump_json,
        evaluate_reader,
        markdown_table,
    )
    from dil_jax.progress import CountBar

    _resolve_checkpoints(args)
    examples = [e for e in select_articles(load_squad(args.data).examples, args.articles)
                if e.answer_texts]
    if args.limit is not None and args.limit < len(examples):
        chosen = np.random.default_rng(args.seed).choice(len(examples), args.limit,
                                                         replace=False)
        examples = [examples[i] for i in sorted(chosen)]
    results = {}
    for position, k in enumerate(args.k):
        base = _open_reader(args, k, max(args.p), position, prescreen=False)
        readers = {"full" if k == 0 else f"DIL k={k}": base}
        if args.prescreen:
            screened = base.with_prescreen(_reader_prescreen(args, base.index))
            readers[f"{next(iter(readers))} + SEP {screened.prescreen.rule}"] = screened
        for name, reader in readers.items():
            print(f"reading {len(examples)} questions x {max(args.p)} passages with {name} "
                  "(its first block of questions pays the compilation) ...", file=sys.stderr)
            progress = None
            if args.out:
                # Resumable: each finished block of questions is kept under --out, and a rerun
                # of the same command reads only the rest.
                progress = EvaluationProgress(
                    Path(args.out) / "progress" / f"{_slug(name)}.jsonl",
                    _evaluation_settings(args, name, k, position, len(examples)))
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
                     index=args.index, checkpoint=args.checkpoint, questions=len(examples),
                     seed=args.seed, device=str(jax.devices()[0].device_kind),
                     cpu_count=os.cpu_count(), jax=jax.__version__)
        for name, text in (("results.md", table + "\n"),
                           ("results.json", dump_json(results, extra))):
            write_atomic(out / name, text)
        print(f"wrote {out / 'results.md'} and {out / 'results.json'}", file=sys.stderr)
    return 0

