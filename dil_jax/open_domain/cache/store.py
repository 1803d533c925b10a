"""The passage cache: tokenized passages and their lower states, computed once, read by subset.

This module holds the cache's reading side: the layout below, the checks on open, the errors,
and `PassageCache`; the manifest's fields are `dil_jax.open_domain.cache.manifest`'s. What a
cache is checked against (the fingerprints, `reader_cache_key`, `check_states`) is
`dil_jax.open_domain.cache.check`'s. Writing
a cache (`build_passage_cache`, the staging folder, resumption) is
`dil_jax.open_domain.cache.build`'s, building it in shards (`build_sharded_passage_cache`,
the multi-process waits) `dil_jax.open_domain.cache.shards`'s, and building it in a store at a
URL, by processes that share no folder (`build_store_cache`),
`dil_jax.open_domain.cache.store_build`'s: every process that only reads a cache (answering,
evaluating) needs none of it, and the builders depend on this module, never the reverse.

Layout of a cache (format RAGGED_FORMAT, what every build writes): a folder, or a prefix at a
URL that tensorstore's kvstore opens (`cache.location`: gs://, s3://, file://), holding

  manifest.json   what the states were computed with (`CacheManifest`: model fingerprint, k,
                  tokenizer, lengths, storage, passages fingerprint, `reuse`), the real tokens
                  (`num_tokens`) and pad id, and every file's digests; opening a cache that does
                  not match the reader is an error, never silently wrong answers
  token_starts/   [num_passages + 1] int64: row r is tokens token_starts[r] .. [r + 1] - 1
  ids/, offsets/  [num_tokens] int32, [num_tokens, 2] int32: real tokens only, no padding
  states/         [num_tokens, code_width] lower states in the manifest's storage
                  (`dil_jax.open_domain.cache.storage`: float32, bfloat16 as uint16 bits, int8
                  codes, [.., d] int8 PCA coordinates, or [.., M] uint8 pq codes); absent for
                  k = 0, whose passage states depend on the question
  states.scale/   [num_tokens] float32, per-token scales (int8, pca<d>)
  states.pca_mean/ [hidden], states.pca_basis/ [hidden, d] float32 (pca<d>; pq<M>: d = hidden,
                  its rotation), states.pq_codebook/ [M, 256, hidden / M] float32 (pq<M>)
  upper_*/        with `reuse` (`dil-jax index --cache-reuse`): the first upper block's passage
                  q/k/v and attention statistics (`dil_jax.open_domain.cache.reuse`), in the same
                  storage (int8 for pca<d> and pq<M>), each with its `.scale/` where scaled

each a zarr v3 array, chunked along the tokens and sharded (`cache.zarr_store`: one file per
shard, a crc32c on every chunk), read by `cache.ragged_store.RaggedPart`. Reading rows gathers
their tokens and pads them back to [rows, p_len, ...]: the mask is a prefix of ones per row
(`cache.ragged`), padding slots read as the pad id (ids), NO_OFFSET (offsets) and 0 (states:
never read, by the mask). No array is read whole on open; a question reads the chunks its
retrieved windows' tokens lie in, so memory does not grow with the corpus.

A cache built by several processes (`dil-jax index --num-processes N`, one shard each;
`build_sharded_passage_cache`) is a folder of complete caches, one per contiguous row range:

  manifest.json   the fields above plus `chunk_passages` and `shards` ([{name, start, stop}]:
                  shard i holds global rows start .. stop - 1), no arrays of its own
  shards/shard-00000-of-00002/   a cache folder as above (its manifest adds `shard`), rows
                  [start, stop); every shard of a pca<d> or pq<M> cache holds the same basis
                  (and codebook)

Caches of earlier builds (CACHE_FORMAT /1, SHARDED_FORMAT /2: padded `.npy` arrays
[rows, p_len, ...], memory-mapped) are read as before (`cache.legacy`), from local folders;
nothing writes them any more.

`PassageCache` reads every layout through one class: an unsharded cache is the one-shard case
(its own folder holds rows [0, num_passages)), and a global row is mapped to (shard, local row)
by the shards' row ranges.

Opening checks what can be checked cheaply: the manifest parses, every array opens with the shape
and dtype the manifest implies (a truncated `.npy` fails here), its files match their digests
(`cache.digests`: sizes, modification times, sampled blocks), and — where the caller can encode —
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

from dil_jax.open_domain.cache.digests import recorded_files, verify_folder
from dil_jax.open_domain.cache.errors import (  # noqa: F401  (re-exported)
    CacheBrokenError,
    CacheMismatchError,
    ShardWaitError,
    broken,
)
from dil_jax.open_domain.cache.legacy import PaddedPart
from dil_jax.open_domain.cache.location import Location
from dil_jax.open_domain.cache.manifest import (
    CACHE_FORMAT,
    FORMATS,
    MANIFEST_FILE,
    RAGGED_FORMAT,
    SHARDS_DIR,
    STORAGE_FIELD,
    CacheKey,
    CacheManifest,
    ManifestFieldError,
    cache_name,
    shard_name,
)
from dil_jax.open_domain.cache.ragged_store import RaggedPart
from dil_jax.open_domain.cache.row_arrays import RowArray, gather_rows
from dil_jax.open_domain.cache.storage import FLOAT32, CacheStorageError, Storage

# How a cache's files are checked against their digests when it is opened
# (`dil_jax.open_domain.cache.digests`): "sampled" on every open, "full" by `dil-jax index
# --verify`, "none" where the files were just written or checked.
VERIFY_LEVELS = ("sampled", "full", "none")

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
    def of(cls, rows: np.ndarray, ids, mask, offsets, first_row: int = 0) -> WindowBatch:
        """The windows `rows` of arrays (numpy, memory maps or `RowArray`s) that start at
        index row `first_row` (a shard's)."""
        rows = np.asarray(rows, np.int64)
        return cls(rows + first_row, np.asarray(ids[rows]), np.asarray(mask[rows]),
                   np.asarray(offsets[rows]))


# What a cache's arrays are computed with, by its builder and again by the check on open:
# WindowBatch -> lower states [rows, p_len, hidden] ...
StatesEncoder = Callable[[WindowBatch], np.ndarray]
# ... and (float32 lower states, mask) -> the first-upper-block arrays by name
# (`dil_jax.open_domain.cache.reuse.reuse_encoder`).
ReuseEncoder = Callable[[np.ndarray, np.ndarray], dict[str, np.ndarray]]


def _mismatch(manifest_path: object, field: str, stored: Any, wanted: Any) -> str:
    """Why a cache does not serve this run (one MATCHED_FIELDS field differs) and the fix. The
    storage is a flag of the reading commands, not a property of the reader: name the flag and
    the value that reads this cache."""
    if field == STORAGE_FIELD:
        return (f"{manifest_path}: the cache stores its states as {stored!r} and this run reads "
                f"{wanted!r} (--cache-dtype {wanted}); give --cache-dtype {stored} to read it")
    return (f"{manifest_path}: cache built with {field} = {stored!r}, but the reader has "
            f"{field} = {wanted!r}; rebuild the cache (dil-jax index)")


class StoredRows:
    """A stored float array per shard (`legacy.StoredArray` or
    `ragged_store.RaggedStoredArray`), read by global row (the one-shard case: one part)."""

    def __init__(self, parts: Sequence[Any], starts: np.ndarray, directory: Location,
                 stem: str):
        self.parts, self.starts = list(parts), np.asarray(starts, np.int64)
        self.storage = self.parts[0].storage
        self.num_rows = sum(part.num_rows for part in self.parts)
        # The file an error names: the array's own with one shard; the pattern of them with more.
        self.path = (self.parts[0].path if len(self.parts) == 1
                     else directory / SHARDS_DIR / "*" / stem)
        first = self.parts[0]
        for part in self.parts[1:]:
            if first.pca is not None and not part.pca.equals(first.pca):
                raise broken(part.path, "its PCA basis (or pq codebook) differs from the first "
                                        "shard's; every shard must hold the same")

    def read(self, indices: Sequence[int]) -> np.ndarray:
        """[len(indices), p_len, width] float32: those rows, decoded."""
        first = self.parts[0]
        return gather_rows(self.starts, self.num_rows, np.asarray(indices, np.int64),
                           lambda s, local: self.parts[s].read(local),
                           (first.p_len, first.width), np.float32)

    def round_trip(self, x: np.ndarray) -> np.ndarray:
        """What this array would hold for values x [..., width] (every shard stores alike)."""
        return self.parts[0].round_trip(x)


def _shard_ranges_of(directory: Location, manifest: CacheManifest
                     ) -> list[tuple[int, int, Location]]:
    """(start, stop, folder) of each shard of a cache: itself for an unsharded one. The
    manifest's `shards` must tile [0, num_passages) in order, each a folder under shards/."""
    rows = manifest.num_passages
    if not manifest.is_sharded:
        return [(0, rows, directory)]
    ranges, expected_start = [], 0
    for number, shard in enumerate(manifest.shards):
        name, start, stop = shard.name, shard.start, shard.stop
        if start != expected_start or stop < start \
                or name != f"{SHARDS_DIR}/{shard_name(number, len(manifest.shards))}":
            listed = dict(name=name, start=start, stop=stop)
            raise broken(directory / MANIFEST_FILE, f"shards[{number}] = {listed!r} does not "
                                                    f"continue the rows at {expected_start} in "
                                                    f"{SHARDS_DIR}/")
        ranges.append((start, stop, directory / name))
        expected_start = stop
    if expected_start != rows:
        raise broken(directory / MANIFEST_FILE, f"the shards hold {expected_start} rows, "
                                                f"num_passages is {rows}")
    return ranges


def _check_shard_manifest(folder: Location, top: CacheManifest, number: int, count: int,
                          start: int, stop: int) -> CacheManifest:
    """A shard's own manifest, checked to agree with the cache's (MATCHED_FIELDS, reuse, its
    rows, the format of a shard of it): a shard of another build put in its place is refused,
    naming it."""
    path = folder / MANIFEST_FILE
    own = _read_manifest_json(folder)
    wanted = dict(top.key.to_json(), reuse=top.reuse,
                  format=RAGGED_FORMAT if top.is_ragged else CACHE_FORMAT)
    wanted["shard"] = dict(index=number, count=count, start=start, stop=stop)
    for field, value in wanted.items():
        if own.get(field) != value:
            raise broken(path, f"{field} = {own.get(field)!r}, the cache's manifest says "
                               f"{value!r}")
    return _parsed(path, own)


def _read_manifest_json(folder: Location) -> dict[str, Any]:
    """The JSON object of a folder's manifest; CacheBrokenError when missing or not one."""
    path = folder / MANIFEST_FILE
    try:
        data = folder.read_bytes(MANIFEST_FILE)
        if data is None:
            raise broken(path, "the file is missing")
        value = json.loads(data.decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise broken(path, f"not readable JSON: {error}") from error
    if not isinstance(value, dict):
        raise broken(path, f"expected a JSON object, got {type(value).__name__}")
    return value


def _parsed(path: object, value: dict[str, Any]) -> CacheManifest:
    """The CacheManifest of a manifest file's JSON object; CacheBrokenError naming the field."""
    try:
        return CacheManifest.from_json(value)
    except (ManifestFieldError, CacheStorageError) as error:
        raise broken(path, str(error)) from error


def _part(folder: Location, manifest: CacheManifest, num_rows: int):
    """The reader of one folder's rows: a ragged store, or a padded (legacy) one."""
    if manifest.is_ragged:
        return RaggedPart(folder, manifest)
    if not folder.is_local:
        raise CacheMismatchError(f"{folder}: a padded cache ({manifest.format}) is read from a "
                                 "local folder only; rebuild it (dil-jax index) to read it "
                                 "from an object store")
    return PaddedPart(folder.path, num_rows, manifest.key.max_passage_len)


class PassageCache:
    """An opened cache, unsharded or sharded (read by global row), ragged or padded.

    manifest: its CacheManifest; storage: how its states are stored (the manifest's).
    ids, mask [rows, p_len], offsets [rows, p_len, 2]: RowArrays. states: the lower states (a
    StoredRows), None for k = 0. reuse: name -> StoredRows of the first-upper-block arrays
    (REUSE_WIDE_ARRAYS, REUSE_LSE_ARRAY), None unless built with them. shards: (start, stop,
    folder) of each shard; an unsharded cache is one shard, its own folder. folders: (folder,
    its CacheManifest) of every folder holding files: the cache's, and each shard's.
    location: where it is (`cache.location.Location`); directory: its local folder (a Path),
    or its URL.
    """

    def __init__(self, directory: str | os.PathLike | Location, manifest: CacheManifest,
                 verify: str = "sampled"):
        """Opens the arrays; one missing, truncated or of the wrong shape is CacheBrokenError,
        and so is a file that differs from the digests its manifest recorded (`verify`:
        "sampled", the cheap check on open, "full", every byte, or "none";
        `dil_jax.open_domain.cache.digests` says what each catches)."""
        if verify not in VERIFY_LEVELS:
            raise ValueError(f"verify={verify!r}, expected one of {VERIFY_LEVELS}")
        self.location = Location.of(directory)
        self.directory = self.location.path or self.location.url
        self.manifest = manifest
        self.storage = manifest.key.storage
        hidden = manifest.key.hidden_size
        self.shards = _shard_ranges_of(self.location, manifest)
        self.folders = [(self.location, manifest)]
        if manifest.is_sharded:
            self.folders += [(folder, _check_shard_manifest(folder, manifest, number,
                                                            len(self.shards), start, stop))
                             for number, (start, stop, folder) in enumerate(self.shards)]
        # The folders holding rows, with the manifests that describe them.
        holding = self.folders[1:] if manifest.is_sharded else self.folders
        parts = [_part(folder, own, stop - start)
                 for (start, stop, _), (folder, own) in zip(self.shards, holding, strict=True)]
        starts = np.asarray([start for start, _, _ in self.shards], np.int64)

        def stored(stem: str, storage: Storage, width: int) -> StoredRows:
            return StoredRows([part.stored(stem, storage, width) for part in parts], starts,
                              self.location, stem)

        self.ids, self.mask, self.offsets = (RowArray([part.rows(name) for part in parts],
                                                      starts)
                                             for name in ("ids", "mask", "offsets"))
        self.states = (None if manifest.key.num_lower_layers == 0
                       else stored("states", self.storage, hidden))
        self.reuse: dict[str, StoredRows] | None = None
        if manifest.reuse:
            wide = self.storage.without_pca()
            self.reuse = {name: stored(name, wide, hidden) for name in REUSE_WIDE_ARRAYS}
            self.reuse[REUSE_LSE_ARRAY] = stored(REUSE_LSE_ARRAY, FLOAT32, manifest.num_heads)
        # After the shapes (a truncated file is named as such): the bytes against the digests.
        self.digest_checks = ([] if verify == "none" else
                              [verify_folder(folder.path or folder.objects(), own.digests,
                                             full=verify == "full")
                               for folder, own in self.folders])
        for check in self.digest_checks:
            if check.problems:
                raise broken(*check.problems[0])

    @property
    def num_tokens(self) -> int:
        """The real tokens of its rows (mask ones): a ragged cache's `num_tokens`, summed over
        its shards; a padded one's counted from its mask."""
        if self.manifest.is_ragged:
            owners = self.folders[1:] if self.manifest.is_sharded else self.folders
            return sum(own.num_tokens for _, own in owners)
        return int(sum(int(np.asarray(self.mask[start:start + 4096]).sum())
                       for start in range(0, len(self), 4096)))

    def digest_warnings(self) -> list[str]:
        """What the digest check on open could not do cheaply, and how to fix it: caches
        written before digests existed (not checked), files whose modification time changed
        while their bytes did not (hashed whole on every open)."""
        index = Path(str(self.directory)).parent
        warnings = []
        undigested = [check.folder for check in self.digest_checks if not check.digested]
        if undigested:
            warnings.append(
                f"{self.directory}: written by an older dil-jax without file digests, so its "
                "bytes are not checked on open (only its shapes and two re-encoded rows); rerun "
                f"`dil-jax index --out {index}` with the same settings and this reader to "
                "record them (they record the files as they are now), or delete the folder and "
                "rerun it to rebuild the cache")
        rehashed = [str(check.where(name)) for check in self.digest_checks
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
    def open(cls, directory: str | os.PathLike | Location, expected: CacheKey | None = None,
             verify: str = "sampled") -> PassageCache:
        """Opens a finished cache (a local folder, or a URL: `cache.location`); its
        MATCHED_FIELDS must be `expected`'s exactly (a reader's key:
        `cache.check.reader_cache_key`); `verify`: how its files are checked against their
        digests (`__init__`)."""
        location = Location.of(directory)
        manifest_path = location / MANIFEST_FILE
        if not location.exists(MANIFEST_FILE):
            if location.is_local and location.path.is_dir():
                # A finished cache always has its manifest: this folder was damaged.
                raise broken(manifest_path, "the file is missing")
            hint = ""
            if location.is_local and location.path.with_name(
                    f".{location.name}.partial").exists():
                hint = " (an unfinished build exists: rerun it to resume)"
            raise CacheMismatchError(f"{location}: no passage cache here{hint}")
        manifest = _read_manifest_json(location)
        if manifest.get("format") not in FORMATS:
            raise CacheMismatchError(f"{manifest_path}: format {manifest.get('format')!r}, "
                                     f"expected one of {', '.join(map(repr, FORMATS))} (written "
                                     "by another version of dil-jax?)")
        # Checked on the file's values as written, before they are parsed: a field another
        # build wrote differently is a mismatch to name, not a broken cache to delete.
        name = location.name
        if (name.startswith("cache-k") and isinstance(manifest.get("model"), str)
                and "num_lower_layers" in manifest
                and name != cache_name(manifest["num_lower_layers"], manifest["model"])):
            # The folder name was derived from the manifest when it was written.
            raise broken(manifest_path, f"it says k={manifest.get('num_lower_layers')}, model "
                                        f"{str(manifest['model'])[:8]}, but the folder is "
                                        f"{name}; was it edited?")
        for field, value in (expected.to_json() if expected else {}).items():
            if manifest.get(field) != value:
                raise CacheMismatchError(_mismatch(manifest_path, field, manifest.get(field),
                                                   value))
        return cls(location, _parsed(manifest_path, manifest), verify)

    def passage_side(self, indices: Sequence[int]) -> np.ndarray:
        """What pairs read of those passages (`PairGrid.passage_side`, from the cache): the
        ids [len(indices), passage_len] for a k = 0 cache (it holds no states), else
        `read_states` [len(indices), passage_len, hidden]."""
        if self.states is None:
            return self.ids.take(np.asarray(indices, np.int64))
        return self.read_states(indices)

    def read_states(self, indices: Sequence[int]) -> np.ndarray:
        """[len(indices), passage_len, hidden] float32 lower states of those passages only
        (decoded from the cache's storage; a ragged cache's padding slots are 0)."""
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


def _file_part(name: str) -> str:
    """Which part of a cache a file (its path in its folder) belongs to: "states" (lower states:
    codes, scales, PCA basis), "reuse" (the first-upper-block arrays), "tokens" (ids, mask,
    offsets, token_starts) or "" (anything else)."""
    top = name.split("/", 1)[0]
    if top.startswith("states"):
        return "states"
    if top.startswith("upper_"):
        return "reuse"
    if top.split(".")[0] in ("ids", "mask", "offsets", "token_starts"):
        return "tokens"
    return ""


def cache_bytes_per_token(cache: PassageCache) -> dict[str, float]:
    """File bytes per real token (`num_tokens`: the mask's ones, padding slots not counted) of
    each part of a local cache, from its files: `states` (lower states: codes, scales, PCA
    basis), `reuse` (the first-upper-block arrays), `tokens` (ids, offsets, token_starts; a
    padded cache's mask), `total` (every file, the manifests included). A ragged cache's are
    the storage's bytes per token (docs/open_domain.md) plus its zarr metadata, shard indexes,
    chunk checksums and the amortised PCA basis; a padded cache's count its padding slots too,
    so they are larger by p_len / (mean real tokens)."""
    tokens = max(cache.num_tokens, 1)
    parts = dict(states=0, reuse=0, tokens=0, total=0)
    for folder, _ in cache.folders:  # a sharded cache: its own folder and every shard's
        for name in [MANIFEST_FILE, *recorded_files(folder.path)]:
            size = (folder.path / name).stat().st_size
            parts["total"] += size
            if _file_part(name):
                parts[_file_part(name)] += size
    return {name: size / tokens for name, size in parts.items()}
