"""Reliability of the open-domain index and its passage caches: edited, broken, concurrent,
stale or mismatched folders get a clear error (or are repaired), never wrong answers.

One tiny index (the sample passages, MiniLM, k = 0 and 1, 32-token windows) is built once per
module; each test works on its own copy.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tests.helpers import file_digests, run_cli
from tests.helpers.index import build_sample_index, cache_folder

# --checkpoint default: the raw embedded MiniLM (what these tests were written for), not the
# bundled fine-tuned readers that index/ask/odqa-eval read without --checkpoint.
COMMON = ["--checkpoint", "default", "--max-question-len", "16", "--batch-size", "2",
          "--chunk-size", "8"]
SETTINGS = ["--max-passage-len", "32", "--doc-stride", "16"]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(index folder, corpus source) of an index with caches for k = 0 and k = 1."""
    return build_sample_index(tmp_path_factory.mktemp("reliability-index"), *SETTINGS, *COMMON)


def _index_argv(index, corpus, *extra) -> list[str]:
    return ["index", "--out", str(index), "--corpus", corpus, *SETTINGS, *COMMON, *extra]


def _ask_argv(index, k: int) -> list[str]:
    return ["ask", "Who wrote Pride and Prejudice?", "--index", str(index), "--k", str(k),
            "--top-p", "2", *COMMON]


# ----------------------------------------------------------------------------- probe 1


def test_passages_edited_after_the_build_are_refused_then_repaired(index_copy, capsys):
    from dil_jax.open_domain.index.folder import open_index

    index, corpus = index_copy
    passages = index / "passages.jsonl"
    edited = passages.read_text().replace("Jane Austen", "Jane Austin")
    assert edited != passages.read_text()
    passages.write_text(edited)  # same line count, same passage count: only the text moved
    status, _, err = run_cli(_ask_argv(index, 1), capsys)
    assert status == 1
    assert "passages.jsonl" in err and "changed since the index was built" in err
    assert "dil-jax index" in err and "Traceback" not in err
    # Rerunning the build with the same settings repairs the files and keeps the caches.
    cache_files = file_digests(cache_folder(index, 1))
    status, _, _ = run_cli(_index_argv(index, corpus, "--k", "1"), capsys)
    assert status == 0
    assert "Jane Austen" in passages.read_text()
    assert open_index(index).passages and file_digests(cache_folder(index, 1)) == cache_files


# ----------------------------------------------------------------------------- probe 2

_HOLDER = textwrap.dedent("""
    import fcntl, json, os, socket, sys
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.ftruncate(fd, 0)
    os.write(fd, json.dumps(dict(pid=os.getpid(), host=socket.gethostname(),
                                 started="2026-01-02T03:04:05+00:00")).encode())
    print("locked", flush=True)
    sys.stdin.read()  # hold the lock until the test closes our stdin
""")


def test_a_second_build_fails_at_once_naming_the_first(index_copy, capsys):
    index, corpus = index_copy
    before = file_digests(index)
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(index / ".lock")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        status, _, err = run_cli(_index_argv(index, corpus, "--k", "0"), capsys)
    finally:
        holder.stdin.close()
        holder.wait(timeout=10)
    assert status == 1
    assert f"process {holder.pid} on " in err and "2026-01-02T03:04:05" in err
    assert "wait for it to finish, or use another --out" in err
    assert file_digests(index) == before


# ----------------------------------------------------------------------------- probe 3


