"""A passage cache built in a store by several processes that share no folder
(`dil-jax index --cache-store URL`, `dil_jax.open_domain.cache.store_build`; issue 60, item 4).

The store is a file:// URL: a directory these tests treat as the remote (each process's
working folder is its own temp folder). Expected values come from an independent reference:
the one-process local build (`build_passage_cache`, the code that predates the store) and, for
float32 states, the encoder's own output packed by numpy here.

  - in-process: 2 or 3 "processes" (threads that meet only through the store) give the
    one-process cache byte for byte (float32 and int8: codes and scales); a process that dies
    mid-shard (process 1, or process 0) leaves no visible cache, and a rerun redoes only the
    missing part (finished shards and already written zarr shards keep their files);
  - real `dil-jax index` processes: 2 x 2 CPU devices (jax.distributed, local coordinator),
    each in its own folder (its copy of the corpus, its --out), equal a one-process build, and
    `ask` and `index --verify` read the store; one process SIGKILLed after its first chunk,
    both rerun, gives the same cache again.
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from dil_jax.open_domain.cache.build import build_passage_cache
from dil_jax.open_domain.cache.location import Location
from dil_jax.open_domain.cache.manifest import CacheKey
from dil_jax.open_domain.cache.ragged import pack
from dil_jax.open_domain.cache.storage import Storage
from dil_jax.open_domain.cache.store import (
    CacheBrokenError,
    CacheMismatchError,
    PassageCache,
    ShardWaitError,
)
from dil_jax.open_domain.cache.store_build import build_store_cache, store_url
from dil_jax.open_domain.cache.zarr_store import TokenGrid
from dil_jax.samples import SAMPLE_PASSAGES

from tests.helpers import REPO, free_port, run_all, run_cli, subprocess_env
from tests.helpers.index import assert_same_arrays, zarr_array

ROWS, P_LEN, HIDDEN, PAD, CHUNK = 37, 12, 6, 5, 5
# Shards of 16 tokens: a chunk of 5 windows (~33 tokens) completes some before it ends.
GRID = TokenGrid(4, 16)


def _windows():
    """ids, mask [ROWS, P_LEN] int32, offsets [ROWS, P_LEN, 2]: rows of 1..P_LEN real tokens,
    padded as window_contexts pads (PAD ids, -1 offsets)."""
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, P_LEN + 1, ROWS)
    real = np.arange(P_LEN)[None, :] < lengths[:, None]
    ids = np.where(real, rng.integers(100, 999, (ROWS, P_LEN)), PAD).astype(np.int32)
    offsets = np.where(real[..., None], rng.integers(0, 500, (ROWS, P_LEN, 2)), -1)
    return ids, real.astype(np.int32), offsets.astype(np.int32)


def _states(windows) -> np.ndarray:
    """A stand-in encoder: [n, P_LEN, HIDDEN] float32 from each token's id, position and global
    row (so a shard encoding the wrong rows would differ)."""
    ids = windows.ids.astype(np.float32)[..., None]
    width = np.arange(1, HIDDEN + 1, dtype=np.float32)
    rows = np.asarray(windows.rows, np.float32)[:, None, None]
    return np.sin(ids * 0.01 * width + np.arange(P_LEN, dtype=np.float32)[None, :, None]
                  + 0.1 * rows)


class _Dies(Exception):
    """What the encoder of a process that dies mid-build raises (nothing catches it on the
    way: the store is left as a killed process leaves it)."""


class _Encoder:
    """_states, counting its calls; raises _Dies at call number `dies_at` (1-based)."""

    def __init__(self, dies_at: int | None = None):
        self.calls, self.dies_at = 0, dies_at

    def __call__(self, windows) -> np.ndarray:
        self.calls += 1
        if self.calls == self.dies_at:
            raise _Dies(f"died at call {self.calls}")
        return _states(windows)


def _key(storage: str) -> CacheKey:
    return CacheKey(model="m", architecture="bert", num_lower_layers=1, hidden_size=HIDDEN,
                    tokenizer="t", max_passage_len=P_LEN, storage=Storage.parse(storage),
                    passages="p")


def _processes(url: str, storage: str, encoders: list[_Encoder], count: int | None = None,
               timeout_s: float = 60.0, only: tuple[int, ...] | None = None,
               ids_of: dict[int, np.ndarray] | None = None) -> list[object]:
    """Processes 0 .. count - 1 (`only` those) of a store build, each in its own thread, at
    once -> what each returned or raised. ids_of: a process's own token ids (as a host that
    tokenized otherwise has), instead of `_windows`'s."""
    ids, mask, offsets = _windows()
    count = count or len(encoders)
    only = tuple(range(count)) if only is None else only
    results: list[object] = [None] * count

    def run(number: int) -> None:
        try:
            results[number] = build_store_cache(
                Location.of(url) / "cache-k1-m", _key(storage),
                (ids_of or {}).get(number, ids), mask, offsets,
                encoders[number], process_index=number, process_count=count,
                chunk_passages=CHUNK, wait_timeout_s=timeout_s, pad_id=PAD, grid=GRID)
        except Exception as error:  # handed to the test as the outcome
            results[number] = error

    threads = [threading.Thread(target=run, args=(number,)) for number in only]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


