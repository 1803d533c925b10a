"""The speed-grid benchmark: runs end to end on a tiny config, counts FLOPs right, writes
well-formed records. No timing thresholds here: timing lives in benchmarks/ only."""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import math
from pathlib import Path

import jax
import numpy as np
import pytest

from dil_jax import bench
from dil_jax.bench import report as bench_report
from dil_jax.commands import bench as bench_command
from dil_jax.mesh import data_mesh
from dil_jax.model.attention import attends_per_example
from dil_jax.model.delayed import DelayedInteractionModel
from dil_jax.reading.grid import PairGrid

# XLA's count (matmuls + elementwise) over the matmul formula: 1.006-1.007 on the tiny config,
# reuses on or off (benchmarks/README.md, "FLOPs: XLA's count vs the formula").
FLOP_TOLERANCE = 0.02
# The peer and the plot are optional extras ('dil_jax[bench]'); without them the rest still runs.
HAVE_TORCH = importlib.util.find_spec("torch") is not None
HAVE_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """One benchmark run of the tiny suite (3 blocks: k = 0, 1, 2 and the PyTorch peer)."""
    out = tmp_path_factory.mktemp("bench")
    parser = argparse.ArgumentParser()
    bench_command.add_arguments(parser)
    flags = ["--suite", "tiny", "--repeats", "1", "--out", str(out),
             "--no-retain-memory"]  # leave pytest's allocator alone
    if not HAVE_TORCH:
        flags.append("--no-hf")
    args = parser.parse_args(flags)
    # The progress lines (INFO) the command logs, kept beside the outputs.
    logger = logging.getLogger(bench_command.__name__)
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        assert bench_command.run(args) == 0
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    (out / "log.txt").write_text("\n".join(lines) + "\n")
    return out


@pytest.fixture(scope="module")
def record(run_dir) -> dict:
    return json.loads((run_dir / "speed_grid.json").read_text())


def test_compilation_and_warm_up_say_what_they_do_one_line_each(record, run_dir):
    """bench sat behind one "compiling" line for minutes: now each phase program's compile time
    and each variant's warm-up are a line as they end."""
    log = (run_dir / "log.txt").read_text()
    (suite,) = record["suites"]
    for variant, phases in suite["programs"].items():
        for phase, row in phases.items():
            assert (f"[tiny] {variant} {phase}: compiled in {row['compile_s']:.1f} s (its "
                    "FLOP-count form in") in log
    for variant, seconds in suite["warmup_s"].items():
        assert f"[tiny] warm-up {variant}: {seconds:.1f} s" in log
    assert "compile times: " in (run_dir / "speed_grid.md").read_text()


