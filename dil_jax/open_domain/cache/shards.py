"""Building a passage cache in shards: several processes write one cache, one shard each.

`build_sharded_passage_cache` has every process build its shard (`shard_ranges`: whole chunks
of the global grid) with `dil_jax.open_domain.cache.build.build_passage_cache`, planned by
process 0 (`sharded_manifest`, `_prepare_staging`) and awaited by file polls (`wait_for`);
`staged_progress` reports how far an unfinished build, sharded or not, has come.

Separate from `dil_jax.open_domain.cache.build`, which writes one cache folder (staging,
resumption, the disk check): this module adds only the multi-process part on top of it (the
plan, the shard layout, the waits), and imports from `cache.build` and `cache.store`, never the
reverse.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from dil_jax.file_array import FileArray
from dil_jax.open_domain.cache.build import (
    PLAN_FILE,
    PROGRESS_FILE,
    build_passage_cache,
    check_free_space,
    existing_cache,
    pca_sample,
    stored_bytes,
    window_lengths,
    write_json_atomic,
    write_manifest,
)
from dil_jax.open_domain.cache.digests import digest_fields
from dil_jax.open_domain.cache.location import Location
from dil_jax.open_domain.cache.manifest import (
    MANIFEST_FILE,
    RAGGED_FORMAT,
    SHARDS_DIR,
    CacheKey,
    CacheManifest,
    ShardRange,
    shard_name,
)
from dil_jax.open_domain.cache.ragged_store import read_pca, write_pca
from dil_jax.open_domain.cache.storage import PcaBasis
from dil_jax.open_domain.cache.store import (
    CacheMismatchError,
    PassageCache,
    ReuseEncoder,
    ShardWaitError,
    StatesEncoder,
)
from dil_jax.open_domain.cache.zarr_store import TokenGrid

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


def sharded_manifest(key: CacheKey, num_rows: int, chunk_passages: int, count: int,
                     num_heads: int | None) -> CacheManifest:
    """The top-level manifest (and plan) of a cache of `count` shards, `chunk_passages` rows per
    chunk (`shard_ranges`); num_heads is given iff it stores the first-upper-block arrays."""
    shards = tuple(ShardRange(f"{SHARDS_DIR}/{shard_name(i, count)}", start, stop)
                   for i, (start, stop) in enumerate(shard_ranges(num_rows, chunk_passages,
                                                                  count)))
    return CacheManifest(key, num_passages=int(num_rows), reuse=num_heads is not None,
                         num_heads=None if num_heads is None else int(num_heads),
                         format=RAGGED_FORMAT, chunk_passages=int(chunk_passages),
                         shards=shards)


def wait_for(check: Callable[[], T | None], what: Callable[[], str], timeout_s: float,
             poll_s: float = POLL_SECONDS, peer_check: Callable[[], None] | None = None) -> T:
    """check()'s first value that is not None, looking every poll_s seconds; ShardWaitError
    (saying `what()` was awaited) after timeout_s. A file poll, not a collective: a dead peer
    costs a clear error at the timeout instead of a hang, and hosts need share only a folder.
    peer_check: run before every look; it raises when the other processes run with other
    settings (`dil_jax.open_domain.build_peers`), which no wait would resolve."""
    deadline = time.monotonic() + timeout_s
    while True:
        if peer_check is not None:
            peer_check()
        value = check()
        if value is not None:
            return value
        if time.monotonic() >= deadline:
            raise ShardWaitError(f"waited {timeout_s:g} s for {what()}; is that process "
                                 "running (see its log)? Rerun every process with the same "
                                 "flags: finished shards are kept, unfinished ones resume")
        time.sleep(poll_s)


def row_range(array, start: int, stop: int):
    """Rows start .. stop - 1 of a window array, without reading them: a numpy view, or a
    `FileArray` of those rows (slicing a FileArray reads them: a shard of a large index would
    be held whole in memory)."""
    return array.row_range(start, stop) if isinstance(array, FileArray) else array[start:stop]


def _read_json(path: Path) -> Any:
    """The JSON at path, or None if it is missing or not (yet) readable."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _finished(directory: Path, manifest: CacheManifest) -> PassageCache | None:
    """The finished cache at `directory` if one serving `manifest` is there, else None."""
    if not (directory / MANIFEST_FILE).is_file():
        return None
    try:
        return PassageCache.open(directory, manifest.key)
    except CacheMismatchError:
        return None  # process 0 repairs or refuses it


