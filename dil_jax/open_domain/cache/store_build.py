"""Building a passage cache in a store (a URL: gs://, s3://, file://), by one process or many,
with no folder shared between them.

    dil-jax index --out LOCAL_DIR --cache-store gs://BUCKET/wiki --k 4 \\
        --num-processes N --process-id I --coordinator-address HOST0:1234

Each reader's cache goes to `URL/cache-k{k}-{model}/`, in the sharded layout of
`dil_jax.open_domain.cache.store` (shard i holding the rows `shards.shard_ranges` gives it):

  NAME/states.pca_mean/, NAME/states.pca_basis/   (pca<d>) process 0: the basis, fitted once
  NAME/plan.json          process 0, after the basis: the cache as planned (`sharded_manifest`)
  NAME/shards/shard-i-of-n/   process i only: its arrays, its plan.json and progress.json
                          while it builds, then its manifest.json (its objects' digests), last
  NAME/manifest.json      process 0, once every shard's manifest is there, last of all: from
                          then on the cache exists (a reader opens a cache by its manifest)

Why no staging folder renamed into place, as a local build does: an object store has no
rename. Instead every object is written whole once (`Location.write_bytes`; a zarr shard of an
array is written when complete, `cache.build`) and a folder counts only once its manifest is
written, last; a rerun treats anything without a manifest as unfinished.

Why process 0 joins the shards by polling the store (`shards.wait_for`) and not after a JAX
barrier or in a separate step: the processes may run without jax.distributed (they need no
collective), a barrier hangs on a dead peer where a poll fails after --wait-timeout naming the
missing shard, and the store is the one thing every process sees. A rerun of process 0 alone
joins shards that all finished (its own shard is reopened, not rebuilt).

Resuming after kill -9 of any process: rerun every process with the same flags. Process 0
keeps NAME/ when its plan is this run's (else empties it and starts over); a shard with its
manifest is complete and is reopened (sizes and sampled digests checked), not rewritten; a
shard without one resumes from its progress.json at the first chunk not all written; a
shard's manifest that does not open (damaged) has that shard rebuilt.

No lock: two builds writing one URL at once are not refused (a local build's lock is a file
lock, which object stores lack); give each build its own URL.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from dil_jax.open_domain.cache.build import (
    PLAN_FILE,
    PROGRESS_FILE,
    pca_sample,
    resume_point,
    start_fresh,
    window_lengths,
    write_json_at,
    write_rows,
)
from dil_jax.open_domain.cache.check import check_states
from dil_jax.open_domain.cache.digests import object_digest_fields
from dil_jax.open_domain.cache.location import Location
from dil_jax.open_domain.cache.manifest import (
    MANIFEST_FILE,
    RAGGED_FORMAT,
    CacheKey,
    CacheManifest,
)
from dil_jax.open_domain.cache.ragged import starts_of
from dil_jax.open_domain.cache.ragged_store import read_pca, write_pca
from dil_jax.open_domain.cache.shards import row_range, sharded_manifest, wait_for
from dil_jax.open_domain.cache.storage import PcaBasis
from dil_jax.open_domain.cache.store import (
    CacheBrokenError,
    CacheMismatchError,
    PassageCache,
    ReuseEncoder,
    StatesEncoder,
)
from dil_jax.open_domain.cache.zarr_store import TokenGrid

log = logging.getLogger(__name__)

# The kvstore drivers a cache store is meant for, by URL scheme (tensorstore opens each): only
# file:// is tested here.
STORE_SCHEMES = ("gs", "s3", "file")


def store_url(value: str) -> str:
    """A cache store's URL: `value` itself when it is a URL of STORE_SCHEMES, a local path as
    its file:// URL (absolute); ValueError naming the value otherwise (another scheme)."""
    location = Location.of(value)
    if location.is_local:
        return f"file://{location.path.absolute()}"
    scheme = location.url.split("://", 1)[0]
    if scheme not in STORE_SCHEMES:
        schemes = ", ".join(f"{name}://" for name in STORE_SCHEMES)
        raise ValueError(f"{value!r}: a cache store is a {schemes} URL or a local path")
    if scheme == "file" and not location.url.startswith("file:///"):
        # tensorstore reads file://HOST/...: a relative path there would name a host.
        raise ValueError(f"{value!r}: a file:// store needs an absolute path (file:///...), "
                         "or give the path itself")
    return location.url


