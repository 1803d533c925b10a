"""Building an open-domain index: corpus -> passages -> BM25 and windows -> one passage cache per
reader -> (optionally) sentence embeddings for prescreening.

    settings = BuildSettings(max_passage_len=192, doc_stride=96)
    index, caches = build_open_domain_index("runs/index", ["wikipedia"], readers, settings)

The library decides everything here; a caller (`dil-jax index`, the demo) only parses its flags
and shows progress through the one `progress` callback.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dil_jax.open_domain.build_peers import (
    check_peer_settings,
    check_refusals,
    peer_settings,
    write_run_record,
)
from dil_jax.open_domain.cache.check import tokenizer_fingerprint
from dil_jax.open_domain.cache.reuse import reuse_encoder
from dil_jax.open_domain.cache.shards import shard_ranges, wait_for
from dil_jax.open_domain.cache.storage import Storage
from dil_jax.open_domain.cache.store import PassageCache
from dil_jax.open_domain.index.corpus import (
    MIN_PASSAGE_CHARS,
    Document,
    iter_passages,
    iter_sources,
    iter_split,
)
from dil_jax.open_domain.index.files import (
    IndexBrokenError,
    IndexSettings,
    OpenDomainIndexError,
    read_settings,
    settings_differences,
    stored_settings,
)
from dil_jax.open_domain.index.folder import (
    OpenDomainIndex,
    build_index,
    build_reader_cache,
    index_settings,
    open_index,
)
from dil_jax.open_domain.index.lock import clean_stale, index_lock
from dil_jax.open_domain.index.sentences import build_sentence_store
from dil_jax.open_domain.index.store import summarize_passages
from dil_jax.open_domain.reader import check_read_lengths
from dil_jax.open_domain.retrieval.engines import check_engine_fits, resolve_engine

if TYPE_CHECKING:
    from dil_jax.prescreening.prescreener import SentencePrescreener
    from dil_jax.readers.protocol import Reader

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class BuildStep:
    """One progress report of a build.

    stage: "index" (note: a line saying what was built or reused), "passage cache k=K"
    (done/total: windows encoded) or "sentence embeddings" (done/total: sentences embedded).
    """

    stage: str
    done: int = 0
    total: int | None = None
    note: str = ""


@dataclasses.dataclass(frozen=True)
class BuildSettings:
    """How the corpus is split and cached (the index records these; a rebuild must match)."""

    max_passage_len: int
    doc_stride: int
    split: str = "paragraphs"
    corpus_limit: int | None = None
    # How the caches store their states (--cache-dtype); None: per reader, the existing
    # cache's own, else DEFAULT_STORAGE (`OpenDomainIndex.storage_to_build`).
    storage: Storage | None = None
    batch_size: int = 32
    # Also store each window's first-upper-block q/k/v and attention statistics (k > 0 caches;
    # `dil_jax.open_domain.cache.reuse`): less work per pair, more disk.
    cache_reuse: bool = False
    # The BM25 engine (`defaults.RETRIEVER_ENGINES`) or "auto" (`retrieval.engines.resolve_engine`:
    # by corpus size); None: the existing index's own engine, else "auto" (`choose_engine`).
    retriever: str | None = None
    # Windows encoded per step: the grid a sharded cache is cut on (whole chunks per shard).
    chunk_passages: int = 256
    # A store URL (`cache.store_build.store_url`: gs://, s3://, file://) the caches are built
    # in, instead of the index folder (--cache-store): processes then share no folder.
    cache_store: str | None = None


@dataclasses.dataclass(frozen=True)
class BuildProcess:
    """Which process of a sharded cache build this is (`dil-jax index --num-processes`).

    Process 0 builds (or reuses) the index, its shard of each cache and the caches' manifests;
    process i > 0 waits for the index, then builds shard i of each cache. wait_timeout_s: how
    long a process waits for another's work before failing (`cache.shards.wait_for`).
    """

    index: int = 0
    count: int = 1
    wait_timeout_s: float = 86400.0


def build_open_domain_index(out: str, corpus: Sequence[str], readers: Sequence[Reader],
                            settings: BuildSettings,
                            prescreener: SentencePrescreener | None = None,
                            progress: Callable[[BuildStep], None] | None = None,
                            process: BuildProcess = BuildProcess()
                            ) -> tuple[OpenDomainIndex, list[PassageCache]]:
    """Builds (or reopens, or repairs) the index, one passage cache per reader and, with a
    prescreener, the sentence embeddings of every passage.

    corpus: source specs (wikipedia, squad:PATH, jsonl:PATH). Holds the index folder's lock
    throughout (a second build fails at once, naming this one). An existing index is reused only
    if it was built with this run's corpus, split, lengths and tokenizer; otherwise this refuses,
    naming each differing setting.

    process: with count > 1, this process's part of a build by several (`BuildProcess`; every
    process runs this with the same arguments): process i > 0 holds its own lock
    (`index_lock(out, i)`), waits for the index process 0 builds or reuses, and builds shard i
    of each cache; the sentence embeddings are process 0's. Every process returns the finished
    caches.

    With `settings.cache_store` the processes share no folder: each builds (or reuses) the
    index in its own `out` from the corpus (the same passages and windows: the split and the
    tokenizer are deterministic; the cache plan names the passages' fingerprint, so a process
    over another corpus is refused), then its shard of each cache in the store
    (`cache.store_build`). Only process 0's index is meant to be read (`ask`, `serve`); the
    others' are working copies whose BM25 is built for nothing (at the same time as process
    0's, so no later), and the sentence embeddings are process 0's only.
    """
    for reader in readers:  # before hours of caching: the lengths must fit every reader
        check_read_lengths(reader, settings.max_passage_len)
    report = progress or (lambda step: None)
    # Without a shared folder there is no run record to compare (`build_peers`): processes given
    # other flags plan another cache, which the wait for the plan names at its timeout.
    shared = process.count > 1 and settings.cache_store is None
    mine = _peer_settings(readers, settings, process) if shared else {}
    folder = Path(out).resolve()
    if process.index > 0 and shared:
        with index_lock(out, process.index):
            def agree() -> None:
                check_peer_settings(folder, mine, process.index)

            # Every reader reads the index's windows: they share a tokenizer (a reader whose
            # tokenizer differs is refused by the index when its cache is built).
            index = _await_index(out, corpus, readers[0].tokenizer, settings,
                                 process.wait_timeout_s, agree)
            return index, [_reader_cache(index, reader, settings, report, process, agree)
                           for reader in readers]
    with index_lock(out):
        peer_check = None
        if shared:
            by = write_run_record(folder, mine)

            def peer_check() -> None:
                check_refusals(folder, by)

        index = _split_and_index(out, corpus, readers[0].tokenizer, settings, report)
        caches = [_reader_cache(index, reader, settings, report, process, peer_check)
                  for reader in readers]
        if prescreener is not None and process.index == 0:
            def sentences_done(done: int, total: int) -> None:
                report(BuildStep("sentence embeddings", done, total))

            build_sentence_store(index, prescreener, progress=sentences_done)
    return index, caches


def _peer_settings(readers: Sequence[Reader], settings: BuildSettings,
                   process: BuildProcess) -> dict[str, Any]:
    """What every process of a sharded build must share (`build_peers.peer_settings`)."""
    return peer_settings([(reader.config.num_lower_layers, reader.weights_fingerprint())
                          for reader in readers],
                         chunk_passages=settings.chunk_passages,
                         storage=settings.storage, cache_reuse=settings.cache_reuse,
                         num_processes=process.count, max_passage_len=settings.max_passage_len,
                         doc_stride=settings.doc_stride)


def choose_engine(asked: str | None, stored: IndexSettings | None, num_passages: int
                  ) -> tuple[str, str | None]:
    """(engine, note to log) of a build: `asked` (--retriever; "auto" by corpus size) when
    given; else the engine of the index already there (`stored`: its index.json settings;
    one without the field was built by rank-bm25, the only engine then), so a rerun without
    --retriever never swaps a bm25s or Lucene index for another engine; else "auto"."""
    if asked is not None:
        return resolve_engine(asked, num_passages), None
    if stored is not None:
        engine = stored.retriever
        return engine, f"keeping the index's BM25 engine, {engine} (--retriever changes it)"
    return resolve_engine("auto", num_passages), None


def _split_record(corpus: Sequence[str], settings: BuildSettings) -> dict[str, Any]:
    return {"strategy": settings.split, "sources": list(corpus), "limit": settings.corpus_limit}


def _await_index(out: str, corpus: Sequence[str], tokenizer, settings: BuildSettings,
                 timeout_s: float, peer_check: Callable[[], None] | None = None
                 ) -> OpenDomainIndex:
    """(process i > 0) The index process 0 builds or reuses in `out`, once it opens (every file
    checked). It must have this run's split, lengths and tokenizer (OpenDomainIndexError at
    once, naming them: process 0 refuses it too); its passages are process 0's business (this
    process does not read the corpus). peer_check: run at every poll (`wait_for`)."""
    def opened() -> OpenDomainIndex | None:
        stored = stored_settings(Path(out))
        if stored is None:
            return None
        # Its passages are process 0's: only the split, lengths and tokenizer are compared.
        wanted = dataclasses.replace(
            stored, split=_split_record(corpus, settings),
            tokenizer=tokenizer_fingerprint(tokenizer),
            max_passage_len=settings.max_passage_len, doc_stride=settings.doc_stride)
        differences = settings_differences(stored, wanted)
        if differences:
            raise OpenDomainIndexError(f"{out} holds an index built with other settings:\n  "
                                       + "\n  ".join(differences))
        try:
            return open_index(out)
        except OpenDomainIndexError:
            return None  # being written or repaired by process 0

    return wait_for(opened, lambda: f"process 0 to build or reuse the index {out}", timeout_s,
                    peer_check=peer_check)


def _no_passages_reason(corpus: Sequence[str], num_documents: int, split: str) -> str:
    """Why a corpus gave no passage: it holds no documents, or every one is too short for the
    split (a lone short document read as "is it empty?")."""
    sources = " ".join(f"--corpus {spec}" for spec in corpus)
    if not num_documents:
        return f"no passages: {sources} holds no documents"
    if split == "paragraphs":
        return (f"no passages: the {num_documents} document(s) of {sources} hold no paragraph "
                f"of at least {MIN_PASSAGE_CHARS} characters (shorter pieces are dropped by "
                "--split paragraphs); give longer texts")
    return f"no passages: the {num_documents} document(s) of {sources} hold no words"


def _split_and_index(out: str, corpus: Sequence[str], tokenizer, settings: BuildSettings,
                     report: Callable[[BuildStep], None]) -> OpenDomainIndex:
    """The index of the corpus's passages: reused when its settings match, else (re)built."""
    started = time.perf_counter()
    # A first pass over the corpus, keeping nothing: whether the index there is these passages.
    # (--corpus-limit applies to each source, each of a preset's too.)
    documents = _Counted(iter_sources(corpus, settings.corpus_limit))
    summary = summarize_passages(iter_split(documents, settings.split))
    split_record = _split_record(corpus, settings)
    wanted = index_settings(summary, tokenizer, max_passage_len=settings.max_passage_len,
                            doc_stride=settings.doc_stride, split=split_record)
    engine, note = choose_engine(settings.retriever, stored_settings(Path(out)), summary.count)
    if note:
        log.info("%s: %s", out, note)
    index = None
    if (Path(out) / "index.json").is_file():
        try:
            stored = read_settings(out)
        except IndexBrokenError as error:
            log.warning("%s -- rebuilding the index (its caches are removed)", error)
        else:
            differences = settings_differences(stored, wanted)
            if differences:
                raise OpenDomainIndexError(
                    f"{out} holds an index built with other settings:\n  "
                    + "\n  ".join(differences)
                    + f"\nits caches belong to those settings: give another --out for this run, "
                      f"or delete {out} to rebuild it with these")
            try:
                index = open_index(out)
            except IndexBrokenError as error:
                log.warning("%s -- rebuilding its files (the caches are kept)", error)
            else:
                built_with = index.settings.retriever
                if engine == built_with:
                    report(BuildStep("index", note=f"index: {out} ({len(index.passages)} "
                                                   "passages, reused)"))
                else:
                    log.info("%s: BM25 built with %s, this run asks for %s -- rebuilding the "
                             "index files (the caches are kept)", out, built_with, engine)
                    index = None
    if index is None:
        if not summary.count:
            raise OpenDomainIndexError(_no_passages_reason(corpus, documents.count,
                                                           settings.split))
        check_engine_fits(engine, summary.count, summary.text_bytes)  # before the caches go
        # The second pass: the passages streamed into the index's store (`index.store`).
        index = build_index(out, iter_passages(corpus, settings.split, settings.corpus_limit),
                            tokenizer, max_passage_len=settings.max_passage_len,
                            doc_stride=settings.doc_stride, split=split_record,
                            retriever=engine)
        report(BuildStep("index", note=f"index: {documents.count} documents -> "
                                       f"{len(index.passages)} "
                                       f"passages -> {index.settings.num_windows} windows, "
                                       f"BM25 ({engine}) built in "
                                       f"{time.perf_counter() - started:.1f} s"))
    for note in clean_stale(out, index.settings.passages):
        log.info("%s", note)
    return index


