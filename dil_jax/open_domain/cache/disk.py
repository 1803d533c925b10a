"""Disk space and write failures of an index build: checked up front, reported as one line.

A build checks the free space before it writes (`check_free_space`), so that a cache that
cannot fit is refused before hours of encoding. A disk that fills meanwhile fails a write: the
passage cache's shards are written by tensorstore (`cache.zarr_store` names the array), other
writes (`np.save`, JSON, BM25 files) go through `write_errors`; both turn a full or read-only
disk into a `DilJaxError` naming the file instead of a traceback. (Nothing is written through
memory maps any more, where a full disk was a SIGBUS with no message.)
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from dil_jax.errors import DilJaxError, OutputPathError

log = logging.getLogger(__name__)

# Spare room left beside a cache for what else writes to the same disk (.npy headers,
# manifests, progress records, logs): a share of the cache's size, so a small cache on a small
# disk is not refused for want of a fixed gigabyte, and a large one keeps room in proportion.
SPARE_FRACTION = 0.05
MIN_SPARE_BYTES = 16 << 20
# errno values that mean "this disk cannot take the write" (not a bug): named in one line.
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
# A file-size limit (ulimit -f) or a file system's maximum file size.
TOO_LARGE = (errno.EFBIG,)
NOT_WRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM)


class DiskSpaceError(DilJaxError, OSError):
    """A cache would not fit on its disk, or the disk filled while writing; names the file."""


def format_size(num_bytes: float) -> str:
    """`11.0 MiB` below 1 GiB, `2.5 GiB` above: a megabyte-sized cache must not read as
    `0.0 GiB`."""
    if abs(num_bytes) < 1 << 30:
        return f"{num_bytes / (1 << 20):.1f} MiB"
    return f"{num_bytes / (1 << 30):.1f} GiB"


def spare_bytes(needed_bytes: int) -> int:
    """The free space kept beside `needed_bytes` of cache: SPARE_FRACTION of it, at least
    MIN_SPARE_BYTES."""
    return max(MIN_SPARE_BYTES, int(needed_bytes * SPARE_FRACTION))


def allocated_bytes(folder: Path) -> int:
    """Bytes the files under `folder` hold on disk now (their allocated blocks; 0 when it does
    not exist): what a resumed build already reserved, or a restarted one frees."""
    if not folder.is_dir():
        return 0
    return sum(path.stat().st_blocks * 512 for path in folder.rglob("*") if path.is_file())


def check_free_space(folder: Path, needed_bytes: int, what: str) -> None:
    """Refuses (DiskSpaceError), before anything is written, a build whose arrays would not fit
    in `folder`'s free space less `spare_bytes`."""
    free = shutil.disk_usage(folder if folder.exists() else folder.parent).free
    spare = spare_bytes(needed_bytes)
    if needed_bytes + spare > free:
        raise DiskSpaceError(
            f"{what} needs {format_size(needed_bytes)} and {folder} has {format_size(free)} "
            f"free (keeping {format_size(spare)} spare): free space, or store less "
            "(--cache-dtype bfloat16, int8, pca<d> or pq<M>; without --cache-reuse)")


def write_failure(path: Path, error: OSError) -> DilJaxError | None:
    """The one-line error for an OSError writing `path` when the disk is full or not
    writable (DiskSpaceError / OutputPathError naming the file); None for any other errno
    (a bug or a broken disk: it keeps its traceback)."""
    name = errno.errorcode.get(error.errno or 0, str(error.errno))
    if error.errno in NO_SPACE:
        return DiskSpaceError(f"{path}: cannot write it: {error.strerror} ({name}); free space "
                              "on that disk, or give another --out")
    if error.errno in TOO_LARGE:
        return DiskSpaceError(f"{path}: cannot write it: {error.strerror} ({name}): a file-size "
                              "limit (ulimit -f) or the file system's largest file; raise the "
                              "limit, or store less (--cache-dtype int8, pca<d> or pq<M>)")
    if error.errno in NOT_WRITABLE:
        return OutputPathError(f"{path}: cannot write it: {error.strerror} ({name}); give an "
                               "--out on a writable disk")
    return None


@contextlib.contextmanager
def write_errors(path: str | os.PathLike) -> Iterator[None]:
    """Inside the block, a full or read-only disk (`write_failure`) is a DilJaxError naming
    `path` (the file or folder being written): OSErrors of writes seldom carry a file name."""
    try:
        yield
    except DilJaxError:
        raise
    except OSError as error:
        failure = write_failure(Path(error.filename or path), error)
        if failure is None:
            raise
        raise failure from error
