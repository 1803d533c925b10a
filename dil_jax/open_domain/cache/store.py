"""The passage cache: tokenized passages and their lower states, computed once, read by subset.

This module holds the cache's reading side: the layout below, the checks on open, the errors,
and `PassageCache`; the manifest's fields are `dil_jax.open_domain.cache.manifest`'s. What a
cache is checked against (the fingerprints, `reader_cache_key`, `check_states`) is
`dil_jax.open_domain.cache.check`'s. Writing
a cache (`build_passage_cache`, the staging folder, resumption; `build_sharded_passage_cache` and
the multi-process waits) is `dil_jax.open_domain.cache.build`'s and `cache_shards`'s: every
process that only reads a cache (answering, evaluating) needs none of it, and the builders
depend on this module, never the reverse.

Layout of a cache folder:

  manifest.json   what the states were computed with (`CacheManifest`: model fingerprint, k,
                  tokenizer, lengths, storage, passages fingerprint, `reuse`); opening a cache
                  that does not match the reader is an error, never silently wrong answers
  ids.npy         [num_passages, passage_len] int32   `p [SEP]` token ids
  mask.npy        [num_passages, passage_len] int32
  offsets.npy     [num_passages, passage_len, 2] int32 character offsets in the passage text
  states.npy      [num_passages, passage_len, hidden]  lower states in the manifest's storage
                  (`dil_jax.open_domain.cache.storage`: float32, bfloat16 as uint16 bits, int8
                  codes, [.., d] int8 PCA coordinates, or [.., M] uint8 pq codes); absent for
                  k = 0, whose passage states depend on the question
  states.scale.npy      [num_passages, passage_len] float32, per-token int8 scales (int8, pca<d>)
  states.pca_mean.npy   [hidden], states.pca_basis.npy [hidden, d] float32 (pca<d>; pq<M>: d =
                        hidden, its rotation)
  states.pq_codebook.npy  [M, 256, hidden / M] float32 (pq<M>)
  upper_*.npy     with `reuse` (`dil-jax index --cache-reuse`): the first upper block's passage
                  q/k/v and attention statistics (`dil_jax.open_domain.cache.reuse`), in the same
                  storage (int8 for pca<d> and pq<M>), each with its `.scale.npy` where scaled

A cache built by several processes (`dil-jax index --num-processes N`, one shard each;
`build_sharded_passage_cache`) is a folder of complete caches, one per contiguous row range:

  manifest.json   format SHARDED_FORMAT: the fields above plus `chunk_passages` and `shards`
                  ([{name, start, stop}]: shard i holds global rows start .. stop - 1)
  shards/shard-00000-of-00002/   a cache folder as above (its manifest adds `shard`), rows
                  [start, stop); every shard of a pca<d> or pq<M> cache holds the same basis
                  (and codebook)

`PassageCache` reads both layouts through one class: an unsharded cache is the one-shard case
(its own folder holds rows [0, num_passages)), and a global row is mapped to (shard, local row)
by the shards' row ranges.

The arrays are plain `.npy` files opened as memory maps, so reading the states of the top-p
passages of a question touches only those rows.

Opening checks what can be checked cheaply: the manifest parses, every array loads with the shape
and dtype the manifest implies (a truncated `.npy` fails here), and — where the caller can encode —
a few stored states (and stored first-upper-block arrays) equal a fresh computation stored the
same way (`check_states`), so a cache whose manifest claims another k, or whose arrays belong to
another model, is refused, naming the file. A cache that fails these is `CacheBrokenError`;
`dil-jax index` rebuilds such a cache instead of failing on it.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dil_jax.errors import DilJaxError
from dil_jax.open_domain.cache.digests import verify_folder
from dil_jax.open_domain.cache.manifest import (
    CACHE_FORMAT,
    MANIFEST_FILE,
    SHARDED_FORMAT,
    SHARDS_DIR,
    STORAGE_FIELD,
    CacheKey,
    CacheManifest,
    ManifestFieldError,
    cache_name,
    shard_name,
)
from dil_jax.open_domain.cache.row_arrays import RowArray, gather_rows
from dil_jax.open_domain.cache.storage import FLOAT32, CacheStorageError, PcaBasis, Storage

# How a cache's files are checked against their digests when it is opened
# (`dil_jax.open_domain.cache.digests`): "sampled" on every open, "full" by `dil-jax index
# --verify`, "none" where the files were just written or checked.
VERIFY_LEVELS = ("sampled", "full", "none")


class CacheMismatchError(DilJaxError, ValueError):
    """A cache was built for another model, k, tokenizer or passage set; names the field."""


class ShardWaitError(DilJaxError):
    """A process of a sharded build waited longer than its limit for another process's work
    (process 0's plan, another shard, the finished cache): that process died or lags."""


class CacheBrokenError(CacheMismatchError):
    """A cache file is unreadable, truncated, or holds states its manifest does not describe.

    `build_passage_cache` (`dil-jax index`) rebuilds such a cache; opening one names the file.
    """


# The first-upper-block arrays of a `reuse` cache (dil_jax.open_domain.cache.reuse explains them):
# [rows, p_len, hidden] in the cache's storage (pca<d>, pq<M>: int8, `Storage.without_pca`) ...
REUSE_WIDE_ARRAYS = ("upper_query", "upper_key", "upper_value", "upper_context")
# ... and [rows, p_len, heads] float32 always (an error here is amplified by exp()).
REUSE_LSE_ARRAY = "upper_logsumexp"


@dataclasses.dataclass(frozen=True)
class WindowBatch:
    """Some windows of an index, as a cache encodes them.

    rows: [n] the windows' rows in the index (global rows, whatever shard encodes them: a
    reader that reads characters finds each window's passage text by them); ids, mask:
    [n, p_len] int32; offsets: [n, p_len, 2] int32 character offsets into the passage text.
    """

    rows: np.ndarray
    ids: np.ndarray
    mask: np.ndarray
    offsets: np.ndarray

    @classmethod
    def of(cls, rows: np.ndarray, ids: np.ndarray, mask: np.ndarray, offsets: np.ndarray,
           first_row: int = 0) -> WindowBatch:
        """The windows `rows` of arrays that start at index row `first_row` (a shard's)."""
        rows = np.asarray(rows, np.int64)
        return cls(rows + first_row, np.asarray(ids[rows]), np.asarray(mask[rows]),
                   np.asarray(offsets[rows]))


# What a cache's arrays are computed with, by its builder and again by the check on open:
# WindowBatch -> lower states [rows, p_len, hidden] ...
StatesEncoder = Callable[[WindowBatch], np.ndarray]
# ... and (float32 lower states, mask) -> the first-upper-block arrays by name
# (`dil_jax.open_domain.cache.reuse.reuse_encoder`).
ReuseEncoder = Callable[[np.ndarray, np.ndarray], dict[str, np.ndarray]]


def _mismatch(manifest_path: Path, field: str, stored: Any, wanted: Any) -> str:
    """Why a cache does not serve this run (one MATCHED_FIELDS field differs) and the fix. The
    storage is a flag of the reading commands, not a property of the reader: name the flag and
    the value that reads this cache."""
    if field == STORAGE_FIELD:
        return (f"{manifest_path}: the cache stores its states as {stored!r} and this run reads "
                f"{wanted!r} (--cache-dtype {wanted}); give --cache-dtype {stored} to read it")
    return (f"{manifest_path}: cache built with {field} = {stored!r}, but the reader has "
            f"{field} = {wanted!r}; rebuild the cache (dil-jax index)")


def _broken(path: Path, problem: str) -> CacheBrokenError:
    return CacheBrokenError(f"{path}: broken passage cache ({problem}); rerun `dil-jax index` "
                            "with the same --out and reader to rebuild it")


class StoredArray:
    """One float array of a cache, [rows, p_len, width], in its storage scheme (read-only).

    Files: `{stem}.npy` (codes, [rows, p_len, code_width]), `{stem}.scale.npy` ([rows, p_len],
    scaled schemes), `{stem}.pca_mean.npy` / `{stem}.pca_basis.npy` (pca<d>, pq<M>),
    `{stem}.pq_codebook.npy` (pq<M>). A file missing,
    truncated, or of the wrong shape or dtype is CacheBrokenError naming it.
    """

    def __init__(self, directory: Path, stem: str, storage: Storage,
                 shape: tuple[int, int, int]):
        rows, length, width = shape
        self.storage, self.path = storage, directory / f"{stem}.npy"
        self.codes = _load_array(self.path, (rows, length, storage.code_width(width)))
        if self.codes.dtype != storage.code_dtype:
            raise _broken(self.path, f"dtype {self.codes.dtype} does not match the manifest's "
                                     f"storage {storage.name!r}")
        self.scale = (_load_array(directory / f"{stem}.scale.npy", (rows, length))
                      if storage.scaled else None)
        self.pca = None
        if storage.has_basis:
            self.pca = PcaBasis.of({
                suffix: np.asarray(_load_array(directory / f"{stem}.{suffix}.npy", shape))
                for suffix, shape in storage.basis_shapes(width).items()})

    def read(self, indices: Sequence[int]) -> np.ndarray:
        """[len(indices), p_len, width] float32: those rows, decoded."""
        rows = np.asarray(indices)
        return self.storage.decode(self.codes[rows],
                                   None if self.scale is None else self.scale[rows], self.pca)

    def round_trip(self, x: np.ndarray) -> np.ndarray:
        """What this array would hold for values x [..., width] (its storage's round trip)."""
        return self.storage.round_trip(x, self.pca)


class StoredRows:
    """A StoredArray per shard, read by global row (the one-shard case: one StoredArray)."""

    def __init__(self, parts: Sequence[StoredArray], starts: np.ndarray, directory: Path,
                 stem: str):
        self.parts, self.starts = list(parts), np.asarray(starts, np.int64)
        self.storage = self.parts[0].storage
        self.num_rows = sum(len(part.codes) for part in self.parts)
        # The file an error names: the array's own with one shard; the pattern of them with more.
        self.path = (self.parts[0].path if len(self.parts) == 1
                     else directory / SHARDS_DIR / "*" / f"{stem}.npy")
        first = self.parts[0]
        for part in self.parts[1:]:
            if first.pca is not None and not part.pca.equals(first.pca):
                raise _broken(part.path.with_name(f"{stem}.pca_basis.npy"),
                              f"its PCA basis (or pq codebook) differs from "
                              f"{first.path.parent.name}'s; every shard must hold the same")

    def read(self, indices: Sequence[int]) -> np.ndarray:
        """[len(indices), p_len, width] float32: those rows, decoded."""
        rows = np.asarray(indices, np.int64)
        first = self.parts[0]
        width = first.codes.shape[2] if first.pca is None else first.pca.basis.shape[0]
        return gather_rows(self.starts, self.num_rows, rows,
                       lambda s, local: self.parts[s].read(local),
                       (first.codes.shape[1], width), np.float32)

    def round_trip(self, x: np.ndarray) -> np.ndarray:
        """What this array would hold for values x [..., width] (every shard stores alike)."""
        return self.parts[0].round_trip(x)


def _shard_ranges_of(directory: Path, manifest: CacheManifest) -> list[tuple[int, int, Path]]:
    """(start, stop, folder) of each shard of a cache: itself for an unsharded one. The
    manifest's `shards` must tile [0, num_passages) in order, each a folder under shards/."""
    rows = manifest.num_passages
    if not manifest.is_sharded:
        return [(0, rows, directory)]
    ranges, expected_start = [], 0
    for number, shard in enumerate(manifest.shards):
        name, start, stop = shard.name, shard.start, shard.stop
        if start != expected_start or stop < start or Path(name).parent != Path(SHARDS_DIR) \
                or name != f"{SHARDS_DIR}/{shard_name(number, len(manifest.shards))}":
            listed = dict(name=name, start=start, stop=stop)
            raise _broken(directory / MANIFEST_FILE, f"shards[{number}] = {listed!r} does not "
                                                     f"continue the rows at {expected_start} in "
                                                     f"{SHARDS_DIR}/")
        ranges.append((start, stop, directory / name))
        expected_start = stop
    if expected_start != rows:
        raise _broken(directory / MANIFEST_FILE, f"the shards hold {expected_start} rows, "
                                                 f"num_passages is {rows}")
    return ranges


def _check_shard_manifest(folder: Path, top: CacheManifest, number: int, count: int,
                          start: int, stop: int) -> CacheManifest:
    """A shard's own manifest, checked to agree with the cache's (MATCHED_FIELDS, reuse, its
    rows): a shard of another build put in its place is refused, naming it."""
    path = folder / MANIFEST_FILE
    own = _read_manifest_json(path)
    wanted = dict(top.key.to_json(), reuse=top.reuse)
    wanted["shard"] = dict(index=number, count=count, start=start, stop=stop)
    for field, value in wanted.items():
        if own.get(field) != value:
            raise _broken(path, f"{field} = {own.get(field)!r}, the cache's manifest says "
                                f"{value!r}")
    return _parsed(path, own)


def _read_manifest_json(path: Path) -> dict[str, Any]:
    """The JSON object of a manifest file; CacheBrokenError when missing or not one."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as error:
        raise _broken(path, "the file is missing") from error
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise _broken(path, f"not readable JSON: {error}") from error
    if not isinstance(value, dict):
        raise _broken(path, f"expected a JSON object, got {type(value).__name__}")
    return value


def _parsed(path: Path, value: dict[str, Any]) -> CacheManifest:
    """The CacheManifest of a manifest file's JSON object; CacheBrokenError naming the field."""
    try:
        return CacheManifest.from_json(value)
    except (ManifestFieldError, CacheStorageError) as error:
        raise _broken(path, str(error)) from error


class PassageCache:
    """An opened cache (read-only memory maps), unsharded or sharded (read by global row).

    manifest: its CacheManifest; storage: how its states are stored (the manifest's).
    ids, mask [rows, p_len], offsets [rows, p_len, 2]: RowArrays. states: the lower states (a
    StoredRows), None for k = 0. reuse: name -> StoredRows of the first-upper-block arrays
    (REUSE_WIDE_ARRAYS, REUSE_LSE_ARRAY), None unless built with them. shards: (start, stop,
    folder) of each shard; an unsharded cache is one shard, its own folder. folders: (folder,
    its CacheManifest) of every folder holding files: the cache's, and each shard's.
    """

    def __init__(self, directory: Path, manifest: CacheManifest, verify: str = "sampled"):
        """Maps the arrays; one missing, truncated or of the wrong shape is CacheBrokenError,
        and so is a file that differs from the digests its manifest recorded (`verify`:
        "sampled", the cheap check on open, "full", every byte, or "none";
        `dil_jax.open_domain.cache.digests` says what each catches)."""
        if verify not in VERIFY_LEVELS:
            raise ValueError(f"verify={verify!r}, expected one of {VERIFY_LEVELS}")
        self.directory = directory
        self.manifest = manifest
        self.storage = manifest.key.storage
        length, hidden = manifest.key.max_passage_len, manifest.key.hidden_size
        self.shards = _shard_ranges_of(directory, manifest)
        self.folders = [(directory, manifest)]
        if len(self.shards) > 1:
            self.folders += [(folder, _check_shard_manifest(folder, manifest, number,
                                                            len(self.shards), start, stop))
                             for number, (start, stop, folder) in enumerate(self.shards)]
        starts = np.asarray([start for start, _, _ in self.shards], np.int64)

        def rows_of(name: str, *tail: int) -> RowArray:
            return RowArray([_load_array(folder / f"{name}.npy", (stop - start, length, *tail))
                             for start, stop, folder in self.shards], starts)

        def stored(stem: str, storage: Storage, width: int) -> StoredRows:
            return StoredRows([StoredArray(folder, stem, storage, (stop - start, length, width))
                               for start, stop, folder in self.shards], starts, directory, stem)

        self.ids, self.mask, self.offsets = rows_of("ids"), rows_of("mask"), rows_of("offsets", 2)
        self.states = (None if manifest.key.num_lower_layers == 0
                       else stored("states", self.storage, hidden))
        self.reuse: dict[str, StoredRows] | None = None
        if manifest.reuse:
            wide = self.storage.without_pca()
            self.reuse = {name: stored(name, wide, hidden) for name in REUSE_WIDE_ARRAYS}
            self.reuse[REUSE_LSE_ARRAY] = stored(REUSE_LSE_ARRAY, FLOAT32, manifest.num_heads)
        # After the shapes (a truncated file is named as such): the bytes against the digests.
        self.digest_checks = ([] if verify == "none" else
                              [verify_folder(folder, own.digests, full=verify == "full")
                               for folder, own in self.folders])
        for check in self.digest_checks:
            if check.problems:
                raise _broken(*check.problems[0])

    def digest_warnings(self) -> list[str]:
        """What the digest check on open could not do cheaply, and how to fix it: caches
        written before digests existed (not checked), files whose modification time changed
        while their bytes did not (hashed whole on every open)."""
        index = self.directory.parent
        warnings = []
        undigested = [check.folder for check in self.digest_checks if not check.digested]
        if undigested:
            warnings.append(
                f"{self.directory}: written by an older dil-jax without file digests, so its "
                "bytes are not checked on open (only its shapes and two re-encoded rows); rerun "
                f"`dil-jax index --out {index}` with the same settings and this reader to "
                "record them (they record the files as they are now), or delete the folder and "
                "rerun it to rebuild the cache")
        rehashed = [str(check.folder / name) for check in self.digest_checks
                    for name in check.rehashed]
        if rehashed:
            warnings.append(
                f"{', '.join(rehashed)}: modified since the build by their time but not by "
                f"their bytes (every byte checked: a copy that did not keep times?); `dil-jax "
                f"index --verify --out {index}` records the new times so later opens check "
                "them cheaply again")
        return warnings

    def __len__(self) -> int:
        return self.ids.shape[0]

    @classmethod
    def open(cls, directory: str | os.PathLike, expected: CacheKey | None = None,
             verify: str = "sampled") -> PassageCache:
        """Opens a finished cache; its MATCHED_FIELDS must be `expected`'s exactly (a reader's
        key: `cache.check.reader_cache_key`); `verify`: how its files are checked against their
        digests (`__init__`)."""
        directory = Path(directory)
        manifest_path = directory / MANIFEST_FILE
        if not manifest_path.is_file():
            if directory.is_dir():
                # A finished cache always has its manifest: this folder was damaged.
                raise _broken(manifest_path, "the file is missing")
            partial = directory.with_name(f".{directory.name}.partial")
            hint = " (an unfinished build exists: rerun it to resume)" if partial.exists() else ""
            raise CacheMismatchError(f"{directory}: no passage cache here{hint}")
        manifest = _read_manifest_json(manifest_path)
        if manifest.get("format") not in (CACHE_FORMAT, SHARDED_FORMAT):
            raise CacheMismatchError(f"{manifest_path}: format {manifest.get('format')!r}, "
                                     f"expected {CACHE_FORMAT!r} or {SHARDED_FORMAT!r}")
        # Checked on the file's values as written, before they are parsed: a field another
        # build wrote differently is a mismatch to name, not a broken cache to delete.
        if (directory.name.startswith("cache-k") and isinstance(manifest.get("model"), str)
                and "num_lower_layers" in manifest
                and directory.name != cache_name(manifest["num_lower_layers"],
                                                 manifest["model"])):
            # The folder name was derived from the manifest when it was written.
            raise _broken(manifest_path, f"it says k={manifest.get('num_lower_layers')}, model "
                                         f"{str(manifest['model'])[:8]}, but the folder is "
                                         f"{directory.name}; was it edited?")
        for field, value in (expected.to_json() if expected else {}).items():
            if manifest.get(field) != value:
                raise CacheMismatchError(_mismatch(manifest_path, field, manifest.get(field),
                                                   value))
        return cls(directory, _parsed(manifest_path, manifest), verify)

    def passage_side(self, indices: Sequence[int]) -> np.ndarray:
        """What pairs read of those passages (`PairGrid.passage_side`, from the cache): the
        ids [len(indices), passage_len] for a k = 0 cache (it holds no states), else
        `read_states` [len(indices), passage_len, hidden]."""
        if self.states is None:
            return self.ids.take(np.asarray(indices, np.int64))
        return self.read_states(indices)

    def read_states(self, indices: Sequence[int]) -> np.ndarray:
        """[len(indices), passage_len, hidden] float32 lower states of those passages only
        (decoded from the cache's storage)."""
        if self.states is None:
            raise CacheMismatchError(f"{self.directory}: a k = 0 cache holds no lower states")
        return self.states.read(indices)

    @property
    def has_reuse(self) -> bool:
        """Whether the cache holds the first upper block's passage arrays (`reuse`)."""
        return self.reuse is not None

    def read_reuse(self, indices: Sequence[int]) -> dict[str, np.ndarray]:
        """name -> float32 [len(indices), passage_len, hidden (heads for the log-sum-exp)] of the
        first-upper-block arrays of those passages (`dil_jax.open_domain.cache.reuse.pair_inputs`
        turns them into the pair program's p_qkv / p_stats)."""
        if self.reuse is None:
            raise CacheMismatchError(f"{self.directory}: this cache holds no first-upper-block "
                                     "arrays (built without `dil-jax index --cache-reuse`)")
        return {name: array.read(indices) for name, array in self.reuse.items()}


def _load_array(path: Path, shape: tuple[int, ...]) -> np.ndarray:
    """The .npy at `path` as a read-only memory map of exactly `shape`, else CacheBrokenError."""
    if not path.is_file():
        raise _broken(path, "the file is missing")
    try:
        array = np.load(path, mmap_mode="r")
    except (OSError, ValueError, EOFError) as error:  # a truncated file fails here
        raise _broken(path, f"unreadable, truncated? ({error})") from error
    if array.shape != shape:
        raise _broken(path, f"shape {array.shape}, the manifest implies {shape}")
    return array


def cache_bytes_per_token(cache: PassageCache) -> dict[str, float]:
    """File bytes per token slot (num_passages x passage_len, padding included) of each part of
    a cache, from the files on disk: `states` (lower states: codes, scales, PCA basis), `reuse`
    (the first-upper-block arrays), `tokens` (ids, mask, offsets), `total` (every file, the
    manifest included). The per-scheme formulas (docs/open_domain.md) are these less the .npy
    headers and the amortised PCA basis."""
    slots = max(cache.manifest.num_passages * cache.manifest.key.max_passage_len, 1)
    parts = dict(states=0, reuse=0, tokens=0, total=0)
    for path in cache.directory.rglob("*"):  # a sharded cache: every shard's files
        if not path.is_file():
            continue
        size = path.stat().st_size
        parts["total"] += size
        if path.name.startswith("states."):
            parts["states"] += size
        elif path.name.startswith("upper_"):
            parts["reuse"] += size
        elif path.name in ("ids.npy", "mask.npy", "offsets.npy"):
            parts["tokens"] += size
    return {name: size / slots for name, size in parts.items()}