def test_runs_end_to_end_on_every_variant(record, run_dir):
    (suite,) = record["suites"]
    peer = {bench.HF_PEER} if HAVE_TORCH else set()
    assert set(suite["results"]) == {bench.FULL, "k=1", "k=2"} | peer
    for row in suite["results"].values():
        assert row["seconds"]["total"] > 0
        assert math.isfinite(row["speedup"]) and row["speedup"] > 0
    assert suite["results"]["k=2"]["ideal_speedup"] == pytest.approx(3.0)
    if HAVE_TORCH:
        # Same weights in both frameworks: the peer's span scores equal our full model's.
        assert suite["hf_max_logit_difference"] < 1e-4
    if HAVE_MATPLOTLIB:
        assert (run_dir / "speed_grid.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_compiled_flops_match_the_formula(record):
    """XLA's count of every phase program (the pair program with its reuses, the passages'
    attention statistics in NI P) is within 2% of the analytical matmul count."""
    (suite,) = record["suites"]
    ratios = {(variant, phase): stats["xla_over_analytical"]
              for variant, phases in suite["programs"].items()
              for phase, stats in phases.items() if stats["analytical_flops_per_call"]}
    assert len(ratios) == 7  # full: I Q-P; k = 1, 2: NI Q, NI P, I Q-P
    bad = {key: r for key, r in ratios.items() if abs(r - 1) > FLOP_TOLERANCE}
    assert not bad, f"XLA/analytical FLOPs off by more than 2%: {bad}"
    assert suite["reuse"] is True


def test_flop_check_catches_a_wrong_count():
    """The 2% check has teeth: counting one block too few (k=1 of 3) is far outside it, and so
    is counting the hoisted q/k/v projections in the pairs."""
    reader, _ = bench.suite_model("tiny", question_len=16)
    config, params = reader.config, reader.params
    # Batched attention: on CPU XLA counts the per-example attention loop's body once.
    model = DelayedInteractionModel(config.replace(num_lower_layers=1, attention_form="batched"))
    # One device: the formula counts the 2 pairs of one program. On N devices (a suite run
    # with forced host devices) the chunk pads to N pairs and XLA reports one device's share.
    reader = PairGrid(model, data_mesh(jax.devices()[:1]), batch_size=2, chunk_size=2)
    flops = bench.program_stats(bench.lower_phase(reader, params, "pairs", 2, 2, 16, 48)).flops
    right = bench.phase_flops(model.config, "pairs", 2, 16, 48)
    wrong = bench.phase_flops(config.replace(num_lower_layers=2), "pairs", 2, 16, 48)
    assert abs(flops / right - 1) <= FLOP_TOLERANCE
    assert abs(flops / wrong - 1) > 3 * FLOP_TOLERANCE
    # The pair program reads the first upper block's q/k/v precomputed: counting their
    # projections in each pair (2 pairs of 64 tokens, 6 n h^2 each) would be ~14% too many.
    not_hoisted = right + bench.projection_flops(config, 2, 64)
    assert abs(flops / not_hoisted - 1) > 2 * FLOP_TOLERANCE


@pytest.mark.parametrize("k", [1, 2])
def test_flops_with_and_without_reuse_match_xla(k):
    """Both pair programs, the reference (reuse=False) and the reused one, are each within 2%
    of their own formula and more than 3x that from the other one's (k = 2 of 3: both reuses
    in one block; k = 1: the statistics in block 2, the rows in block 3). NI P with and without
    the passages' attention statistics is within 2% of its formula too (the statistics are
    only 1-2% of that phase here: too few to tell the two formulas apart)."""
    reader, _ = bench.suite_model("tiny", question_len=16)
    config, params = reader.config, reader.params
    model = DelayedInteractionModel(config.replace(num_lower_layers=k, attention_form="batched"))
    counts = {}
    for reuse in (True, False):
        reader = PairGrid(model, data_mesh(jax.devices()[:1]), batch_size=2, chunk_size=2,
                          reuse=reuse)
        for phase in ("ni_p", "pairs"):
            counts[reuse, phase] = bench.program_stats(
                bench.lower_phase(reader, params, phase, 2, 2, 16, 48)).flops
    for (reuse, phase), flops in counts.items():
        right = bench.phase_flops(model.config, phase, 2, 16, 48, reuse)
        other = bench.phase_flops(model.config, phase, 2, 16, 48, not reuse)
        assert abs(flops / right - 1) <= FLOP_TOLERANCE, (reuse, phase, flops / right)
        if phase == "pairs":
            assert abs(flops / other - 1) > 3 * FLOP_TOLERANCE, (reuse, flops / other)


def test_pair_block_flops_formula():
    """By hand, h = 8, f = 16, q = 3, p = 5 (n = 8), one pair: every row with projections is
    block_flops; the last block at k = l - 1 with both reuses and hoisted projections computes
    r = 1 + 5 rows: scores and context 4 h (1 * 8 + 5 * 3), W_o 2 r h^2, FFN 4 r h f."""
    config = bench.EncoderConfig(hidden_size=8, embedding_size=8, num_heads=2,
                                 intermediate_size=16)
    assert bench.pair_block_flops(config, 1, 3, 5) == bench.block_flops(config, 1, 8)
    reused = bench.pair_block_flops(config, 1, 3, 5, projections=False, question_rows=1,
                                    passage_stats=True)
    assert reused == 4 * 8 * (8 + 15) + 2 * 6 * 64 + 4 * 6 * 8 * 16
    # Projections in the pair: K, V on all 8 rows, Q on the 6 computed ones.
    assert bench.pair_block_flops(config, 1, 3, 5, question_rows=1, passage_stats=True) == (
        reused + 4 * 8 * 64 + 2 * 6 * 64)
    assert bench.passage_stats_flops(config, 2, 5) == 2 * 4 * 25 * 8


def test_block_flops_formula():
    config = bench.EncoderConfig(hidden_size=8, embedding_size=8, num_heads=2,
                                 intermediate_size=16)
    # 8 n h^2 + 4 n h f + 4 n^2 h with n = 3, h = 8, f = 16, for a batch of 2.
    assert bench.block_flops(config, 2, 3) == 2 * (8 * 3 * 64 + 4 * 3 * 8 * 16 + 4 * 9 * 8)


def test_pair_memory_is_flat_in_the_number_of_pairs(record):
    """Chunks of fixed size: the pair program's temporaries do not grow with q x p."""
    (suite,) = record["suites"]
    for rows in suite["pair_memory_scaling"].values():
        assert len({row["temp_bytes"] for row in rows}) == 1
        assert rows[-1]["num_pairs"] > 100 * rows[0]["num_pairs"]


def test_json_record_is_well_formed(record):
    for key in ("command", "machine", "threads", "load_before", "load_after", "suites"):
        assert key in record
    assert record["machine"]["device_kind"]
    if HAVE_TORCH:
        assert record["threads"]["torch_intra_op_threads"] == record["threads"][
            "xla_intra_op_threads"]
    (suite,) = record["suites"]
    assert suite["grid"] == {"num_questions": 4, "num_passages": 3, "question_len": 16,
                             "passage_len": 48}
    for name, runs in suite["runs"].items():
        assert len(runs) == 1 and set(runs[0]) == set(bench.PHASES), name


def test_markdown_tables_are_well_formed(run_dir, record):
    text = (run_dir / "speed_grid.md").read_text()
    assert text == bench_report.render_markdown(record)
    tables, current = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            current.append(line)
        elif current:
            tables.append(current)
            current = []
    assert len(tables) == 4  # timing, targets, FLOPs, memory
    for table in tables:
        columns = {row.count("|") for row in table}
        assert len(columns) == 1, table
        assert set(table[1].replace("|", "")) == {"-"}


def test_batched_attention_is_the_same_math():
    """The CPU per-example attention loop and the batched form give the same span scores."""
    reader, _ = bench.suite_model("tiny", question_len=16)
    config, params = reader.config, reader.params
    model = DelayedInteractionModel(config)
    grid = bench.random_grid(bench.GridSpec(3, 1, 16, 48), config.vocab_size)
    q_mask = grid.q_mask.copy()
    q_mask[1, 10:] = 0  # padding, so the masks differ across the batch
    args = (params, grid.q_ids, q_mask, np.repeat(grid.p_ids, 3, 0),
            np.repeat(grid.p_mask, 3, 0))
    looped = model(*args)
    batched = DelayedInteractionModel(config.replace(attention_form="batched"))(*args)
    np.testing.assert_allclose(looped.start_logits, batched.start_logits, atol=1e-5)
    np.testing.assert_allclose(looped.null_end_logits, batched.null_end_logits, atol=1e-5)
    assert jax.default_backend() != "cpu" or attends_per_example(config)


def test_summary_arithmetic():
    grid = bench.GridSpec(2, 5, 4, 8)
    config = bench.EncoderConfig(num_layers=4)
    runs = {bench.FULL: [{"ni_q": 0.0, "ni_p": 0.0, "pairs": 4.0}],
            "k=3": [{"ni_q": 0.6, "ni_p": 1.5, "pairs": 1.0}]}
    results = bench.summarize(runs, config, grid, projection=(4, 10))
    row = results["k=3"]
    assert row["speedup"] == pytest.approx(4.0 / 3.1)
    assert row["pair_speedup"] == pytest.approx(4.0)
    assert row["ideal_speedup"] == pytest.approx(4.0)
    assert row["per_block_per_input"] == pytest.approx(
        {"ni_q": 0.6 / 6, "ni_p": 1.5 / 15, "pairs": 1.0 / 10})
    # q, p doubled: NI Q and NI P double, I Q-P quadruples.
    assert row["projected_speedup"] == pytest.approx(16.0 / (1.2 + 3.0 + 4.0))


def test_others_cpu_share():
    assert bench.others_cpu_share((10.0, 2.0), (14.0, 5.0), 2.0) == 0.5
    assert bench.others_cpu_share(None, (1.0, 1.0), 1.0) is None


def test_the_peer_runs_on_the_readers_kind_of_device():
    """CPU with CPU, CUDA with a GPU; never the host CPU against an accelerator."""
    assert bench.peer_device("cpu", cuda_available=True)[0] == "cpu"
    assert bench.peer_device("gpu", cuda_available=True)[0] == "cuda"
    device, why = bench.peer_device("gpu", cuda_available=False)
    assert device is None and "no CUDA" in why
    device, why = bench.peer_device("tpu", cuda_available=False)
    assert device is None and "'tpu'" in why
