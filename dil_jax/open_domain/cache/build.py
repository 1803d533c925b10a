"""Building a passage cache: the writing side of `dil_jax.open_domain.cache.store`.

`build_passage_cache` writes one cache folder (the layout `dil_jax.open_domain.cache.store`
describes); `dil_jax.open_domain.cache.shards.build_sharded_passage_cache` has several processes
write one shard each with it, planned by process 0 and awaited by file polls (`wait_for`).
Building lives apart from the format and reading side so that a process that only reads a cache
carries none of the staging, resumption and waiting code; this module imports from
`cache.store` (names, errors, `PassageCache`) and `cache.check` (`check_states`), never the
reverse.

Building is resumable and atomic: everything is written into `.<name>.partial/` with a
progress record updated whenever a shard of the arrays has been written, and the folder is
renamed into place only when complete. A build writes the ragged format (RAGGED_FORMAT: real
tokens only, zarr v3 arrays on tensorstore; `dil_jax.open_domain.cache.store` has the layout).

Rows are encoded in chunks of `chunk_passages`; their real tokens are packed (`cache.ragged`),
stored (`Storage.encode`, token by token) and buffered until a whole shard of the token grid
(`cache.zarr_store.TokenGrid`) is complete, which is then written in one go: a shard is one
file, rewritten whole by any write into it, so a build writes each once. The progress record
holds the tokens written (a shard boundary) and the first chunk whose tokens are not all
written; a resumed build re-encodes from that chunk and drops the tokens already written.

`write_rows`, `start_fresh` and `resume_point` work on a `Location`, a local staging folder or a
cache's place in a store: `dil_jax.open_domain.cache.store_build` writes a cache at a URL with
them, where there is no rename (its manifest, written last, makes it exist).
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
    write_errors,
)
from dil_jax.open_domain.cache.location import Location
from dil_jax.open_domain.cache.manifest import (
    MANIFEST_FILE,
    RAGGED_FORMAT,
    CacheKey,
    CacheManifest,
)
from dil_jax.open_domain.cache.ragged import (
    RaggedError,
    check_padding,
    pack,
    row_lengths,
    starts_of,
)
from dil_jax.open_domain.cache.ragged_store import (
    TOKEN_ARRAYS,
    TOKEN_STARTS,
    read_pca,
    stored_arrays,
    write_pca,
)
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
from dil_jax.open_domain.cache.zarr_store import (
    TokenGrid,
    create_array,
    grid_of,
    open_array,
    write_tokens,
)
from dil_jax.tokenization import NO_OFFSET

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
# Rows whose mask is read at a time when counting a cache's real tokens (memory: one block).
LENGTH_BLOCK_ROWS = 65536


def write_json_atomic(path: Path, value: Any) -> None:
    """Writes `value` as JSON to `path` atomically; a full disk is named (`write_errors`)."""
    with write_errors(path):
        write_atomic(path, json.dumps(value, indent=2))


def write_json_at(location: Location, name: str, value: Any) -> None:
    """Writes `value` as JSON to the file `name` of a cache folder, local or at a URL, whole
    (`Location.write_bytes`: write-then-rename, or one object write)."""
    location.write_bytes(name, json.dumps(value, indent=2).encode("utf-8"))


def write_manifest(folder: Path, manifest: CacheManifest) -> None:
    """Writes a cache folder's manifest.json (atomically; a full disk names it)."""
    write_json_atomic(folder / MANIFEST_FILE, manifest.to_json())


