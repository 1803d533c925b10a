"""Building a passage cache: the writing side of `dil_jax.open_domain.cache.store`.

`build_passage_cache` writes one cache folder (the layout `dil_jax.open_domain.cache.store`
describes); `dil_jax.open_domain.cache.shards.build_sharded_passage_cache` has several processes
write one shard each with it, planned by process 0 and awaited by file polls (`wait_for`).
Building lives apart from the format and reading side so that a process that only reads a cache
carries none of the staging, resumption and waiting code; this module imports from `cache`
(names, errors, `PassageCache`) and `cache_check` (`check_states`), never the reverse.

Building is resumable and atomic: everything is written into `.<name>.partial/` with a
progress record updated after each flushed chunk, and the folder is renamed into place only
when complete.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from dil_jax.atomic import write_atomic
from dil_jax.open_domain.cache.check import check_states
from dil_jax.open_domain.cache.digests import digest_fields, refreshed_digests
from dil_jax.open_domain.cache.disk import (  # noqa: F401  (DiskSpaceError: re-exported)
    DiskSpaceError,
    allocated_bytes,
    check_free_space,
    preallocate,
    write_errors,
)
from dil_jax.open_domain.cache.manifest import MANIFEST_FILE, CacheKey, CacheManifest
from dil_jax.open_domain.cache.storage import FLOAT32, PcaBasis, Storage
from dil_jax.open_domain.cache.store import (
    REUSE_LSE_ARRAY,
    REUSE_WIDE_ARRAYS,
    CacheBrokenError,
    CacheMismatchError,
    PassageCache,
    ReuseEncoder,
    StatesEncoder,
    WindowBatch,
)

log = logging.getLogger(__name__)

# Passages written so far by a build (`{"done": n}`), in its staging folder: where a rerun resumes.
PROGRESS_FILE = "progress.json"
# The manifest a build was started with (`CacheManifest.to_json`), in its staging folder: a
# rerun resumes only a build planned alike.
PLAN_FILE = "plan.json"
# PCA bases are fitted on the states of up to this many windows, evenly spread over the corpus,
# and up to this many of their real tokens (a width x width covariance: memory does not grow).
PCA_FIT_WINDOWS = 1024
PCA_FIT_TOKENS = 131072


def write_json_atomic(path: Path, value: Any) -> None:
    """Writes `value` as JSON to `path` atomically; a full disk is named (`write_errors`)."""
    with write_errors(path):
        write_atomic(path, json.dumps(value, indent=2))


def write_manifest(folder: Path, manifest: CacheManifest) -> None:
    """Writes a cache folder's manifest.json (atomically; a full disk names it)."""
    write_json_atomic(folder / MANIFEST_FILE, manifest.to_json())