class _Counted(Iterator[Document]):
    """An iterator of documents that counts those it has given."""

    def __init__(self, documents: Iterator[Document]):
        self._documents = documents
        self.count = 0

    def __next__(self) -> Document:
        document = next(self._documents)
        self.count += 1
        return document


def _reader_cache(index: OpenDomainIndex, reader: Reader, settings: BuildSettings,
                  report: Callable[[BuildStep], None], process: BuildProcess,
                  peer_check: Callable[[], None] | None = None) -> PassageCache:
    """One reader's passage cache over the index (built, resumed or reopened); with several
    processes, this process's shard of it (progress: that shard's windows; peer_check at
    every wait)."""
    stage = f"passage cache k={reader.config.num_lower_layers}"
    start, stop = shard_ranges(index.settings.num_windows, settings.chunk_passages,
                               process.count)[process.index]
    total = stop - start
    report(BuildStep(stage, 0, total))
    reuse = None
    if settings.cache_reuse:
        reuse = reuse_encoder(reader, settings.batch_size)
        if reuse is None:
            log.info("k = %d: no first-upper-block arrays to store (they need 0 < k < l)",
                     reader.config.num_lower_layers)
    cache = build_reader_cache(index, reader,
                               encode=reader.passage_encoder(settings.batch_size,
                                                             index.window_texts),
                               storage=index.storage_to_build(reader, settings.storage),
                               reuse=reuse,
                               chunk_passages=settings.chunk_passages,
                               progress=lambda done: report(BuildStep(stage, done, total)),
                               process_index=process.index, process_count=process.count,
                               wait_timeout_s=process.wait_timeout_s, peer_check=peer_check,
                               cache_store=settings.cache_store)
    report(BuildStep(stage, total, total))
    return cache
