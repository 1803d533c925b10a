"""`dil-jax bench --suite qanet|bidaf`: the whole reader on every pair against CharPairGrid.

End to end through the CLI on a tiny QANet (the record, its phases, the Markdown), the delayed
variant's span scores against the whole variant's (and a wrong pairing caught by the same
check), the summary's arithmetic by hand, and flags refused in one line before any model is
built. No timing thresholds (timing lives in benchmarks/)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest

from dil_jax import bench
from dil_jax.bench import char_suites
from dil_jax.bench import report as bench_report
from dil_jax.cli import main
from dil_jax.commands import bench as bench_command
from dil_jax.errors import UsageError
from dil_jax.mesh import data_mesh
from dil_jax.reading.char_grid import CharPairGrid

from tests.helpers import run_cli
from tests.helpers.qanet import perturb

# Two float32 paths to the same logits (one apply over both segments, or encode_lower then
# encode_upper at another batch shape): rounding only, as tests/reading/test_char_grid.py.
RELATIVE_TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """One `dil-jax bench` run of the tiny QANet suite (4 x 3 grid, 16 + 48 tokens)."""
    out = tmp_path_factory.mktemp("char_bench")
    status = main(["bench", "--suite", "qanet-tiny", "--repeats", "2", "--out", str(out),
                   "--name", "qanet", "--no-retain-memory"])  # leave pytest's allocator alone
    assert status == 0
    return out


@pytest.fixture(scope="module")
def suite(run_dir) -> dict:
    record = json.loads((run_dir / "qanet.json").read_text())
    (suite,) = record["suites"]
    return suite


def test_the_suite_writes_its_record_with_the_phases(suite, run_dir):
    assert suite["kind"] == "qanet" and suite["name"] == "qanet-tiny"
    assert suite["grid"] == {"num_questions": 4, "num_passages": 3, "question_len": 16,
                             "passage_len": 48}
    assert set(suite["runs"]) == set(suite["results"]) == {bench.WHOLE, bench.DELAYED}
    for name, runs in suite["runs"].items():
        assert len(runs) == 2 and all(set(run) == set(bench.PHASES) for run in runs), name
    whole = suite["results"][bench.WHOLE]["seconds"]
    delayed = suite["results"][bench.DELAYED]
    assert whole["ni_q"] == whole["ni_p"] == 0.0 < whole["pairs"]  # all of it per pair
    assert all(delayed["seconds"][phase] > 0 for phase in bench.PHASES)
    assert 0 < delayed["ni_p_share"] < 1
    assert delayed["ni_p_share"] == pytest.approx(
        delayed["seconds"]["ni_p"] / delayed["seconds"]["total"])
    assert delayed["online_speedup"] == pytest.approx(whole["total"] / delayed["online_s"])
    # Every phase program compiled and counted: whole's pairs; delayed's NI Q, NI P, I Q-P.
    programs = suite["programs"]
    assert set(programs[bench.WHOLE]) == {"pairs"}
    assert set(programs[bench.DELAYED]) == set(bench.PHASES)
    for phases in programs.values():
        for stats in phases.values():
            assert stats["xla_flops_per_call"] > 0 and not stats["counts_loop_body_once"]
    markdown = (run_dir / "qanet.md").read_text()
    assert "NI P share of total" in markdown and "online speedup" in markdown
    assert "| delayed | NI P |" in markdown


def test_whole_and_delayed_are_the_same_work_in_xla_flops(suite):
    """The whole reader's FLOPs per pair are NI Q + NI P + I Q-P per input (one question and
    one passage through encode_lower, the pair through encode_upper): the programs counted are
    the ones that split the same reader (0.99998 measured)."""
    flops = suite["results"][bench.DELAYED]["flops"]
    assert flops["whole_per_pair_over_phases"] == pytest.approx(1.0, abs=0.01)
    assert 0 < flops["ni_p_share"] < flops["one_question_ni_p_share"] < 1


def test_the_recorded_span_scores_agree(suite):
    assert suite["largest_real_logit"] > 0
    assert suite["max_logit_difference"] <= RELATIVE_TOLERANCE * suite["largest_real_logit"]


def test_markdown_tables_are_well_formed(run_dir):
    record = json.loads((run_dir / "qanet.json").read_text())
    text = (run_dir / "qanet.md").read_text()
    assert text == bench_report.render_markdown(record)
    tables = [block for block in text.split("\n\n") if block.startswith("|")]
    assert len(tables) == 2  # timing, programs
    for table in tables:
        rows = table.splitlines()
        assert len({row.count("|") for row in rows}) == 1, table
        assert set(rows[1].replace("|", "")) == {"-"}


@pytest.mark.parametrize("name", ["qanet-tiny", "bidaf-tiny"])
def test_delayed_span_scores_equal_the_whole_readers(name):
    """The same random grid through both variants (params perturbed off Flax's zero biases and
    unit LayerNorm scales): every span score within 1e-4 of the largest real logit. The same
    check with the passages paired off by one (question i against passage i + 1) fails: it can
    tell a pair from another."""
    reader, _ = bench.char_suite_model(name, 16, seed=1)
    variables = {"params": perturb(reader.params["params"], 7),
                 "frozen": reader.params["frozen"]}
    # The suite's tiny grid and sizes: the compiled programs are the CLI run's (cache hits).
    inputs = bench.random_char_grid(bench.GridSpec(4, 3, 16, 48), reader.config.vocab_size,
                                    reader.config.max_chars, seed=3)
    mesh = data_mesh()
    _, whole = char_suites.run_whole_grid(char_suites.WholeReaderGrid(reader, mesh, 4),
                                          variables, inputs)
    _, delayed = char_suites.run_char_delayed_grid(
        reader, CharPairGrid(reader.model, mesh, 3, 4, trim_padding=False), variables, inputs)
    largest = char_suites.largest_real_logit(whole)
    assert whole.start_logits.shape == delayed.start_logits.shape == (4, 3, 48)
    np.testing.assert_allclose(delayed.start_logits, whole.start_logits,
                               atol=RELATIVE_TOLERANCE * largest, rtol=0)
    np.testing.assert_allclose(delayed.end_logits, whole.end_logits,
                               atol=RELATIVE_TOLERANCE * largest, rtol=0)
    shifted = np.roll(delayed.start_logits, 1, axis=1)
    assert np.max(np.abs(shifted - whole.start_logits)) > 100 * RELATIVE_TOLERANCE * largest


def test_summary_arithmetic():
    """By hand: q = 2, p = 5 (10 pairs); whole 4 s; delayed NI Q 0.2, NI P 1.0, I Q-P 2.0."""
    grid = bench.GridSpec(2, 5, 4, 8)
    runs = {bench.WHOLE: [{"ni_q": 0.0, "ni_p": 0.0, "pairs": 4.0}],
            bench.DELAYED: [{"ni_q": 0.2, "ni_p": 1.0, "pairs": 2.0}]}
    row = bench.summarize_char(runs, grid)[bench.DELAYED]
    assert row["ni_p_share"] == pytest.approx(1.0 / 3.2)
    assert row["online_s"] == pytest.approx(2.2)
    assert row["speedup"] == pytest.approx(4.0 / 3.2)
    assert row["online_speedup"] == pytest.approx(4.0 / 2.2)
    assert row["pair_speedup"] == pytest.approx(2.0)
    assert row["per_input_ms"] == pytest.approx({"ni_q": 100.0, "ni_p": 200.0, "pairs": 200.0})
    # One question per passage: whole 0.4 s a pair; delayed 0.1 + 0.2 + 0.2 per input.
    one = row["one_question"]
    assert one["ni_p_share"] == pytest.approx(0.2 / 0.5)
    assert one["speedup"] == pytest.approx(0.4 / 0.5)
    assert one["online_speedup"] == pytest.approx(0.4 / 0.3)


@pytest.fixture
def _no_model(monkeypatch):
    """Building a suite's model fails the test: the refusals must come first."""
    def refuse(*args, **kwargs):
        raise AssertionError("a model was built before the flags were checked")

    for name in ("char_suite_model", "suite_model"):
        monkeypatch.setattr(bench, name, refuse)