def build_passage_cache(directory: str | os.PathLike, key: CacheKey, ids: np.ndarray,
                        mask: np.ndarray, offsets: np.ndarray, encode: StatesEncoder | None,
                        chunk_passages: int = 256, progress: Callable[[int], None] | None = None,
                        reuse: ReuseEncoder | None = None, num_heads: int | None = None,
                        pca: PcaBasis | None = None,
                        shard: Mapping[str, int] | None = None) -> PassageCache:
    """Builds (or resumes building) a cache; returns it opened.

    An existing cache is reused when it matches `manifest` (and, with `encode`, `check_states`)
    and holds the reuse arrays if they are asked for; a broken one (CacheBrokenError) is removed
    and rebuilt, with a warning; one built for other settings is refused, naming the field. The
    caller must hold the index's lock (`dil_jax.open_domain.index.lock.index_lock`): this
    removes and renames folders inside the index.

    Args:
      key: what the encoder is (`cache.check.reader_cache_key`): weights, k, hidden size,
        tokenizer, lengths, the storage scheme (`dil_jax.open_domain.cache.storage.Storage`).
      ids, mask: [num_passages, passage_len]; offsets: [num_passages, passage_len, 2].
      encode: a chunk's `WindowBatch` -> [chunk, passage_len, hidden] lower states, or None
        for k = 0.
      progress: called with the number of passages finished after each chunk.
      reuse: (float32 lower states, mask) chunk -> the first-upper-block arrays to store beside
        them (`cache.reuse.reuse_encoder`; needs `encode` and num_heads), or None.
      pca: the basis a pca<d> or pq<M> cache stores (pq<M>: with its codebook; a shard gets
        its cache's, so every shard has the same); None fits one on these rows' states.
      shard: {index, count, start, stop} when this is one shard of a sharded cache (its
        manifest records its place).

    Rows are encoded in chunks of `chunk_passages` from row 0 (the last one shorter), so a shard
    whose rows start on a chunk boundary encodes exactly the chunks an unsharded build of all
    rows encodes for them.
    """
    directory = Path(directory).absolute()
    # The index row of this cache's row 0 (a shard's start): what encoders are told.
    first_row = int(shard["start"]) if shard is not None else 0
    if reuse is not None and (encode is None or not num_heads):
        raise CacheMismatchError("the first-upper-block arrays need lower states (k > 0) and "
                                 "the number of heads")
    manifest = CacheManifest(key, num_passages=int(ids.shape[0]), reuse=reuse is not None,
                             num_heads=int(num_heads) if reuse is not None else None,
                             shard=shard)
    storage = key.storage
    cache = existing_cache(directory, manifest, encode, reuse)
    if cache is not None:
        return cache
    staging = directory.with_name(f".{directory.name}.partial")
    done = _resume_point(staging, manifest)
    rows, length = ids.shape
    # The whole cache, less what its staging folder holds on disk already: a resumed build
    # reserved its files when it started (they are preallocated), and a restarted one frees
    # them. Counting them again refused the rerun after a disk had filled.
    complete = rows * length * (cache_bytes_per_window_token(manifest, has_states=encode
                                                             is not None) + TOKEN_ARRAY_BYTES)
    check_free_space(staging.parent, max(0, complete - allocated_bytes(staging)),
                     f"the passage cache {directory.name} ({rows - (done or 0)} of {rows} "
                     "windows to write)")
    if done is None:
        if encode is not None and storage.has_basis and pca is None:
            pca = storage.fit(pca_sample(ids, mask, offsets, encode, first_row))
        _start_fresh(staging, manifest, ids, mask, offsets, encode is not None, pca)
        done = 0
    elif done:
        log.info("%s: resuming at window %d of %d", staging, done, ids.shape[0])
    if encode is not None:
        writers = {"states": _ArrayWriter(staging, "states", storage)}
        if reuse is not None:
            writers.update({name: _ArrayWriter(staging, name, storage.without_pca())
                            for name in REUSE_WIDE_ARRAYS})
            writers[REUSE_LSE_ARRAY] = _ArrayWriter(staging, REUSE_LSE_ARRAY, FLOAT32)
        for start in range(done, ids.shape[0], chunk_passages):
            stop = min(start + chunk_passages, ids.shape[0])
            windows = WindowBatch.of(np.arange(start, stop), ids, mask, offsets, first_row)
            chunk = np.asarray(encode(windows), dtype=np.float32)
            values = {"states": chunk}
            if reuse is not None:
                # From the exact float32 states, not their stored round trip: each array then
                # carries only its own storage error.
                values.update(reuse(chunk, mask[start:stop]))
            for name, writer in writers.items():
                writer.write(start, values[name])
            for writer in writers.values():
                writer.flush()  # data on disk before the progress record says so
            write_json_atomic(staging / PROGRESS_FILE, {"done": stop})
            if progress:
                progress(stop)
        del writers
    (staging / PROGRESS_FILE).unlink(missing_ok=True)
    (staging / PLAN_FILE).unlink(missing_ok=True)
    # Digests of the finished files (one read of each), checked whenever the cache is opened.
    write_manifest(staging, dataclasses.replace(manifest, digests=digest_fields(staging)))
    os.replace(staging, directory)
    return PassageCache.open(directory)


