"""Building a passage cache: the writing side of `dil_jax.open_domain.cache`.

`build_passage_cache` writes one cache folder (the layout `dil_jax.open_domain.cache`
describes); `build_sharded_passage_cache` has several processes write one shard each, planned
by process 0 and awaited by file polls (`wait_for`). Building lives apart from the format and
reading side so that a process that only reads a cache carries none of the staging, resumption
and waiting code; this module imports from `cache` (names, errors, `PassageCache`) and
`cache_check` (`check_states`), never the reverse.

Building is resumable and atomic: everything is written into `.<name>.partial/` with a
progress record updated after each flushed chunk, and the folder is renamed into place only
when complete.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from dil_jax.atomic import write_atomic
from dil_jax.errors import DilJaxError
from dil_jax.open_domain.cache import (
    _MANIFEST,
    CACHE_FORMAT,
    MATCHED_FIELDS,
    REUSE_LSE_ARRAY,
    REUSE_WIDE_ARRAYS,
    SHARDED_FORMAT,
    SHARDS_DIR,
    CacheBrokenError,
    CacheMismatchError,
    PassageCache,
    ShardWaitError,
    shard_name,
)
from dil_jax.open_domain.cache_check import check_states
from dil_jax.open_domain.compression import PcaBasis, Storage, fit_pca

log = logging.getLogger(__name__)

_PROGRESS = "progress.json"
# PCA bases are fitted on the states of up to this many windows, evenly spread over the corpus,
# and up to this many of their real tokens (a width x width covariance: memory does not grow).
PCA_FIT_WINDOWS = 1024
PCA_FIT_TOKENS = 131072


def _write_json_atomic(path: Path, value: Any) -> None:
    write_atomic(path, json.dumps(value, indent=2))


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
    rows, length = ids.shape
    check_free_space(staging.parent, (rows - (done or 0)) * length * cache_bytes_per_window_token(
        manifest, storage, hidden_size, has_states=encode is not None)
        + (0 if done is not None else rows * length * TOKEN_ARRAY_BYTES),
        f"the passage cache {directory.name} ({rows - (done or 0)} of {rows} windows to write)")
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


# ids and mask (int32 each) and offsets (two int32) per window token.
TOKEN_ARRAY_BYTES = 4 * (1 + 1 + 2)
# Left free beside a cache, for everything else that writes to the same disk.
FREE_SPACE_MARGIN_BYTES = 1 << 30


class DiskSpaceError(DilJaxError, OSError):
    """A cache would not fit on its disk."""


def cache_bytes_per_window_token(manifest: dict[str, Any], storage: Storage, hidden_size: int,
                                 has_states: bool) -> int:
    """Stored bytes of one window token's lower states and, with manifest["reuse"], its first
    upper block arrays (the .npy headers and a PCA basis not counted)."""
    per_token = storage.bytes_per_token(hidden_size) if has_states else 0
    if manifest.get("reuse"):
        per_token += (len(REUSE_WIDE_ARRAYS) * storage.without_pca().bytes_per_token(hidden_size)
                      + 4 * int(manifest["num_heads"]))
    return per_token


def check_free_space(folder: Path, needed_bytes: int, what: str) -> None:
    """Refuses, before anything is written, a build whose arrays would not fit in `folder`'s
    free space (less FREE_SPACE_MARGIN_BYTES): the arrays are sparse memory maps that take their
    blocks as they are written, so a full disk would otherwise stop the build part-way (a killed
    process, or a SIGBUS) after filling it."""
    free = shutil.disk_usage(folder if folder.exists() else folder.parent).free
    if needed_bytes + FREE_SPACE_MARGIN_BYTES > free:
        raise DiskSpaceError(
            f"{what} needs {needed_bytes / 2**30:.1f} GiB and {folder} has {free / 2**30:.1f} GiB "
            f"free (keeping {FREE_SPACE_MARGIN_BYTES / 2**30:.0f} GiB spare): free space, or "
            "store less (--cache-dtype bfloat16, int8 or pca<d>; without --cache-reuse)")


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
