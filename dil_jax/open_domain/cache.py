"""The passage cache: tokenized passages and their lower states, computed once, read by subset.

Layout of a cache folder:

  manifest.json   what the states were computed with (model fingerprint, k, tokenizer, lengths,
                  storage `dtype`, passages fingerprint, `reuse`); opening a cache that does not
                  match the reader is an error, never silently wrong answers
  ids.npy         [num_passages, passage_len] int32   `p [SEP]` token ids
  mask.npy        [num_passages, passage_len] int32
  offsets.npy     [num_passages, passage_len, 2] int32 character offsets in the passage text
  states.npy      [num_passages, passage_len, hidden]  lower states in the manifest's storage
                  (`dil_jax.open_domain.compression`: float32, bfloat16 as uint16 bits, int8
                  codes, or [.., d] int8 PCA coordinates); absent for k = 0, whose passage
                  states depend on the question
  states.scale.npy      [num_passages, passage_len] float32, per-token int8 scales (int8, pca<d>)
  states.pca_mean.npy   [hidden], states.pca_basis.npy [hidden, d] float32 (pca<d>)
  upper_*.npy     with `reuse` (`dil-jax index --cache-reuse`): the first upper block's passage
                  q/k/v and attention statistics (`dil_jax.open_domain.reuse`), in the same
                  storage (int8 for pca<d>), each with its `.scale.npy` where scaled

A cache built by several processes (`dil-jax index --num-processes N`, one shard each;
`build_sharded_passage_cache`) is a folder of complete caches, one per contiguous row range:

  manifest.json   format SHARDED_FORMAT: the fields above plus `chunk_passages` and `shards`
                  ([{name, start, stop}]: shard i holds global rows start .. stop - 1)
  shards/shard-00000-of-00002/   a cache folder as above (its manifest adds `shard`), rows
                  [start, stop); every shard of a pca<d> cache holds the same basis

`PassageCache` reads both layouts through one class: an unsharded cache is the one-shard case
(its own folder holds rows [0, num_passages)), and a global row is mapped to (shard, local row)
by the shards' row ranges.

The arrays are plain `.npy` files opened as memory maps, so reading the states of the top-p
passages of a question touches only those rows. Building is resumable and atomic: everything is
written into `.<name>.partial/` with a progress record updated after each flushed chunk, and the
folder is renamed into place only when complete.

Opening checks what can be checked cheaply: the manifest parses, every array loads with the shape
and dtype the manifest implies (a truncated `.npy` fails here), and — where the caller can encode —
a few stored states (and stored first-upper-block arrays) equal a fresh computation stored the
same way (`check_states`), so a cache whose manifest claims another k, or whose arrays belong to
another model, is refused, naming the file. A cache that fails these is `CacheBrokenError`;
`dil-jax index` rebuilds such a cache instead of failing on it.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from dil_jax.atomic import write_atomic
from dil_jax.checkpoints.fingerprint import params_fingerprint, short_sha256
from dil_jax.errors import DilJaxError
from dil_jax.open_domain.compression import CacheStorageError, PcaBasis, Storage, fit_pca

log = logging.getLogger(__name__)

CACHE_FORMAT = "dil_jax.passage_cache/1"
# A cache of several shards. Its own format name (not a field of /1): code that knows only /1
# refuses it as another format instead of taking it for a broken /1 cache and deleting it.
SHARDED_FORMAT = "dil_jax.passage_cache/2"
SHARDS_DIR = "shards"
_MANIFEST = "manifest.json"
_PROGRESS = "progress.json"
# Fields a reader must agree with; anything else in the manifest is informational.
MATCHED_FIELDS = ("model", "architecture", "num_lower_layers", "hidden_size", "tokenizer",
                  "max_passage_len", "dtype", "passages")


class CacheMismatchError(DilJaxError, ValueError):
    """A cache was built for another model, k, tokenizer or passage set; names the field."""


class ShardWaitError(DilJaxError):
    """A process of a sharded build waited longer than its limit for another process's work
    (process 0's plan, another shard, the finished cache): that process died or lags."""


class CacheBrokenError(CacheMismatchError):
    """A cache file is unreadable, truncated, or holds states its manifest does not describe.

    `build_passage_cache` (`dil-jax index`) rebuilds such a cache; opening one names the file.
    """


# Rows compared by `check_states`: first and last are enough to catch another k or model (every
# state of a row changes), and cost one tiny encoder call.
CHECKED_ROWS = 2
# Mean |stored - expected| / mean |expected| above which stored values are not this encoder's,
# where expected = the fresh values sent through the array's own storage (its round trip), so
# compression error does not count: re-encoding in float32 differs by ~1e-6 (more across devices,
# e.g. TF32 matmuls on a GPU: ~1e-3), which flips an int8 code or a bfloat16 rounding only near a
# rounding boundary (~4e-3 at most on the mean); another k or model differs by tens of percent.
CHECK_TOLERANCE = {"float32": 1e-3}
QUANTIZED_TOLERANCE = 1e-2

# The first-upper-block arrays of a `reuse` cache (dil_jax.open_domain.reuse explains them):
# [rows, p_len, hidden] in the cache's storage (pca<d>: int8, they have no basis of their own) ...
REUSE_WIDE_ARRAYS = ("upper_query", "upper_key", "upper_value", "upper_context")
# ... and [rows, p_len, heads] float32 always (an error here is amplified by exp()).
REUSE_LSE_ARRAY = "upper_logsumexp"
# PCA bases are fitted on the states of up to this many windows, evenly spread over the corpus,
# and up to this many of their real tokens (a width x width covariance: memory does not grow).
PCA_FIT_WINDOWS = 1024
PCA_FIT_TOKENS = 131072


def shard_name(index: int, count: int) -> str:
    """The folder (under shards/) of shard `index` of `count`."""
    return f"shard-{index:05d}-of-{count:05d}"


def cache_name(manifest: dict[str, Any]) -> str:
    """The folder name of a cache inside an index: one per (k, reader weights)."""
    return f"cache-k{manifest['num_lower_layers']}-{manifest['model'][:8]}"


def _broken(path: Path, problem: str) -> CacheBrokenError:
    return CacheBrokenError(f"{path}: broken passage cache ({problem}); rerun `dil-jax index` "
                            "with the same --out and reader to rebuild it")


def tokenizer_fingerprint(tokenizer) -> str:
    vocab = sorted(tokenizer.get_vocab().items())
    return f"{type(tokenizer).__name__}:{short_sha256([json.dumps(vocab).encode()])}"


def texts_fingerprint(texts: Sequence[str]) -> str:
    return short_sha256([json.dumps(list(texts)).encode()])


def _write_json_atomic(path: Path, value: Any) -> None:
    write_atomic(path, json.dumps(value, indent=2))


class StoredArray:
    """One float array of a cache, [rows, p_len, width], in its storage scheme (read-only).

    Files: `{stem}.npy` (codes, [rows, p_len, code_width]), `{stem}.scale.npy` ([rows, p_len],
    scaled schemes), `{stem}.pca_mean.npy` / `{stem}.pca_basis.npy` (pca<d>). A file missing,
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
        if storage.pca_dim is not None:
            self.pca = PcaBasis(
                np.asarray(_load_array(directory / f"{stem}.pca_mean.npy", (width,))),
                np.asarray(_load_array(directory / f"{stem}.pca_basis.npy",
                                       (width, storage.pca_dim))))

    def read(self, indices: Sequence[int]) -> np.ndarray:
        """[len(indices), p_len, width] float32: those rows, decoded."""
        rows = np.asarray(indices)
        return self.storage.decode(self.codes[rows],
                                   None if self.scale is None else self.scale[rows], self.pca)

    def round_trip(self, x: np.ndarray) -> np.ndarray:
        """What this array would hold for values x [..., width] (its storage's round trip)."""
        return self.storage.round_trip(x, self.pca)


def _locate(starts: np.ndarray, num_rows: int, rows: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray]:
    """(shard, local row) of global rows [n] (negative ones count from the end), for shards
    holding rows starts[i] .. starts[i + 1] - 1. An empty shard repeats the next one's start;
    side="right" then picks the shard that holds the row."""
    rows = np.asarray(rows, np.int64)
    rows = np.where(rows < 0, rows + num_rows, rows)
    if rows.size and (rows.min() < 0 or rows.max() >= num_rows):
        raise IndexError(f"row out of range for a cache of {num_rows} rows")
    shard = np.searchsorted(starts, rows, side="right") - 1
    return shard, rows - starts[shard]


class RowArray:
    """One array of a cache whose rows are kept in several memory-mapped parts (shards), indexed
    by global row: `a[rows]`, `a[row, i, j]`, `a[start:stop]`. Only the rows asked for are read.

    parts: [rows_i, ...] arrays (memory maps); starts: [num_parts] global row of each first row.
    """

    def __init__(self, parts: Sequence[np.ndarray], starts: np.ndarray):
        self.parts, self.starts = list(parts), np.asarray(starts, np.int64)
        self.shape = (sum(len(part) for part in self.parts),) + tuple(self.parts[0].shape[1:])
        self.dtype = self.parts[0].dtype
        self.ndim = len(self.shape)

    def __len__(self) -> int:
        return self.shape[0]

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        return np.asarray(self[:], dtype)

    def __getitem__(self, key) -> np.ndarray:
        row_key, rest = (key[0], key[1:]) if isinstance(key, tuple) else (key, ())
        if isinstance(row_key, (int, np.integer)):
            (shard,), (local,) = _locate(self.starts, len(self), np.asarray([row_key]))
            return self.parts[shard][(local,) + rest]
        rows = (np.arange(len(self))[row_key] if isinstance(row_key, slice)
                else np.asarray(row_key, np.int64))
        return self.take(rows)[(slice(None),) + rest]

    def take(self, rows: np.ndarray) -> np.ndarray:
        """[len(rows), ...] those global rows, in order."""
        return _gather(self.starts, len(self), rows, lambda s, local: self.parts[s][local],
                       self.shape[1:], self.dtype)


def _gather(starts: np.ndarray, num_rows: int, rows: np.ndarray,
            read: Callable[[int, np.ndarray], np.ndarray], tail: tuple[int, ...],
            dtype) -> np.ndarray:
    """[len(rows), *tail] rows gathered shard by shard: read(shard, local rows) -> their values."""
    shard, local = _locate(starts, num_rows, rows)
    if len(starts) == 1:
        return np.asarray(read(0, local))
    out = np.empty((len(local),) + tuple(tail), dtype)
    for s in np.unique(shard):
        chosen = shard == s
        out[chosen] = read(int(s), local[chosen])
    return out


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
            if first.pca is not None and not (
                    np.array_equal(part.pca.mean, first.pca.mean)
                    and np.array_equal(part.pca.basis, first.pca.basis)):
                raise _broken(part.path.with_name(f"{stem}.pca_basis.npy"),
                              f"its PCA basis differs from {first.path.parent.name}'s; every "
                              "shard must hold the same")

    def read(self, indices: Sequence[int]) -> np.ndarray:
        """[len(indices), p_len, width] float32: those rows, decoded."""
        rows = np.asarray(indices, np.int64)
        first = self.parts[0]
        width = first.codes.shape[2] if first.pca is None else first.pca.basis.shape[0]
        return _gather(self.starts, self.num_rows, rows,
                       lambda s, local: self.parts[s].read(local),
                       (first.codes.shape[1], width), np.float32)

    def round_trip(self, x: np.ndarray) -> np.ndarray:
        """What this array would hold for values x [..., width] (every shard stores alike)."""
        return self.parts[0].round_trip(x)


def _shard_ranges_of(directory: Path, manifest: dict[str, Any], rows: int
                     ) -> list[tuple[int, int, Path]]:
    """(start, stop, folder) of each shard of a cache: itself for an unsharded one. The
    manifest's `shards` must tile [0, rows) in order, each a folder under shards/."""
    if manifest.get("format") == CACHE_FORMAT:
        return [(0, rows, directory)]
    manifest_path = directory / _MANIFEST
    shards = manifest.get("shards")
    if not isinstance(shards, list) or not shards:
        raise _broken(manifest_path, "field 'shards' missing or empty")
    ranges, expected_start = [], 0
    for number, shard in enumerate(shards):
        try:
            name, start, stop = str(shard["name"]), int(shard["start"]), int(shard["stop"])
        except (KeyError, TypeError, ValueError) as error:
            raise _broken(manifest_path, f"shards[{number}] is not {{name, start, stop}}"
                          ) from error
        if start != expected_start or stop < start or Path(name).parent != Path(SHARDS_DIR) \
                or name != f"{SHARDS_DIR}/{shard_name(number, len(shards))}":
            raise _broken(manifest_path, f"shards[{number}] = {shard!r} does not continue the "
                                         f"rows at {expected_start} in {SHARDS_DIR}/")
        ranges.append((start, stop, directory / name))
        expected_start = stop
    if expected_start != rows:
        raise _broken(manifest_path, f"the shards hold {expected_start} rows, num_passages is "
                                     f"{rows}")
    return ranges


def _check_shard_manifest(folder: Path, top: dict[str, Any], number: int, count: int,
                          start: int, stop: int) -> None:
    """A shard's own manifest agrees with the cache's (MATCHED_FIELDS, reuse, its rows): a
    shard of another build put in its place is refused, naming it."""
    path = folder / _MANIFEST
    try:
        own = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as error:
        raise _broken(path, "the file is missing") from error
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise _broken(path, f"not readable JSON: {error}") from error
    wanted = {field: top.get(field) for field in MATCHED_FIELDS + ("reuse",)}
    wanted["shard"] = dict(index=number, count=count, start=start, stop=stop)
    for field, value in wanted.items():
        if not isinstance(own, dict) or own.get(field) != value:
            raise _broken(path, f"{field} = {own.get(field) if isinstance(own, dict) else None!r}"
                                f", the cache's manifest says {value!r}")


class PassageCache:
    """An opened cache (read-only memory maps), unsharded or sharded (read by global row).

    ids, mask [rows, p_len], offsets [rows, p_len, 2]: RowArrays. states: the lower states (a
    StoredRows), None for k = 0. reuse: name -> StoredRows of the first-upper-block arrays
    (REUSE_WIDE_ARRAYS, REUSE_LSE_ARRAY), None unless built with them. shards: (start, stop,
    folder) of each shard; an unsharded cache is one shard, its own folder.
    """

    def __init__(self, directory: Path, manifest: dict[str, Any]):
        """Maps the arrays; one missing, truncated or of the wrong shape is CacheBrokenError."""
        self.directory = directory
        self.manifest = manifest
        try:
            rows, length = int(manifest["num_passages"]), int(manifest["max_passage_len"])
            hidden, k = int(manifest["hidden_size"]), int(manifest["num_lower_layers"])
            heads = int(manifest["num_heads"]) if manifest.get("reuse") else 0
        except (KeyError, TypeError, ValueError) as error:
            raise _broken(directory / _MANIFEST, f"field {error} missing or not a number"
                          ) from error
        try:
            self.storage = Storage.parse(str(manifest.get("dtype")), hidden)
        except CacheStorageError as error:
            raise _broken(directory / _MANIFEST, str(error)) from error
        self.shards = _shard_ranges_of(directory, manifest, rows)
        if len(self.shards) > 1:
            for number, (start, stop, folder) in enumerate(self.shards):
                _check_shard_manifest(folder, manifest, number, len(self.shards), start, stop)
        starts = np.asarray([start for start, _, _ in self.shards], np.int64)

        def rows_of(name: str, *tail: int) -> RowArray:
            return RowArray([_load_array(folder / f"{name}.npy", (stop - start, length, *tail))
                             for start, stop, folder in self.shards], starts)

        def stored(stem: str, storage: Storage, width: int) -> StoredRows:
            return StoredRows([StoredArray(folder, stem, storage, (stop - start, length, width))
                               for start, stop, folder in self.shards], starts, directory, stem)

        self.ids, self.mask, self.offsets = rows_of("ids"), rows_of("mask"), rows_of("offsets", 2)
        self.states = None if k == 0 else stored("states", self.storage, hidden)
        self.reuse: dict[str, StoredRows] | None = None
        if manifest.get("reuse"):
            wide = self.storage.without_pca()
            self.reuse = {name: stored(name, wide, hidden) for name in REUSE_WIDE_ARRAYS}
            self.reuse[REUSE_LSE_ARRAY] = stored(REUSE_LSE_ARRAY, Storage("float32"), heads)

    def __len__(self) -> int:
        return self.ids.shape[0]

    @classmethod
    def open(cls, directory: str | os.PathLike,
             expected: dict[str, Any] | None = None) -> PassageCache:
        """Opens a finished cache; `expected` fields (see MATCHED_FIELDS) must match exactly."""
        directory = Path(directory)
        manifest_path = directory / _MANIFEST
        if not manifest_path.is_file():
            if directory.is_dir():
                # A finished cache always has its manifest: this folder was damaged.
                raise _broken(manifest_path, "the file is missing")
            partial = directory.with_name(f".{directory.name}.partial")
            hint = " (an unfinished build exists: rerun it to resume)" if partial.exists() else ""
            raise CacheMismatchError(f"{directory}: no passage cache here{hint}")
        try:
            manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            raise _broken(manifest_path, f"not readable JSON: {error}") from error
        if not isinstance(manifest, dict):
            raise _broken(manifest_path, f"expected a JSON object, got {type(manifest).__name__}")
        if manifest.get("format") not in (CACHE_FORMAT, SHARDED_FORMAT):
            raise CacheMismatchError(f"{manifest_path}: format {manifest.get('format')!r}, "
                                     f"expected {CACHE_FORMAT!r} or {SHARDED_FORMAT!r}")
        if (directory.name.startswith("cache-k") and isinstance(manifest.get("model"), str)
                and "num_lower_layers" in manifest and directory.name != cache_name(manifest)):
            # The folder name was derived from the manifest when it was written.
            raise _broken(manifest_path, f"it says k={manifest.get('num_lower_layers')}, model "
                                         f"{str(manifest['model'])[:8]}, but the folder is "
                                         f"{directory.name}; was it edited?")
        for field, value in (expected or {}).items():
            if manifest.get(field) != value:
                raise CacheMismatchError(
                    f"{manifest_path}: cache built with {field} = {manifest.get(field)!r}, but "
                    f"the reader has {field} = {value!r}; rebuild the cache (dil-jax index)")
        return cls(directory, manifest)

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
        first-upper-block arrays of those passages (`dil_jax.open_domain.reuse.pair_inputs`
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


def _mean_relative_difference(stored: np.ndarray, expected: np.ndarray, mask: np.ndarray
                              ) -> float:
    """mean |stored - expected| / mean |expected| over the real tokens (mask [rows, p_len]):
    padding rows are never read."""
    mask = np.asarray(mask, bool)
    scale = float(np.abs(expected[mask]).mean()) or 1.0
    return float(np.abs(stored[mask] - expected[mask]).mean()) / scale


def _tolerance(storage: Storage) -> float:
    return CHECK_TOLERANCE.get(storage.name, QUANTIZED_TOLERANCE)


def check_states(cache: PassageCache,
                 encode: Callable[[np.ndarray, np.ndarray], np.ndarray],
                 reuse: Callable[[np.ndarray, np.ndarray], dict[str, np.ndarray]] | None = None
                 ) -> None:
    """Refuses (CacheBrokenError) a cache whose stored states (or reuse arrays) are not these.

    Re-encodes CHECKED_ROWS sampled rows (the first and the last), sends the fresh values through
    each array's own storage (so compression error does not count) and compares them with the
    stored ones, so a manifest edited to claim another k (or model) is caught on open. With
    `reuse` and a cache holding the first-upper-block arrays, those are recomputed from the fresh
    states and compared too; a mismatch names the file. A k = 0 cache holds no states: nothing
    to compare.

    encode: (ids, mask) [rows, passage_len] -> [rows, passage_len, hidden] lower states.
    reuse: (states, mask) -> the first-upper-block arrays (`dil_jax.open_domain.reuse`).
    """
    if cache.states is None or not len(cache):
        return
    rows = sorted({0, len(cache) - 1})[:CHECKED_ROWS]
    mask = np.asarray(cache.mask[rows])
    fresh = np.asarray(encode(np.asarray(cache.ids[rows]), mask), dtype=np.float32)
    difference = _mean_relative_difference(cache.read_states(rows),
                                           cache.states.round_trip(fresh), mask)
    if not difference <= _tolerance(cache.storage):
        k = cache.manifest["num_lower_layers"]
        raise CacheBrokenError(
            f"{cache.directory}: the stored states do not match k={k} of this reader (mean "
            f"relative difference {difference:.3g} on {len(rows)} sampled passages): the cache "
            "was built by another model or k, or its manifest was edited; rerun `dil-jax index` "
            "with the same --out and reader to rebuild it")
    if reuse is None or cache.reuse is None:
        return
    for name, fresh_array in reuse(fresh, mask).items():
        stored = cache.reuse[name]
        difference = _mean_relative_difference(stored.read(rows),
                                               stored.round_trip(fresh_array), mask)
        if not difference <= _tolerance(stored.storage):
            raise CacheBrokenError(
                f"{stored.path}: the stored first-upper-block array {name} does not match this "
                f"reader's (mean relative difference {difference:.3g} on {len(rows)} sampled "
                "passages): it belongs to another model or k, or was edited; rerun `dil-jax "
                "index` with the same --out and reader to rebuild the cache")


def build_passage_cache(directory: str | os.PathLike, manifest: dict[str, Any],
                        ids: np.ndarray, mask: np.ndarray, offsets: np.ndarray,
                        encode: Callable[[np.ndarray, np.ndarray], np.ndarray] | None,
                        hidden_size: int, chunk_passages: int = 256,
                        progress: Callable[[int], None] | None = None,
                        reuse: Callable[[np.ndarray, np.ndarray], dict[str, np.ndarray]]
                        | None = None, num_heads: int | None = None,
                        pca: PcaBasis | None = None) -> PassageCache:
    """Builds (or resumes building) a cache; returns it opened.

    An existing cache is reused when it matches `manifest` (and, with `encode`, `check_states`)
    and holds the reuse arrays if they are asked for; a broken one (CacheBrokenError) is removed
    and rebuilt, with a warning; one built for other settings is refused, naming the field. The
    caller must hold the index's lock (`dil_jax.open_domain.index_lock.index_lock`): this
    removes and renames folders inside the index.

    Args:
      manifest: MATCHED_FIELDS values (and anything informational) describing the encoder; its
        `dtype` names the storage (`dil_jax.open_domain.compression.Storage`).
      ids, mask: [num_passages, passage_len]; offsets: [num_passages, passage_len, 2].
      encode: (ids, mask) chunk -> [chunk, passage_len, hidden] lower states, or None for k = 0.
      progress: called with the number of passages finished after each chunk.
      reuse: (float32 lower states, mask) chunk -> the first-upper-block arrays to store beside
        them (`dil_jax.open_domain.reuse.reuse_encoder`; needs `encode` and num_heads), or None.
      pca: the basis a pca<d> cache stores (a shard gets its cache's, so every shard has the
        same); None fits one on these rows' states.

    Rows are encoded in chunks of `chunk_passages` from row 0 (the last one shorter), so a shard
    whose rows start on a chunk boundary encodes exactly the chunks an unsharded build of all
    rows encodes for them.
    """
    directory = Path(directory).absolute()
    if reuse is not None and (encode is None or not num_heads):
        raise CacheMismatchError("the first-upper-block arrays need lower states (k > 0) and "
                                 "the number of heads")
    manifest = dict(manifest, format=CACHE_FORMAT, num_passages=int(ids.shape[0]),
                    reuse=reuse is not None)
    if reuse is not None:
        manifest["num_heads"] = int(num_heads)
    storage = Storage.parse(manifest["dtype"], hidden_size)
    cache = _existing_cache(directory, manifest, encode, reuse)
    if cache is not None:
        return cache
    staging = directory.with_name(f".{directory.name}.partial")
    done = _resume_point(staging, manifest)
    if done is None:
        if encode is not None and storage.pca_dim is not None and pca is None:
            pca = fit_pca(_pca_sample(ids, mask, encode), storage.pca_dim)
        _start_fresh(staging, manifest, ids, mask, offsets, encode is not None, hidden_size,
                     storage, pca)
        done = 0
    elif done:
        log.info("%s: resuming at window %d of %d", staging, done, ids.shape[0])
    if encode is not None:
        writers = {"states": _ArrayWriter(staging, "states", storage)}
        if reuse is not None:
            writers.update({name: _ArrayWriter(staging, name, storage.without_pca())
                            for name in REUSE_WIDE_ARRAYS})
            writers[REUSE_LSE_ARRAY] = _ArrayWriter(staging, REUSE_LSE_ARRAY, Storage("float32"))
        for start in range(done, ids.shape[0], chunk_passages):
            stop = min(start + chunk_passages, ids.shape[0])
            chunk = np.asarray(encode(ids[start:stop], mask[start:stop]), dtype=np.float32)
            values = {"states": chunk}
            if reuse is not None:
                # From the exact float32 states, not their stored round trip: each array then
                # carries only its own storage error.
                values.update(reuse(chunk, mask[start:stop]))
            for name, writer in writers.items():
                writer.write(start, values[name])
            for writer in writers.values():
                writer.flush()  # data on disk before the progress record says so
            _write_json_atomic(staging / _PROGRESS, {"done": stop})
            if progress:
                progress(stop)
        del writers
    (staging / _PROGRESS).unlink(missing_ok=True)
    (staging / "plan.json").unlink(missing_ok=True)
    _write_json_atomic(staging / _MANIFEST, manifest)
    os.replace(staging, directory)
    return PassageCache.open(directory)


def _existing_cache(directory: Path, manifest: dict[str, Any],
                    encode: Callable[[np.ndarray, np.ndarray], np.ndarray] | None,
                    reuse: Callable[[np.ndarray, np.ndarray], dict[str, np.ndarray]] | None
                    ) -> PassageCache | None:
    """The finished cache at `directory` if it serves `manifest` (checked: `check_states`),
    None if there is none (a broken one is removed, with a warning); another build's is
    CacheMismatchError."""
    if not directory.exists():
        return None
    try:
        cache = PassageCache.open(directory, {f: manifest[f] for f in MATCHED_FIELDS
                                              if f in manifest})
        if reuse is not None and not cache.has_reuse:
            raise CacheMismatchError(
                f"{directory / _MANIFEST}: cache built without the first upper block's "
                "arrays, and this run asks for them (--cache-reuse)")
        if encode is not None:
            check_states(cache, encode, reuse)
        return cache
    except CacheBrokenError as error:
        log.warning("%s -- rebuilding it", error)
        shutil.rmtree(directory)
        return None
    except CacheMismatchError as error:
        raise CacheMismatchError(
            f"{error}. This run would build a different cache under the same name: delete "
            f"{directory} to rebuild it with this run's settings, or use another --out"
        ) from error


class _ArrayWriter:
    """Writes float32 rows into a StoredArray's files (created by `_create_array`)."""

    def __init__(self, staging: Path, stem: str, storage: Storage):
        self.storage = storage
        self.codes = np.load(staging / f"{stem}.npy", mmap_mode="r+")
        self.scale = (np.load(staging / f"{stem}.scale.npy", mmap_mode="r+")
                      if storage.scaled else None)
        self.pca = None
        if storage.pca_dim is not None:
            self.pca = PcaBasis(np.load(staging / f"{stem}.pca_mean.npy"),
                                np.load(staging / f"{stem}.pca_basis.npy"))

    def write(self, start: int, values: np.ndarray) -> None:
        """values: [n, p_len, width] float32 -> rows start .. start + n."""
        codes, scale = self.storage.encode(values, self.pca)
        self.codes[start:start + len(values)] = codes
        if self.scale is not None:
            self.scale[start:start + len(values)] = scale

    def flush(self) -> None:
        self.codes.flush()
        if self.scale is not None:
            self.scale.flush()


def _create_array(staging: Path, stem: str, storage: Storage, shape: tuple[int, int, int],
                  pca: PcaBasis | None = None) -> None:
    """Empty files of a StoredArray [rows, p_len, width] (and its PCA basis) in `staging`."""
    rows, length, width = shape
    np.lib.format.open_memmap(staging / f"{stem}.npy", mode="w+", dtype=storage.code_dtype,
                              shape=(rows, length, storage.code_width(width))).flush()
    if storage.scaled:
        np.lib.format.open_memmap(staging / f"{stem}.scale.npy", mode="w+", dtype=np.float32,
                                  shape=(rows, length)).flush()
    if pca is not None:
        np.save(staging / f"{stem}.pca_mean.npy", pca.mean)
        np.save(staging / f"{stem}.pca_basis.npy", pca.basis)


def _pca_sample(ids: np.ndarray, mask: np.ndarray,
                encode: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> np.ndarray:
    """[n, hidden] float32 real-token lower states of up to PCA_FIT_WINDOWS windows spread evenly
    over the corpus (up to PCA_FIT_TOKENS of them, evenly spaced): what a PCA basis is fitted on.
    """
    rows = np.unique(np.linspace(0, len(ids) - 1, min(len(ids), PCA_FIT_WINDOWS)).astype(int))
    states = np.asarray(encode(ids[rows], mask[rows]), np.float32)
    tokens = states[np.asarray(mask[rows], bool)]
    step = max(1, -(-len(tokens) // PCA_FIT_TOKENS))
    return tokens[::step]


def _start_fresh(staging: Path, manifest: dict[str, Any], ids: np.ndarray, mask: np.ndarray,
                 offsets: np.ndarray, has_states: bool, hidden_size: int, storage: Storage,
                 pca: PcaBasis | None) -> None:
    """A new staging folder: token arrays, empty state (and reuse) arrays, the PCA basis
    (pca<d>, saved here so a resumed build encodes with the same one), the plan, progress 0."""
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    np.save(staging / "ids.npy", ids.astype(np.int32))
    np.save(staging / "mask.npy", mask.astype(np.int32))
    np.save(staging / "offsets.npy", offsets.astype(np.int32))
    shape = (ids.shape[0], ids.shape[1], hidden_size)
    if has_states:
        _create_array(staging, "states", storage, shape, pca)
    if manifest.get("reuse"):
        for name in REUSE_WIDE_ARRAYS:
            _create_array(staging, name, storage.without_pca(), shape)
        _create_array(staging, REUSE_LSE_ARRAY, Storage("float32"),
                      shape[:2] + (int(manifest["num_heads"]),))
    _write_json_atomic(staging / "plan.json", manifest)
    _write_json_atomic(staging / _PROGRESS, {"done": 0})


def cache_bytes_per_token(cache: PassageCache) -> dict[str, float]:
    """File bytes per token slot (num_passages x passage_len, padding included) of each part of
    a cache, from the files on disk: `states` (lower states: codes, scales, PCA basis), `reuse`
    (the first-upper-block arrays), `tokens` (ids, mask, offsets), `total` (every file, the
    manifest included). The per-scheme formulas (docs/open_domain.md) are these less the .npy
    headers and the amortised PCA basis."""
    slots = max(int(cache.manifest["num_passages"]) * int(cache.manifest["max_passage_len"]), 1)
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


def _resume_point(staging: Path, manifest: dict[str, Any]) -> int | None:
    """Passages already done in a compatible partial build, or None to start over."""
    try:
        planned = json.loads((staging / "plan.json").read_text())
        done = json.loads((staging / _PROGRESS).read_text())["done"]
    except (FileNotFoundError, json.JSONDecodeError, KeyError):
        return None
    return int(done) if planned == manifest else None


# ----------------------------------------------------------------- a cache built in shards

T = TypeVar("T")
# How often a waiting process looks at the shared folder again.
POLL_SECONDS = 1.0


def shard_ranges(num_rows: int, chunk_passages: int, count: int) -> list[tuple[int, int]]:
    """[start, stop) rows of each of `count` shards, made of whole chunks of the global grid.

    Chunk c holds rows c * chunk_passages .. (c + 1) * chunk_passages - 1 (the last one
    shorter); with C chunks, shard i gets chunks [i * C // count, (i + 1) * C // count): so
    every row is encoded in the same chunk, with the same shapes, whatever the shard count. A
    shard may be empty (fewer chunks than shards).
    """
    chunks = -(-num_rows // chunk_passages)
    bounds = [min(num_rows, (i * chunks // count) * chunk_passages) for i in range(count + 1)]
    return list(itertools.pairwise(bounds))


def sharded_manifest(manifest: dict[str, Any], num_rows: int, chunk_passages: int, count: int,
                     num_heads: int | None) -> dict[str, Any]:
    """The top-level manifest (and plan) of a cache of `count` shards: `manifest`'s fields,
    `chunk_passages` and `shards` [{name, start, stop}]; num_heads is given iff it stores the
    first-upper-block arrays."""
    top = dict(manifest, format=SHARDED_FORMAT, num_passages=int(num_rows),
               reuse=num_heads is not None, chunk_passages=int(chunk_passages),
               shards=[dict(name=f"{SHARDS_DIR}/{shard_name(i, count)}", start=start, stop=stop)
                       for i, (start, stop) in enumerate(shard_ranges(num_rows, chunk_passages,
                                                                      count))])
    if num_heads is not None:
        top["num_heads"] = int(num_heads)
    return top


def wait_for(check: Callable[[], T | None], what: Callable[[], str], timeout_s: float,
             poll_s: float = POLL_SECONDS) -> T:
    """check()'s first value that is not None, looking every poll_s seconds; ShardWaitError
    (saying `what()` was awaited) after timeout_s. A file poll, not a collective: a dead peer
    costs a clear error at the timeout instead of a hang, and hosts need share only a folder."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value is not None:
            return value
        if time.monotonic() >= deadline:
            raise ShardWaitError(f"waited {timeout_s:g} s for {what()}; is that process "
                                 "running (see its log)? Rerun every process with the same "
                                 "flags: finished shards are kept, unfinished ones resume")
        time.sleep(poll_s)


def _read_json(path: Path) -> Any:
    """The JSON at path, or None if it is missing or not (yet) readable."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _matched(manifest: dict[str, Any]) -> dict[str, Any]:
    return {field: manifest[field] for field in MATCHED_FIELDS if field in manifest}


def _finished(directory: Path, manifest: dict[str, Any]) -> PassageCache | None:
    """The finished cache at `directory` if one serving `manifest` is there, else None."""
    if not (directory / _MANIFEST).is_file():
        return None
    try:
        return PassageCache.open(directory, _matched(manifest))
    except CacheMismatchError:
        return None  # process 0 repairs or refuses it


def _plan_note(staging: Path, top: dict[str, Any]) -> str:
    """Why `staging`'s plan is not `top` (for a wait's error), or ''."""
    plan = _read_json(staging / "plan.json")
    if not isinstance(plan, dict):
        return ""
    fields = sorted(f for f in set(plan) | set(top) if plan.get(f) != top.get(f))
    return (f" (its plan differs from this process's in {', '.join(fields)}: give every "
            "process the same flags)") if fields else ""


def _prepare_staging(staging: Path, top: dict[str, Any], ids: np.ndarray, mask: np.ndarray,
                     encode: Callable[[np.ndarray, np.ndarray], np.ndarray] | None,
                     storage: Storage) -> PcaBasis | None:
    """(process 0) The staging folder of a sharded build, kept if planned alike (its finished
    and partial shards resume), else new; returns the PCA basis every shard stores (pca<d>:
    fitted once here, on the sample an unsharded build fits on). plan.json is written last:
    the other processes start their shards when it appears."""
    pca_files = (staging / "states.pca_mean.npy", staging / "states.pca_basis.npy")
    has_basis = encode is not None and storage.pca_dim is not None
    if _read_json(staging / "plan.json") == top:
        return PcaBasis(*(np.load(path) for path in pca_files)) if has_basis else None
    shutil.rmtree(staging, ignore_errors=True)
    (staging / SHARDS_DIR).mkdir(parents=True)
    pca = None
    if has_basis:
        pca = fit_pca(_pca_sample(ids, mask, encode), storage.pca_dim)
        np.save(pca_files[0], pca.mean)
        np.save(pca_files[1], pca.basis)
    _write_json_atomic(staging / "plan.json", top)
    return pca


def build_sharded_passage_cache(directory: str | os.PathLike, manifest: dict[str, Any],
                                ids: np.ndarray, mask: np.ndarray, offsets: np.ndarray,
                                encode: Callable[[np.ndarray, np.ndarray], np.ndarray] | None,
                                hidden_size: int, *, process_index: int, process_count: int,
                                chunk_passages: int = 256,
                                progress: Callable[[int], None] | None = None,
                                reuse: Callable[[np.ndarray, np.ndarray], dict[str, np.ndarray]]
                                | None = None, num_heads: int | None = None,
                                wait_timeout_s: float = 86400.0) -> PassageCache:
    """This process's shard of a cache built by `process_count` processes; returns the whole
    cache opened, once process 0 has finished it. Every process calls this with the same
    arguments (but process_index) and sees the same folder.

      process 0  reuses a finished cache serving `manifest` (as `build_passage_cache`), or
                 prepares `.NAME.partial/` (`_prepare_staging`: plan.json last), builds its
                 shard, waits for every shard's folder, writes manifest.json, renames the
                 folder into place (the only writer of anything outside its shard)
      process i  waits for process 0's plan (or the finished cache), builds shard i, waits for
                 the finished cache

    A shard is `build_passage_cache` of rows [start, stop) (`shard_ranges`) into
    `.NAME.partial/shards/shard-i-of-n/`: resumable chunk by chunk, a finished shard kept as
    is. Waits are file polls (`wait_for`), each failing after wait_timeout_s. The caller holds
    its process's lock of the index (`index_lock(..., process_index)`).

    ids, mask: [num_rows, passage_len]; offsets: [num_rows, passage_len, 2]; the other
    arguments as `build_passage_cache`'s (progress: windows of this shard finished).
    """
    directory = Path(directory).absolute()
    staging = directory.with_name(f".{directory.name}.partial")
    if reuse is not None and (encode is None or not num_heads):
        raise CacheMismatchError("the first-upper-block arrays need lower states (k > 0) and "
                                 "the number of heads")
    top = sharded_manifest(manifest, len(ids), chunk_passages, process_count,
                           num_heads if reuse is not None else None)
    storage = Storage.parse(manifest["dtype"], hidden_size)
    if process_index == 0:
        cache = _existing_cache(directory, top, encode, reuse)
        if cache is not None:
            return cache
        pca = _prepare_staging(staging, top, ids, mask, encode, storage)
    else:
        ready = wait_for(lambda: _finished(directory, top) or (
                             True if _read_json(staging / "plan.json") == top else None),
                         lambda: f"process 0 to plan {staging}{_plan_note(staging, top)}",
                         wait_timeout_s)
        if isinstance(ready, PassageCache):
            return ready
        pca = None
        if encode is not None and storage.pca_dim is not None:
            pca = PcaBasis(np.load(staging / "states.pca_mean.npy"),
                           np.load(staging / "states.pca_basis.npy"))
    start, stop = top["shards"][process_index]["start"], top["shards"][process_index]["stop"]
    shard = dict(manifest, shard=dict(index=process_index, count=process_count, start=start,
                                      stop=stop))
    build_passage_cache(staging / top["shards"][process_index]["name"], shard, ids[start:stop],
                        mask[start:stop], offsets[start:stop], encode, hidden_size,
                        chunk_passages=chunk_passages, progress=progress, reuse=reuse,
                        num_heads=num_heads, pca=pca)
    if process_index != 0:
        return wait_for(lambda: _finished(directory, top),
                        lambda: f"process 0 to finish {directory}", wait_timeout_s)

    def missing() -> list[str]:
        return [entry["name"] for entry in top["shards"]
                if not (staging / entry["name"] / _MANIFEST).is_file()]

    wait_for(lambda: None if missing() else True,
             lambda: f"shard(s) {', '.join(missing())} of {staging}", wait_timeout_s)
    PassageCache(staging, top)  # every shard maps and agrees with the plan, before committing
    _write_json_atomic(staging / _MANIFEST, top)
    os.replace(staging, directory)
    # After the rename: a crash just before it leaves a staging folder that still resumes.
    (directory / "plan.json").unlink()
    return PassageCache.open(directory)


def staged_progress(staging: Path) -> tuple[int, int, str | None]:
    """(windows done, windows planned, passages fingerprint) of an unfinished cache build,
    sharded or not; ValueError if it cannot be resumed (no readable plan or progress)."""
    plan = _read_json(staging / "plan.json")
    if not isinstance(plan, dict) or "num_passages" not in plan:
        raise ValueError("no readable plan")
    if plan.get("format") != SHARDED_FORMAT:
        progress = _read_json(staging / _PROGRESS)
        if not isinstance(progress, dict) or "done" not in progress:
            raise ValueError("no readable progress")
        return int(progress["done"]), int(plan["num_passages"]), plan.get("passages")
    done = 0
    for entry in plan.get("shards", []):
        folder = staging / entry["name"]
        if (folder / _MANIFEST).is_file():
            done += entry["stop"] - entry["start"]
        else:
            progress = _read_json(folder.with_name(f".{folder.name}.partial") / _PROGRESS)
            done += int(progress["done"]) if isinstance(progress, dict) else 0
    return done, int(plan["num_passages"]), plan.get("passages")


def reader_manifest(config, params: Any, tokenizer_id: str, max_passage_len: int,
                    passages_id: str, dtype: str = "float32") -> dict[str, Any]:
    """The MATCHED_FIELDS of a reader: what a cache must have been built with to serve it.

    dtype: the storage scheme (`--cache-dtype`: float32, bfloat16, int8 or pca<d>, d <= hidden);
    another name is CacheStorageError.
    """
    Storage.parse(dtype)  # an unknown name is refused before the config is read
    Storage.parse(dtype, config.hidden_size)
    return dict(model=params_fingerprint(params), architecture=config.architecture,
                num_lower_layers=config.num_lower_layers, hidden_size=config.hidden_size,
                tokenizer=tokenizer_id, max_passage_len=max_passage_len, dtype=dtype,
                passages=passages_id)
