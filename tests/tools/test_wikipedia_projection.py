"""tools/wikipedia_projection.py's arithmetic on tiny hand-made records, against hand
computation."""

from __future__ import annotations

import dataclasses
import json

import pytest

from dil_jax.open_domain.cache.storage import Storage

from tests.helpers import load_script

projection = load_script("tools/wikipedia_projection.py")

N = 1000  # passages projected to
PASSAGES = dict(
    machine=dict(cpu="test CPU", cpu_count=2),
    sample=dict(passages=10, windows_per_passage=2.0, real_tokens_per_window=100.0,
                line_bytes_per_passage=500.0),
    index=dict(folder="idx", num_passages=5, num_windows=10,
               file_bytes={"windows.npz": 30_000}),
    rate=dict(checkpoint="ckpt", k=4, layers=6, hidden=384, num_heads=12,
              intermediate_size=1536, windows_per_s=10.0, flop_per_s=2e10))
RETRIEVAL = dict(rows=[
    dict(engine="pyserini", size=10, disk_mib=5.0),
    dict(engine="pyserini", size=1000, disk_mib=1.0),
    dict(engine="pyserini", size=10_000, error="over the limit"),
    dict(engine="bm25s", size=100_000, disk_mib=9.0)])
BM25_BUILD = dict(machine="test CPU", cpus=2, rows=[
    dict(engine="pyserini", passages=100, seconds=10.0, peak_mib=100.0),
    dict(engine="pyserini", passages=400, seconds=25.0, peak_mib=130.0),
    dict(engine="pyserini", passages=200, seconds=15.0, peak_mib=110.0),
    dict(engine="rank-bm25", passages=400, seconds=99.0, peak_mib=999.0)])
QUERY_MEMORY = dict(
    indexes=[dict(passages=100, windows=500, index_seconds=50.0),
             dict(passages=10, windows=50, index_seconds=20.0)],
    rows=[dict(command="ask", passages=10, VmHWM=300.0),
          dict(command="ask", passages=100, VmHWM=309.0),
          dict(command="serve", passages=100, VmHWM=420.0),
          dict(command="serve", passages=10, VmHWM=400.0)])
CACHE = dict(rows=[
    dict(scheme="float32", bytes_per_token=dict(states=1536.0),
         open_domain=dict(EM=5.0, EM_ir=20.0, F1_ir=30.0, questions=7)),
    dict(scheme="bfloat16", bytes_per_real_token=dict(states=700.0, reuse=3000.0, tokens=16.0),
         open_domain=dict(EM=6.0, EM_ir=21.0, F1_ir=31.0, questions=7))])
WINDOWS, TOKENS = 2.0 * N, 2.0 * N * 100.0  # 2,000 windows, 200,000 real tokens
# MiniLM k = 4 at 192 slots: 4 x (8 n h^2 + 4 n h f + 4 n^2 h), n = 192, h = 384, f = 1536.
PER_WINDOW = 4 * (8 * 192 * 384**2 + 4 * 192 * 384 * 1536 + 4 * 192**2 * 384)


def records(cache=CACHE):
    return projection.Records(passages=PASSAGES, retrieval=RETRIEVAL, bm25_build=BM25_BUILD,
                              query_memory=QUERY_MEMORY, cache=cache,
                              files=dict(passages="p.json", retrieval="r.json",
                                         bm25_build="b.json", query_memory="q.json",
                                         cache="c.json"))


def test_storage_definitions_by_hand():
    assert projection.defined_states_bytes("float32", 384) == 1536
    assert projection.defined_states_bytes("int8", 384) == 388  # 384 codes + a float32 scale
    assert projection.defined_states_bytes("pca64", 384) == 68
    assert projection.defined_states_bytes("pq32", 384) == 32
    # 4 wide arrays in int8 (pq has no codebook for them) + 12 float32 log-sum-exps.
    assert projection.defined_reuse_bytes("pq32", 384, 12) == 4 * 388 + 48 == 1600
    assert projection.defined_reuse_bytes("bfloat16", 384, 12) == 4 * 768 + 48
    # mean + full-width rotation 4 x 384 x 385, codebook 4 x 256 x 384.
    assert projection.defined_side_bytes("pq32", 384) == 591_360 + 393_216
    assert projection.defined_side_bytes("pca64", 384) == 4 * 384 * 65
    assert projection.defined_side_bytes("int8", 384) == 0
    with pytest.raises(ValueError, match="unknown storage 'int4'"):
        projection.defined_states_bytes("int4", 384)