# ids and mask (int32 each) and offsets (two int32) per window token.
TOKEN_ARRAY_BYTES = 4 * (1 + 1 + 2)


def cache_bytes_per_window_token(manifest: CacheManifest, has_states: bool) -> int:
    """Stored bytes of one window token's lower states and, with the manifest's `reuse`, its
    first upper block arrays (the .npy headers and a basis or codebook not counted)."""
    storage, hidden_size = manifest.key.storage, manifest.key.hidden_size
    per_token = storage.bytes_per_token(hidden_size) if has_states else 0
    if manifest.reuse:
        per_token += (len(REUSE_WIDE_ARRAYS) * storage.without_pca().bytes_per_token(hidden_size)
                      + 4 * manifest.num_heads)
    return per_token


def existing_cache(directory: Path, manifest: CacheManifest,
                    encode: StatesEncoder | None,
                    reuse: ReuseEncoder | None
                    ) -> PassageCache | None:
    """The finished cache at `directory` if it serves `manifest` (checked: `check_states`),
    None if there is none (a broken one is removed, with a warning); another build's is
    CacheMismatchError."""
    if not directory.exists():
        return None
    try:
        cache = PassageCache.open(directory, manifest.key)
        if reuse is not None and not cache.has_reuse:
            raise CacheMismatchError(
                f"{directory / MANIFEST_FILE}: cache built without the first upper block's "
                "arrays, and this run asks for them (--cache-reuse)")
        if encode is not None:
            check_states(cache, encode, reuse)
        return record_digests(cache)
    except CacheBrokenError as error:
        log.warning("%s -- rebuilding it", error)
        shutil.rmtree(directory)
        return None
    except CacheMismatchError as error:
        raise CacheMismatchError(
            f"{error}. This run would build a different cache under the same name: delete "
            f"{directory} to rebuild it with this run's settings, or use another --out"
        ) from error


def record_digests(cache: PassageCache) -> PassageCache:
    """(Under the index's lock.) Records, in each folder's manifest, the digests a cache of an
    older dil-jax lacks (its files as they are now: its shapes and two re-encoded rows were
    checked, no more) and the new modification times of files whose every byte matched their
    digest (a copy that did not keep times), so later opens check them cheaply. Returns the
    cache reopened when anything was recorded, else `cache`."""
    changed = False
    for check, (folder, manifest) in zip(cache.digest_checks, cache.folders):
        if check.digested and not check.rehashed:
            continue
        if not check.digested:
            log.warning("%s: recording file digests of a cache written without them (its "
                        "files as they are now; delete the folder and rerun to rebuild it "
                        "if in doubt)", folder)
        else:
            log.info("%s: recording the new modification times of %s (every byte matched)",
                     folder, ", ".join(check.rehashed))
        write_manifest(folder, dataclasses.replace(
            manifest, digests=refreshed_digests(folder, manifest.digests, check)))
        changed = True
    return PassageCache.open(cache.directory, verify="none") if changed else cache


class _ArrayWriter:
    """Writes float32 rows into a StoredArray's files (created by `_create_array`)."""

    def __init__(self, staging: Path, stem: str, storage: Storage):
        self.storage = storage
        self.codes = np.load(staging / f"{stem}.npy", mmap_mode="r+")
        self.scale = (np.load(staging / f"{stem}.scale.npy", mmap_mode="r+")
                      if storage.scaled else None)
        self.pca = load_basis(staging, stem, storage)

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
    """Empty files of a StoredArray [rows, p_len, width] (and its basis) in `staging`."""
    rows, length, width = shape
    _create_memmap(staging / f"{stem}.npy", storage.code_dtype,
                   (rows, length, storage.code_width(width)))
    if storage.scaled:
        _create_memmap(staging / f"{stem}.scale.npy", np.float32, (rows, length))
    if pca is not None:
        save_basis(staging, stem, pca)


