"""tools/wikipedia_projection.py's arithmetic on hand-made records, against hand computation."""

from __future__ import annotations

import pytest

from tests.helpers import load_script

projection = load_script("tools/wikipedia_projection.py")


def test_projection_by_hand():
    cache_record = dict(hidden=384, layers=6, k=4, rows=[dict(
        scheme="bfloat16", bytes_per_token=dict(states=768.0, tokens=16.0, reuse=0.0),
        open_domain=dict(F1=40.0, questions=10, timings=dict(
            retrieval=9.0, question_lower=1.0, pair_upper=3.0, decode=1.0)),
        predict=dict(F1=41.0))])
    retrieval_record = dict(rows=[
        dict(engine="bm25s", size=1000, build_s=2.0, disk_mib=1.0, build_peak_mib=10.0,
             single_qps=100.0),
        dict(engine="bm25s", size=10, build_s=1.0, disk_mib=1.0, build_peak_mib=1.0,
             single_qps=1.0),
        dict(engine="rank-bm25", size=1000, error="over the 16 GiB limit")])
    result = projection.project(cache_record, retrieval_record, windows=1.5)
    n = projection.WIKIPEDIA_PASSAGES
    (cache,) = result["cache"]
    assert cache["states_tb"] == pytest.approx(768 * 192 * 1.5 * n / 1e12)
    # MiniLM k = 4 at 192 tokens: 4 x (8 n h^2 + 4 n h f + 4 n^2 h), n = 192, h = 384, f = 1536.
    per_window = 4 * (8 * 192 * 384**2 + 4 * 192 * 384 * 1536 + 4 * 192**2 * 384)
    assert per_window == 2_944_401_408
    first = result["build"][0]
    assert (first["k"], first["reuse"]) == (4, False)
    assert first["flops"] == pytest.approx(per_window * 1.5 * n)
    assert first["seconds_at_peak"] == pytest.approx(per_window * 1.5 * n / (275e12 * 16))
    with_reuse = result["build"][1]  # + 3 x 2 n h^2 projections + 4 n^2 h statistics
    assert with_reuse["flops"] == pytest.approx(
        (per_window + 6 * 192 * 384**2 + 4 * 192**2 * 384) * 1.5 * n)
    (bm25,) = result["bm25"]  # the failed rank-bm25 row has nothing to extrapolate from
    assert bm25["measured_passages"] == 1000  # the largest measured corpus
    assert bm25["query_seconds"] == pytest.approx(n / 1000 / 100)
    assert bm25["disk_gb"] == pytest.approx(2**20 * n / 1000 / 1e9)
    (e2e,) = result["end_to_end"]
    assert e2e["reader_seconds"] == pytest.approx(0.5)  # (1 + 3 + 1) s / 10 questions
    assert e2e["questions_per_second"] == pytest.approx(1 / (n / 1e5 + 0.5))
    assert "| bfloat16 | 768.0 |" in projection.markdown(result)


def test_reader_seconds_come_from_the_fastest_way_of_the_speed_record():
    speed_record = dict(questions=4, rows=[
        dict(k=4, mode="before", questions_per_s=1.0,
             timings=dict(retrieval=5.0, question_lower=1.0, pair_upper=6.0, decode=1.0)),
        dict(k=4, mode="+ cache", questions_per_s=2.0,
             timings=dict(retrieval=5.0, question_lower=1.0, pair_upper=2.0, decode=1.0)),
        dict(k=5, mode="+ cache", questions_per_s=9.0, timings=dict(pair_upper=0.1))])
    assert projection.reader_seconds_from_speed_record(speed_record, 4) == (1.0, "+ cache")
    # A chunk sweep's record names the fastest row's chunk size too.
    speed_record["rows"][1]["chunk_size"] = 8
    assert projection.reader_seconds_from_speed_record(speed_record, 4) == (
        1.0, "+ cache at chunk 8")
    with pytest.raises(ValueError, match="no row at k = 3"):
        projection.reader_seconds_from_speed_record(speed_record, 3)
