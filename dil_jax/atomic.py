"""Writes that are never seen half done: write beside the target, then rename over it.

`os.replace` is atomic within a file system, so a reader (or a crash) sees either the old target
or the complete new one, never a partial file or folder.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO


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

    overwrite=False refuses (FileExistsError) when `target` already exists. On an exception the
    staging folder is removed and `target` is left as it was.
    """
    target = Path(target).absolute()
    if target.exists() and not overwrite:
        raise FileExistsError(f"{target} already exists; refusing to overwrite it")
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
