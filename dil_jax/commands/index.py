"""`dil-jax index`: split a corpus, build BM25 and the passage caches (or verify an index).

    dil-jax index --out runs/index --corpus wikipedia --corpus squad:FILE --k 0 4
    dil-jax index ... --num-processes 2 --process-id I --coordinator-address host:1234
    dil-jax index --out LOCAL_DIR --cache-store gs://BUCKET/index ... --distributed
    dil-jax index --out runs/index --verify
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from dil_jax.commands.arguments import (
    DEFAULT_STORAGE_HELP,
    STORAGE_HELP,
    add_compilation_cache_arguments,
    add_reader_arguments,
    cache_storage,
    check_checkpoint_count,
    checked_first,
    local_paths,
    non_negative_int,
    option_type,
    positive_int,
    reader_requests,
    window_len,
)
from dil_jax.defaults import (
    AUTO_BM25S_FROM,
    OPEN_DOMAIN_DOC_STRIDE,
    OPEN_DOMAIN_MAX_PASSAGE_LEN,
    RETRIEVER_ENGINES,
)
from dil_jax.errors import UsageError

if TYPE_CHECKING:
    from dil_jax.open_domain.build import BuildStep


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
    --coordinator-address), before any other JAX call."""
    import jax

    from dil_jax.mesh import DistributedSettings, maybe_initialize_distributed
    from dil_jax.open_domain.build import BuildProcess

    distributed = args.distributed or args.coordinator_address is not None
    maybe_initialize_distributed(DistributedSettings(
        initialize=distributed, coordinator_address=args.coordinator_address,
        num_processes=args.num_processes, process_id=args.process_id,
        num_cpu_devices=args.num_cpu_devices))
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
    from dil_jax.open_domain.index.corpus import expand_presets, parse_source
    from dil_jax.open_domain.retrieval.engines import check_engine_available

    if args.verify:
        if args.corpus:
            raise UsageError("--verify checks the index in --out as it was built: give it no "
                             "--corpus (or drop --verify to build)")
        return
    if not args.corpus:
        raise UsageError("--corpus is required to build an index (or give --verify to check "
                         "the one in --out)")
    # An unknown source type or a preset's missing file is named now, not after the models load.
    corpus = expand_presets(args.corpus)
    if args.retriever not in (None, "auto"):  # a missing engine or Java: now, not mid-build
        check_engine_available(args.retriever)
    _check_process_flags(args)
    if args.cache_store is not None:
        from dil_jax.open_domain.cache.store_build import store_url

        try:
            args.cache_store = store_url(args.cache_store)
        except ValueError as error:
            raise UsageError(f"--cache-store {error}") from error
    if args.storage is not None:  # pq<M> without faiss: now, not after the BM25 build
        args.storage.check_buildable()
    check_window_flags(args.max_passage_len, args.doc_stride)
    check_checkpoint_count(args)
    corpus_files = [path for kind, path in map(parse_source, corpus) if path]
    # The index is built in place under its lock (dil_jax.open_domain.index.lock), which refuses a
    # folder holding anything an index build did not write; here only what needs no model: the
    # folder can be written and is none of the inputs.
    check_output_folder(args.out, "--out",
                        {"--corpus": corpus_files, "--checkpoint": local_paths(args.checkpoint),
                         "--tokenizer": args.tokenizer,
                         "--prescreen": local_paths(args.prescreen)})