def build_passage_cache(directory: str | os.PathLike, key: CacheKey, ids: np.ndarray,
                        mask: np.ndarray, offsets: np.ndarray, encode: StatesEncoder | None,
                        chunk_passages: int = 256, progress: Callable[[int], None] | None = None,
                        reuse: ReuseEncoder | None = None, num_heads: int | None = None,
                        pca: PcaBasis | None = None,
                        shard: Mapping[str, int] | None = None, pad_id: int = 0,
                        grid: TokenGrid | None = None) -> PassageCache:
    """Builds (or resumes building) a cache; returns it opened.

    An existing cache is reused when it matches `key` (and, with `encode`, `check_states`)
    and holds the reuse arrays if they are asked for; a broken one (CacheBrokenError) is removed
    and rebuilt, with a warning; one built for other settings is refused, naming the field. The
    caller must hold the index's lock (`dil_jax.open_domain.index.lock.index_lock`): this
    removes and renames folders inside the index.

    Args:
      key: what the encoder is (`cache.check.reader_cache_key`): weights, k, hidden size,
        tokenizer, lengths, the storage scheme (`dil_jax.open_domain.cache.storage.Storage`).
      ids, mask: [num_passages, passage_len]; offsets: [num_passages, passage_len, 2] (numpy
        arrays or memory maps: read a chunk at a time). Each row's mask is ones then zeros,
        its padding slots hold `pad_id` (ids) and NO_OFFSET (offsets): what reading gives back
        there (RaggedError otherwise).
      encode: a chunk's `WindowBatch` -> [chunk, passage_len, hidden] lower states, or None
        for k = 0.
      progress: called with the number of passages finished after each chunk.
      reuse: (float32 lower states, mask) chunk -> the first-upper-block arrays to store beside
        them (`cache.reuse.reuse_encoder`; needs `encode` and num_heads), or None.
      pca: the basis a pca<d> or pq<M> cache stores (pq<M>: with its codebook; a shard gets
        its cache's, so every shard has the same); None fits one on these rows' states.
      shard: {index, count, start, stop} when this is one shard of a sharded cache (its
        manifest records its place).
      grid: the arrays' token grid (`TokenGrid`); None sizes it by the widest array's bytes
        per token.

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
    rows = len(ids)
    planned = CacheManifest(key, num_passages=int(rows), reuse=reuse is not None,
                            num_heads=int(num_heads) if reuse is not None else None,
                            shard=shard, format=RAGGED_FORMAT)
    cache = existing_cache(directory, planned, encode, reuse)
    if cache is not None:
        return cache
    starts = starts_of(window_lengths(mask, directory))
    manifest = dataclasses.replace(planned, num_tokens=int(starts[-1]), pad_id=int(pad_id))
    storage = key.storage
    staging = directory.with_name(f".{directory.name}.partial")
    resume = resume_point(Location.of(staging), manifest)
    # The whole cache, less what its staging folder holds on disk already: a resumed build
    # wrote its shards so far, and a restarted one frees them. Counting them again refused the
    # rerun after a disk had filled.
    complete = stored_bytes(manifest, has_states=encode is not None)
    done = resume[0] if resume else 0
    check_free_space(staging.parent, max(0, complete - allocated_bytes(staging)),
                     f"the passage cache {directory.name} ({rows - done} of {rows} "
                     "windows to write)")
    if resume is None:
        if encode is not None and storage.has_basis and pca is None:
            pca = storage.fit(pca_sample(ids, mask, offsets, encode, first_row))
        shutil.rmtree(staging, ignore_errors=True)
        with write_errors(staging):
            staging.mkdir(parents=True)
        start_fresh(Location.of(staging), manifest, starts, encode is not None, pca, grid)
        resume = (0, 0)
    else:
        log.info("%s: resuming at window %d of %d (%d of %d tokens written)", staging, done,
                 rows, resume[1], manifest.num_tokens)
    write_rows(Location.of(staging), directory, manifest, starts, ids, mask, offsets, encode,
               reuse, chunk_passages, resume, first_row, progress)
    (staging / PROGRESS_FILE).unlink(missing_ok=True)
    (staging / PLAN_FILE).unlink(missing_ok=True)
    # Digests of the finished files (one read of each), checked whenever the cache is opened.
    write_manifest(staging, dataclasses.replace(manifest, digests=digest_fields(staging)))
    os.replace(staging, directory)
    return PassageCache.open(directory)


def window_lengths(mask: np.ndarray, where: object = "the windows") -> np.ndarray:
    """[rows] int64 real tokens of each window of mask [rows, p_len] (a memory map is read a
    block at a time); RaggedError naming `where` and the row when a mask is not ones then
    zeros."""
    lengths = []
    for start in range(0, len(mask), LENGTH_BLOCK_ROWS):
        try:
            lengths.append(row_lengths(np.asarray(mask[start:start + LENGTH_BLOCK_ROWS])))
        except RaggedError as error:
            raise RaggedError(f"{where}: window rows from {start}: {error}") from error
    return np.concatenate(lengths) if lengths else np.zeros(0, np.int64)


# ids and two offsets (int32 each) per real token: the token arrays (the mask is not stored).
TOKEN_ARRAY_BYTES = 4 * (1 + 2)


def cache_bytes_per_window_token(manifest: CacheManifest, has_states: bool) -> int:
    """Stored bytes of one real token's lower states and, with the manifest's `reuse`, its
    first upper block arrays (zarr metadata, shard indexes, checksums and a basis or codebook
    not counted)."""
    storage, hidden_size = manifest.key.storage, manifest.key.hidden_size
    per_token = storage.bytes_per_token(hidden_size) if has_states else 0
    if manifest.reuse:
        per_token += (len(REUSE_WIDE_ARRAYS) * storage.without_pca().bytes_per_token(hidden_size)
                      + 4 * manifest.num_heads)
    return per_token


def stored_bytes(manifest: CacheManifest, has_states: bool) -> int:
    """Bytes a ragged cache of `manifest` (its num_tokens) stores: every real token's arrays
    (`cache_bytes_per_window_token` and TOKEN_ARRAY_BYTES) and the token starts (8 per row)."""
    per_token = cache_bytes_per_window_token(manifest, has_states) + TOKEN_ARRAY_BYTES
    return manifest.num_tokens * per_token + 8 * (manifest.num_passages + 1)


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
    for check, (folder, manifest) in zip(cache.digest_checks, cache.folders, strict=True):
        if check.digested and not check.rehashed:
            continue
        if not check.digested:
            log.warning("%s: recording file digests of a cache written without them (its "
                        "files as they are now; delete the folder and rerun to rebuild it "
                        "if in doubt)", folder)
        else:
            log.info("%s: recording the new modification times of %s (every byte matched)",
                     folder, ", ".join(check.rehashed))
        write_manifest(folder.path, dataclasses.replace(
            manifest, digests=refreshed_digests(folder.path, manifest.digests, check)))
        changed = True
    return PassageCache.open(cache.directory, verify="none") if changed else cache


def _array_specs(manifest: CacheManifest, has_states: bool
                 ) -> dict[str, tuple[tuple[int, ...], np.dtype, bool]]:
    """Every per-token array of a ragged cache of `manifest`: name -> (per-token shape, dtype,
    zstd-compressed)."""
    specs = {name: (tail, np.dtype(dtype), True) for name, (tail, dtype, _) in
             TOKEN_ARRAYS.items()}
    storage, hidden = manifest.key.storage, manifest.key.hidden_size
    stems = {"states": (storage, hidden)} if has_states else {}
    if manifest.reuse:
        stems.update({name: (storage.without_pca(), hidden) for name in REUSE_WIDE_ARRAYS})
        stems[REUSE_LSE_ARRAY] = (FLOAT32, manifest.num_heads)
    for stem, (scheme, width) in stems.items():
        specs.update({name: (tail, dtype, False) for name, (tail, dtype)
                      in stored_arrays(stem, scheme, width).items()})
    return specs


def _stems(manifest: CacheManifest, has_states: bool) -> dict[str, Storage]:
    """The stored float arrays of a cache: stem -> its storage scheme."""
    stems = {"states": manifest.key.storage} if has_states else {}
    if manifest.reuse:
        stems.update({name: manifest.key.storage.without_pca() for name in REUSE_WIDE_ARRAYS})
        stems[REUSE_LSE_ARRAY] = FLOAT32
    return stems


def default_grid(manifest: CacheManifest, has_states: bool) -> TokenGrid:
    """The token grid of a cache's arrays, sized by its widest array's bytes per token."""
    specs = _array_specs(manifest, has_states)
    widest = max(int(np.prod(tail, dtype=np.int64)) * dtype.itemsize
                 for tail, dtype, _ in specs.values())
    return TokenGrid.for_bytes(widest, manifest.num_tokens)


class _TokenWriter:
    """Writes one per-token array a whole shard at a time: tokens are buffered until the shard
    they fall in is complete (its last token, or the array's), then written in one go (a shard
    is one file, rewritten whole by any write into it)."""

    def __init__(self, array, where: Location, shard_tokens: int, total: int, flushed: int):
        self.array, self.where = array, where
        self.shard_tokens, self.total = shard_tokens, total
        self.flushed = flushed  # tokens written: a shard boundary, or `total`
        self.buffer: np.ndarray | None = None
        self.filled = 0

    def add(self, start: int, values: np.ndarray) -> None:
        """values [n, ...]: tokens start .. start + n - 1, following those added before (those
        already written or buffered, which a resumed build encodes again, are dropped)."""
        skip = max(0, self.flushed + self.filled - start)
        values, start = values[skip:], start + skip
        if len(values) and start != self.flushed + self.filled:
            raise RuntimeError(f"{self.where}: tokens from {start} added after "
                               f"{self.flushed + self.filled}")
        while len(values):
            if self.buffer is None:
                size = min(self.shard_tokens, self.total - self.flushed)
                self.buffer = np.empty((size, *values.shape[1:]), values.dtype)
            take = min(len(values), len(self.buffer) - self.filled)
            self.buffer[self.filled:self.filled + take] = values[:take]
            self.filled += take
            values = values[take:]
            if self.filled == len(self.buffer):
                write_tokens(self.array, self.flushed, self.buffer, self.where)
                self.flushed += self.filled
                self.buffer, self.filled = None, 0


def _stored_values(stem: str, storage: Storage, tokens: np.ndarray, pca: PcaBasis | None
                   ) -> dict[str, np.ndarray]:
    """float32 tokens [T, width] of the array `stem` -> its per-token arrays (codes, scales)."""
    codes, scale = storage.encode(tokens, pca)
    values = {stem: codes}
    if scale is not None:
        values[f"{stem}.scale"] = scale
    return values


def _resume_row(starts: np.ndarray, written: int, chunk_passages: int) -> int:
    """The first row of the chunk holding the first row whose tokens are not all written
    (`written` tokens are): where a resumed build encodes again from."""
    row = int(np.searchsorted(starts[1:], written, side="right"))
    return row if row >= len(starts) - 1 else row // chunk_passages * chunk_passages


def write_rows(location: Location, name: object, manifest: CacheManifest, starts: np.ndarray,
               ids, mask, offsets, encode: StatesEncoder | None, reuse: ReuseEncoder | None,
               chunk_passages: int, resume: tuple[int, int], first_row: int,
               progress: Callable[[int], None] | None) -> None:
    """Encodes rows resume[0].. in chunks and writes their tokens (those from token resume[1];
    the module docstring says how) into the arrays at `location` (a staging folder, or a
    cache's place in a store), recording progress whenever a shard is written. name: the
    cache, as errors name it."""
    rows = manifest.num_passages
    total = manifest.num_tokens
    specs = _array_specs(manifest, encode is not None)
    arrays = {name: open_array(location, name, (total, *tail), dtype, writable=True)
              for name, (tail, dtype, _) in specs.items()}
    shard_tokens = grid_of(arrays["ids"]).shard_tokens
    done, written = resume
    writers = {name: _TokenWriter(array, location / name, shard_tokens, total, written)
               for name, array in arrays.items()}
    stems = _stems(manifest, encode is not None)
    pca = None
    if "states" in stems and stems["states"].has_basis:
        pca = read_pca(location, "states", stems["states"], manifest.key.hidden_size)
    for start in range(done, rows, chunk_passages):
        stop = min(start + chunk_passages, rows)
        lengths = starts[start + 1:stop + 1] - starts[start:stop]
        chunk = {name: np.asarray(array[start:stop])
                 for name, array in (("ids", ids), ("mask", mask), ("offsets", offsets))}
        try:
            check_padding(chunk["ids"], lengths, manifest.pad_id, "ids")
            check_padding(chunk["offsets"], lengths, NO_OFFSET, "offsets")
        except RaggedError as error:
            raise RaggedError(f"{name}: windows {start}..{stop - 1}: {error}") from error
        values = {name: pack(chunk[name], lengths) for name in TOKEN_ARRAYS}
        if encode is not None:
            windows = WindowBatch(np.arange(start, stop) + first_row, chunk["ids"],
                                  chunk["mask"], chunk["offsets"])
            states = np.asarray(encode(windows), dtype=np.float32)
            float_values = {"states": states}
            if reuse is not None:
                # From the exact float32 states, not their stored round trip: each array then
                # carries only its own storage error.
                float_values.update(reuse(states, chunk["mask"]))
            for stem, scheme in stems.items():
                values.update(_stored_values(stem, scheme, pack(float_values[stem], lengths),
                                             pca if stem == "states" else None))
        before = writers["ids"].flushed
        for name, writer in writers.items():
            writer.add(int(starts[start]), values[name])
        now = writers["ids"].flushed
        if now != before:  # a shard written: data on disk before the progress record says so
            write_json_at(location, PROGRESS_FILE,
                          {"done": _resume_row(starts, now, chunk_passages), "tokens": now})
        if progress:
            progress(stop)
    unwritten = [name for name, writer in writers.items() if writer.flushed != total]
    if unwritten:
        raise RuntimeError(f"{location}: {', '.join(unwritten)} not written to the end")


def start_fresh(location: Location, manifest: CacheManifest, starts: np.ndarray,
                has_states: bool, pca: PcaBasis | None, grid: TokenGrid | None) -> None:
    """Fills an empty cache folder (a new staging folder, or an emptied place in a store): the
    token starts, the empty per-token arrays (zarr metadata only), the basis (pca<d>; pq<M>:
    and codebook; saved here so a resumed build encodes with the same one), the plan, progress
    0 (last: a rerun resumes only a folder whose plan and progress say it was started alike)."""
    grid = grid or default_grid(manifest, has_states)
    starts_array = create_array(location, TOKEN_STARTS, (len(starts),), np.int64,
                                TokenGrid.for_bytes(8, len(starts)), compress=True)
    write_tokens(starts_array, 0, np.asarray(starts, np.int64), location / TOKEN_STARTS)
    for name, (tail, dtype, compress) in _array_specs(manifest, has_states).items():
        create_array(location, name, (manifest.num_tokens, *tail), dtype, grid, compress)
    if pca is not None:
        write_pca(location, "states", pca)
    write_json_at(location, PLAN_FILE, manifest.to_json())
    write_json_at(location, PROGRESS_FILE, {"done": 0, "tokens": 0})


def resume_point(staging: Location, manifest: CacheManifest) -> tuple[int, int] | None:
    """(rows to encode from, tokens written) of a compatible partial build in `staging` (a
    folder, or a place in a store), or None to start over: its plan (the manifest it was
    started with, as written) is this build's."""
    try:
        planned = json.loads(staging.read_bytes(PLAN_FILE) or b"")
        progress = json.loads(staging.read_bytes(PROGRESS_FILE) or b"")
        done, written = int(progress["done"]), int(progress["tokens"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError):
        return None
    return (done, written) if planned == manifest.to_json() else None


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