@pytest.mark.parametrize("name", ["float32", "bfloat16", "int8", "pca64", "pca96"])
def test_definitions_agree_with_the_storage_code(name):
    assert projection.defined_states_bytes(name, 384) == Storage.parse(name).bytes_per_token(384)


def test_cache_rows_measured_or_defined():
    result = projection.project(records(), ["float32", "bfloat16", "pq32"], passages=N)
    assert (result["windows"], result["real_tokens"]) == (WINDOWS, TOKENS)
    float32, bfloat16, pq32 = result["cache"]
    # float32: the record has no bytes per real token, so the definition; its accuracy kept.
    assert float32["source"] == "definition"
    assert float32["states_tb"] == pytest.approx(1536 * 200_000 / 1e12)
    assert float32["accuracy"]["EM_ir"] == 20.0
    # token ids and offsets: 12 B a token + 8 B a window (2,000 windows / 200,000 tokens).
    assert float32["token_bytes_per_token"] == pytest.approx(12.08)
    # bfloat16: measured, as the record's row gives it.
    assert bfloat16["source"] == "measured (c.json)"
    assert bfloat16["states_tb"] == pytest.approx(700 * 200_000 / 1e12)
    assert bfloat16["reuse_tb"] == pytest.approx(3000 * 200_000 / 1e12)
    assert bfloat16["cache_tb"] == pytest.approx((700 + 16) * 200_000 / 1e12)
    assert pq32["source"] == "definition (not measured yet)"
    assert pq32["cache_with_reuse_tb"] == pytest.approx(
        ((32 + 1600 + 12.08) * 200_000 + 984_576) / 1e12)
    assert "accuracy" not in pq32


def test_a_run_that_did_not_store_the_reuse_arrays_gives_their_bytes_if_stored():
    """benchmarks/cache_compression.py's rows read without storing the reuse arrays record 0
    bytes of them and what they would take ("not stored (+N)"): the projection takes the
    latter; the storage rows are named after the cache record's reader and k."""
    cache = dict(checkpoint="readers/k2", k=2, rows=[dict(
        scheme="pq64", reuse=False, reuse_if_stored=1600.0,
        bytes_per_real_token=dict(states=64.8, reuse=0.0, tokens=4.0),
        open_domain=dict(EM=56.8, EM_ir=64.2, F1_ir=72.2, questions=1278))])
    result = projection.project(records(cache), ["pq64"], passages=N)
    (pq64,) = result["cache"]
    assert pq64["reuse_bytes_per_token"] == 1600.0
    assert pq64["states_tb"] == pytest.approx(64.8 * 200_000 / 1e12)
    assert pq64["cache_with_reuse_tb"] == pytest.approx((64.8 + 4.0 + 1600.0) * 200_000 / 1e12)
    assert (result["reader"]["checkpoint"], result["reader"]["k"]) == ("readers/k2", 2)


def test_index_files_by_hand():
    result = projection.project(records(), ["int8"], passages=N)
    jsonl, offsets, windows, lucene = result["index_files"]
    assert jsonl["gb"] == pytest.approx(500 * 1000 / 1e9)
    assert offsets["gb"] == pytest.approx(8 * 1001 / 1e9)
    assert windows["gb"] == pytest.approx(3000 * 2000 / 1e9)  # 30,000 B / 10 windows
    # A /2 index's windows.npz holds real tokens only: its bytes scale with them, not windows.
    ragged = dataclasses.replace(records(), passages=dict(
        PASSAGES, index=dict(PASSAGES["index"], real_tokens=1_000)))  # 30,000 B: 30 B a token
    ragged_windows = projection.project(ragged, ["int8"], passages=N)["index_files"][2]
    assert ragged_windows["gb"] == pytest.approx(30 * 200_000 / 1e9)  # N x 2 windows x 100
    assert "30.00 B a real token" in ragged_windows["source"]
    # The largest pyserini row that built: 1 MiB for 1,000 passages.
    assert lucene["bytes_per_passage"] == pytest.approx(2**20 / 1000)
    index_tb = (500_000 + 8008 + 6_000_000 + 2**20) / 1e12
    assert result["cache"][0]["disk_tb"] == pytest.approx(
        index_tb + (388 + 12.08) * 200_000 / 1e12)