def test_truncated_states_are_named_on_open_and_rebuilt_by_index(index_copy, capsys):
    from dil_jax.open_domain.cache.store import PassageCache

    index, corpus = index_copy
    states = cache_folder(index, 1) / "states" / "c" / "0" / "0"  # its one shard
    size = states.stat().st_size
    with states.open("r+b") as stream:
        stream.truncate(size // 2)
    status, _, err = run_cli(_ask_argv(index, 1), capsys)
    assert status == 1
    assert str(states) in err and "rerun `dil-jax index`" in err and "Traceback" not in err

    manifest = cache_folder(index, 0) / "manifest.json"
    manifest.write_text('{"format": "dil_jax.passage_cache/1", ')  # cut short
    status, _, err = run_cli(_ask_argv(index, 0), capsys)
    assert status == 1
    assert str(manifest) in err and "not readable JSON" in err and "dil-jax index" in err

    status, _, _ = run_cli(_index_argv(index, corpus, "--k", "0", "1"), capsys)
    assert status == 0
    assert states.stat().st_size == size
    assert json.loads(manifest.read_text())["num_lower_layers"] == 0
    assert PassageCache.open(cache_folder(index, 1)).read_states([0]).shape[0] == 1


# ----------------------------------------------------------------------------- probe 4


def test_a_cache_claiming_another_k_is_refused_by_its_states(index_copy, capsys):
    index, _ = index_copy
    k1 = cache_folder(index, 1)
    k2 = k1.with_name(k1.name.replace("cache-k1-", "cache-k2-"))
    k1.rename(k2)
    manifest = json.loads((k2 / "manifest.json").read_text())
    (k2 / "manifest.json").write_text(json.dumps({**manifest, "num_lower_layers": 2}))
    status, _, err = run_cli(_ask_argv(index, 2), capsys)
    assert status == 1
    assert str(k2) in err and "stored states do not match k=2" in err


def test_a_manifest_disagreeing_with_its_folder_name_is_broken(index_copy):
    from dil_jax.open_domain.cache.store import CacheBrokenError, PassageCache

    index, _ = index_copy
    path = cache_folder(index, 1) / "manifest.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "num_lower_layers": 3}))
    with pytest.raises(CacheBrokenError, match=r"it says k=3.*but the folder is cache-k1-"):
        PassageCache.open(path.parent)


# ----------------------------------------------------------------------------- probe 5


def test_staging_left_by_a_killed_build_is_cleaned_up(index_copy, capsys, caplog):
    index, corpus = index_copy
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stray = [index / f".bm25.tmp-{dead.pid}", index / ".passages.jsonl.tmp-123",
             index / ".cache-k3-deadbeef.partial", index.parent / f".index.tmp-{dead.pid}"]
    for path in stray:
        if path.name.endswith(".jsonl.tmp-123"):
            path.write_text("half a file")
        else:
            path.mkdir()
            (path / "junk.npy").write_bytes(b"x")
    alive = index.parent / f".index.tmp-{os.getpid()}"  # a live process's: not ours to remove
    alive.mkdir()
    # An unfinished cache build over these passages can be resumed: kept, and said so.
    resumable = index / ".cache-k3-0123abcd.partial"
    resumable.mkdir()
    plan = {"passages": json.loads((index / "index.json").read_text())["passages"],
            "num_passages": 9}
    (resumable / "plan.json").write_text(json.dumps(plan))
    (resumable / "progress.json").write_text(json.dumps({"done": 4}))
    with caplog.at_level(logging.INFO):
        status, _, _ = run_cli(_index_argv(index, corpus, "--k", "0"), capsys)
    assert status == 0
    assert not [path for path in stray if path.exists()]
    assert alive.exists() and resumable.exists()
    for path in stray:
        assert f"removed {path}" in caplog.text
    assert f"kept {resumable} (4 of 9 windows encoded): rerun with its reader" in caplog.text


# ----------------------------------------------------------------------------- probe 6


def test_a_rerun_with_other_settings_is_refused_naming_each(index_copy, tmp_path, capsys):
    index, corpus = index_copy
    before = file_digests(index)
    status, _, err = run_cli(["index", "--out", str(index), "--corpus", corpus, "--k", "0",
                              "--max-passage-len", "48", "--doc-stride", "16", "--split",
                              "windows", *COMMON], capsys)
    assert status == 1
    assert "--max-passage-len: index has 32, this run 48" in err
    assert "--split: index has 'paragraphs', this run 'windows'" in err
    assert "another --out" in err and f"delete {index}" in err
    assert "--doc-stride" not in err
    # Another corpus under the same settings.
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"id": "x", "title": "X", "text": "A different document " * 5})
                     + "\n")
    status, _, err = run_cli(_index_argv(index, f"jsonl:{other}", "--k", "0"), capsys)
    assert status == 1
    assert "--corpus: index has 6 passages" in err and "this run 1 passages" in err
    assert file_digests(index) == before
    # The same settings with a new --k: the index is reused and that k's cache added.
    status, out, _ = run_cli(_index_argv(index, corpus, "--k", "2"), capsys)
    assert status == 0 and "reused" in out
    assert cache_folder(index, 2).is_dir()
    assert {name: digest for name, digest in file_digests(index).items()
            if not name.startswith("cache-k2-")} == before


def test_an_index_is_never_written_into_a_foreign_folder(tmp_path, built, capsys):
    _, corpus = built
    folder = tmp_path / "my-documents"
    folder.mkdir()
    (folder / "notes.txt").write_text("precious")
    status, _, err = run_cli(_index_argv(folder, corpus, "--k", "0"), capsys)
    assert status == 1
    assert str(folder) in err and "is not an index folder" in err and "notes.txt" in err
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt"]
    assert (folder / "notes.txt").read_text() == "precious"


# ----------------------------------------------------------------------------- probe 7


def test_reachable_errors_are_dil_jax_errors(index_copy, tmp_path):
    from dil_jax.errors import DilJaxError
    from dil_jax.open_domain.cache.check import reader_cache_key
    from dil_jax.open_domain.cache.storage import Storage
    from dil_jax.open_domain.index.corpus import (
        Document,
        read_jsonl,
        read_squad_paragraphs,
        split_documents,
        split_windows,
    )
    from dil_jax.open_domain.index.folder import open_index
    from dil_jax.open_domain.retrieval.engines import RankBM25Retriever

    index, _ = index_copy
    latin1 = tmp_path / "latin1.jsonl"
    latin1.write_bytes('{"id": "a", "text": "caf\u00e9"}\n'.encode("latin-1"))
    with pytest.raises(DilJaxError, match=r"latin1.jsonl: cannot be read as UTF-8"):
        read_jsonl(latin1)
    with pytest.raises(DilJaxError, match=f"{tmp_path}: cannot be read"):
        read_squad_paragraphs(tmp_path)  # a folder, e.g. `--corpus squad:` with no path
    with pytest.raises(DilJaxError, match="unknown split strategy 'lines'"):
        split_documents([Document("d", "t", "text")], "lines")
    with pytest.raises(DilJaxError, match="must be positive"):
        split_windows("a b c", 0, 1)
    with pytest.raises(DilJaxError, match="float16"):
        reader_cache_key(None, "model", "tok", 32, "p", Storage.parse("float16"))
    (index / "bm25" / "weights.npz").write_bytes(b"not a zip")
    with pytest.raises(DilJaxError, match="weights.npz"):
        RankBM25Retriever.load(index / "bm25")
    (index / "index.json").write_text("{")
    with pytest.raises(DilJaxError, match=r"index.json: not readable JSON.*dil-jax index"):
        open_index(index)
    (index / "index.json").unlink()
    (index / "windows.npz").write_bytes(np.zeros(3).tobytes())
    with pytest.raises(DilJaxError, match="no index.json"):
        open_index(index)
