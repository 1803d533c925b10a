"""The build lock of an index folder, and the cleanup of what killed builds left behind.

    index/.lock              held (fcntl.flock) by the process writing the index; names it
    index/.lock-process-I    held by process I > 0 of a sharded cache build (`dil-jax index
                             --num-processes N`): it writes only its shard of each cache
    index/.NAME.tmp-PID      staging of an interrupted write (removed under the lock)
    index/.cache-*.partial   an unfinished cache build (kept when it can be resumed)
    .index.tmp-PID           staging beside the index (removed once process PID is gone)

Writers (`build_index`, `build_reader_cache`, `dil-jax index`) hold the folder's lock
(`index_lock`); a second writer fails at once with BusyError naming the holder.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import json
import os
import re
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

from dil_jax.errors import BusyError, OutputPathError
from dil_jax.open_domain.cache.shards import staged_progress

LOCK_NAME = ".lock"
# What an index folder may hold besides index.json; anything else means --out is some other
# folder, which an index build must not write into.
_INDEX_ENTRY = re.compile(
    r"(passages\.jsonl|passages\.offsets\.npy|windows\.npz|bm25|cache-k.*|cache-store\.json"
    r"|sentences-.*|\..*)")
_TEMPORARY = re.compile(r"\..+\.tmp-(\d+)")

# Locks this process holds: flock conflicts between two descriptors of one process, so nested
# writers (build_all -> build_index -> build_reader_cache) share the outermost lock.
_HELD: dict[Path, int] = {}


def lock_name(process_index: int = 0) -> str:
    """The lock file of process `process_index` of a build: `.lock` for process 0 (the only
    process that writes the index itself), `.lock-process-I` for the others of a sharded cache
    build, which write only their own shard (so a second build's process I is refused)."""
    return LOCK_NAME if process_index == 0 else f"{LOCK_NAME}-process-{process_index}"


@contextlib.contextmanager
def index_lock(directory: str | os.PathLike, process_index: int = 0) -> Iterator[Path]:
    """Holds `directory/lock_name(process_index)` (creating the folder) for the block;
    BusyError if another process holds it, naming that process (pid, host, start time) from
    the lock file; OutputPathError if the folder holds anything but an index (no lock file is
    put there).

    The kernel drops an flock when its holder dies, so a killed build never leaves a stale lock.
    A folder this call created is removed again if the block fails before writing into it.
    """
    # Resolved: two spellings of one folder (a symlink, `..`) must find the same held lock.
    directory = Path(directory).resolve()
    lock = directory / lock_name(process_index)
    if lock in _HELD:
        _HELD[lock] += 1
        try:
            yield directory
        finally:
            _HELD[lock] -= 1
        return
    _refuse_foreign_folder(directory)  # before the lock file is written into it
    created = not directory.exists()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as error:
        raise OutputPathError(f"{directory}: cannot create the index folder or its lock file "
                              f"({error.strerror}); choose another --out") from error
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            if error.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise BusyError(f"{directory}: {_holder(fd)} is writing this index (it holds "
                            f"{lock}); wait for it to finish, or use another --out") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(dict(
            pid=os.getpid(), host=socket.gethostname(),
            started=datetime.datetime.now().astimezone().isoformat(timespec="seconds"))).encode(),
            0)
        _HELD[lock] = 1
        try:
            yield directory
        except BaseException:
            if created and [e.name for e in directory.iterdir()] == [lock.name]:
                shutil.rmtree(directory)  # nothing was built: leave no empty folder behind
            raise
        finally:
            del _HELD[lock]
            # The file stays: unlinking it would let a waiter lock an orphaned inode.
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _holder(fd: int) -> str:
    """'process PID on HOST (started T)' from a held lock file, as far as it can be read."""
    try:
        record = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return (f"process {record['pid']} on {record['host']} (started {record['started']})")
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"


def pid_alive(pid: int) -> bool:
    """Whether process `pid` of this host runs (someone else's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's
        return True
    return True


def clean_stale(directory: str | os.PathLike, passages_fingerprint: str | None = None
                ) -> list[str]:
    """Removes what killed builds left behind; returns one line per thing removed or kept.

    Inside the index (the caller holds its lock, so no live build owns them): every `.*.tmp-PID`
    staging file or folder, and every `.cache-*.partial` cache build that cannot be resumed
    (no readable plan, or planned over other passages). A resumable one is kept (rerunning with
    its reader resumes it) and reported. Beside the index: `.{name}.tmp-PID` folders of older
    builds, only when that process is gone.
    """
    directory = Path(directory).absolute()
    notes = []
    for entry in sorted(directory.iterdir()):
        reason = None
        if _TEMPORARY.fullmatch(entry.name):
            reason = "staging left by an interrupted build"
        elif entry.name.startswith(".cache-") and entry.name.endswith(".partial"):
            try:
                done, total, passages = staged_progress(entry)
            except (OSError, ValueError, KeyError, TypeError):
                reason = "an unfinished cache build that cannot be resumed"
            else:
                if passages_fingerprint is not None and passages != passages_fingerprint:
                    reason = "an unfinished cache build over other passages"
                else:
                    notes.append(f"kept {entry} ({done} of {total} windows encoded): rerun "
                                 "with its reader to resume it, or delete it")
        if reason:
            remove_entry(entry)
            notes.append(f"removed {entry} ({reason})")
    for entry in sorted(directory.parent.glob(f".{directory.name}.tmp-*")):
        match = _TEMPORARY.fullmatch(entry.name)
        if match and not pid_alive(int(match.group(1))):
            remove_entry(entry)
            notes.append(f"removed {entry} (staging of a build whose process "
                         f"{match.group(1)} is gone)")
    return notes


def remove_entry(entry: Path) -> None:
    """Removes a file, a link (not what it points to) or a folder with its contents."""
    if entry.is_dir() and not entry.is_symlink():
        shutil.rmtree(entry)
    else:
        entry.unlink(missing_ok=True)


def _refuse_foreign_folder(directory: Path) -> None:
    """OutputPathError when `directory` holds files that no index build wrote."""
    if not directory.is_dir() or (directory / "index.json").is_file():
        return
    foreign = sorted(e.name for e in directory.iterdir() if not _INDEX_ENTRY.fullmatch(e.name)
                     and e.name != "index.json")
    if foreign:
        raise OutputPathError(
            f"{directory}: exists and is not an index folder (it holds {', '.join(foreign[:5])}"
            f"{', ...' if len(foreign) > 5 else ''}); choose another --out, or an empty folder")

