"""An open-domain index folder: passages, their BM25 index, their windows, passage caches.

    index/
      index.json         split strategy, lengths, tokenizer, passage fingerprint, counts, and
                         the size and sha256 of every file below except the caches (`files`)
      passages.jsonl     one Passage per line (id, source document id, title, text, offsets)
      windows.npz        which cache rows (windows of `p_window [SEP]`) belong to which passage
      bm25/              the BM25 index (dil_jax.open_domain.retrieval)
      cache-k{k}-{model}/  one passage cache per (reader weights, k) (dil_jax.open_domain.cache)
      .lock              held (fcntl.flock) by the process building the index; names it

Passages longer than `max_passage_len - 1` tokens are read in strided windows exactly as SQuAD
contexts are (`dil_jax.data.features.window_contexts`), so a passage's answer is the same as the
SQuAD predict path gives for that (question, passage).

Consistency: `index.json` is written last (atomically), so a folder without it holds no index.
`open_index` checks every file `index.json` lists against its recorded size and sha256 (its cost:
docs/open_domain.md, "Checked on open") and the passages against their fingerprint, so an index
edited after it was built is refused, naming the file, instead of giving answers shifted by it.
Writers (`build_index`, `build_reader_cache`, `dil-jax index`) hold the folder's lock
(`index_lock`); a second writer fails at once with BusyError naming the holder.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import socket
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dil_jax.atomic import write_atomic
from dil_jax.data.features import window_contexts
from dil_jax.errors import BusyError, DilJaxError, OutputPathError
from dil_jax.open_domain.cache import (
    PassageCache,
    build_passage_cache,
    cache_name,
    check_states,
    reader_manifest,
    texts_fingerprint,
    tokenizer_fingerprint,
)
from dil_jax.open_domain.corpus import Passage
from dil_jax.open_domain.retrieval import BM25Retriever, RetrievalError

log = logging.getLogger(__name__)

INDEX_FORMAT = "dil_jax.odqa_index/1"
LOCK_NAME = ".lock"
# Files whose size and sha256 index.json records (the caches check themselves).
CHECKED_FILES = ("passages.jsonl", "windows.npz", "bm25/manifest.json", "bm25/weights.npz",
                 "bm25/vocabulary.json")
# Settings that decide the passages and windows: an index (and its caches) is reused only when
# all of them agree.
CORE_SETTINGS = ("format", "split", "max_passage_len", "doc_stride", "tokenizer", "passages",
                 "num_passages", "num_windows")
# What an index folder may hold besides index.json; anything else means --out is some other
# folder, which an index build must not write into.
_INDEX_ENTRY = re.compile(r"(passages\.jsonl|windows\.npz|bm25|cache-k.*|sentences-.*|\..*)")
_TEMPORARY = re.compile(r"\..+\.tmp-(\d+)")
REPAIR_HINT = "rerun `dil-jax index` with the same --out and settings to repair it"


class OpenDomainIndexError(DilJaxError, ValueError):
    """An index folder is missing, incomplete or built with other settings; names the field."""


class IndexBrokenError(OpenDomainIndexError):
    """A file of a built index is missing, unreadable, or changed since the build."""


def _broken(path: Path, problem: str) -> IndexBrokenError:
    return IndexBrokenError(f"{path}: {problem}; {REPAIR_HINT}")


# ----------------------------------------------------------------------------- the build lock

# Locks this process holds: flock conflicts between two descriptors of one process, so nested
# writers (build_all -> build_index -> build_reader_cache) share the outermost lock.
_HELD: dict[Path, int] = {}


@contextlib.contextmanager
def index_lock(directory: str | os.PathLike) -> Iterator[Path]:
    """Holds `directory/.lock` (creating the folder) for the block; BusyError if another
    process holds it, naming that process (pid, host, start time) from the lock file;
    OutputPathError if the folder holds anything but an index (no lock file is put there).

    The kernel drops an flock when its holder dies, so a killed build never leaves a stale lock.
    A folder this call created is removed again if the block fails before writing into it.
    """
    # Resolved: two spellings of one folder (a symlink, `..`) must find the same held lock.
    directory = Path(directory).resolve()
    if directory in _HELD:
        _HELD[directory] += 1
        try:
            yield directory
        finally:
            _HELD[directory] -= 1
        return
    _refuse_foreign_folder(directory)  # before the lock file is written into it
    created = not directory.exists()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(directory / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as error:
        raise OutputPathError(f"{directory}: cannot create the index folder or its lock file "
                              f"({error.strerror}); choose another --out") from error
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            if error.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise BusyError(f"{directory}: {_holder(fd)} is writing this index (it holds "
                            f"{directory / LOCK_NAME}); wait for it to finish, or use another "
                            "--out") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(dict(
            pid=os.getpid(), host=socket.gethostname(),
            started=datetime.datetime.now().astimezone().isoformat(timespec="seconds"))).encode(),
            0)
        _HELD[directory] = 1
        try:
            yield directory
        except BaseException:
            if created and [e.name for e in directory.iterdir()] == [LOCK_NAME]:
                shutil.rmtree(directory)  # nothing was built: leave no empty folder behind
            raise
        finally:
            del _HELD[directory]
            # The file stays: unlinking it would let a waiter lock an orphaned inode.
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _holder(fd: int) -> str:
    """'process PID on HOST (started T)' from a held lock file, as far as it can be read."""
    try:
        record = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return (f"process {record['pid']} on {record['host']} (started {record['started']})")
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's
        return True
    return True


def clean_stale(directory: str | os.PathLike, passages_fingerprint: str | None = None
                ) -> list[str]:
    """Removes what killed builds left behind; returns one line per thing removed or kept.

    Inside the index (the caller holds its lock, so no live build owns them): every `.*.tmp-PID`
    staging file or folder, and every `.cache-*.partial` cache build that cannot be resumed
    (no readable plan, or planned over other passages). A resumable one is kept (rerunning with
    its reader resumes it) and reported. Beside the index: `.{name}.tmp-PID` folders of older
    builds, only when that process is gone.
    """
    directory = Path(directory).absolute()
    notes = []
    for entry in sorted(directory.iterdir()):
        reason = None
        if _TEMPORARY.fullmatch(entry.name):
            reason = "staging left by an interrupted build"
        elif entry.name.startswith(".cache-") and entry.name.endswith(".partial"):
            try:
                plan = json.loads((entry / "plan.json").read_text())
                done = json.loads((entry / "progress.json").read_text())["done"]
                total = plan["num_passages"]
            except (OSError, ValueError, KeyError, TypeError):
                reason = "an unfinished cache build that cannot be resumed"
            else:
                if passages_fingerprint is not None and plan.get("passages") != \
                        passages_fingerprint:
                    reason = "an unfinished cache build over other passages"
                else:
                    notes.append(f"kept {entry} ({done} of {total} windows encoded): rerun "
                                 "with its reader to resume it, or delete it")
        if reason:
            _remove(entry)
            notes.append(f"removed {entry} ({reason})")
    for entry in sorted(directory.parent.glob(f".{directory.name}.tmp-*")):
        match = _TEMPORARY.fullmatch(entry.name)
        if match and not _pid_alive(int(match.group(1))):
            _remove(entry)
            notes.append(f"removed {entry} (staging of a build whose process "
                         f"{match.group(1)} is gone)")
    return notes


def _remove(entry: Path) -> None:
    if entry.is_dir() and not entry.is_symlink():
        shutil.rmtree(entry)
    else:
        entry.unlink(missing_ok=True)


# ----------------------------------------------------------------------------- file checks


def file_fingerprint(path: Path, data: bytes | None = None) -> dict[str, Any]:
    """{"bytes": size, "sha256": hex digest} of a file (or of `data`, its bytes, when read)."""
    if data is None:
        digest = hashlib.sha256()
        with path.open("rb") as stream:
            for block in iter(lambda: stream.read(1 << 20), b""):
                digest.update(block)
        return dict(bytes=path.stat().st_size, sha256=digest.hexdigest())
    return dict(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())


def _check_file(directory: Path, name: str, recorded: dict[str, Any],
                data: bytes | None = None) -> None:
    """Refuses (IndexBrokenError) a file whose size or sha256 differs from index.json's."""
    path = directory / name
    if not path.is_file():
        raise _broken(path, "the file is missing")
    size = path.stat().st_size if data is None else len(data)
    if size != recorded.get("bytes"):
        raise _broken(path, f"{size} bytes, index.json recorded {recorded.get('bytes')}: the "
                            "file changed since the index was built")
    if file_fingerprint(path, data)["sha256"] != recorded.get("sha256"):
        raise _broken(path, "its sha256 differs from the one index.json recorded: the file "
                            "changed since the index was built")