@pytest.fixture(scope="module")
def local(tmp_path_factory) -> dict[str, Path]:
    """The one-process local caches (the reference), float32 and int8."""
    root = tmp_path_factory.mktemp("local")
    ids, mask, offsets = _windows()
    for storage in ("float32", "int8"):
        build_passage_cache(root / storage, _key(storage), ids, mask, offsets, _states,
                            chunk_passages=CHUNK, pad_id=PAD, grid=GRID)
    return {storage: root / storage for storage in ("float32", "int8")}


def _stamps(folder: Path) -> dict[str, tuple[int, int]]:
    """(inode, mtime) of every file under `folder`: a rewritten file changes both."""
    return {path.relative_to(folder).as_posix(): (path.stat().st_ino, path.stat().st_mtime_ns)
            for path in folder.rglob("*") if path.is_file()}


# 10 processes over 8 chunks of 5 windows: shards 0 and 5 are empty (`shard_ranges`).
@pytest.mark.parametrize("storage, count", [("float32", 1), ("float32", 2), ("int8", 3),
                                            ("int8", 10)])
def test_processes_sharing_only_the_store_equal_one_process(local, tmp_path, storage, count):
    store = tmp_path / "store"
    results = _processes(f"file://{store}", storage, [_Encoder() for _ in range(count)])
    assert all(isinstance(result, PassageCache) for result in results), results
    cache_dir = store / "cache-k1-m"
    manifest = json.loads((cache_dir / "manifest.json").read_text())
    assert len(manifest["shards"]) == count and "files" in manifest
    assert_same_arrays(cache_dir, local[storage])
    # Nothing left of the build: no plan or progress record anywhere in the store.
    assert not [p for p in store.rglob("*") if p.name in ("plan.json", "progress.json")]
    ids, mask, offsets = _windows()
    opened = PassageCache.open(f"file://{cache_dir}", _key(storage))
    rows = [36, 0, 20, 19, 5]
    np.testing.assert_array_equal(opened.ids[rows], ids[rows])
    np.testing.assert_array_equal(opened.offsets[rows], offsets[rows])
    if storage == "float32":  # against the encoder's own output, packed by numpy here
        lengths = mask.sum(axis=1)
        expected = pack(_states(type("W", (), {"ids": ids, "rows": np.arange(ROWS)})),
                        lengths)
        joined = np.concatenate([zarr_array(shard / "states")
                                 for shard in sorted((cache_dir / "shards").iterdir())])
        assert joined.tobytes() == expected.tobytes()