def _read_json(location: Location, name: str) -> Any:
    """The JSON of the file `name` at `location`; None when missing or not (yet) readable."""
    try:
        return json.loads(location.read_bytes(name) or b"")
    except (OSError, ValueError):
        return None


def _commit(location: Location, manifest: CacheManifest) -> None:
    """Finishes a folder in the store: its objects' digests into its manifest, written last
    (the folder exists from then on), then the build's records dropped (a rerun that finds
    them beside a manifest ignores them)."""
    digests = object_digest_fields(location.objects(), location.names())
    write_json_at(location, MANIFEST_FILE, dataclasses.replace(manifest,
                                                               digests=digests).to_json())
    for name in (PLAN_FILE, PROGRESS_FILE):
        location.delete(name)


def _planned_fields(manifest: CacheManifest) -> dict[str, Any]:
    """What a finished shard must hold to be this plan's: its manifest's fields but the
    counts and digests its build found."""
    value = manifest.without_digests().to_json()
    return {field: value[field] for field in value if field not in ("num_tokens", "pad_id")}


def _finished_shard(location: Location, planned: CacheManifest) -> PassageCache | None:
    """The complete shard at `location` when it is `planned`'s (opened: sizes and sampled
    digests checked); None when it has no manifest yet; one damaged, or of another plan, is
    emptied (with a warning) and None."""
    if not location.exists(MANIFEST_FILE):
        return None
    try:
        cache = PassageCache.open(location, planned.key)
        if _planned_fields(cache.manifest) != _planned_fields(planned):
            raise CacheBrokenError(f"{location / MANIFEST_FILE}: another plan's shard")
        return cache
    except (CacheBrokenError, CacheMismatchError) as error:
        log.warning("%s -- rebuilding the shard", error)
        # The manifest first: from here on no process takes the shard for finished.
        location.delete(MANIFEST_FILE)
        location.delete_all()
        return None


def build_cache_at(location: Location, key: CacheKey, ids: np.ndarray, mask: np.ndarray,
                   offsets: np.ndarray, encode: StatesEncoder | None, *,
                   shard: dict[str, int], pca: PcaBasis | None,
                   chunk_passages: int = 256, progress: Callable[[int], None] | None = None,
                   reuse: ReuseEncoder | None = None, num_heads: int | None = None,
                   pad_id: int = 0, grid: TokenGrid | None = None) -> PassageCache:
    """Builds (or resumes, or reopens) one shard of a cache at `location` in a store; returns
    it opened. Rows are encoded in chunks of `chunk_passages` as a local build encodes them
    (`cache.build`: the same chunks, the same bytes), written into the shard's final place
    (module docstring: its manifest last).

    ids, mask: [rows, passage_len]; offsets: [rows, passage_len, 2] (the shard's rows, read a
    chunk at a time). shard: {index, count, start, stop}. pca: the cache's basis (pca<d>;
    process 0 fitted it), None for another scheme. The rest as `build_passage_cache`'s.
    """
    planned = CacheManifest(key, num_passages=len(ids), reuse=reuse is not None,
                            num_heads=int(num_heads) if reuse is not None else None,
                            shard=dict(shard), format=RAGGED_FORMAT)
    done = _finished_shard(location, planned)
    if done is not None:
        return done
    starts = starts_of(window_lengths(mask, location))
    manifest = dataclasses.replace(planned, num_tokens=int(starts[-1]), pad_id=int(pad_id))
    resume = resume_point(location, manifest)
    if resume is None:
        location.delete_all()  # another plan's, or a start interrupted before its records
        start_fresh(location, manifest, starts, encode is not None, pca, grid)
        resume = (0, 0)
    else:
        log.info("%s: resuming at window %d of %d (%d of %d tokens written)", location,
                 resume[0], len(ids), resume[1], manifest.num_tokens)
    write_rows(location, location, manifest, starts, ids, mask, offsets, encode, reuse,
               chunk_passages, resume, int(shard["start"]), progress)
    _commit(location, manifest)
    return PassageCache.open(location, verify="none")