def settings_differences(stored: dict[str, Any], wanted: dict[str, Any]) -> list[str]:
    """'setting: index has A, this run B' for each setting of `wanted` the index differs in.

    Both dicts are index.json settings (`wanted` as `index_settings` computes them for a run).
    """
    old_split, new_split = stored.get("split") or {}, wanted.get("split") or {}
    pairs = [("--split", old_split.get("strategy"), new_split.get("strategy")),
             ("--corpus-limit", old_split.get("limit"), new_split.get("limit")),
             ("--max-passage-len", stored.get("max_passage_len"), wanted["max_passage_len"]),
             ("--doc-stride", stored.get("doc_stride"), wanted["doc_stride"]),
             ("tokenizer", stored.get("tokenizer"), wanted["tokenizer"])]
    lines = [f"{name}: index has {old!r}, this run {new!r}" for name, old, new in pairs
             if old != new]
    if stored.get("passages") != wanted["passages"]:
        lines.append(f"--corpus: index has {stored.get('num_passages')} passages from "
                     f"{old_split.get('sources')}, this run {wanted['num_passages']} passages "
                     f"from {new_split.get('sources')} (fingerprints {stored.get('passages')} "
                     f"vs {wanted['passages']})")
    return lines


@dataclasses.dataclass
class PassageWindows:
    """Cache rows of each passage: rows first[i] .. first[i] + count[i] - 1 are passage i's.

    passage_of_row: [n_rows] passage index of each cache row.
    """

    first: np.ndarray
    count: np.ndarray
    passage_of_row: np.ndarray

    def rows_of(self, passages: Sequence[int]) -> np.ndarray:
        """Cache rows of these passages, in order."""
        if not len(passages):
            return np.zeros(0, np.int64)
        passages = np.asarray(passages)
        return np.concatenate([np.arange(self.first[p], self.first[p] + self.count[p])
                               for p in passages])


