"""Writes that are never seen half done: write beside the target, then rename over it.

`os.replace` is atomic within a file system, so a reader (or a crash) sees either the old target
or the complete new one, never a partial file or folder.

Only a regular file is replaced that way. A symlink stays a link (the file it points to is
replaced), and a target that is not a regular file — a character device such as /dev/null or
/dev/full, a FIFO, or a process's open file reached through /proc such as /dev/stdout — is
written in place, as a shell's `>` would: renaming over it would replace the device node or the
link with a regular file and the data would never reach the reader (`output_target`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import BinaryIO

from dil_jax.errors import OutputPathError

PathLike = str | os.PathLike


class OutputExistsError(OutputPathError, FileExistsError):
    """`staged_directory(overwrite=False)` found its target already there."""


# The kernel's own limit on symlinks followed in one path lookup (ELOOP beyond it).
_MAX_SYMLINKS = 40


def _in_proc(path: str | os.PathLike) -> bool:
    """Whether `path` lies in /proc (e.g. /proc/self/fd/1, where /dev/stdout points)."""
    text = os.fspath(path)
    return text == "/proc" or text.startswith("/proc/")


def _file_kind(mode: int) -> str:
    """A stat mode's file type in words, for messages."""
    kinds = ((stat.S_ISDIR, "folder"), (stat.S_ISCHR, "character device"),
             (stat.S_ISBLK, "block device"), (stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket"))
    return next((name for test, name in kinds if test(mode)), "regular file")


def output_target(path: str | os.PathLike) -> tuple[Path, bool]:
    """(the file a write to `path` goes to, whether it is written in place rather than renamed
    over).

    Symlinks are followed one by one, so the rename replaces the file a link points to and the
    link stays. In place: a character device or a FIFO (what /dev/null, /dev/full and pipes
    are), or anything reached through /proc (/dev/stdout, /dev/fd/N: a file a shell opened for
    this process, maybe for appending). Refused (OutputPathError): a folder, a block device, a
    socket, a symlink loop.
    """
    current = Path(os.path.abspath(path))
    for _ in range(_MAX_SYMLINKS):
        folder = os.path.realpath(current.parent)
        if _in_proc(folder):  # /dev/fd/1: the folder is /proc/self/fd
            return current, True
        current = Path(folder) / current.name
        if not current.is_symlink():
            break
        link = os.readlink(current)
        if _in_proc(link):  # /dev/stdout -> /proc/self/fd/1
            return current, True
        current = Path(os.path.normpath(current.parent / link))
    else:
        raise OutputPathError(f"{path}: more than {_MAX_SYMLINKS} symlinks to follow (a loop?); "
                              "choose another output path")
    try:
        mode = os.stat(current).st_mode
    except (FileNotFoundError, NotADirectoryError):  # not there yet (or under a file: refused
        return current, False                       # by the caller, naming that file)
    if stat.S_ISREG(mode):
        return current, False
    if stat.S_ISCHR(mode) or stat.S_ISFIFO(mode):
        return current, True
    raise OutputPathError(f"{path}: {current} is a {_file_kind(mode)}, not a file an output can "
                          "be written to; choose another output path")


def _write_error(path: Path, error: OSError) -> OutputPathError:
    """OutputPathError naming the output and the system's reason (e.g. ENOSPC, /dev/full)."""
    code = errno.errorcode.get(error.errno or 0, "")
    reason = f"{error.strerror or error}{f' ({code})' if code else ''}"
    return OutputPathError(f"{path}: cannot write it: {reason}; free some space or choose "
                           "another output path")


def _is_output_error(error: OSError, *paths: Path) -> bool:
    """Whether an OSError came from writing the output itself (no file name, or one of
    `paths`), not from a file a `data` callback read on its own account."""
    return error.filename is None or str(error.filename) in {str(p) for p in paths}


def _write(out: BinaryIO, data: str | bytes | Callable[[BinaryIO], None]) -> None:
    if callable(data):
        data(out)
    else:
        out.write(data.encode("utf-8") if isinstance(data, str) else data)


def _write_in_place(path: Path, target: Path,
                    data: str | bytes | Callable[[BinaryIO], None]) -> None:
    """Writes to a device, FIFO or /proc file as it is: no O_CREAT (a node that vanished is
    not replaced by a regular file), O_APPEND (a shell's `>>` file is not truncated)."""
    try:
        fd = os.open(target, os.O_WRONLY | os.O_APPEND)
        with os.fdopen(fd, "wb") as out:
            _write(out, data)
    except OSError as error:
        if not _is_output_error(error, path, target):
            raise
        raise _write_error(path, error) from error


def write_atomic(path: str | os.PathLike, data: str | bytes | Callable[[BinaryIO], None]
                 ) -> Path:
    """Writes text, bytes, or whatever `data(file)` writes, to `path` atomically (a regular
    file, also through a symlink), or in place to a device, FIFO or /dev/stdout
    (`output_target`). A write the system refuses (a full disk, /dev/full) is an
    OutputPathError naming `path`. Returns `path`."""
    path = Path(path)
    target, in_place = output_target(path)
    if in_place:
        _write_in_place(path, target, data)
        return path
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    try:
        with temporary.open("wb") as out:
            _write(out, data)
        os.replace(temporary, target)
    except OSError as error:
        temporary.unlink(missing_ok=True)
        if not _is_output_error(error, path, target, temporary):
            raise
        raise _write_error(path, error) from error
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return path


@contextlib.contextmanager
def staged_directory(target: str | os.PathLike, overwrite: bool = True) -> Iterator[Path]:
    """Yields an empty staging folder beside `target`; on success it replaces `target`.

    overwrite=False refuses (OutputExistsError, a FileExistsError) when `target` already exists.
    On an exception the staging folder is removed and `target` is left as it was.
    """
    target = Path(target).absolute()
    if target.exists() and not overwrite:
        raise OutputExistsError(f"{target} already exists; refusing to overwrite it")
    staging = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if target.exists():
        shutil.rmtree(target)
    os.replace(staging, target)


# ---------------------------------------------------------------- output paths, checked up front
# A command checks where it will write before it loads a model or reads a corpus: a bad --output
# should cost the user a second, not the whole run, and must never destroy an input.


def _same_path(a: Path, b: Path) -> bool:
    """True when a and b name the same file or folder (through symlinks, `..`, hard links)."""
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet): compare where they would resolve
        return a.resolve() == b.resolve()


def _inside(path: Path, folder: Path) -> bool:
    """True when `path` is `folder` or lies somewhere below it (symlinks resolved)."""
    path, folder = path.resolve(), folder.resolve()
    return path == folder or folder in path.parents


def _given(inputs: Mapping[str, PathLike | Iterable[PathLike] | None] | None
           ) -> Iterator[tuple[str, Path]]:
    """(flag, path) of every input given, flattening flags that take several paths."""
    for flag, value in (inputs or {}).items():
        if value is None:
            continue
        for one in ([value] if isinstance(value, (str, os.PathLike)) else value):
            if one is not None and str(one) != "":
                yield flag, Path(one)


def _check_creatable(path: Path, flag: str) -> None:
    """Raises OutputPathError unless `path` (which does not exist) can be created.

    The nearest existing ancestor must be a folder we may write into; the folders in between
    are created when the output is written.
    """
    ancestor = path.absolute().parent
    while not ancestor.exists():
        if ancestor == ancestor.parent:
            break
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise OutputPathError(f"{flag} {path}: {ancestor} is a file, so the folder "
                              f"{path.absolute().parent} cannot be created; choose another "
                              "output path")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise OutputPathError(f"{flag} {path}: cannot create it, the folder {ancestor} is not "
                              "writable (permission denied); choose another output path")


def check_output_path(path: PathLike, flag: str,
                      inputs: Mapping[str, PathLike | Iterable[PathLike] | None] | None = None
                      ) -> Path:
    """Checks, before any work, that the output FILE `path` (given as `flag`) can be written.

    inputs: {flag: path or paths} the command reads. Refuses (OutputPathError naming the flag
    and the path) an output that is one of the inputs by any path (symlink, `..`, hard link) or
    an existing file inside an input folder, a folder, a read-only file, or one under a parent
    that cannot be created or written.
    Returns `path` as a Path. Creates nothing.
    """
    path = Path(path)
    for input_flag, given in _given(inputs):
        if _same_path(path, given):
            raise OutputPathError(f"{flag} {path} is the {input_flag} file {given}: writing it "
                                  "would overwrite the input; choose another output path")
        if path.exists() and given.is_dir() and _inside(path, given):
            raise OutputPathError(f"{flag} {path} is a file of the {input_flag} folder {given}: "
                                  "writing it would overwrite part of the input; choose "
                                  "another output path")
    if path.is_dir():
        raise OutputPathError(f"{flag} {path} is a folder; give a file path, e.g. "
                              f"{path / 'predictions.json'}")
    try:
        target, in_place = output_target(path)
    except OutputPathError as error:
        raise OutputPathError(f"{flag} {error}") from None
    if in_place:  # written as it is (/dev/null, a FIFO, /dev/stdout): its folder is not touched
        if not os.access(target, os.W_OK):
            raise OutputPathError(f"{flag} {path}: not writable (permission denied); choose "
                                  "another output path")
        return path
    # A symlink's target is what gets replaced, beside it in its own folder.
    if target.exists():
        if not os.access(target, os.W_OK) or not os.access(target.parent, os.W_OK):
            raise OutputPathError(f"{flag} {path}: not writable (permission denied); choose "
                                  "another output path")
        return path
    _check_creatable(target if path.is_symlink() else path, flag)
    return path


def check_output_folder(folder: PathLike, flag: str,
                        inputs: Mapping[str, PathLike | Iterable[PathLike] | None] | None = None,
                        files: Iterable[str] = (), replaced_unless: str | None = None) -> Path:
    """Checks, before any work, that the output FOLDER `folder` (given as `flag`) can be written.

    files: the names the command writes into it; none may be an input.
    replaced_unless: for a folder the command replaces as a whole (staged, then renamed over)
      unless it holds this file, the mark of one it wrote (e.g. "index.json", reused): without
      it, a non-empty folder, or one holding an input, is refused (replacing would delete them).
    Returns `folder` as a Path. Creates nothing.
    """
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise OutputPathError(f"{flag} {folder} is a file, not a folder; give a folder path")
    given = list(_given(inputs))
    for input_flag, path in given:
        if folder.resolve() == path.resolve():
            raise OutputPathError(f"{flag} {folder} is the {input_flag} input; the command writes "
                                  "into it; choose another output folder")
    for name in files:
        check_output_path(folder / name, f"{flag} (its {name})", inputs)
    if replaced_unless is not None and not (folder / replaced_unless).exists():
        for input_flag, path in given:
            if _inside(path, folder):
                raise OutputPathError(
                    f"{flag} {folder} holds the {input_flag} input {path}; the command "
                    "replaces that folder as a whole, which would delete the input; choose "
                    "another output folder")
        if folder.is_dir() and any(folder.iterdir()):
            raise OutputPathError(
                f"{flag} {folder} is a folder that is not empty and has no {replaced_unless}; "
                "the command replaces that folder as a whole, which would delete what is in "
                "it; choose a new or empty folder")
    if folder.is_dir():
        if not os.access(folder, os.W_OK | os.X_OK):
            raise OutputPathError(f"{flag} {folder}: not writable (permission denied); choose "
                                  "another output folder")
        if replaced_unless is not None and not os.access(folder.absolute().parent, os.W_OK):
            raise OutputPathError(f"{flag} {folder}: its parent folder is not writable "
                                  "(permission denied), so it cannot be replaced")
        return folder
    _check_creatable(folder, flag)
    return folder
