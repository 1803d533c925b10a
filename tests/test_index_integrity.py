"""Integrity of an open-domain index: file digests of its passage caches, retriever switches
that fail without breaking the index, and one-line errors for a full or read-only disk.

One tiny index (the sample passages, MiniLM, k = 0 and 1, 32-token windows: 10 windows) is
built once per module; each test works on its own copy (shutil.copytree keeps modification
times, as `cp -a` does).
"""

from __future__ import annotations

import collections
import errno
import hashlib
import json
import os
import shutil

import pytest

from dil_jax.samples import SAMPLE_PASSAGES

from conftest import run_cli

COMMON = ["--max-question-len", "16", "--batch-size", "2", "--chunk-size", "8"]
SETTINGS = ["--max-passage-len", "32", "--doc-stride", "16"]
QUESTION = "Who wrote Pride and Prejudice?"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(index folder, corpus source) of an index with caches for k = 0 and k = 1."""
    from dil_jax.cli import main

    root = tmp_path_factory.mktemp("integrity-index")
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"doc{i}", "title": f"T{i}", "text": text})
                              + "\n" for i, text in enumerate(SAMPLE_PASSAGES)))
    index = root / "index"
    assert main(["index", "--out", str(index), "--corpus", f"jsonl:{corpus}", "--k", "0", "1",
                 *SETTINGS, *COMMON]) == 0
    return index, f"jsonl:{corpus}"


@pytest.fixture
def index_copy(built, tmp_path):
    index, corpus = built
    copy = tmp_path / "index"
    shutil.copytree(index, copy)
    return copy, corpus


def _index_argv(index, corpus, *extra) -> list[str]:
    return ["index", "--out", str(index), "--corpus", corpus, *SETTINGS, *COMMON, *extra]


def _ask_argv(index, k: int, *extra) -> list[str]:
    return ["ask", QUESTION, "--index", str(index), "--k", str(k), "--top-p", "2", *COMMON,
            *extra]


def _cache(index, k: int):
    (folder,) = index.glob(f"cache-k{k}-*")
    return folder


def _digests(folder) -> dict[str, str]:
    """sha256 of every file under `folder` (to show a failed run changed nothing)."""
    return {str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(folder.rglob("*")) if path.is_file() and path.name != ".lock"}


def _one_line_error(err: str) -> str:
    """The CLI's error line; asserts it is one line and no traceback."""
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if ": error: " in line]
    assert len(lines) == 1, err
    return lines[0]


def test_free_space_is_told_in_mib_with_a_spare_in_proportion(tmp_path, monkeypatch):
    """An 11 MiB cache and 40 MiB free: it fits (the spare is 5% of the cache, at least 16
    MiB: 27 MiB in all); with 20 MiB free it does not, and the message says MiB, not
    '0.0 GiB'."""
    from dil_jax.open_domain import cache_build

    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(0, 0, 40 << 20))
    cache_build.check_free_space(tmp_path, 11 << 20, "the passage cache c")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(0, 0, 20 << 20))
    with pytest.raises(cache_build.DiskSpaceError,
                       match=r"the passage cache c needs 11\.0 MiB and .* has 20\.0 MiB free "
                             r"\(keeping 16\.0 MiB spare\)"):
        cache_build.check_free_space(tmp_path, 11 << 20, "the passage cache c")
    # 100 GiB of cache: 5 GiB spare, not a fixed 1 GiB.
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(0, 0, 104 << 30))
    with pytest.raises(cache_build.DiskSpaceError, match=r"keeping 5\.0 GiB spare"):
        cache_build.check_free_space(tmp_path, 100 << 30, "the passage cache c")


def test_a_disk_full_for_the_memory_maps_is_named_not_a_sigbus(built, tmp_path, capsys,
                                                               monkeypatch):
    """The states file is reserved on disk when created (posix_fallocate): a disk that cannot
    hold it fails there, naming it, instead of a SIGBUS when a memory-mapped row is written."""
    _, corpus = built
    calls = []

    def full(fd, offset, length):
        calls.append(length)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", full)
    index = tmp_path / "index"
    status, _, err = run_cli(_index_argv(index, corpus, "--k", "1"), capsys)
    assert status == 1
    line = _one_line_error(err)
    assert "states.npy: cannot reserve its" in line and "No space left on device" in line
    # 10 windows x 32 tokens x 384 float32 = 491,520 bytes, plus the .npy header.
    assert len(calls) == 1 and 491_520 < calls[0] < 491_520 + 4096