@dataclasses.dataclass
class OpenDomainIndex:
    directory: Path
    settings: dict[str, Any]
    passages: list[Passage]
    retriever: BM25Retriever
    windows: PassageWindows

    def cache_dir(self, manifest: dict[str, Any]) -> Path:
        return self.directory / cache_name(manifest)

    def open_cache(self, config, params, tokenizer, dtype: str = "float32") -> PassageCache:
        """The passage cache for this reader; a mismatch is an error naming the field.

        Also re-encodes two stored passages with this reader (`check_states`: one jitted
        encoder call on 2 rows, about a second of compiling on a CPU), so a cache whose manifest
        claims another k than its states hold is refused instead of giving wrong answers.
        """
        import jax

        from dil_jax.model.delayed import DelayedInteractionModel
        from dil_jax.model.modules import PASSAGE_SEGMENT

        manifest = self.reader_manifest(config, params, tokenizer, dtype)
        cache = PassageCache.open(self.cache_dir(manifest), manifest)
        model = DelayedInteractionModel(config)
        # Jitted (params as an argument, not baked-in constants): op-by-op dispatch of the k
        # blocks is slower than compiling them once.
        encode = jax.jit(lambda weights, ids, mask: model.encode_lower(weights, ids, mask,
                                                                       PASSAGE_SEGMENT))
        check_states(cache, lambda ids, mask: np.asarray(encode(params, ids, mask)))
        return cache

    def reader_manifest(self, config, params, tokenizer, dtype: str = "float32"
                        ) -> dict[str, Any]:
        tokenizer_id = tokenizer_fingerprint(tokenizer)
        if tokenizer_id != self.settings["tokenizer"]:
            raise OpenDomainIndexError(
                f"{self.directory / 'index.json'}: index tokenized with "
                f"{self.settings['tokenizer']}, reader tokenizer is {tokenizer_id}")
        return reader_manifest(config, params, tokenizer_id, self.settings["max_passage_len"],
                               self.settings["passages"], dtype)