def _is_planned(staging: Path, top: CacheManifest) -> bool:
    """Whether `staging` holds the plan of `top` (as process 0 writes it, last)."""
    return _read_json(staging / PLAN_FILE) == top.to_json()


def _plan_note(staging: Path, top: CacheManifest) -> str:
    """Why `staging`'s plan is not `top` (for a wait's error), or ''."""
    plan = _read_json(staging / PLAN_FILE)
    if not isinstance(plan, dict):
        return ""
    wanted = top.to_json()
    fields = sorted(f for f in set(plan) | set(wanted) if plan.get(f) != wanted.get(f))
    return (f" (its plan differs from this process's in {', '.join(fields)}: give every "
            "process the same flags)") if fields else ""


def _prepare_staging(staging: Path, top: CacheManifest, ids: np.ndarray, mask: np.ndarray,
                     offsets: np.ndarray, encode: StatesEncoder | None
                     ) -> PcaBasis | None:
    """(process 0) The staging folder of a sharded build, kept if planned alike (its finished
    and partial shards resume), else new; returns the basis every shard stores (pca<d>; pq<M>
    with its codebook: fitted once here, on the sample an unsharded build fits on, and stored
    in the staging folder, `_shared_basis`). plan.json is written last: the other processes
    start their shards when it appears."""
    has_basis = encode is not None and top.key.storage.has_basis
    if _is_planned(staging, top):
        return _shared_basis(staging, top, encode)
    shutil.rmtree(staging, ignore_errors=True)
    (staging / SHARDS_DIR).mkdir(parents=True)
    pca = None
    if has_basis:
        pca = top.key.storage.fit(pca_sample(ids, mask, offsets, encode))
        write_pca(Location.of(staging), "states", pca)
    write_json_atomic(staging / PLAN_FILE, top.to_json())
    return pca


def _shared_basis(staging: Path, top: CacheManifest, encode: StatesEncoder | None
                  ) -> PcaBasis | None:
    """The basis process 0 stored in the staging folder of a sharded pca<d> or pq<M> build
    (None for another scheme, or k = 0)."""
    if encode is None:
        return None
    return read_pca(Location.of(staging), "states", top.key.storage, top.key.hidden_size)


def _check_whole_build_fits(staging: Path, top: CacheManifest, num_tokens: int,
                            has_states: bool, name: str) -> None:
    """(process 0) Refuses, before any shard starts, a sharded build whose unwritten windows,
    all shards together, would not fit beside the cache: every shard writes to the same disk,
    and each shard's own check (`build_passage_cache`) sees only its rows, so without this the
    first shards could fill the disk and the last ones fail part-way. Windows a kept staging
    folder already holds (`staged_progress`) are not counted again; their token arrays are
    (a few percent over, on the safe side).

    num_tokens: the real tokens of the whole cache; the windows left to write are counted at
    its mean tokens per window."""
    rows = top.num_passages
    done = 0
    if _is_planned(staging, top):
        try:
            done = staged_progress(staging)[0]
        except ValueError:
            done = 0
    whole = stored_bytes(dataclasses.replace(top, num_tokens=num_tokens), has_states)
    check_free_space(staging.parent, whole * (rows - done) // max(rows, 1),
                     f"the passage cache {name} ({rows - done} of {rows} windows to write, "
                     f"{len(top.shards)} shards together)")