def test_a_process_killed_mid_shard_resumes_only_what_is_missing(local, tmp_path):
    store = tmp_path / "store"
    url, cache_dir = f"file://{store}", store / "cache-k1-m"
    # Process 1 dies encoding its second chunk; process 0 finishes shard 0, then gives up.
    results = _processes(url, "int8", [_Encoder(), _Encoder(dies_at=2)], timeout_s=2)
    assert isinstance(results[1], _Dies)
    assert isinstance(results[0], ShardWaitError)
    assert "shard(s) shards/shard-00001-of-00002" in str(results[0])
    with pytest.raises(CacheMismatchError, match="no passage cache here"):
        PassageCache.open(f"file://{cache_dir}", _key("int8"))  # invisible until joined
    shard0 = cache_dir / "shards" / "shard-00000-of-00002"
    shard1 = cache_dir / "shards" / "shard-00001-of-00002"
    assert (shard0 / "manifest.json").is_file() and not (shard1 / "manifest.json").exists()
    # By hand: shard 1 holds rows 20..36; its first chunk (rows 20..24) filled the whole
    # zarr shards of 16 tokens below its last token, and those were written.
    _, mask, _ = _windows()
    first_chunk = int(mask[20:25].sum())
    written = first_chunk // 16 * 16
    assert written > 0
    progress = json.loads((shard1 / "progress.json").read_text())
    assert progress == {"done": 0, "tokens": written}
    states_written = sorted((shard1 / "states" / "c").iterdir())
    assert len(states_written) == written // 16
    before0, before1 = _stamps(shard0), {p.name: _stamps(p) for p in states_written}

    encoders = [_Encoder(), _Encoder()]
    results = _processes(url, "int8", encoders)
    assert all(isinstance(result, PassageCache) for result in results), results
    assert encoders[0].calls == 0  # shard 0 reopened, not encoded again
    assert encoders[1].calls == 4  # shard 1's 17 rows from its first chunk: 4 chunks of 5
    assert _stamps(shard0) == before0
    assert {p.name: _stamps(p) for p in states_written} == before1
    assert_same_arrays(cache_dir, local["int8"])


def test_process_0_killed_then_rerun_alone_joins_the_shards(local, tmp_path):
    store = tmp_path / "store"
    url, cache_dir = f"file://{store}", store / "cache-k1-m"
    # Process 0 dies on its first chunk, after planning; process 1 finishes shard 1 and gives
    # up waiting for the join.
    results = _processes(url, "float32", [_Encoder(dies_at=1), _Encoder()], timeout_s=2)
    assert isinstance(results[0], _Dies)
    assert isinstance(results[1], ShardWaitError) and "process 0 to join" in str(results[1])
    shard1 = cache_dir / "shards" / "shard-00001-of-00002"
    before = _stamps(shard1)
    assert (shard1 / "manifest.json").is_file() and (cache_dir / "plan.json").is_file()
    results = _processes(url, "float32", [_Encoder(), None], count=2, only=(0,))
    assert isinstance(results[0], PassageCache), results
    assert _stamps(shard1) == before
    assert not (cache_dir / "plan.json").exists()
    assert_same_arrays(cache_dir, local["float32"])


def test_a_damaged_shard_is_rebuilt_the_others_kept(local, tmp_path):
    store = tmp_path / "store"
    url, cache_dir = f"file://{store}", store / "cache-k1-m"
    _processes(url, "int8", [_Encoder(), _Encoder()])
    shard0 = cache_dir / "shards" / "shard-00000-of-00002"
    shard1 = cache_dir / "shards" / "shard-00001-of-00002"
    # The join undone (as if process 0 died before it) and one of shard 1's objects cut.
    (cache_dir / "manifest.json").unlink()
    (cache_dir / "plan.json").write_text(json.dumps(_plan_of()))
    states = shard1 / "states" / "c" / "0" / "0"  # [tokens, width]: one file per zarr shard
    states.write_bytes(states.read_bytes()[:-3])
    before = _stamps(shard0)
    encoders = [_Encoder(), _Encoder()]
    results = _processes(url, "int8", encoders)
    assert all(isinstance(result, PassageCache) for result in results), results
    assert encoders[0].calls == 0 and encoders[1].calls == 4
    assert _stamps(shard0) == before
    assert_same_arrays(cache_dir, local["int8"])