def index_settings(passages: Sequence[Passage], tokenizer, *, max_passage_len: int,
                   doc_stride: int, split: dict[str, Any]) -> dict[str, Any]:
    """The index.json settings of these passages, before any tokenizing (cheap: a hash)."""
    return dict(format=INDEX_FORMAT, split=split, max_passage_len=max_passage_len,
                doc_stride=doc_stride, tokenizer=tokenizer_fingerprint(tokenizer),
                passages=texts_fingerprint([p.text for p in passages]),
                num_passages=len(passages))


def build_index(directory: str | os.PathLike, passages: Sequence[Passage], tokenizer, *,
                max_passage_len: int, doc_stride: int, split: dict[str, Any]) -> OpenDomainIndex:
    """Writes passages, windows and BM25 into `directory` under its lock; index.json last.

    Rebuilding over an index with the same settings (a repair) keeps its caches; over one with
    other settings it removes them (they belong to the old passages). Refuses a folder that
    holds anything but an index, rather than writing into it.
    """
    directory = Path(directory).absolute()
    if not passages:
        raise OpenDomainIndexError("no passages to index (is the corpus empty?)")
    texts = [p.text for p in passages]
    windows = window_contexts(tokenizer, texts, max_passage_len=max_passage_len,
                              doc_stride=doc_stride)
    settings = index_settings(passages, tokenizer, max_passage_len=max_passage_len,
                              doc_stride=doc_stride, split=split)
    settings["num_windows"] = int(windows.ids.shape[0])
    with index_lock(directory):
        old = _stored_settings(directory)
        keep = old is not None and all(old.get(f) == settings[f] for f in CORE_SETTINGS)
        # Uncommit first: from here until index.json is back, the folder holds no index.
        (directory / "index.json").unlink(missing_ok=True)
        if not keep:
            for entry in sorted(directory.iterdir()):
                if re.fullmatch(r"\.?(cache-k.*|sentences-.*)", entry.name):
                    log.info("removing %s (built for the index being replaced)", entry)
                    _remove(entry)
        lines = "".join(json.dumps(dataclasses.asdict(passage), ensure_ascii=False) + "\n"
                        for passage in passages)
        write_atomic(directory / "passages.jsonl", lines)
        write_atomic(directory / "windows.npz", lambda out: np.savez(
            out, first=windows.first_window, count=windows.counts,
            passage_of_row=windows.context_index, ids=windows.ids, mask=windows.mask,
            offsets=windows.offsets, max_context=windows.max_context))
        BM25Retriever.build(texts).save(directory / "bm25", fingerprint=settings["passages"])
        settings["files"] = {name: file_fingerprint(directory / name)
                             for name in CHECKED_FILES}
        write_atomic(directory / "index.json", json.dumps(settings, indent=2))
        return open_index(directory)


def _refuse_foreign_folder(directory: Path) -> None:
    """OutputPathError when `directory` holds files that no index build wrote."""
    if not directory.is_dir() or (directory / "index.json").is_file():
        return
    foreign = sorted(e.name for e in directory.iterdir() if not _INDEX_ENTRY.fullmatch(e.name)
                     and e.name != "index.json")
    if foreign:
        raise OutputPathError(
            f"{directory}: exists and is not an index folder (it holds {', '.join(foreign[:5])}"
            f"{', ...' if len(foreign) > 5 else ''}); choose another --out, or an empty folder")