def _finished_cache(location: Location, top: CacheManifest, encode: StatesEncoder | None,
                    reuse: ReuseEncoder | None) -> PassageCache | None:
    """(process 0) The finished cache at `location` if it serves `top`'s key (re-encoded rows
    checked, `check_states`), None if there is none; a damaged one is emptied (with a
    warning) and None; one of other settings is CacheMismatchError naming the URL and the fix."""
    if not location.exists(MANIFEST_FILE):
        return None
    try:
        cache = PassageCache.open(location, top.key)
        if reuse is not None and not cache.has_reuse:
            raise CacheMismatchError(f"{location / MANIFEST_FILE}: cache built without the "
                                     "first upper block's arrays, and this run asks for them "
                                     "(--cache-reuse)")
        if encode is not None:
            check_states(cache, encode, reuse)
        return cache
    except CacheBrokenError as error:
        log.warning("%s -- rebuilding it", error)
        location.delete(MANIFEST_FILE)  # first: no process takes it for finished meanwhile
        location.delete_all()
        return None
    except CacheMismatchError as error:
        raise CacheMismatchError(f"{error}. This run would build a different cache under the "
                                 f"same name: delete {location} (every object under it) to "
                                 "rebuild it with this run's settings, or give another "
                                 "--cache-store") from error


def _prepare_plan(location: Location, top: CacheManifest, ids: np.ndarray, mask: np.ndarray,
                  offsets: np.ndarray, encode: StatesEncoder | None) -> PcaBasis | None:
    """(process 0) Keeps `location` when it holds this plan (its shards resume), else empties
    it and writes the PCA basis (pca<d>: fitted once, on the sample a one-process build fits
    on) and then plan.json, last: the other processes start their shards when it appears.
    Returns the basis every shard stores (None for another scheme, or k = 0)."""
    if _read_json(location, PLAN_FILE) == top.to_json():
        return _stored_basis(location, top, encode)
    location.delete_all()
    pca = None
    if encode is not None and top.key.storage.has_basis:
        pca = top.key.storage.fit(pca_sample(ids, mask, offsets, encode))
        write_pca(location, "states", pca)
    write_json_at(location, PLAN_FILE, top.to_json())
    return pca


def _stored_basis(location: Location, top: CacheManifest, encode: StatesEncoder | None
                  ) -> PcaBasis | None:
    """The PCA basis process 0 stored beside the plan (None for another scheme, or k = 0)."""
    if encode is None:
        return None
    return read_pca(location, "states", top.key.storage, top.key.hidden_size)


def _plan_note(location: Location, top: CacheManifest) -> str:
    """Why the plan at `location` is not `top` (for a wait's error), or ''."""
    plan, wanted = _read_json(location, PLAN_FILE), top.to_json()
    if not isinstance(plan, dict):
        return ""
    fields = sorted(f for f in set(plan) | set(wanted) if plan.get(f) != wanted.get(f))
    return (f" (its plan differs from this process's in {', '.join(fields)}: give every "
            "process the same flags)") if fields else ""


def _shard_done(location: Location, key: CacheKey) -> bool:
    """(process 0, joining) Whether the shard at `location` is finished: its manifest is there
    and it opens (sizes and sampled digests checked). One that does not is its own process's
    to rebuild (`_finished_shard`), not finished: joining it would publish a damaged cache."""
    if not location.exists(MANIFEST_FILE):
        return False
    try:
        PassageCache.open(location, key)
    except (CacheBrokenError, CacheMismatchError):
        return False
    return True


def check_shard_windows(cache: PassageCache, ids: np.ndarray) -> None:
    """(process 0, joining) The first and last window of every shard hold the token ids of
    process 0's own windows for those rows (ids [num_rows, passage_len]); CacheBrokenError
    naming the shard and the window otherwise. Each host splits and tokenizes the corpus itself:
    one that did it otherwise (another corpus file, tokenizer or dil-jax version) would be
    joined unnoticed, its rows answering with another passage's tokens; two rows per shard
    are read, not the whole cache."""
    for number, (start, stop, folder) in enumerate(cache.shards):
        for row in sorted({start, stop - 1}) if stop > start else ():
            if not np.array_equal(cache.ids[[row]][0], np.asarray(ids[row])):
                raise CacheBrokenError(
                    f"{folder}: window {row}'s token ids differ from process 0's: process "
                    f"{number} split or tokenized the corpus otherwise; delete {folder} (every "
                    f"object under it) and rerun process {number} with process 0's corpus, "
                    "dil-jax and tokenizer")


