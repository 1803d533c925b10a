"""A passage cache built by several processes (`dil-jax index --num-processes N`, issue 18).

The multi-process tests run real `dil-jax index` processes on this machine (2 processes x 2 forced
CPU devices, jax.distributed with a local coordinator, as tests/train/test_train_multiprocess.py
does) over the sample passages (10 windows of 32 tokens, chunks of 3: shards of rows 0-5 and 6-9),
and compare with one in-process build:
  - every array of the shards, concatenated, equals the one-process cache byte for byte;
  - a process killed after its first chunk resumes its shard only (the other shard's files, and
    its own shard files written before the kill, keep their inode and mtime) and the result is
    again byte-identical;
  - the open-domain reader answers with identical candidates and scores from either cache.
"""

from __future__ import annotations

import itertools
import json
import shutil
import sys

import numpy as np
import pytest

from dil_jax.open_domain.cache.row_arrays import RowArray
from dil_jax.open_domain.cache.shards import shard_ranges
from dil_jax.samples import SAMPLE_PASSAGES

from tests.helpers import REPO, free_port, run_all, run_cli, subprocess_env
from tests.helpers.index import array_names, assert_same_arrays, shard_dirs, zarr_array

# --checkpoint default: the raw embedded MiniLM (what these tests were written for), not the
# bundled fine-tuned readers that index/ask/odqa-eval read without --checkpoint.
BUILD = ["--checkpoint", "default", "--k", "1", "--max-passage-len", "32", "--doc-stride", "16",
         "--max-question-len", "16", "--cache-chunk", "3"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("sharded-corpus") / "corpus.jsonl"
    path.write_text("".join(json.dumps({"id": f"doc{i}", "title": f"T{i}", "text": text}) + "\n"
                            for i, text in enumerate(SAMPLE_PASSAGES)))
    return f"jsonl:{path}"


def _index_argv(out, corpus: str, *extra: str) -> list[str]:
    return ["index", "--out", str(out), "--corpus", corpus, *BUILD, *extra]


# `dil-jax index` whose build exits at once (as a killed process would: no cleanup) after the
# first chunk of a passage cache is encoded: the callback is handed to the command's run. Its
# arrays are cut in shards of 16 tokens (8-byte rows: offsets, pca8 codes), so that some of
# that chunk's are written (a shard is written once complete) before it exits.
KILLED_AFTER_FIRST_CHUNK = """
import os, sys
import dil_jax.commands.index as index_command
from dil_jax import cli
from dil_jax.open_domain.cache import zarr_store

zarr_store.CHUNK_BYTES = zarr_store.SHARD_BYTES = 128

def exit_after_first_chunk(step):
    if step.stage.startswith("passage cache") and 0 < step.done < (step.total or 0):
        print(f"exiting after {step.done} windows", file=sys.stderr, flush=True)
        os._exit(75)

run_index = index_command.run_index
index_command.run_index = lambda args: run_index(args, on_step=exit_after_first_chunk)
sys.exit(cli.main(sys.argv[1:]))
"""


def _run_processes(argvs: list[list[str]], killed: tuple[bool, ...] | None = None
                   ) -> list[tuple[int, str]]:
    """`python -m dil_jax ARGV` for each argv at once (where `killed` says so, the index run
    that exits after its first chunk) -> [(exit status, output)]."""
    env = subprocess_env(PYTHONPATH=str(REPO))
    killed = killed or (False,) * len(argvs)
    return run_all([[sys.executable, *(["-c", KILLED_AFTER_FIRST_CHUNK] if kill else
                                       ["-m", "dil_jax"]), *argv]
                    for argv, kill in zip(argvs, killed, strict=True)], [env] * len(argvs))


def _two_processes(out, corpus: str, *extra: str, killed=None, coordinator: bool = True,
                   per_process: tuple[list[str], list[str]] = ([], [])):
    """Two processes x 2 CPU devices building `out` -> [(status, output)] of each."""
    port = free_port("localhost")
    argvs = []
    for pid in (0, 1):
        argv = _index_argv(out, corpus, *extra, "--num-processes", "2", "--process-id",
                           str(pid), "--num-cpu-devices", "2", *per_process[pid])
        if coordinator:
            argv += ["--coordinator-address", f"localhost:{port}"]
        argvs.append(argv)
    return _run_processes(argvs, killed)


def _cache_dir(index):
    (folder,) = index.glob("cache-k1-*")
    return folder


@pytest.fixture(scope="module")
def one_process(corpus, tmp_path_factory) -> dict[str, object]:
    """Unsharded indexes built in this process: float32 with the reuse arrays, and pca8."""
    from dil_jax.cli import main

    root = tmp_path_factory.mktemp("one-process")
    built = {}
    for name, extra in (("reuse", ["--cache-reuse"]), ("pca", ["--cache-dtype", "pca8"])):
        assert main(_index_argv(root / name, corpus, *extra)) == 0
        built[name] = root / name
    return built


@pytest.fixture(scope="module")
def two_processes(corpus, tmp_path_factory):
    """The float32 + reuse index built by 2 coordinated processes x 2 devices."""
    index = tmp_path_factory.mktemp("two-processes") / "index"
    results = _two_processes(index, corpus, "--cache-reuse")
    for pid, (status, log) in enumerate(results):
        assert status == 0, f"process {pid} failed:\n{log[-4000:]}"
    assert "process 1 of 2: shard 1 of each cache on 2 local device(s) (cpu)" in results[1][1]
    return index


def test_two_processes_equal_one_byte_for_byte(two_processes, one_process, tmp_path):
    sharded, single = _cache_dir(two_processes), _cache_dir(one_process["reuse"])
    manifest = json.loads((sharded / "manifest.json").read_text())
    assert manifest["format"] == "dil_jax.passage_cache/3" and manifest["reuse"]
    assert [(s["start"], s["stop"]) for s in manifest["shards"]] == [(0, 6), (6, 10)]
    assert [p.name for p in shard_dirs(sharded)] == ["shard-00000-of-00002",
                                                      "shard-00001-of-00002"]
    assert_same_arrays(sharded, single)
    # Nothing but the caches' files and manifest: no staging or progress left behind.
    assert not list(two_processes.glob(".cache-*")) and not list(sharded.rglob("*progress*"))
    # The comparison can fail: one changed state in one shard is caught.
    import tensorstore as ts

    copy = tmp_path / "copy"
    shutil.copytree(sharded, copy)
    states = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": str(
        copy / "shards" / "shard-00001-of-00002" / "states") + "/"}}).result()
    last = states[states.shape[0] - 1:, :1]
    last.write(last.read().result() + 1).result()
    with pytest.raises(AssertionError, match="states differs"):
        assert_same_arrays(copy, single)


