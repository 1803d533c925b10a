"""`--chunk-size auto`: the choice from measured throughputs, the order sizes are tried in, the
record per machine and reader shape, the flag, and a real (tiny) measurement
(dil_jax/open_domain/chunk_size.py)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from dil_jax.errors import UsageError
from dil_jax.open_domain import chunk_size as cs
from dil_jax.open_domain.chunk_size import (
    AUTO,
    DEFAULT,
    GIVEN,
    MEASURE,
    MEASURED,
    RECORDED,
    ChunkChoice,
    choose_chunk_size,
    probe_order,
    resolve_chunk_size,
)

from tests.helpers import run_cli
from tests.helpers.training import tiny_encoder

# ----------------------------------------------------------------------------- the choice


def test_the_best_throughput_wins():
    assert choose_chunk_size({4: 10.0, 8: 20.0, 16: 30.0, 32: 25.0}) == 16
    assert choose_chunk_size({8: 5.0}) == 8


def test_sizes_within_the_tolerance_prefer_the_smaller():
    # 16 is 3 % faster than 8: within 5 %, so 8 (it pads less); 32 is 10 % faster: it wins.
    assert choose_chunk_size({8: 100.0, 16: 103.0}) == 8
    assert choose_chunk_size({8: 100.0, 16: 103.0, 32: 113.0}) == 32
    assert choose_chunk_size({4: 99.0, 8: 100.0}) == 4
    assert choose_chunk_size({4: 99.0, 8: 100.0}, tolerance=0.0) == 8
    with pytest.raises(ValueError):
        choose_chunk_size({})


def _rates(table):
    tried = []

    def rate_of(size):
        tried.append(size)
        return table[size]

    return rate_of, tried


def test_larger_sizes_are_tried_while_they_win_then_no_smaller_one():
    rate_of, tried = _rates({4: 1.0, 8: 10.0, 16: 20.0, 32: 15.0})
    assert probe_order(8, (4, 8, 16, 32), rate_of) == {8: 10.0, 16: 20.0, 32: 15.0}
    assert tried == [8, 16, 32]


def test_smaller_sizes_are_tried_when_no_larger_one_wins():
    rate_of, tried = _rates({2: 9.0, 4: 10.2, 8: 10.0, 16: 10.3, 32: 99.0})
    # 16 is within 5 % of 8: not the choice, so 32 is not tried; 4 is (within 5 %, smaller),
    # then 2 is not (10 % below the best).
    rates = probe_order(8, (2, 4, 8, 16, 32), rate_of)
    assert tried == [8, 16, 4, 2]
    assert choose_chunk_size(rates) == 4


def test_no_new_size_is_tried_after_the_deadline():
    rate_of, _ = _rates({4: 1.0, 8: 10.0, 16: 20.0, 32: 40.0})
    calls = iter([False, True])
    assert probe_order(8, (4, 8, 16, 32), rate_of, deadline=lambda: next(calls)) == {
        8: 10.0, 16: 20.0}


# ----------------------------------------------------------------------------- the record


def _reader(q_len=8, p_len=48, **config):
    """What `resolve_chunk_size` reads of an OpenDomainReader: its grid (a real one: the
    mesh of this process's devices), its Reader's config, kind and label, its cache's window
    length."""
    from dil_jax.reading.grid import MeshGrid

    config = tiny_encoder(max_question_len=q_len, **config)
    return SimpleNamespace(grid=MeshGrid(None, 8, None),
                           reader=SimpleNamespace(config=config, kind="encoder", label="tiny"),
                           cache=SimpleNamespace(mask=np.zeros((1, p_len))))


class FakeMeasure:
    def __init__(self, rates):
        self.rates, self.calls = rates, 0

    def __call__(self, reader, candidates, default):
        self.calls += 1
        return dict(self.rates)


@pytest.fixture
def record(tmp_path):
    path = tmp_path / "cache" / "chunk_sizes.json"
    return path, {cs.ENV: str(path)}


def test_auto_measures_once_then_reads_the_record(record):
    path, env = record
    measure = FakeMeasure({8: 10.0, 16: 20.0, 32: 19.5})
    reader = _reader()
    choice = resolve_chunk_size(AUTO, reader, env=env, measure=measure)
    assert (choice.size, choice.source, measure.calls) == (16, MEASURED, 1)
    assert reader.grid.chunk_size == 16
    assert "measured now" in choice.reason and str(path) in choice.reason
    (entry,) = json.loads(path.read_text())["records"].values()
    assert entry["chunk_size"] == 16 and entry["pairs_per_second"]["32"] == 19.5
    assert entry["key"]["q_len"] == 8 and entry["key"]["p_len"] == 48
    assert entry["key"]["cores"] >= 1 and entry["key"]["cpu"]
    # A second start (a new reader of the same shape) reads it: no measurement.
    again = _reader()
    choice = resolve_chunk_size(AUTO, again, env=env, measure=measure)
    assert (choice.size, choice.source, measure.calls) == (16, RECORDED, 1)
    assert again.grid.chunk_size == 16 and "read from the record" in choice.reason
    assert choice.pairs_per_second == {8: 10.0, 16: 20.0, 32: 19.5}
    # Without --chunk-size (ask, odqa-eval): the record too.
    assert resolve_chunk_size(None, _reader(), env=env, measure=measure).source == RECORDED
    # `measure` measures again and replaces the entry.
    measure.rates = {8: 30.0, 16: 20.0}
    choice = resolve_chunk_size(MEASURE, _reader(), env=env, measure=measure)
    assert (choice.size, choice.source, measure.calls) == (8, MEASURED, 2)
    (entry,) = json.loads(path.read_text())["records"].values()
    assert entry["chunk_size"] == 8


@pytest.mark.parametrize("other", ["cpu", "q_len", "p_len", "upper_layers", "hidden"])
def test_another_machine_or_reader_shape_is_measured_again(record, monkeypatch, other):
    path, env = record
    measure = FakeMeasure({8: 10.0, 16: 20.0})
    assert resolve_chunk_size(AUTO, _reader(), env=env, measure=measure).source == MEASURED
    reader = _reader()
    if other == "cpu":
        monkeypatch.setattr(cs, "cpu_model", lambda: "Another CPU")
    elif other in ("q_len", "p_len"):
        reader = _reader(**{other: 16 if other == "q_len" else 64})
    elif other == "upper_layers":
        reader = _reader(num_lower_layers=0)
    else:
        reader = _reader(hidden_size=64, embedding_size=64)
    measure.rates = {8: 10.0, 16: 5.0}
    choice = resolve_chunk_size(AUTO, reader, env=env, measure=measure)
    assert (choice.size, choice.source, measure.calls) == (8, MEASURED, 2)
    # Both entries are kept: the first key still reads its own.
    assert len(json.loads(path.read_text())["records"]) == 2
    monkeypatch.undo()
    assert resolve_chunk_size(AUTO, _reader(), env=env, measure=measure).size == 16


def test_without_a_record_none_takes_the_default_and_never_measures(record):
    path, env = record
    measure = FakeMeasure({8: 1.0, 16: 2.0})
    choice = resolve_chunk_size(None, _reader(), env=env, measure=measure)
    assert (choice.size, choice.source, measure.calls) == (8, DEFAULT, 0)
    assert "no record" in choice.reason and not path.exists()


def test_records_off_auto_takes_the_default(tmp_path):
    measure = FakeMeasure({8: 1.0, 16: 2.0})
    choice = resolve_chunk_size(AUTO, _reader(), env={cs.ENV: "off"}, measure=measure)
    assert (choice.size, choice.source, measure.calls) == (8, DEFAULT, 0)
    assert f"{cs.ENV}=off" in choice.reason
    # `measure` still measures (nothing is written).
    choice = resolve_chunk_size(MEASURE, _reader(), env={cs.ENV: "off"}, measure=measure)
    assert (choice.size, choice.source, measure.calls) == (16, MEASURED, 1)


def test_a_given_size_is_used_as_it_is(record):
    _, env = record
    measure = FakeMeasure({8: 1.0})
    reader = _reader()
    choice = resolve_chunk_size(5, reader, env=env, measure=measure)
    assert (choice.size, choice.source, choice.reason, measure.calls) == (5, GIVEN,
                                                                         "5 (given)", 0)
    assert reader.grid.chunk_size == 5
    with pytest.raises(UsageError, match="--chunk-size"):
        resolve_chunk_size("fast", _reader(), env=env, measure=measure)


def test_a_damaged_or_foreign_record_is_measured_again_and_rewritten(record):
    path, env = record
    measure = FakeMeasure({8: 1.0, 16: 2.0})
    path.parent.mkdir(parents=True)
    for text in ("{not json", json.dumps({"format": 99, "records": {}}), "[]"):
        path.write_text(text)
        assert resolve_chunk_size(AUTO, _reader(), env=env, measure=measure).source == MEASURED
        assert json.loads(path.read_text())["format"] == cs.RECORD_FORMAT
    assert measure.calls == 3


def test_the_record_file_follows_the_environment(tmp_path):
    assert cs.record_file({"XDG_CACHE_HOME": str(tmp_path)}) == (
        tmp_path / "dil_jax" / "chunk_sizes.json")
    assert cs.record_file({cs.ENV: str(tmp_path / "x.json")}) == tmp_path / "x.json"
    assert cs.record_file({cs.ENV: "off"}) is None


def test_serve_info_shows_the_choice_and_why():
    from dil_jax.serve.app import chunk_info

    choice = ChunkChoice(16, MEASURED, {8: 10.0, 16: 20.0}, "/r.json")
    info = chunk_info(SimpleNamespace(chunk=choice))
    assert info["chunk_size"] == 16 and info["chunk_size_source"] == "measured now"
    assert info["chunk_size_reason"] == ("16, measured now (pairs/s 8: 10.0, 16: 20.0), "
                                         "recorded in /r.json")
    unresolved = SimpleNamespace(chunk=None, reader=SimpleNamespace(grid=SimpleNamespace(
        chunk_size=8)))
    assert chunk_info(unresolved) == {"chunk_size": 8, "chunk_size_source": None,
                                      "chunk_size_reason": None}


# ----------------------------------------------------------------------------- the flag


def test_the_flag_takes_auto_measure_or_a_size():
    from dil_jax.cli import build_parser

    parser = build_parser()
    common = ["--index", "x"]
    assert parser.parse_args(["ask", "Q", *common, "--chunk-size", "auto"]).chunk_size == AUTO
    assert parser.parse_args(["ask", "Q", *common, "--chunk-size", "16"]).chunk_size == 16
    assert parser.parse_args(["ask", "Q", *common]).chunk_size is None
    assert parser.parse_args(["odqa-eval", *common, "--data", "d.json", "--chunk-size",
                              "MEASURE"]).chunk_size == MEASURE
    assert parser.parse_args(["serve"]).chunk_size == AUTO


@pytest.mark.parametrize("value", ["0", "-8", "fast", "8.5"])
def test_a_bad_value_is_refused_naming_the_flag(value, capsys):
    status, _, err = run_cli(["ask", "Q", "--index", "x", "--chunk-size", value], capsys)
    assert status == 2 and "--chunk-size" in err and "'auto'" in err and value in err, err
    status, _, err = run_cli(["serve", "--chunk-size", value], capsys)
    assert status == 2 and "--chunk-size" in err, err


# ----------------------------------------------------------------------------- a measurement


class TinyOpenDomainReader:
    """What `measure_chunk_sizes` reads of an OpenDomainReader, over a tiny random encoder:
    its grid, Reader, question batch (2 rows of 8 tokens) and passage side (3 windows of 16
    tokens), no cached first-upper-block arrays."""

    reads_cached_reuse = False
    top_p = 8  # a whole batch reads 16 pairs of 2 questions: they are projected once

    def __init__(self, k=1):
        import jax

        from dil_jax.readers.encoder import init_reader

        self.reader = init_reader(tiny_encoder(num_lower_layers=k), jax.random.PRNGKey(0))
        self.grid = self.reader.pair_grid(None, 2, 4)

    def _encode_question_batch(self, questions):
        ids = np.ones((2, 8), np.int32)
        return self.grid.encode_questions(self.reader.params, ids, ids), ids

    def _passage_side(self, rows):
        ids = np.ones((3, 16), np.int32)
        return self.grid.passage_side(self.reader.params, ids, ids), ids


@pytest.mark.parametrize("k", [0, 1])
def test_a_measurement_times_the_readers_own_pair_program(k):
    reader = TinyOpenDomainReader(k)
    rates = cs.measure_chunk_sizes(reader, (2, 4, 8), default=4, reps=1, budget_s=60)
    assert 4 in rates and set(rates) <= {2, 4, 8} and len(rates) >= 2
    assert all(rate > 0 for rate in rates.values())
    assert reader.grid.chunk_size == 4  # restored
    # The programs it compiled are the grid's own: reading at the chosen size compiles none.
    size = choose_chunk_size(rates)
    reader.grid.set_chunk_size(size)
    before = reader.grid._pair_fn._cache_size()
    q_lower, q_mask = reader._encode_question_batch([])
    p_source, p_mask = reader._passage_side(None)
    index = np.zeros(size, np.int64)
    given = {}
    if reader.grid.plan.hoists_projections:  # 16 pairs: both sides projected (min_reads 2)
        assert reader.grid.plan.projects_passages(16, 3, False)
        given["q_qkv"] = reader.grid.project_segments(reader.reader.params, q_lower)
        given["p_qkv"] = reader.grid.project_segments(reader.reader.params, p_source)
        if reader.grid.plan.passage_stats:
            given["p_stats"] = reader.grid.passage_attention_stats(given["p_qkv"], p_mask)
    reader.grid.read_pairs(reader.reader.params, q_lower, q_mask, p_source, p_mask, index,
                           index, **given)
    assert reader.grid._pair_fn._cache_size() == before


# ----------------------------------------------------------------------------- the commands


def test_serve_and_ask_choose_read_and_show_the_size(tmp_path, monkeypatch, capsys):
    """`dil-jax serve` (the server itself not started: `serve` is replaced) measures each
    reader once with its default `auto`, says so and why, and sets every batch shape's grid;
    a second start reads the record; `ask --chunk-size measure` measures again."""
    from dil_jax.commands import serve as serve_command
    from dil_jax.defaults import bundled_reader

    from tests.helpers import free_port
    from tests.helpers.index import build_sample_index

    if bundled_reader("full") is None or bundled_reader("delayed") is None:
        pytest.skip("needs the bundled readers")
    index, _ = build_sample_index(tmp_path, "--max-passage-len", "48", "--doc-stride", "24",
                                  ks=("0", "2"))
    path = tmp_path / "chunk_sizes.json"
    monkeypatch.setenv(cs.ENV, str(path))
    measure = FakeMeasure({8: 1.0, 16: 2.0})
    monkeypatch.setattr(cs, "measure_chunk_sizes", measure)
    loaded = {}

    def capture(readers, limits, args, api_key, sockets=None) -> int:
        loaded.clear()
        loaded.update(readers)
        return 0

    monkeypatch.setattr(serve_command, "serve", capture)
    common = ["serve", "--index", str(index), "--top-p", "3", "--max-question-len", "16",
              "--port", str(free_port())]
    status, _, err = run_cli(common, capsys)
    assert status == 0, err
    assert measure.calls == 2 and "measuring the pair program's chunk size" in err
    for served in loaded.values():
        assert (served.chunk.size, served.chunk.source) == (16, MEASURED)
        assert {reader.grid.chunk_size for reader in served.shapes.values()} == {16}
    assert len(json.loads(path.read_text())["records"]) == 2
    lines = serve_command.reader_lines(loaded)
    assert "  pairs per chunk of the full reader: 16, measured now (pairs/s 8: 1.0, 16: 2.0)" \
        f", recorded in {path}" in lines
    status, _, err = run_cli(common, capsys)
    assert status == 0 and measure.calls == 2, err
    assert {served.chunk.source for served in loaded.values()} == {RECORDED}
    status, _, err = run_cli([*common, "--chunk-size", "4"], capsys)
    assert status == 0 and {served.chunk.reason for served in loaded.values()} == {"4 (given)"}
    status, out, err = run_cli(["ask", "Who wrote Pride and Prejudice?", "--index", str(index),
                                "--k", "2", "--max-question-len", "16", "--top-p", "3",
                                "--chunk-size", "measure"], capsys)
    assert status == 0 and measure.calls == 3, err
    assert "pairs per chunk for" in err and "16, measured now" in err
    assert "Austen" in out
    # --matmul-dtype: both readers read bfloat16 operands over the caches built in float32,
    # and the start log says so.
    status, _, err = run_cli([*common, "--chunk-size", "4", "--matmul-dtype", "bfloat16"],
                             capsys)
    assert status == 0, err
    assert {served.matmul_dtype for served in loaded.values()} == {"bfloat16"}
    assert ("  matmuls of the delayed reader: --matmul-dtype bfloat16 (approximate: operands "
            "rounded to bfloat16)") in serve_command.reader_lines(loaded)
