"""An open-domain index folder: passages, their BM25 index, their windows, passage caches.

    index/
      index.json         settings and file records (dil_jax.open_domain.index.files)
      passages.jsonl     one Passage per line (id, source document id, title, text, offsets)
      windows.npz        which cache rows (windows of `p_window [SEP]`) belong to which passage,
                         and their tokens (dil_jax.open_domain.index.windows: memory-mapped)
      bm25/              the BM25 index (open_domain.retrieval.engines)
      cache-k{k}-{model}/  one passage cache per (reader weights, k) (open_domain.cache.store)
      cache-store.json   {"url": URL} when the caches were built in a store (`dil-jax index
                         --cache-store URL`): they are read from URL/cache-k{k}-{model}/
      .lock              the build lock (open_domain.index.lock)

Passages longer than `max_passage_len - 1` tokens are read in strided windows exactly as SQuAD
contexts are (`dil_jax.data.features.window_contexts`), so a passage's answer is the same as the
SQuAD predict path gives for that (question, passage).

Consistency: `index.json` is written last (atomically), so a folder without it holds no index.
`open_index` checks every file `index.json` lists against its recorded size and sha256
(`index.files.check_file`) and the passages against their fingerprint, so an index edited after
it was built is refused, naming the file, instead of giving answers shifted by it.
Writers (`build_index`, `build_reader_cache`) hold the folder's lock (`index_lock`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import zipfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dil_jax.atomic import write_atomic
from dil_jax.open_domain.cache.build import PLAN_FILE, build_passage_cache
from dil_jax.open_domain.cache.check import (
    CHECKED_ROWS,
    check_states,
    reader_cache_key,
    tokenizer_fingerprint,
)
from dil_jax.open_domain.cache.disk import write_errors
from dil_jax.open_domain.cache.location import Location
from dil_jax.open_domain.cache.manifest import MANIFEST_FILE, STORAGE_FIELD, CacheKey
from dil_jax.open_domain.cache.shards import build_sharded_passage_cache
from dil_jax.open_domain.cache.storage import FLOAT32, Storage, default_storage
from dil_jax.open_domain.cache.store import PassageCache, ReuseEncoder, StatesEncoder
from dil_jax.open_domain.cache.store_build import build_store_cache
from dil_jax.open_domain.index.corpus import Passage
from dil_jax.open_domain.index.files import (
    CHECKED_FILES,
    REPAIR_HINT,
    IndexBrokenError,
    IndexSettings,
    OpenDomainIndexError,
    broken_file,
    check_file,
    file_fingerprint,
    read_settings,
    stored_settings,
)
from dil_jax.open_domain.index.lock import index_lock, remove_entry
from dil_jax.open_domain.index.store import (
    OFFSETS_FILE,
    PASSAGES_FILE,
    PassageStore,
    StoreSummary,
    TextsFingerprint,
    write_passage_store,
)
from dil_jax.open_domain.index.windows import WINDOWS_FILE, PassageWindows, write_windows
from dil_jax.open_domain.index.windows import window_arrays as windows_file_arrays
from dil_jax.open_domain.retrieval.engines import (
    RetrievalError,
    Retriever,
    build_retriever,
    check_engine_available,
    check_engine_fits,
    index_files,
    load_retriever,
)

if TYPE_CHECKING:
    from dil_jax.readers.protocol import Reader

log = logging.getLogger(__name__)

# Where an index whose caches were built in a store records the store's URL (module docstring).
CACHE_STORE_FILE = "cache-store.json"


def read_cache_store(directory: Path) -> str | None:
    """The store URL an index's cache-store.json records, None without one;
    OpenDomainIndexError naming the file when it is not {"url": "..."}."""
    path = Path(directory) / CACHE_STORE_FILE
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        raise OpenDomainIndexError(f"{path}: not readable JSON ({error}); rerun `dil-jax "
                                   "index` with its --cache-store to rewrite it") from error
    if not isinstance(value, dict) or not isinstance(value.get("url"), str):
        raise OpenDomainIndexError(f"{path}: expected {{\"url\": \"...\"}}, got {value!r}; "
                                   "rerun `dil-jax index` with its --cache-store to rewrite it")
    return value["url"]


def record_cache_store(directory: Path, url: str) -> None:
    """(Under the index's lock.) Records that this index's caches are in the store `url`."""
    with write_errors(Path(directory) / CACHE_STORE_FILE):
        write_atomic(Path(directory) / CACHE_STORE_FILE, json.dumps({"url": url}, indent=2))


@dataclasses.dataclass
class OpenDomainIndex:
    directory: Path
    settings: IndexSettings
    passages: Sequence[Passage]  # a PassageStore: read from disk by offset, not held
    retriever: Retriever
    windows: PassageWindows

    def cache_dir(self, key: CacheKey) -> Path:
        """The folder of the cache of `key` in this index."""
        return self.directory / key.folder_name

    def cache_location(self, key: CacheKey) -> Location:
        """Where the cache of `key` is read from: its folder in the index when there is one,
        else its place in the store the index records (`cache-store.json`), else the folder
        (opening it then says there is no cache)."""
        folder = self.cache_dir(key)
        url = None if folder.exists() else read_cache_store(self.directory)
        return Location.of(url) / key.folder_name if url else Location.of(folder)

    def built_storage(self, reader: Reader) -> Storage:
        """The storage the cache of `reader` in this index was built with (read from its
        manifest), FLOAT32 when there is no such cache or its manifest names none."""
        location = self.cache_location(self.cache_key(reader, FLOAT32))
        try:
            manifest = json.loads(location.read_bytes(MANIFEST_FILE) or b"")
            return Storage.parse(str(manifest[STORAGE_FIELD]), reader.config.hidden_size)
        except (OSError, ValueError, KeyError, TypeError):  # opening it names what is wrong
            return FLOAT32

    def storage_to_build(self, reader: Reader, asked: Storage | None) -> Storage:
        """The storage a build of `reader`'s cache uses: `asked` (--cache-dtype) when given;
        else float32 for a k = 0 cache (it holds token ids only); else the existing cache's
        own, or the one an unfinished build of it was started with (so a rerun without the
        flag keeps or resumes what is there, whatever the default was then); else
        DEFAULT_STORAGE."""
        if asked is not None:
            return asked
        if reader.config.num_lower_layers == 0:
            return default_storage(0)
        key = self.cache_key(reader, FLOAT32)
        if self.cache_location(key).exists(MANIFEST_FILE):
            return self.built_storage(reader)
        folder = self.cache_dir(key)
        try:
            plan = json.loads((folder.with_name(f".{folder.name}.partial") / PLAN_FILE)
                              .read_bytes())
            return Storage.parse(str(plan[STORAGE_FIELD]), reader.config.hidden_size)
        except (OSError, ValueError, KeyError, TypeError):  # none, or unreadable: started over
            return default_storage(reader.config.num_lower_layers)

    def open_cache(self, reader: Reader, storage: Storage | None = None,
                   verify: str = "sampled") -> PassageCache:
        """The passage cache for `reader`; a mismatch is an error naming the field.

        storage: the one the reader expects (`--cache-dtype`); a cache stored another way is
        refused, naming both; None: the one the cache was built with (`built_storage`), as
        for a k = 0 cache always (it holds token ids, no states, whatever it records).
        verify: how its files are checked against the digests recorded at build time
        (`PassageCache`): "sampled" by default (`dil_jax.open_domain.cache.digests` says what
        that catches), "full" every byte, "none" not at all; a cache without digests is opened with
        a warning saying how to add them. Also re-encodes two stored passages with this reader
        (`check_states`: one jitted encoder call on 2 rows, plus the first upper block's
        projections and statistics when the cache holds them), so a cache whose manifest claims
        another k than its states hold, or whose arrays belong to another model, is refused
        instead of giving wrong answers.
        """
        from dil_jax.open_domain.cache.reuse import reuse_encoder

        if storage is None or reader.config.num_lower_layers == 0:
            storage = self.built_storage(reader)
        key = self.cache_key(reader, storage)
        cache = PassageCache.open(self.cache_location(key), key, verify)
        # The cache builder's own encoder, at a batch of the rows it checks.
        encode = reader.passage_encoder(CHECKED_ROWS, self.window_texts)
        reuse = reuse_encoder(reader, batch_size=CHECKED_ROWS) if cache.has_reuse else None
        if encode is not None:
            check_states(cache, encode, reuse)
        for warning in cache.digest_warnings():  # never silently unchecked
            log.warning("%s", warning)
        return cache

    def window_texts(self, rows: np.ndarray) -> list[str]:
        """The text of each window's passage (rows: [n] window rows), in order."""
        passage_of_row = self.windows.passage_of_row
        return [self.passages[int(passage_of_row[row])].text for row in np.asarray(rows)]

    def cache_key(self, reader: Reader, storage: Storage = FLOAT32) -> CacheKey:
        """What a cache of this index must have been built with to serve `reader`."""
        tokenizer_id = tokenizer_fingerprint(reader.tokenizer)
        if tokenizer_id != self.settings.tokenizer:
            raise OpenDomainIndexError(
                f"{self.directory / 'index.json'}: index tokenized with "
                f"{self.settings.tokenizer}, reader tokenizer is {tokenizer_id}")
        return reader_cache_key(reader.config, reader.weights_fingerprint(), tokenizer_id,
                               self.settings.max_passage_len, self.settings.passages, storage)


def index_settings(summary: StoreSummary, tokenizer, *, max_passage_len: int,
                   doc_stride: int, split: dict[str, Any]) -> IndexSettings:
    """The index.json settings of passages of this `summary` (`store.summarize_passages`),
    before any tokenizing (cheap: a hash): no windows counted yet."""
    return IndexSettings(split=split, max_passage_len=max_passage_len, doc_stride=doc_stride,
                         tokenizer=tokenizer_fingerprint(tokenizer),
                         passages=summary.fingerprint, num_passages=summary.count)


def build_index(directory: str | os.PathLike, passages: Iterable[Passage], tokenizer, *,
                max_passage_len: int, doc_stride: int, split: dict[str, Any],
                retriever: str = "rank-bm25") -> OpenDomainIndex:
    """Writes passages, BM25 and windows into `directory` under its lock; index.json last.

    passages: iterated once, one at a time (a list, or `corpus.iter_passages`): they are
    written to the passage store (`index.store`) as they come, and BM25 and the windows are
    built from it. retriever: the BM25 engine (`dil_jax.defaults.RETRIEVER_ENGINES`),
    recorded in index.json; the index is rebuilt with it (its caches kept when the passages
    agree).

    Everything that can fail is done before the folder is touched: the engine's environment is
    checked (`check_engine_available`: a missing Java names the install), and the new files are
    written into a staging folder beside the index (`.index-files.tmp-PID`). Only then is the
    old index uncommitted (index.json removed), the new files swapped in by renames, and
    index.json written: a failed build (a rebuild with another engine, a full disk) leaves the
    index it found working.

    Rebuilding over an index with the same settings (a repair) keeps its caches; over one with
    other settings it removes them (they belong to the old passages). Refuses a folder that
    holds anything but an index, rather than writing into it.
    """
    directory = Path(directory).absolute()
    check_engine_available(retriever)
    with index_lock(directory):
        old = stored_settings(directory)
        staging = directory / f".index-files.tmp-{os.getpid()}"
        remove_entry(staging)
        try:
            summary = stage_passages_and_bm25(staging, passages, retriever)
            num_windows = _stage_windows(staging, tokenizer, max_passage_len, doc_stride)
            names = CHECKED_FILES + tuple(f"bm25/{file}"
                                          for file in index_files(staging / "bm25"))
            settings = dataclasses.replace(
                index_settings(summary, tokenizer, max_passage_len=max_passage_len,
                               doc_stride=doc_stride, split=split),
                num_windows=num_windows, retriever=retriever,
                files={name: file_fingerprint(staging / name) for name in names})
            # The format is the windows file's layout, which the caches do not depend on.
            keep = old is not None and old.same_index(settings)
            # Uncommit: from here until index.json is back, the folder holds no index.
            (directory / "index.json").unlink(missing_ok=True)
            if not keep:
                for entry in sorted(directory.iterdir()):
                    if re.fullmatch(r"\.?(cache-k.*|sentences-.*)", entry.name):
                        log.info("removing %s (built for the index being replaced)", entry)
                        remove_entry(entry)
            _swap_in(staging, directory, INDEX_ENTRIES)
        finally:
            remove_entry(staging)
        with write_errors(directory / "index.json"):
            write_atomic(directory / "index.json", json.dumps(settings.to_json(), indent=2))
        return open_index(directory)


# What `build_index` writes besides index.json (files, and the BM25 folder).
INDEX_ENTRIES = CHECKED_FILES + ("bm25",)


def stage_passages_and_bm25(staging: Path, passages: Iterable[Passage],
                            retriever: str) -> StoreSummary:
    """Writes the passage store (passages.jsonl, passages.offsets.npy) and bm25/ into
    `staging` (a new folder inside the index); returns the passages' summary. The BM25 part
    of `build_index`, which `benchmarks/bm25_build_memory.py` measures.

    `passages` are iterated once; Lucene (pyserini) then reads the texts back from the store
    one at a time, so with it nothing here grows with the corpus but the store's offsets (8
    bytes a passage, on disk). rank-bm25 and bm25s are built from a list of every text, and
    refused first where that would not fit in memory (`check_engine_fits`). A full or
    read-only disk names the index's file (`write_errors`); no passages: OpenDomainIndexError.
    """
    target = staging.parent
    with write_errors(target):
        staging.mkdir(parents=True)
    with write_errors(target / PASSAGES_FILE):
        summary = write_passage_store(passages, staging)
    if summary.count == 0:
        raise OpenDomainIndexError("no passages to index (is the corpus empty?)")
    check_engine_fits(retriever, summary.count, summary.text_bytes)
    built = build_retriever(PassageStore.open(staging).texts(), retriever)
    with write_errors(target / "bm25"):
        built.save(staging / "bm25", fingerprint=summary.fingerprint)
    return summary


def _stage_windows(staging: Path, tokenizer, max_passage_len: int, doc_stride: int) -> int:
    """Writes windows.npz of the passages staged in `staging` (read back from the store a
    block at a time: `index.windows.write_windows`); returns the window count."""
    target = staging.parent
    with write_errors(target / WINDOWS_FILE):
        return write_windows(staging / WINDOWS_FILE, PassageStore.open(staging).texts(),
                             tokenizer, max_passage_len=max_passage_len, doc_stride=doc_stride)


def _swap_in(staging: Path, directory: Path, names: Sequence[str]) -> None:
    """Moves each staged entry into `directory` by a rename (a folder replaces the old one: the
    old one is moved into the staging folder first, and goes with it)."""
    for name in names:
        target = directory / name
        if (staging / name).is_dir() and target.exists():
            os.replace(target, staging / f"{name}.old")
        os.replace(staging / name, target)


def open_index(directory: str | os.PathLike) -> OpenDomainIndex:
    """Opens a built index, checking its files against index.json (sizes, sha256, passages
    fingerprint); a missing, damaged or edited file is IndexBrokenError naming it.

    The passages stay on disk (`index.store.PassageStore`, read by offset). Their texts are
    fingerprinted only for an index built before index.json recorded its files' sha256 (the
    sha256 of passages.jsonl, checked here, covers them otherwise); an index built before the
    offsets file has its line starts found once here (8 bytes a passage in memory).
    """
    directory = Path(directory)
    settings = read_settings(directory)
    files = settings.files  # none in indexes built before the check existed
    passages_path = directory / PASSAGES_FILE
    if not passages_path.is_file():
        raise broken_file(passages_path, "the file is missing")
    for name, recorded in files.items():
        check_file(directory, name, recorded)
    try:
        passages = PassageStore.open(directory)
    except OSError as error:
        raise broken_file(passages_path, f"cannot be read ({error.strerror})") from error
    except ValueError as error:  # np.load of a damaged offsets file
        raise broken_file(directory / OFFSETS_FILE, f"unreadable ({error})") from error
    _check_passages(passages, settings, checked=PASSAGES_FILE in files)
    try:
        retriever = load_retriever(directory / "bm25", fingerprint=settings.passages)
    except RetrievalError as error:
        raise IndexBrokenError(f"{error}; {REPAIR_HINT}") from error
    windows_path = directory / WINDOWS_FILE
    try:
        windows = PassageWindows.open(windows_path)  # read by rows: nothing read yet
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as error:
        raise broken_file(windows_path, f"unreadable ({error})") from error
    if len(windows.first) != len(passages) or \
            len(windows.passage_of_row) != settings.num_windows:
        raise broken_file(windows_path, f"{len(windows.first)} passages and "
                          f"{len(windows.passage_of_row)} windows, index.json says "
                          f"{len(passages)} and {settings.num_windows}")
    return OpenDomainIndex(directory, settings, passages, retriever, windows)


def _check_passages(passages: PassageStore, settings: IndexSettings, checked: bool) -> None:
    """Refuses (IndexBrokenError naming passages.jsonl) a store of another passage count than
    index.json's, whose first and last lines are not passages, or (unless its sha256 was
    `checked`) whose texts do not have index.json's fingerprint."""
    path = passages.path
    if len(passages) != settings.num_passages:
        raise broken_file(path, f"{len(passages)} passages, index.json says "
                          f"{settings.num_passages}")
    if checked:
        for number in sorted({0, len(passages) - 1} if len(passages) else set()):
            try:
                passages[number]
            except (ValueError, TypeError) as error:
                raise broken_file(path, f"line {number + 1} is not a passage ({error})"
                                  ) from error
        return
    fingerprint = TextsFingerprint()
    for number, line in enumerate(_lines(path), 1):
        try:
            fingerprint.add(Passage(**json.loads(line)).text)
        except (ValueError, TypeError) as error:
            raise broken_file(path, f"line {number} is not a passage ({error})") from error
    if fingerprint.hexdigest() != settings.passages:
        raise broken_file(path, "the passage texts differ from the ones the index was "
                          "built over (fingerprint mismatch)")


def _lines(path: Path) -> Iterator[str]:
    """The lines of a text file, decoded as UTF-8 (undecodable bytes replaced)."""
    with path.open("rb") as stream:
        for line in stream:
            yield line.decode("utf-8", errors="replace")


def window_arrays(index: OpenDomainIndex) -> dict[str, np.ndarray]:
    """ids, mask, offsets, max_context of every window (what a passage cache is built from,
    and a reader decodes spans with), read by rows from windows.npz (`index.windows`)."""
    return windows_file_arrays(index.directory / WINDOWS_FILE)


def build_reader_cache(index: OpenDomainIndex, reader: Reader, *, encode: StatesEncoder | None,
                       storage: Storage = FLOAT32, chunk_passages: int = 256,
                       progress: Callable[[int], None] | None = None,
                       reuse: ReuseEncoder | None = None, process_index: int = 0,
                       process_count: int = 1, wait_timeout_s: float = 86400.0,
                       peer_check: Callable[[], None] | None = None,
                       cache_store: str | None = None) -> PassageCache:
    """Builds (or resumes, or just opens, or repairs) the passage cache of `reader` over the
    index, holding this process's lock of the index (`index_lock`).

    encode: (ids, mask) -> lower states; None for k = 0 (the cache then holds tokens only).
    storage: the scheme (`dil_jax.open_domain.cache.storage`). reuse: the first upper
    block's arrays to store too (`dil_jax.open_domain.cache.reuse.reuse_encoder`), or None.
    chunk_passages: windows encoded per step (the grid shards are cut on). process_count > 1:
    this process builds its shard of a sharded cache (`build_sharded_passage_cache`; every
    process calls this alike; peer_check runs at its every wait); 1: the unsharded cache.
    cache_store: a store URL (`cache.store_build.store_url`): the cache is built there by
    every process alike, one shard each (`build_store_cache`; this index records the URL,
    `cache-store.json`), instead of in the index folder.
    """
    key = index.cache_key(reader, storage)
    num_heads = reader.config.num_heads if reuse else None
    with index_lock(index.directory, process_index):
        arrays = window_arrays(index)
        pad_id = int(reader.tokenizer.pad_token_id or 0)  # what windows pad their ids with
        if cache_store is not None:
            record_cache_store(index.directory, cache_store)
            return build_store_cache(
                Location.of(cache_store) / key.folder_name, key, arrays["ids"], arrays["mask"],
                arrays["offsets"], encode, process_index=process_index,
                process_count=process_count, chunk_passages=chunk_passages, progress=progress,
                reuse=reuse, num_heads=num_heads, wait_timeout_s=wait_timeout_s, pad_id=pad_id)
        if process_count > 1:
            return build_sharded_passage_cache(
                index.cache_dir(key), key, arrays["ids"], arrays["mask"],
                arrays["offsets"], encode, process_index=process_index,
                process_count=process_count, chunk_passages=chunk_passages, progress=progress,
                reuse=reuse, num_heads=num_heads, wait_timeout_s=wait_timeout_s,
                peer_check=peer_check, pad_id=pad_id)
        return build_passage_cache(index.cache_dir(key), key, arrays["ids"],
                                   arrays["mask"], arrays["offsets"], encode,
                                   chunk_passages=chunk_passages,
                                   progress=progress, reuse=reuse, num_heads=num_heads,
                                   pad_id=pad_id)
