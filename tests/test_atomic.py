"""Atomic writes: a failure leaves the old target and no staging files behind."""

from __future__ import annotations

import pytest

from dil_jax.atomic import staged_directory, write_atomic


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
