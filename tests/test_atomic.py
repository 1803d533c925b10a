"""Atomic writes: a failure leaves the old target and no staging files behind."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from dil_jax.atomic import check_output_path, staged_directory, write_atomic
from dil_jax.errors import OutputPathError


def test_write_atomic_keeps_old_file_on_failure(tmp_path):
    target = write_atomic(tmp_path / "a.json", "old")

    def broken(out):
        out.write(b"half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        write_atomic(target, broken)
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]
    write_atomic(target, b"new")
    assert target.read_text() == "new"


def test_staged_directory_replaces_only_on_success(tmp_path):
    target = tmp_path / "index"
    with staged_directory(target) as staging:
        (staging / "x").write_text("1")
    with pytest.raises(KeyError), staged_directory(target) as staging:
        (staging / "x").write_text("2")
        raise KeyError("interrupted")
    assert (target / "x").read_text() == "1"
    assert [p.name for p in tmp_path.iterdir()] == ["index"]
    with pytest.raises(FileExistsError, match="refusing to overwrite"), \
            staged_directory(target, overwrite=False):
        pass


# ----------------------------------------------------------------- targets that are not files
# What must never happen: an output path that names a device, a FIFO or a process's open file
# (/dev/null, /dev/full, a pipe, /dev/stdout) is replaced by a regular file. The tests reach the
# real /dev/null and /dev/full only through symlinks in tmp_path: even code that renames over its
# target replaces the link there, never the device node.


def _is_char_device(path: str) -> bool:
    return os.path.exists(path) and stat.S_ISCHR(os.stat(path).st_mode)


@pytest.fixture
def dev_null_checked():
    """/dev/null is a character device before and after the test."""
    assert _is_char_device("/dev/null")
    yield
    assert _is_char_device("/dev/null"), "/dev/null was replaced"


def test_write_atomic_writes_into_a_fifo_and_keeps_it(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # open now: the writer needs a reader
    try:
        write_atomic(fifo, "predictions")
        assert os.read(reader, 100) == b"predictions"
    finally:
        os.close(reader)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]  # no staging file left


def test_write_atomic_through_a_link_to_dev_null_keeps_link_and_device(tmp_path,
                                                                       dev_null_checked):
    link = tmp_path / "out.json"
    link.symlink_to("/dev/null")
    assert write_atomic(link, "{}") == link
    assert link.is_symlink() and os.readlink(link) == "/dev/null"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


def test_write_atomic_to_a_link_to_dev_full_is_a_named_error(tmp_path, dev_null_checked):
    assert _is_char_device("/dev/full")
    link = tmp_path / "out.json"
    link.symlink_to("/dev/full")
    with pytest.raises(OutputPathError, match=rf"^{link}: cannot write it: No space left on "
                                              r"device \(ENOSPC\)"):
        write_atomic(link, "{}")
    assert link.is_symlink() and _is_char_device("/dev/full")


def test_write_atomic_to_a_link_into_proc_writes_the_open_file(tmp_path):
    """/dev/stdout is a link to /proc/self/fd/1: the same, for a pipe this test holds."""
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)  # nothing written must fail the test, not hang it
    try:
        link = tmp_path / "stdout"
        link.symlink_to(f"/proc/self/fd/{write_end}")
        write_atomic(link, b"answer\n")
        assert os.read(read_end, 100) == b"answer\n"
        assert link.is_symlink()
    finally:
        os.close(read_end)
        os.close(write_end)


def test_write_atomic_replaces_the_file_a_link_points_to_and_keeps_the_link(tmp_path):
    real = tmp_path / "runs" / "preds.json"
    real.parent.mkdir()
    real.write_text("old")
    link = tmp_path / "latest.json"
    link.symlink_to(Path("runs") / "preds.json")  # relative, as users make them
    write_atomic(link, "new")
    assert link.is_symlink() and real.read_text() == "new"
    assert sorted(p.name for p in real.parent.iterdir()) == ["preds.json"]


def test_check_output_path_takes_a_fifo_in_a_folder_it_cannot_write(tmp_path):
    """A device or FIFO is written in place, so its folder's permissions do not matter: a
    non-root user's --output /dev/null must not be refused because /dev is not writable."""
    from unittest import mock

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    real_access = os.access

    def access(path, mode):
        return False if Path(path) == tmp_path else real_access(path, mode)

    with mock.patch("dil_jax.atomic.os.access", side_effect=access):
        assert check_output_path(fifo, "--output") == fifo
        with pytest.raises(OutputPathError, match="not writable"):
            check_output_path(tmp_path / "new.json", "--output")
