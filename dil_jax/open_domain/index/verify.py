"""`dil-jax index --verify`: every byte of an index folder against what its build recorded.

Opening an index checks its own files whole (index.json's sizes and sha256) but its passage
caches only cheaply (`dil_jax.open_domain.cache.digests`: sizes, sampled blocks, modification
times); this reads every byte of every cache file too, and lists every file that differs
instead of stopping at the first. It needs no reader: it checks bytes, not what the states
mean (opening with a reader re-encodes two rows for that).

It writes one thing: where a cache file's modification time differs from its record but every
byte matches (a copy that did not keep times), the new time is recorded in that folder's
manifest, so later opens check it cheaply again. It holds the index's lock meanwhile.

The caches of an index built with `--cache-store URL` (`cache-store.json`) are checked in the
store too: every `cache-k*` there, object by object (a store records no modification times, so
nothing is written there).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from dil_jax.open_domain.cache.build import write_manifest
from dil_jax.open_domain.cache.digests import FolderCheck, refreshed_digests, verify_folder
from dil_jax.open_domain.cache.disk import format_size
from dil_jax.open_domain.cache.location import Location
from dil_jax.open_domain.cache.store import CacheBrokenError, CacheMismatchError, PassageCache
from dil_jax.open_domain.index.files import OpenDomainIndexError, read_settings
from dil_jax.open_domain.index.folder import open_index, read_cache_store
from dil_jax.open_domain.index.lock import index_lock


@dataclasses.dataclass
class VerifyReport:
    """lines: what was checked (one line per part); problems: 'file: what differs', every one
    found; unchecked: caches without digests (written by an older dil-jax)."""

    lines: list[str] = dataclasses.field(default_factory=list)
    problems: list[str] = dataclasses.field(default_factory=list)
    unchecked: list[Path] = dataclasses.field(default_factory=list)


def _cache_line(name: str, checks: list[FolderCheck], seconds: float) -> str:
    """One cache's line of the report: files, bytes hashed, the verdict, the time taken."""
    if not all(check.digested for check in checks):
        return (f"{name}: no file digests recorded (written by an older dil-jax): not "
                "checked; rerun `dil-jax index` with the same --out, settings and its reader "
                "to record them, or delete the folder and rerun to rebuild it")
    problems = sum(len(check.problems) for check in checks)
    verdict = "every byte matches" if not problems else f"{problems} differ"
    return (f"{name}: {sum(check.files for check in checks)} files, "
            f"{format_size(sum(check.bytes_hashed for check in checks))} hashed, {verdict} "
            f"({seconds:.1f} s)")


def verify_index(directory: str | Path) -> VerifyReport:
    """Checks every file of the index in `directory` and of each of its passage caches against
    its build-time record (module docstring); records new modification times of files that
    match. OpenDomainIndexError when `directory` holds no index."""
    directory = Path(directory)
    read_settings(directory)  # "not an index" before the lock would create the folder
    report = VerifyReport()
    with index_lock(directory):
        started = time.perf_counter()
        try:
            index = open_index(directory)  # its files: sizes and sha256 of every byte
        except OpenDomainIndexError as error:
            report.problems.append(str(error))
        else:
            report.lines.append(f"index files: {len(index.settings.files)} files, "
                                f"every byte matches ({time.perf_counter() - started:.1f} s)")
        for folder in sorted(entry for entry in directory.glob("cache-k*") if entry.is_dir()):
            started = time.perf_counter()
            try:
                cache = PassageCache.open(folder, verify="none")  # the manifests and shapes
            except CacheMismatchError as error:
                report.problems.append(str(error))
                continue
            checks = [verify_folder(path.path, manifest.digests, full=True)
                      for path, manifest in cache.folders]
            report.problems += [f"{path}: {problem}" for check in checks
                                for path, problem in check.problems]
            if not all(check.digested for check in checks):
                report.unchecked.append(folder)
            for check, (path, manifest) in zip(checks, cache.folders, strict=True):
                if check.rehashed and not check.problems:
                    write_manifest(path.path, dataclasses.replace(
                        manifest, digests=refreshed_digests(path.path, manifest.digests, check)))
            report.lines.append(_cache_line(folder.name, checks, time.perf_counter() - started))
        url = read_cache_store(directory)
        if url is not None:
            _verify_store(Location.of(url), report)
        stores = sorted(entry.name for entry in directory.glob("sentences-*"))
        if stores:
            report.lines.append(f"{', '.join(stores)}: no digests recorded for sentence stores "
                                "(not checked)")
    return report


def store_cache_names(store: Location) -> list[str]:
    """The cache folders (`cache-k*`) in a store, from the names of its objects, sorted."""
    return sorted({name.split("/", 1)[0] for name in store.names()
                   if name.startswith("cache-k") and "/" in name})


def _verify_store(store: Location, report: VerifyReport) -> None:
    """Adds to `report` every byte of each cache in `store` against its manifests' digests;
    an unfinished one (no manifest) or one whose manifest does not open is a problem."""
    for name in store_cache_names(store):
        started = time.perf_counter()
        try:
            cache = PassageCache.open(store / name, verify="none")  # the manifests and shapes
        except (CacheMismatchError, CacheBrokenError) as error:
            report.problems.append(str(error))
            continue
        checks = [verify_folder(folder.objects(), manifest.digests, full=True)
                  for folder, manifest in cache.folders]
        report.problems += [f"{path}: {problem}" for check in checks
                            for path, problem in check.problems]
        report.lines.append(_cache_line(str(store / name), checks, time.perf_counter() - started))