def test_a_host_that_tokenized_otherwise_is_named_not_joined(tmp_path):
    store = tmp_path / "store"
    ids, mask, _ = _windows()
    other = np.where(mask == 1, ids + 1, ids)  # same lengths and padding, other tokens
    results = _processes(f"file://{store}", "float32", [_Encoder(), _Encoder()], timeout_s=2,
                         ids_of={1: other})
    assert isinstance(results[0], CacheBrokenError), results
    shard1 = f"file://{store}/cache-k1-m/shards/shard-00001-of-00002"
    assert str(results[0]).startswith(f"{shard1}: window 20's token ids differ from process "
                                      "0's: process 1 split or tokenized the corpus otherwise")
    assert f"delete {shard1} (every object under it) and rerun process 1" in str(results[0])
    assert isinstance(results[1], ShardWaitError)  # it waited for a join that never came
    assert not (store / "cache-k1-m" / "manifest.json").exists()


def _plan_of() -> dict:
    """The plan process 0 writes for these tests' int8 build of 2 processes."""
    from dil_jax.open_domain.cache.shards import sharded_manifest

    return sharded_manifest(_key("int8"), ROWS, CHUNK, 2, None).to_json()


def test_store_urls(tmp_path):
    assert store_url("gs://bucket/index/") == "gs://bucket/index"
    assert store_url("s3://bucket/index") == "s3://bucket/index"
    assert store_url(str(tmp_path / "s")) == f"file://{tmp_path / 's'}"
    with pytest.raises(ValueError, match="'http://host/x': a cache store is a gs://, s3://, "
                                         "file:// URL or a local path"):
        store_url("http://host/x")
    with pytest.raises(ValueError, match="'file://runs/x': a file:// store needs an absolute "
                                         "path"):
        store_url("file://runs/x")


def test_location_writes_lists_and_empties_a_url_folder(tmp_path):
    where = Location.of(f"file://{tmp_path / 'store'}") / "cache"
    assert where.names() == []
    where.write_bytes("a/b.json", b"{}")
    where.write_bytes("c", b"x")
    assert where.names() == ["a/b.json", "c"] and where.read_bytes("c") == b"x"
    where.delete("c")
    assert where.names() == ["a/b.json"] and where.read_bytes("c") is None
    (Location.of(f"file://{tmp_path / 'store'}") / "other").write_bytes("kept", b"1")
    where.delete_all()
    assert where.names() == []
    assert (tmp_path / "store" / "other" / "kept").read_bytes() == b"1"


def test_a_store_that_cannot_be_written_is_named(tmp_path):
    from dil_jax.errors import OutputPathError

    (tmp_path / "blocker").write_text("a file where the store's folder would be")
    (result,) = _processes(f"file://{tmp_path / 'blocker'}/store", "int8", [_Encoder()])
    assert isinstance(result, OutputPathError), result
    assert str(result).startswith(f"file://{tmp_path / 'blocker'}/store/cache-k1-m: cannot "
                                  "write it (")
    assert "check the store's URL (--cache-store)" in str(result)


# ------------------------------------------------------------------ real `dil-jax index` processes

BUILD = ["--checkpoint", "default", "--k", "1", "--max-passage-len", "32", "--doc-stride", "16",
         "--max-question-len", "16", "--cache-chunk", "3"]

