"""Writes that are never seen half done: write beside the target, then rename over it.

`os.replace` is atomic within a file system, so a reader (or a crash) sees either the old target
or the complete new one, never a partial file or folder.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import BinaryIO

from dil_jax.errors import OutputPathError

PathLike = str | os.PathLike


class OutputExistsError(OutputPathError, FileExistsError):
    """`staged_directory(overwrite=False)` found its target already there."""


def write_atomic(path: str | os.PathLike, data: str | bytes | Callable[[BinaryIO], None]
                 ) -> Path:
    """Writes text, bytes, or whatever `data(file)` writes, to `path` atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with temporary.open("wb") as out:
            if callable(data):
                data(out)
            else:
                out.write(data.encode("utf-8") if isinstance(data, str) else data)
        os.replace(temporary, path)
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
    if path.exists():
        if not os.access(path, os.W_OK) or not os.access(path.absolute().parent, os.W_OK):
            raise OutputPathError(f"{flag} {path}: not writable (permission denied); choose "
                                  "another output path")
        return path
    _check_creatable(path, flag)
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