def test_builds_by_hand():
    result = projection.project(records(), ["int8"], passages=N)
    lucene = result["lucene_build"]
    # seconds: 25 + (25 - 15) / (400 - 200) x (1000 - 400) = 55; peak on the line through
    # (100, 100 MiB) and (400, 130 MiB): 130 + 0.1 x 600 = 190 MiB.
    assert lucene["hours"] == pytest.approx(55 / 3600)
    assert lucene["passages_per_s"] == pytest.approx(200 / 10)
    assert lucene["peak_gib"] == pytest.approx(190 / 1024)
    assert lucene["peak_from"] == "plain build"
    # With the heap-resident record, the peak is on its line instead, the hours unchanged:
    # through (100, 300 MiB) and (1,000, 309 MiB): 309 + 0.01 x 0 = 309 MiB at N = 1,000.
    bound = dict(machine="m", cpus=2, rows=[
        dict(engine="pyserini", passages=100, seconds=1.0, peak_mib=300.0),
        dict(engine="pyserini", passages=1000, seconds=9.0, peak_mib=309.0),
        dict(engine="pyserini", passages=5000, error="killed")])
    bounded = projection.project(dataclasses.replace(records(), bm25_bound=bound), ["int8"],
                                 passages=10 * N)["lucene_build"]
    assert bounded["peak_gib"] == pytest.approx((309 + 0.01 * 9000) / 1024)
    assert bounded["peak_from"] == "heap resident from the start"
    assert bounded["hours"] == pytest.approx(
        (25 + 10 / 200 * (10 * N - 400)) / 3600)
    assert PER_WINDOW == 2_944_401_408
    plain, reuse = result["cache_builds"][:2]
    assert (plain["k"], plain["reuse"], reuse["reuse"]) == (4, False, True)
    assert plain["flops"] == PER_WINDOW * 2000
    assert plain["minutes"]["TPU v4-32"]["at_peak"] == pytest.approx(
        PER_WINDOW * 2000 / (16 * 275e12) / 60)
    assert plain["minutes"]["8 x H100 SXM"]["at_assumed"] == pytest.approx(
        PER_WINDOW * 2000 / (8 * 989e12 * 0.4) / 60)
    assert plain["this_machine_hours"] == pytest.approx(PER_WINDOW * 2000 / 2e10 / 3600)
    # + the first upper block's projections 3 x 2 n h^2 and statistics 4 n^2 h.
    assert reuse["flops"] == (PER_WINDOW + 6 * 192 * 384**2 + 4 * 192**2 * 384) * 2000
    bert = result["cache_builds"][2]
    assert (bert["hidden"], bert["k"]) == (768, 11)
    # The largest index: 50 s for 100 passages -> 500 s at 1,000.
    assert result["whole_index"]["hours"] == pytest.approx(500 / 3600)


def test_query_memory_by_hand():
    ask, serve = projection.project(records(), ["int8"], passages=N)["query_memory"]
    assert ask["ratio"] == pytest.approx(309 / 300)
    assert ask["growth_mib_per_million"] == pytest.approx(9 / 90 * 1e6)
    assert ask["projected_mib"] == pytest.approx(309 + 0.1 * 900)
    assert (serve["small_passages"], serve["large_mib"]) == (10, 420.0)


def test_markdown_and_the_command_line(tmp_path):
    paths = {}
    for role, record in (("passages", PASSAGES), ("retrieval", RETRIEVAL),
                         ("bm25-build", BM25_BUILD), ("query-memory", QUERY_MEMORY),
                         ("cache", CACHE)):
        paths[role] = tmp_path / f"{role}.json"
        paths[role].write_text(json.dumps(record))
    argv = [arg for role, path in paths.items() for arg in (f"--{role}-record", str(path))]
    assert projection.main([*argv, "--storages", "int8", "pq32", "--out",
                            str(tmp_path / "out")]) == 0
    table = (tmp_path / "out.md").read_text()
    assert "| int8 | definition | 388.0 | 1600.0 |" in table
    assert str(paths["bm25-build"]) in table  # every input named
    assert json.loads((tmp_path / "out.json").read_text())["inputs"]["cache"] == str(
        paths["cache"])
    with pytest.raises(SystemExit):
        projection.main([*argv, "--storages", "int4", "--out", str(tmp_path / "bad")])