def test_reader_reads_a_sharded_cache_as_the_unsharded_one(two_processes, one_process):
    from dil_jax.open_domain.index.folder import open_index
    from dil_jax.open_domain.reader import OpenDomainReader
    from dil_jax.readers import load_reader

    loaded = load_reader("default", 1, 16)
    questions = ["Who wrote Pride and Prejudice?", "What is the capital of France?"]
    answers = {}
    for name, folder in (("sharded", two_processes), ("single", one_process["reuse"])):
        index = open_index(folder)
        cache = index.open_cache(loaded)  # check_states: 1st/last shard
        assert len(cache.shards) == (2 if name == "sharded" else 1) and cache.has_reuse
        reader = OpenDomainReader(index, loaded, cache, top_p=3, batch_size=2, chunk_size=8)
        assert reader.reads_cached_reuse  # the first-upper-block arrays come from the shards
        answers[name] = reader.read(questions).candidates
    assert answers["sharded"] == answers["single"]
    assert all(answers["single"])


def test_a_killed_process_resumes_its_shard_only(corpus, one_process, tmp_path):
    index = tmp_path / "index"
    # Independent processes (no coordinator: a killed peer must not take the other down).
    # Process 1 exits abruptly after its first chunk (3 of its 4 windows); process 0 finishes
    # shard 0, then gives up waiting for shard 1 after 1 s.
    results = _two_processes(index, corpus, "--cache-dtype", "pca8", coordinator=False,
                             killed=(False, True),
                             per_process=(["--wait-timeout", "1"], []))
    (status0, log0), (status1, log1) = results
    assert status1 == 75, log1[-4000:]
    assert status0 == 1 and "waited 1 s for shard(s) shards/shard-00001-of-00002" in log0, \
        log0[-4000:]
    (staging,) = index.glob(".cache-k1-*.partial")
    done = staging / "shards" / "shard-00000-of-00002"
    assert (done / "manifest.json").is_file()
    partial = staging / "shards" / ".shard-00001-of-00002.partial"
    progress = json.loads((partial / "progress.json").read_text())
    # By hand: the shards of 16 tokens the first chunk (3 windows) filled are written; the
    # rerun encodes again from the chunk of the first window not all written.
    starts = zarr_array(partial / "token_starts")
    tokens = starts[3] // 16 * 16
    first = int(np.argmax(starts[1:] > tokens))
    assert progress == {"done": first // 3 * 3, "tokens": tokens} and tokens > 0
    written = sorted((partial / "states" / "c").iterdir())
    assert len(written) == tokens // 16

    def stamps(folder) -> dict:
        return {path.relative_to(folder).as_posix(): (path.stat().st_ino,
                                                      path.stat().st_mtime_ns)
                for path in folder.rglob("*") if path.is_file()}

    before = stamps(done)
    before_written = {path.name: stamps(path) for path in written}

    results = _two_processes(index, corpus, "--cache-dtype", "pca8")
    for pid, (status, log) in enumerate(results):
        assert status == 0, f"process {pid} failed:\n{log[-4000:]}"
    # clean_stale kept the sharded build: shard 0's 6 windows and shard 1's done ones.
    assert f"({6 + progress['done']} of 10 windows encoded)" in results[0][1]
    assert (f"resuming at window {progress['done']} of 4 ({progress['tokens']} of "
            in results[1][1])
    assert "resuming" not in results[0][1]
    cache = _cache_dir(index)
    shard0 = cache / "shards" / "shard-00000-of-00002"
    assert stamps(shard0) == before
    shard1 = cache / "shards" / "shard-00001-of-00002" / "states" / "c"
    assert {name: stamps(shard1 / name) for name in before_written} == before_written
    assert_same_arrays(cache, _cache_dir(one_process["pca"]))


def test_two_processes_build_the_pq_cache_of_one(corpus, tmp_path):
    """pq8: process 0 fits the rotation and codebook once, every shard stores them, and the
    shards equal a one-process build byte for byte."""
    pytest.importorskip("faiss")
    from dil_jax.cli import main

    assert main(_index_argv(tmp_path / "one", corpus, "--cache-dtype", "pq8")) == 0
    results = _two_processes(tmp_path / "two", corpus, "--cache-dtype", "pq8")
    for pid, (status, log) in enumerate(results):
        assert status == 0, f"process {pid} failed:\n{log[-4000:]}"
    single = _cache_dir(tmp_path / "one")
    assert "states.pq_codebook" in array_names(single)
    assert_same_arrays(_cache_dir(tmp_path / "two"), single)


def test_shard_ranges_cut_whole_chunks():
    assert shard_ranges(10, 3, 2) == [(0, 6), (6, 10)]
    assert shard_ranges(10, 3, 1) == [(0, 10)]
    # More shards than chunks: some are empty; every start is on the chunk grid.
    assert shard_ranges(4, 3, 3) == [(0, 0), (0, 3), (3, 4)]
    for rows, chunk, count in ((1000, 7, 5), (17, 4, 8)):
        ranges = shard_ranges(rows, chunk, count)
        assert ranges[0][0] == 0 and ranges[-1][1] == rows
        assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
        assert all(start % chunk == 0 for start, stop in ranges if start < stop)


def test_row_array_reads_global_rows_across_shards():
    full = np.arange(7 * 3 * 2).reshape(7, 3, 2)
    parts, starts = [full[:2], full[2:2], full[2:]], np.array([0, 2, 2])  # one empty shard
    rows = RowArray(parts, starts)
    assert rows.shape == full.shape and len(rows) == 7
    np.testing.assert_array_equal(rows[[6, 0, 3, 1]], full[[6, 0, 3, 1]])
    np.testing.assert_array_equal(rows[np.array([5, 2]), 1], full[[5, 2], 1])
    np.testing.assert_array_equal(rows[2:5], full[2:5])
    assert rows[4, 2, 1] == full[4, 2, 1] and rows[-1, 0, 0] == full[-1, 0, 0]
    np.testing.assert_array_equal(np.asarray(rows), full)
    with pytest.raises(IndexError):
        rows[[7]]


@pytest.mark.parametrize("flags, message", [
    (["--process-id", "1"], "--num-processes and --process-id go together"),
    (["--num-processes", "2", "--process-id", "2"], "--process-id 2: must be below "
                                                    "--num-processes 2"),
    (["--num-processes", "2", "--process-id", "0", "--coordinator-address", "nohost"],
     "--coordinator-address 'nohost': expected HOST:PORT"),
    (["--coordinator-address", "localhost:1234"], "give --num-processes and --process-id"),
    (["--distributed", "--num-processes", "2", "--process-id", "0"],
     "--distributed finds the process count and id itself"),
])
def test_bad_process_flags_are_refused(flags, message, tmp_path, capsys):
    status, _, err = run_cli(_index_argv(tmp_path / "index", "jsonl:x.jsonl", *flags), capsys)
    assert status != 0 and message in err
    assert not (tmp_path / "index").exists()