def register(subparsers) -> None:
    index = subparsers.add_parser(
        "index", help="split a corpus, build BM25 and the passage caches",
        description="Splits documents into passages, builds the BM25 index and, for each k, the "
                    "cache of passage lower states (resumable; rerun to continue).")
    index.add_argument("--out", required=True, help="index folder")
    index.add_argument("--corpus", action="append", default=None,
                       help="source (repeatable): wikipedia, squad:PATH, jsonl:PATH, or the "
                            "preset squad-open[:DIR] (SQuAD v1.1 train + dev paragraphs + the "
                            "Wikipedia leads; DIR default ../shared/data/squad) (required "
                            "unless --verify; default: none)")
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
    index.add_argument("--doc-stride", type=option_type("doc_stride"),
                       default=OPEN_DOMAIN_DOC_STRIDE,
                       help="tokens between window starts (< --max-passage-len)")
    index.add_argument("--cache-dtype", dest="storage", type=cache_storage, default=None,
                       metavar="STORAGE", help=STORAGE_HELP + DEFAULT_STORAGE_HELP)
    index.add_argument("--cache-reuse", action="store_true",
                       help="also store each window's first-upper-block q/k/v and attention "
                            "statistics (0 < k < l): less work per pair, about 4x the "
                            "states' disk (pca<d>, pq<M>: these are int8; "
                            "docs/open_domain.md)")
    index.add_argument("--retriever", choices=("auto",) + RETRIEVER_ENGINES, default=None,
                       help="BM25 engine: rank-bm25 (small corpora), bm25s (memory-mapped, "
                            "up to ~1M passages), pyserini (Lucene, the paper's; needs Java; "
                            "streams the corpus: any size; rank-bm25 and bm25s are refused "
                            "where they would not fit in memory), "
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
        "a folder every process sees, unless the caches go to a store (--cache-store).")
    shards.add_argument("--cache-store", default=None, metavar="URL",
                        help="build the passage caches in this store instead of --out: "
                             "gs://BUCKET/PATH, s3://BUCKET/PATH or file://PATH (a local path "
                             "is taken as file://); every process writes its own shards there "
                             "and needs no folder shared with the others (each its own --out, "
                             "the corpus on every host); --out records the URL and reads the "
                             "caches from it (docs/open_domain.md, \"Many hosts, no shared "
                             "folder\"; default: the caches are folders in --out)")
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
    add_reader_arguments(index, many_k=True)
    index.add_argument("--prescreen", default=None, metavar="PRESCREENER",
                       help="also store every passage's sentence embeddings for this "
                            "prescreener ('default' = the bundled one, or a folder; default: none "
                            "stored)")
    add_compilation_cache_arguments(index)
    index.set_defaults(func=checked_first(_check_index_flags, run_index))



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


def run_index(args: argparse.Namespace,
              on_step: Callable[[BuildStep], None] | None = None) -> int:
    """`index`: build (or with --verify, check) the index in --out. on_step (optional) is
    called with every step of the build before its progress bar is drawn (a test stops a
    process mid-build with it)."""
    from dil_jax.open_domain.cache.disk import write_failure

    if args.verify:
        return run_verify(args.out)
    try:
        return _run_build(args, on_step)
    except OSError as error:
        # A write not wrapped where it happens (`cache.disk.write_errors`): a full or read-only disk
        # is still one line, naming the file when the error knows it, else --out.
        failure = write_failure(Path(error.filename or args.out), error)
        if failure is None:
            raise
        raise failure from error


def run_verify(out: str) -> int:
    """`index --verify`: every byte of the index in `out` (`open_domain.index.verify`); each part's
    line on stdout, each differing file on stderr; InputFileError when any differs or could
    not be checked."""
    from dil_jax.errors import InputFileError
    from dil_jax.open_domain.index.verify import verify_index

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


def _run_build(args: argparse.Namespace, on_step: Callable[[BuildStep], None] | None) -> int:
    from dil_jax.open_domain.index.lock import index_lock
    from dil_jax.readers.request import load_requested

    requests = reader_requests(args)
    process = _build_process(args)
    # The lock first: a second build into the same folder fails at once, before loading models.
    with index_lock(args.out, process.index):
        prescreener = None
        if args.prescreen:
            from dil_jax.prescreening.prescreener import SentencePrescreener

            prescreener = SentencePrescreener.load(args.prescreen)
        readers = [load_requested(request) for request in requests]
        from dil_jax.open_domain.build import BuildSettings, build_open_domain_index

        settings = BuildSettings(max_passage_len=args.max_passage_len, doc_stride=args.doc_stride,
                                 split=args.split, corpus_limit=args.corpus_limit,
                                 storage=args.storage, cache_reuse=args.cache_reuse,
                                 retriever=args.retriever, chunk_passages=args.cache_chunk,
                                 cache_store=args.cache_store)
        bars = _ProgressBars()

        def progress(step: BuildStep) -> None:
            if on_step is not None:
                on_step(step)
            bars(step)

        try:
            build_open_domain_index(args.out, args.corpus, readers, settings,
                                    prescreener=prescreener, progress=progress, process=process)
        finally:
            bars.close()
    return 0