def _opened(location: Location, top: CacheManifest) -> PassageCache | None:
    """The finished cache at `location` serving top's key, else None (not there yet)."""
    if not location.exists(MANIFEST_FILE):
        return None
    try:
        return PassageCache.open(location, top.key)
    except (CacheBrokenError, CacheMismatchError):
        return None  # process 0 repairs or refuses it


def build_store_cache(location: Location, key: CacheKey, ids: np.ndarray, mask: np.ndarray,
                      offsets: np.ndarray, encode: StatesEncoder | None, *,
                      process_index: int = 0, process_count: int = 1,
                      chunk_passages: int = 256, progress: Callable[[int], None] | None = None,
                      reuse: ReuseEncoder | None = None, num_heads: int | None = None,
                      wait_timeout_s: float = 86400.0, pad_id: int = 0,
                      grid: TokenGrid | None = None) -> PassageCache:
    """This process's shard of a cache that `process_count` processes build at `location`
    (a URL: module docstring); returns the whole cache opened once process 0 has joined it.
    Every process calls this with the same arguments but process_index; each reads only its
    own rows of the windows (its local copy of the index) and the store.

      process 0  reuses a finished cache serving `key`, or keeps / writes the plan
                 (`_prepare_plan`), builds shard 0, waits for every shard's manifest, checks
                 that they agree with the plan and writes the cache's manifest, last
      process i  waits for the plan (or the finished cache), builds shard i, waits for the
                 cache's manifest

    ids, mask: [num_rows, passage_len]; offsets: [num_rows, passage_len, 2]: every window of
    the index (each process slices its rows). Waits fail after wait_timeout_s (`wait_for`).
    """
    if reuse is not None and (encode is None or not num_heads):
        raise CacheMismatchError("the first-upper-block arrays need lower states (k > 0) and "
                                 "the number of heads")
    top = sharded_manifest(key, len(ids), chunk_passages, process_count,
                           num_heads if reuse is not None else None)
    if process_index == 0:
        cache = _finished_cache(location, top, encode, reuse)
        if cache is not None:
            return cache
        pca = _prepare_plan(location, top, ids, mask, offsets, encode)
    else:
        ready = wait_for(lambda: _opened(location, top) or (
                             True if _read_json(location, PLAN_FILE) == top.to_json() else None),
                         lambda: f"process 0 to plan {location}{_plan_note(location, top)}",
                         wait_timeout_s)
        if isinstance(ready, PassageCache):
            return ready
        pca = _stored_basis(location, top, encode)
    mine = top.shards[process_index]
    build_cache_at(location / mine.name, key,
                   *(row_range(array, mine.start, mine.stop) for array in (ids, mask, offsets)),
                   encode, shard=dict(index=process_index, count=process_count,
                                      start=mine.start, stop=mine.stop),
                   pca=pca, chunk_passages=chunk_passages, progress=progress, reuse=reuse,
                   num_heads=num_heads, pad_id=pad_id, grid=grid)
    if process_index != 0:
        return wait_for(lambda: _opened(location, top), lambda: f"process 0 to join {location}",
                        wait_timeout_s)

    done: set[str] = set()

    def missing() -> list[str]:
        # A shard found finished is not opened again at the next poll: with many hosts each
        # open reads sampled blocks of a shard's objects.
        done.update(entry.name for entry in top.shards
                    if entry.name not in done and _shard_done(location / entry.name, key))
        return [entry.name for entry in top.shards if entry.name not in done]

    wait_for(lambda: None if missing() else True,
             lambda: f"shard(s) {', '.join(missing())} of {location}", wait_timeout_s)
    # Every shard agrees with the plan (its own manifest against the cache's) and with process
    # 0's windows.
    check_shard_windows(PassageCache(location, top, verify="none"), ids)
    _commit(location, top)
    return PassageCache.open(location, verify="none")