# `dil-jax index` that SIGKILLs itself (no cleanup, no flush: kill -9) once the first chunk
# of its passage cache shard is written. Arrays are cut in zarr shards of 16 tokens, so that
# some of that chunk's are in the store before it dies.
KILLED_AFTER_FIRST_CHUNK = """
import os, signal, sys
import dil_jax.commands.index as index_command
from dil_jax import cli
from dil_jax.open_domain.cache import zarr_store

zarr_store.CHUNK_BYTES = zarr_store.SHARD_BYTES = 128

def die_after_first_chunk(step):
    if step.stage.startswith("passage cache") and 0 < step.done < (step.total or 0):
        print(f"killed after {step.done} windows", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

run_index = index_command.run_index
index_command.run_index = lambda args: run_index(args, on_step=die_after_first_chunk)
sys.exit(cli.main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("store-corpus") / "corpus.jsonl"
    path.write_text("".join(json.dumps({"id": f"doc{i}", "title": f"T{i}", "text": text}) + "\n"
                            for i, text in enumerate(SAMPLE_PASSAGES)))
    return f"jsonl:{path}"


@pytest.fixture(scope="module")
def one_process(corpus, tmp_path_factory) -> dict[str, Path]:
    """Local one-process indexes (their caches in --out), float32 and int8."""
    from dil_jax.cli import main

    root = tmp_path_factory.mktemp("one-process")
    for storage in ("float32", "int8"):
        assert main(["index", "--out", str(root / storage), "--corpus", corpus, *BUILD,
                     "--cache-dtype", storage]) == 0
    return {storage: root / storage for storage in ("float32", "int8")}


def _store_processes(root: Path, store: str, corpus: str, *extra: str,
                     killed: tuple[bool, bool] = (False, False), coordinator: bool = True,
                     per_process: tuple[list[str], list[str]] = ([], [])):
    """Two `dil-jax index` processes, each with its own folder root/host-I (its copy of the
    corpus, its --out: nothing shared by path but the store), the caches in `store` ->
    [(status, output)]."""
    port = free_port("localhost")
    argvs = []
    for pid in (0, 1):
        host = root / f"host-{pid}"
        host.mkdir(exist_ok=True)
        copy = host / "corpus.jsonl"
        copy.write_bytes(Path(corpus.removeprefix("jsonl:")).read_bytes())
        argv = ["index", "--out", str(host / "out"), "--corpus", f"jsonl:{copy}", *BUILD,
                "--cache-store", store, *extra, "--num-processes", "2", "--process-id",
                str(pid), *per_process[pid]]
        if coordinator:
            argv += ["--coordinator-address", f"localhost:{port}", "--num-cpu-devices", "2"]
        argvs.append([sys.executable, *(["-c", KILLED_AFTER_FIRST_CHUNK] if killed[pid]
                                        else ["-m", "dil_jax"]), *argv])
    env = subprocess_env(PYTHONPATH=str(REPO))
    return run_all(argvs, [env, env])


def _cache_in(folder: Path) -> Path:
    (cache,) = folder.glob("cache-k1-*")
    return cache


def test_two_hosts_without_a_shared_folder_equal_one_process(corpus, one_process, tmp_path,
                                                             capsys):
    from dil_jax.open_domain.index.folder import open_index
    from dil_jax.readers import load_reader

    store = tmp_path / "store"
    results = _store_processes(tmp_path, f"file://{store}", corpus)
    for pid, (status, log) in enumerate(results):
        assert status == 0, f"process {pid} failed:\n{log[-4000:]}"
    assert "process 1 of 2: shard 1 of each cache on 2 local device(s) (cpu)" in results[1][1]
    cache = _cache_in(store)
    assert [p.name for p in sorted((cache / "shards").iterdir())] == [
        "shard-00000-of-00002", "shard-00001-of-00002"]
    # Without --cache-dtype: int8 (the default), as the one-process int8 build, byte for byte.
    assert_same_arrays(cache, _cache_in(one_process["int8"]))
    # Each --out holds its own index and the store's URL, no cache folder of its own.
    for pid in (0, 1):
        out = tmp_path / f"host-{pid}" / "out"
        assert not list(out.glob("cache-k*")) and not list(out.glob(".cache-k*"))
        assert json.loads((out / "cache-store.json").read_text()) == {"url": f"file://{store}"}
    # The index opens its cache from the store (two re-encoded rows checked), rows as built.
    loaded = load_reader("default", 1, 16)
    from_store = open_index(tmp_path / "host-0" / "out").open_cache(loaded)
    assert str(from_store.location) == f"file://{cache}"
    single = open_index(one_process["int8"]).open_cache(loaded)
    rows = list(range(len(single)))
    assert from_store.read_states(rows).tobytes() == single.read_states(rows).tobytes()
    # `ask` over process 0's index answers from the store; a storage the store's cache was not
    # built with is named as such (not taken for a missing cache).
    ask = ["--index", str(tmp_path / "host-0" / "out"), "--k", "1", "--checkpoint", "default",
           "--max-question-len", "16", "--batch-size", "2", "--chunk-size", "8"]
    status, out, err = run_cli(["ask", "Who wrote Pride and Prejudice?", "--top-p", "3", *ask],
                               capsys)
    assert status == 0 and "Q: Who wrote Pride and Prejudice?" in out, err
    status, _, err = run_cli(["ask", "Who?", "--cache-dtype", "float32", *ask], capsys)
    assert status == 1 and "the cache stores its states as 'int8'" in err, err
    # `index --verify` hashes every object of the store's cache too, and names one that differs.
    verify = ["index", "--out", str(tmp_path / "host-0" / "out"), "--verify"]
    status, out, err = run_cli(verify, capsys)
    assert status == 0 and f"file://{cache}: " in out and "every byte matches" in out, err
    victim = cache / "shards" / "shard-00001-of-00002" / "states" / "c" / "0" / "0"
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    status, _, err = run_cli(verify, capsys)
    assert status == 1 and f"file://{victim}: its sha256 differs" in err, err


def test_kill_9_of_a_process_then_rerun_gives_the_same_cache(corpus, one_process, tmp_path):
    store = tmp_path / "store"
    url = f"file://{store}"
    # Independent processes (no coordinator: a killed peer must not take the other down).
    # Process 1 is SIGKILLed after its first chunk (3 of its 4 windows); process 0 finishes
    # shard 0, then gives up waiting for shard 1 after 1 s.
    results = _store_processes(tmp_path, url, corpus, "--cache-dtype", "int8",
                               killed=(False, True), coordinator=False,
                               per_process=(["--wait-timeout", "1"], []))
    (status0, log0), (status1, log1) = results
    assert status1 == -9, log1[-4000:]
    assert status0 == 1 and "waited 1 s for shard(s) shards/shard-00001-of-00002" in log0, \
        log0[-4000:]
    (cache,) = store.glob("cache-k1-*")
    assert not (cache / "manifest.json").exists()
    shard0 = cache / "shards" / "shard-00000-of-00002"
    shard1 = cache / "shards" / "shard-00001-of-00002"
    progress = json.loads((shard1 / "progress.json").read_text())
    assert progress["tokens"] > 0  # some zarr shards were in the store before the kill
    before = _stamps(shard0)

    results = _store_processes(tmp_path, url, corpus, "--cache-dtype", "int8",
                               coordinator=False)
    for pid, (status, log) in enumerate(results):
        assert status == 0, f"process {pid} failed:\n{log[-4000:]}"
    assert f"resuming at window {progress['done']} of 4 ({progress['tokens']} of" \
        in results[1][1]
    assert "resuming" not in results[0][1]
    assert _stamps(shard0) == before
    assert_same_arrays(cache, _cache_in(one_process["int8"]))


def test_a_cache_store_of_another_scheme_is_refused(tmp_path, capsys):
    status, _, err = run_cli(["index", "--out", str(tmp_path / "index"), "--corpus",
                              "jsonl:x.jsonl", "--cache-store", "http://host/x"], capsys)
    assert status != 0
    assert "--cache-store 'http://host/x': a cache store is a gs://, s3://, file://" in err
    assert not (tmp_path / "index").exists()