def save_basis(folder: Path, stem: str, basis: PcaBasis) -> None:
    """A fitted scheme's arrays (pca<d>: mean, basis; pq<M>: and codebook) as
    `{stem}.{suffix}.npy` files (`storage.BASIS_FILES`) in `folder`."""
    for suffix, array in basis.arrays().items():
        _save(folder / f"{stem}.{suffix}.npy", array)


def load_basis(folder: Path, stem: str, storage: Storage) -> PcaBasis | None:
    """The arrays `save_basis` wrote in `folder` for a `storage` array; None for a scheme
    without (a finished cache's are read, checked, by `store.StoredArray`)."""
    if not storage.has_basis:
        return None
    return PcaBasis.of({suffix: np.load(folder / f"{stem}.{suffix}.npy")
                        for suffix in storage.basis_files})


def _create_memmap(path: Path, dtype, shape: tuple[int, ...]) -> None:
    """An empty .npy of `shape`, every block reserved on disk (`cache.disk.preallocate`): its rows
    are written later through a memory map, where a full disk would be a SIGBUS."""
    with write_errors(path):
        np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=shape).flush()
    preallocate(path)


def _save(path: Path, array: np.ndarray) -> None:
    with write_errors(path):
        np.save(path, array)


def pca_sample(ids: np.ndarray, mask: np.ndarray, offsets: np.ndarray, encode: StatesEncoder,
               first_row: int = 0) -> np.ndarray:
    """[n, hidden] float32 real-token lower states of up to PCA_FIT_WINDOWS windows spread evenly
    over the corpus (up to PCA_FIT_TOKENS of them, evenly spaced): what a PCA basis is fitted on.
    first_row: the index row of the arrays' row 0.
    """
    rows = np.unique(np.linspace(0, len(ids) - 1, min(len(ids), PCA_FIT_WINDOWS)).astype(int))
    states = np.asarray(encode(WindowBatch.of(rows, ids, mask, offsets, first_row)), np.float32)
    tokens = states[np.asarray(mask[rows], bool)]
    step = max(1, -(-len(tokens) // PCA_FIT_TOKENS))
    return tokens[::step]


def _start_fresh(staging: Path, manifest: CacheManifest, ids: np.ndarray, mask: np.ndarray,
                 offsets: np.ndarray, has_states: bool, pca: PcaBasis | None) -> None:
    """A new staging folder: token arrays, empty state (and reuse) arrays, the basis (pca<d>,
    pq<M>: saved here so a resumed build encodes with the same one), the plan, progress 0."""
    shutil.rmtree(staging, ignore_errors=True)
    with write_errors(staging):
        staging.mkdir(parents=True)
    _save(staging / "ids.npy", ids.astype(np.int32))
    _save(staging / "mask.npy", mask.astype(np.int32))
    _save(staging / "offsets.npy", offsets.astype(np.int32))
    storage = manifest.key.storage
    shape = (ids.shape[0], ids.shape[1], manifest.key.hidden_size)
    if has_states:
        _create_array(staging, "states", storage, shape, pca)
    if manifest.reuse:
        for name in REUSE_WIDE_ARRAYS:
            _create_array(staging, name, storage.without_pca(), shape)
        _create_array(staging, REUSE_LSE_ARRAY, FLOAT32, shape[:2] + (manifest.num_heads,))
    write_json_atomic(staging / PLAN_FILE, manifest.to_json())
    write_json_atomic(staging / PROGRESS_FILE, {"done": 0})


def _resume_point(staging: Path, manifest: CacheManifest) -> int | None:
    """Passages already done in a compatible partial build, or None to start over: its plan
    (the manifest it was started with, as written) is this build's."""
    try:
        planned = json.loads((staging / PLAN_FILE).read_text())
        done = json.loads((staging / PROGRESS_FILE).read_text())["done"]
    except (FileNotFoundError, json.JSONDecodeError, KeyError):
        return None
    return int(done) if planned == manifest.to_json() else None