@pytest.mark.parametrize("flags, wanted", [
    (["--suite", "qanet", "--ks", "1"], "--ks: suite qanet has no split k"),
    (["--suite", "qanet-tiny", "--suite", "bidaf", "--no-reuse"],
     "--no-reuse: suite qanet-tiny, bidaf has no pair-program reuses"),
    (["--suite", "bidaf-tiny", "--question-len", "2"], "--question-len 2: QANet / BiDAF"),
])
def test_bad_flags_are_refused_in_one_line(flags, wanted, capsys, tmp_path, _no_model):
    status, _, err = run_cli(["bench", *flags, "--out", str(tmp_path)], capsys)
    assert status == 1, err
    assert err.startswith(f"dil-jax bench: error: {wanted}"), err
    assert err.count("\n") == 1, err  # one line, no traceback
    assert list(tmp_path.iterdir()) == []


def test_flags_of_the_bert_suites_pass_where_one_is_chosen():
    """--ks with a BERT-family suite beside a QANet one is that suite's (not refused)."""
    parser = argparse.ArgumentParser()
    bench_command.add_arguments(parser)
    args = parser.parse_args(["--suite", "qanet", "--suite", "tiny", "--ks", "1",
                              "--no-reuse"])
    bench_command.check_suite_flags(args)  # no error
    args = parser.parse_args(["--suite", "qanet", "--ks", "1"])
    with pytest.raises(UsageError, match="--ks"):
        bench_command.check_suite_flags(args)


def test_random_characters_are_shaped_as_the_readers_read_them():
    inputs = bench.random_char_grid(bench.GridSpec(2, 3, 5, 7), vocab_size=1000, max_chars=4)
    assert inputs.q_chars.shape == (2, 5, 4) and inputs.p_chars.shape == (3, 7, 4)
    assert inputs.q_chars.dtype == np.uint16
    # [CLS] / [SEP]: one special character; words: 1 to 4 real ones from id 4 on, then padding.
    assert (inputs.q_chars[:, 0] == [1, 0, 0, 0]).all() and (inputs.p_chars[:, -1, 1:] == 0).all()
    words = inputs.p_chars[:, :-1]
    assert (words[..., 0] >= 4).all()
    real = words > 0
    assert (np.diff(real.astype(int), axis=-1) <= 0).all()  # real characters first


def test_the_record_names_the_cores_it_ran_on(run_dir):
    """A run pinned with `taskset -c 0` on a 2-core machine says so in its Markdown."""
    machine = json.loads((run_dir / "qanet.json").read_text())["machine"]
    assert machine["cpus_allowed"] and set(machine["cpus_allowed"]) <= set(
        range(machine["cpu_count"]))
    assert bench_report._allowed({"cpu_count": 2, "cpus_allowed": [0]}) == (
        "; this process pinned to core(s) 0")
    assert bench_report._allowed({"cpu_count": 2, "cpus_allowed": [0, 1]}) == ""
    assert bench_report._allowed({"cpu_count": 2}) == ""  # records from before the field