def build_sharded_passage_cache(directory: str | os.PathLike, key: CacheKey, ids: np.ndarray,
                                mask: np.ndarray, offsets: np.ndarray,
                                encode: StatesEncoder | None, *, process_index: int,
                                process_count: int, chunk_passages: int = 256,
                                progress: Callable[[int], None] | None = None,
                                reuse: ReuseEncoder | None = None, num_heads: int | None = None,
                                wait_timeout_s: float = 86400.0,
                                peer_check: Callable[[], None] | None = None, pad_id: int = 0,
                                grid: TokenGrid | None = None) -> PassageCache:
    """This process's shard of a cache built by `process_count` processes; returns the whole
    cache opened, once process 0 has finished it. Every process calls this with the same
    arguments (but process_index) and sees the same folder.

      process 0  reuses a finished cache serving `key` (as `build_passage_cache`), or
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
    arguments as `build_passage_cache`'s (progress: windows of this shard finished; pad_id and
    grid: every shard's).
    peer_check: run at every poll of every wait (`wait_for`).
    """
    directory = Path(directory).absolute()
    staging = directory.with_name(f".{directory.name}.partial")
    if reuse is not None and (encode is None or not num_heads):
        raise CacheMismatchError("the first-upper-block arrays need lower states (k > 0) and "
                                 "the number of heads")
    top = sharded_manifest(key, len(ids), chunk_passages, process_count,
                           num_heads if reuse is not None else None)
    if process_index == 0:
        cache = existing_cache(directory, top, encode, reuse)
        if cache is not None:
            return cache
        _check_whole_build_fits(staging, top, int(window_lengths(mask, directory).sum()),
                                has_states=encode is not None, name=directory.name)
        pca = _prepare_staging(staging, top, ids, mask, offsets, encode)
    else:
        ready = wait_for(lambda: _finished(directory, top) or (
                             True if _is_planned(staging, top) else None),
                         lambda: f"process 0 to plan {staging}{_plan_note(staging, top)}",
                         wait_timeout_s, peer_check=peer_check)
        if isinstance(ready, PassageCache):
            return ready
        pca = _shared_basis(staging, top, encode)
    mine = top.shards[process_index]
    start, stop = mine.start, mine.stop
    build_passage_cache(staging / mine.name, key, *(row_range(array, start, stop)
                                                    for array in (ids, mask, offsets)),
                        encode, chunk_passages=chunk_passages,
                        progress=progress, reuse=reuse, num_heads=num_heads, pca=pca,
                        shard=dict(index=process_index, count=process_count, start=start,
                                   stop=stop), pad_id=pad_id, grid=grid)
    if process_index != 0:
        return wait_for(lambda: _finished(directory, top),
                        lambda: f"process 0 to finish {directory}", wait_timeout_s,
                        peer_check=peer_check)

    def missing() -> list[str]:
        return [entry.name for entry in top.shards
                if not (staging / entry.name / MANIFEST_FILE).is_file()]

    wait_for(lambda: None if missing() else True,
             lambda: f"shard(s) {', '.join(missing())} of {staging}", wait_timeout_s,
             peer_check=peer_check)
    # Every shard maps and agrees with the plan, before committing (their files were just
    # written or checked on reopening: no digest check here).
    PassageCache(staging, top, verify="none")
    write_manifest(staging, dataclasses.replace(top, digests=digest_fields(staging)))
    os.replace(staging, directory)
    # After the rename: a crash just before it leaves a staging folder that still resumes.
    (directory / PLAN_FILE).unlink()
    return PassageCache.open(directory)


def staged_progress(staging: Path) -> tuple[int, int, str | None]:
    """(windows done, windows planned, passages fingerprint) of an unfinished cache build,
    sharded or not; ValueError if it cannot be resumed (no readable plan or progress).

    The plan is read as JSON, not as a CacheManifest: a staging folder left by any earlier
    build, with fewer fields, is still reported (and kept when its passages are the index's)."""
    plan = _read_json(staging / PLAN_FILE)
    if not isinstance(plan, dict) or "num_passages" not in plan:
        raise ValueError("no readable plan")
    if not plan.get("shards"):  # one folder (not a sharded build's plan)
        progress = _read_json(staging / PROGRESS_FILE)
        if not isinstance(progress, dict) or "done" not in progress:
            raise ValueError("no readable progress")
        return int(progress["done"]), int(plan["num_passages"]), plan.get("passages")
    done = 0
    for entry in plan.get("shards", []):
        folder = staging / entry["name"]
        if (folder / MANIFEST_FILE).is_file():
            done += entry["stop"] - entry["start"]
        else:
            progress = _read_json(folder.with_name(f".{folder.name}.partial") / PROGRESS_FILE)
            done += int(progress["done"]) if isinstance(progress, dict) else 0
    return done, int(plan["num_passages"]), plan.get("passages")
