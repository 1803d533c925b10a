"""Building a passage cache in shards: several processes write one cache, one shard each.

`build_sharded_passage_cache` has every process build its shard (`shard_ranges`: whole chunks
of the global grid) with `dil_jax.open_domain.cache_build.build_passage_cache`, planned by
process 0 (`sharded_manifest`, `_prepare_staging`) and awaited by file polls (`wait_for`);
`staged_progress` reports how far an unfinished build, sharded or not, has come.

Separate from cache_build.py, which writes one cache folder (staging, resumption, the disk
check): this module adds only the multi-process part on top of it (the plan, the shard layout,
the waits), and imports from `cache_build` and `cache`, never the reverse.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from dil_jax.open_domain.cache import (
    _MANIFEST,
    MATCHED_FIELDS,
    SHARDED_FORMAT,
    SHARDS_DIR,
    CacheMismatchError,
    PassageCache,
    ShardWaitError,
    shard_name,
)
from dil_jax.open_domain.cache_build import (
    _PROGRESS,
    TOKEN_ARRAY_BYTES,
    _existing_cache,
    _pca_sample,
    _write_json_atomic,
    build_passage_cache,
    cache_bytes_per_window_token,
    check_free_space,
)
from dil_jax.open_domain.cache_digests import digest_fields
from dil_jax.open_domain.compression import PcaBasis, Storage, fit_pca

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


def _check_whole_build_fits(staging: Path, top: dict[str, Any], shape: tuple[int, int],
                            storage: Storage, hidden_size: int, has_states: bool,
                            name: str) -> None:
    """(process 0) Refuses, before any shard starts, a sharded build whose unwritten windows,
    all shards together, would not fit beside the cache: every shard writes to the same disk,
    and each shard's own check (`build_passage_cache`) sees only its rows, so without this the
    first shards could fill the disk and the last ones fail part-way. Windows a kept staging
    folder already holds (`staged_progress`) are not counted again; their token arrays are
    (a few percent over, on the safe side).

    shape: (num_rows, passage_len) of the whole cache."""
    rows, length = shape
    done = 0
    if _read_json(staging / "plan.json") == top:
        try:
            done = staged_progress(staging)[0]
        except ValueError:
            done = 0
    per_token = cache_bytes_per_window_token(top, storage, hidden_size, has_states)
    check_free_space(staging.parent, (rows - done) * length * (per_token + TOKEN_ARRAY_BYTES),
                     f"the passage cache {name} ({rows - done} of {rows} windows to write, "
                     f"{len(top['shards'])} shards together)")


def build_sharded_passage_cache(directory: str | os.PathLike, manifest: dict[str, Any],
                                ids: np.ndarray, mask: np.ndarray, offsets: np.ndarray,
                                encode: Callable[[np.ndarray, np.ndarray], np.ndarray] | None,
                                hidden_size: int, *, process_index: int, process_count: int,
                                chunk_passages: int = 256,
                                progress: Callable[[int], None] | None = None,
                                reuse: Callable[[np.ndarray, np.ndarray], dict[str, np.ndarray]]
                                | None = None, num_heads: int | None = None,
                                wait_timeout_s: float = 86400.0,
                                peer_check: Callable[[], None] | None = None) -> PassageCache:
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
    peer_check: run at every poll of every wait (`wait_for`).
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
        _check_whole_build_fits(staging, top, ids.shape, storage, hidden_size,
                                has_states=encode is not None, name=directory.name)
        pca = _prepare_staging(staging, top, ids, mask, encode, storage)
    else:
        ready = wait_for(lambda: _finished(directory, top) or (
                             True if _read_json(staging / "plan.json") == top else None),
                         lambda: f"process 0 to plan {staging}{_plan_note(staging, top)}",
                         wait_timeout_s, peer_check=peer_check)
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
                        lambda: f"process 0 to finish {directory}", wait_timeout_s,
                        peer_check=peer_check)

    def missing() -> list[str]:
        return [entry["name"] for entry in top["shards"]
                if not (staging / entry["name"] / _MANIFEST).is_file()]

    wait_for(lambda: None if missing() else True,
             lambda: f"shard(s) {', '.join(missing())} of {staging}", wait_timeout_s,
             peer_check=peer_check)
    # Every shard maps and agrees with the plan, before committing (their files were just
    # written or checked on reopening: no digest check here).
    PassageCache(staging, top, verify="none")
    _write_json_atomic(staging / _MANIFEST, dict(top, **digest_fields(staging)))
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
