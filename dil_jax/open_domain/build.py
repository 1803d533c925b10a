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
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dil_jax.model.delayed import DelayedInteractionModel, Params
from dil_jax.model.grid import PairGrid, reads_passage_ids
from dil_jax.open_domain.cache import PassageCache
from dil_jax.open_domain.corpus import iter_sources, split_documents
from dil_jax.open_domain.index import (
    OpenDomainIndex,
    build_index,
    build_reader_cache,
    index_settings,
    open_index,
)
from dil_jax.open_domain.index_files import (
    IndexBrokenError,
    OpenDomainIndexError,
    read_settings,
    settings_differences,
)
from dil_jax.open_domain.index_lock import clean_stale, index_lock
from dil_jax.open_domain.reader import check_read_lengths
from dil_jax.open_domain.retrieval import resolve_engine
from dil_jax.open_domain.reuse import reuse_encoder
from dil_jax.open_domain.sentences import build_sentence_store

if TYPE_CHECKING:
    from dil_jax.prescreening.prescreener import SentencePrescreener

log = logging.getLogger(__name__)

# (model, params, tokenizer), as `dil_jax.checkpoints.load_reader` returns it.
ReaderParts = tuple[DelayedInteractionModel, Params, Any]


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
    cache_dtype: str = "float32"
    batch_size: int = 32
    # Also store each window's first-upper-block q/k/v and attention statistics (k > 0 caches;
    # `dil_jax.open_domain.reuse`): less work per pair, more disk.
    cache_reuse: bool = False
    # The BM25 engine (`defaults.RETRIEVER_ENGINES`) or "auto" (`retrieval.resolve_engine`:
    # by corpus size).
    retriever: str = "auto"


def passage_encoder(model: DelayedInteractionModel, params: Params, batch_size: int = 32
                    ) -> Callable[[np.ndarray, np.ndarray], np.ndarray] | None:
    """The `encode` of `build_reader_cache`: (ids, mask) [n, p_len] -> lower states
    [n, p_len, hidden] as numpy; None at k = 0 (`reads_passage_ids`: the cache then holds the
    tokens only)."""
    if reads_passage_ids(model.config):
        return None
    grid = PairGrid(model, batch_size=batch_size)
    return lambda ids, mask: np.asarray(grid.encode_passages(params, ids, mask))


def build_open_domain_index(out: str, corpus: Sequence[str], readers: Sequence[ReaderParts],
                            settings: BuildSettings,
                            prescreener: SentencePrescreener | None = None,
                            progress: Callable[[BuildStep], None] | None = None
                            ) -> tuple[OpenDomainIndex, list[PassageCache]]:
    """Builds (or reopens, or repairs) the index, one passage cache per reader and, with a
    prescreener, the sentence embeddings of every passage.

    corpus: source specs (wikipedia, squad:PATH, jsonl:PATH). Holds the index folder's lock
    throughout (a second build fails at once, naming this one). An existing index is reused only
    if it was built with this run's corpus, split, lengths and tokenizer; otherwise this refuses,
    naming each differing setting.
    """
    for model, _, _ in readers:  # before hours of caching: the lengths must fit every reader
        check_read_lengths(model.config, settings.max_passage_len)
    report = progress or (lambda step: None)
    with index_lock(out):
        index = _split_and_index(out, corpus, readers[0][2], settings, report)
        caches = [_reader_cache(index, reader, settings, report) for reader in readers]
        if prescreener is not None:
            def sentences_done(done: int, total: int) -> None:
                report(BuildStep("sentence embeddings", done, total))

            build_sentence_store(index, prescreener, progress=sentences_done)
    return index, caches


def _split_and_index(out: str, corpus: Sequence[str], tokenizer, settings: BuildSettings,
                     report: Callable[[BuildStep], None]) -> OpenDomainIndex:
    """The index of the corpus's passages: reused when its settings match, else (re)built."""
    started = time.perf_counter()
    documents = []
    for spec in corpus:
        source = list(iter_sources([spec]))
        documents += source[:settings.corpus_limit] if settings.corpus_limit else source
    passages = split_documents(documents, settings.split)
    split_record = {"strategy": settings.split, "sources": list(corpus),
                    "limit": settings.corpus_limit}
    wanted = index_settings(passages, tokenizer, max_passage_len=settings.max_passage_len,
                            doc_stride=settings.doc_stride, split=split_record)
    engine = resolve_engine(settings.retriever, len(passages))
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
                built_with = index.settings.get("retriever", "rank-bm25")
                if engine == built_with:
                    report(BuildStep("index", note=f"index: {out} ({len(index.passages)} "
                                                   "passages, reused)"))
                else:
                    log.info("%s: BM25 built with %s, this run asks for %s -- rebuilding the "
                             "index files (the caches are kept)", out, built_with, engine)
                    index = None
    if index is None:
        if not passages:
            raise OpenDomainIndexError(f"no passages in --corpus {' '.join(corpus)} (is it "
                                       "empty?)")
        index = build_index(out, passages, tokenizer, max_passage_len=settings.max_passage_len,
                            doc_stride=settings.doc_stride, split=split_record,
                            retriever=engine)
        report(BuildStep("index", note=f"index: {len(documents)} documents -> {len(passages)} "
                                       f"passages -> {index.settings['num_windows']} windows, "
                                       f"BM25 ({engine}) built in "
                                       f"{time.perf_counter() - started:.1f} s"))
    for note in clean_stale(out, index.settings["passages"]):
        log.info("%s", note)
    return index


def _reader_cache(index: OpenDomainIndex, reader: ReaderParts, settings: BuildSettings,
                  report: Callable[[BuildStep], None]) -> PassageCache:
    """One reader's passage cache over the index (built, resumed or reopened)."""
    model, params, tokenizer = reader
    stage = f"passage cache k={model.config.num_lower_layers}"
    total = index.settings["num_windows"]
    report(BuildStep(stage, 0, total))
    reuse = None
    if settings.cache_reuse:
        reuse = reuse_encoder(model, params, settings.batch_size)
        if reuse is None:
            log.info("k = %d: no first-upper-block arrays to store (they need 0 < k < l)",
                     model.config.num_lower_layers)
    cache = build_reader_cache(index, model.config, params, tokenizer,
                               encode=passage_encoder(model, params, settings.batch_size),
                               dtype=settings.cache_dtype, reuse=reuse,
                               progress=lambda done: report(BuildStep(stage, done, total)))
    report(BuildStep(stage, total, total))
    return cache