def _stored_settings(directory: Path) -> dict[str, Any] | None:
    """index.json's settings, or None when there is none or it is unreadable."""
    try:
        settings = json.loads((directory / "index.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return settings if isinstance(settings, dict) else None


def read_settings(directory: str | os.PathLike) -> dict[str, Any]:
    """index.json of an index folder; OpenDomainIndexError (naming the fix) if missing or bad."""
    directory = Path(directory)
    settings_path = directory / "index.json"
    if not settings_path.is_file():
        raise OpenDomainIndexError(f"{directory}: not an open-domain index (no index.json); "
                                   "build one with `dil-jax index`")
    try:
        settings = json.loads(settings_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise _broken(settings_path, f"not readable JSON ({error})") from error
    if not isinstance(settings, dict):
        raise _broken(settings_path, "expected a JSON object")
    if settings.get("format") != INDEX_FORMAT:
        raise OpenDomainIndexError(f"{settings_path}: format {settings.get('format')!r}, expected "
                                   f"{INDEX_FORMAT!r}")
    missing = [f for f in CORE_SETTINGS if f not in settings]
    if missing:
        raise _broken(settings_path, f"field(s) {', '.join(missing)} missing")
    return settings


def open_index(directory: str | os.PathLike) -> OpenDomainIndex:
    """Opens a built index, checking its files against index.json (sizes, sha256, passages
    fingerprint); a missing, damaged or edited file is IndexBrokenError naming it."""
    directory = Path(directory)
    settings = read_settings(directory)
    files = settings.get("files") or {}  # absent in indexes built before the check existed
    passages_path = directory / "passages.jsonl"
    try:
        data = passages_path.read_bytes()
    except OSError as error:
        raise _broken(passages_path, f"cannot be read ({error.strerror})") from error
    if "passages.jsonl" in files:
        _check_file(directory, "passages.jsonl", files["passages.jsonl"], data)
    passages = []
    for number, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
        try:
            passages.append(Passage(**json.loads(line)))
        except (ValueError, TypeError) as error:
            raise _broken(passages_path, f"line {number} is not a passage ({error})") from error
    if len(passages) != settings["num_passages"]:
        raise _broken(passages_path, f"{len(passages)} passages, index.json says "
                                     f"{settings['num_passages']}")
    if texts_fingerprint([p.text for p in passages]) != settings["passages"]:
        raise _broken(passages_path, "the passage texts differ from the ones the index was "
                                     "built over (fingerprint mismatch)")
    for name, recorded in files.items():
        if name != "passages.jsonl":
            _check_file(directory, name, recorded)
    try:
        retriever = BM25Retriever.load(directory / "bm25", fingerprint=settings["passages"])
    except RetrievalError as error:
        raise IndexBrokenError(f"{error}; {REPAIR_HINT}") from error
    windows_path = directory / "windows.npz"
    try:
        with np.load(windows_path) as arrays:
            windows = PassageWindows(arrays["first"], arrays["count"], arrays["passage_of_row"])
    except (OSError, ValueError, KeyError, EOFError) as error:
        raise _broken(windows_path, f"unreadable ({error})") from error
    if len(windows.first) != len(passages) or \
            len(windows.passage_of_row) != settings["num_windows"]:
        raise _broken(windows_path, f"{len(windows.first)} passages and "
                                    f"{len(windows.passage_of_row)} windows, index.json says "
                                    f"{len(passages)} and {settings['num_windows']}")
    return OpenDomainIndex(directory, settings, passages, retriever, windows)


def window_arrays(index: OpenDomainIndex) -> dict[str, np.ndarray]:
    """ids, mask, offsets, max_context of every window (what a passage cache is built from)."""
    with np.load(index.directory / "windows.npz") as arrays:
        return {name: arrays[name] for name in ("ids", "mask", "offsets", "max_context")}


def build_reader_cache(index: OpenDomainIndex, config, params, tokenizer, *,
                       encode: Callable[[np.ndarray, np.ndarray], np.ndarray] | None,
                       dtype: str = "float32", chunk_passages: int = 256,
                       progress: Callable[[int], None] | None = None) -> PassageCache:
    """Builds (or resumes, or just opens, or repairs) the passage cache of this reader over
    the index, holding the index's lock.

    encode: (ids, mask) -> lower states; None for k = 0 (the cache then holds tokens only).
    """
    manifest = index.reader_manifest(config, params, tokenizer, dtype)
    with index_lock(index.directory):
        arrays = window_arrays(index)
        return build_passage_cache(index.cache_dir(manifest), manifest, arrays["ids"],
                                   arrays["mask"], arrays["offsets"], encode,
                                   config.hidden_size, chunk_passages=chunk_passages,
                                   progress=progress)
