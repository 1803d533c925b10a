"""Timed passes over a grid, and the figures made of them.

One warm-up pass per variant (compiles, and touches every buffer) is excluded; every measured
pass ends with the device work synchronised (`jax.block_until_ready`, or the numpy copy of the
outputs); the variants are interleaved within each repeat, so that load from other processes on
a shared machine falls on all of them alike; each figure is the median of the repeats.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from dil_jax.bench.grids import PHASES, GridInputs, GridSpec
from dil_jax.bench.machine import load_average
from dil_jax.model.delayed import Params
from dil_jax.model.encoder_config import EncoderConfig
from dil_jax.reading.grid import PairGrid
from dil_jax.reading.pairs import SpanScores


def _ready(x: Any) -> Any:
    return jax.block_until_ready(x)


def run_delayed_grid(reader: PairGrid, params: Params, inputs: GridInputs,
                     max_pairs: int | None = None) -> tuple[dict[str, float], SpanScores | None]:
    """One timed pass over the grid: seconds per phase, and the grid's span scores.

    With `max_pairs` only that many pairs are read and no output is returned (the warm-up: it
    compiles the very programs the full pass runs, whose shapes do not depend on the pair count).
    """
    def segments(encode, ids: np.ndarray, mask: np.ndarray, stats: bool
                 ) -> tuple[Any, Any, Any]:
        """Lower states (and, for 0 < k < l, their first-upper-block q/k/v, and with `stats`
        the passages' attention statistics), ready."""
        lower = encode(params, ids, mask)
        qkv = reader.project_segments(params, lower) if reader.plan.hoists_projections else None
        p_stats = reader.passage_attention_stats(qkv, mask) if stats else None
        return _ready((lower, qkv, p_stats))

    times = {}
    start = time.perf_counter()
    q_lower, q_qkv, _ = segments(reader.encode_questions, inputs.q_ids, inputs.q_mask, False)
    times["ni_q"] = time.perf_counter() - start
    start = time.perf_counter()
    # At k = 0 the passage side is the ids (the full model embeds them inside the pair program).
    # The passages' attention statistics are per-passage work: timed in NI P, like their q/k/v.
    p_source, p_qkv, p_stats = segments(reader.passage_side, inputs.p_ids, inputs.p_mask,
                                        reader.plan.passage_stats)
    times["ni_p"] = time.perf_counter() - start
    start = time.perf_counter()
    if max_pairs is None:
        output = reader.read_grid(params, q_lower, inputs.q_mask, p_source, inputs.p_mask,
                                  q_qkv, p_qkv, p_stats)
    else:
        output = None
        index = np.zeros(max_pairs, np.int32)
        for _, chunk in reader.iter_pair_chunks(params, q_lower, inputs.q_mask, p_source,
                                                inputs.p_mask, index, index, q_qkv=q_qkv,
                                                p_qkv=p_qkv, p_stats=p_stats):
            _ready(chunk)
    times["pairs"] = time.perf_counter() - start
    return times, output


# One variant's timed pass: max_pairs (None: the whole grid) -> (seconds per phase, span scores
# or None); `run_delayed_grid` and `peer.run_hf_grid` bound to their model and inputs.
Runner = Callable[[int | None], tuple[dict[str, float], SpanScores | None]]


def warm_up(runners: dict[str, Runner], num_pairs: int,
            log: Callable[[str], None] | None = None) -> dict[str, float]:
    """One chunk per variant (compiles every program the timed passes run); seconds each,
    each also given to `log` as it ends."""
    seconds = {}
    for name, runner in runners.items():
        start = time.perf_counter()
        runner(num_pairs)
        seconds[name] = time.perf_counter() - start
        if log is not None:
            log(f"warm-up {name}: {seconds[name]:.1f} s")
    return seconds


def timed_repeats(runners: dict[str, Runner], repeats: int, log: Callable[[str], None]
                   ) -> tuple[dict[str, list[dict[str, float]]], dict[str, SpanScores]]:
    """Every variant once per repeat, interleaved so that load drift hits all of them alike.

    Returns the phase times of every pass and each variant's span scores from the first.
    """
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in runners}
    outputs: dict[str, SpanScores] = {}
    for repeat in range(repeats):
        for name, runner in runners.items():
            times, output = runner(None)
            runs[name].append(times)
            if output is not None and name not in outputs:
                outputs[name] = output
            log(f"repeat {repeat + 1}/{repeats} {name}: {sum(times.values()):.3f} s "
                f"(load {load_average()[0]})")
    return runs, outputs


def median_times(runs: list[dict[str, float]]) -> dict[str, float]:
    """Median seconds of each phase over the passes, and the median of the passes' totals."""
    medians = {phase: statistics.median(run[phase] for run in runs) for phase in PHASES}
    medians["total"] = statistics.median(sum(run[p] for p in PHASES) for run in runs)
    return medians


def normalized_times(times: dict[str, float], config: EncoderConfig, k: int,
                     grid: GridSpec) -> dict[str, float | None]:
    """The paper's parenthesised figures: seconds per block per input of each phase.

    NI Q / (k q), NI P / (k p), I Q-P / ((l - k) q p); None where a phase runs no block.
    """
    upper = config.num_layers - k
    return {
        "ni_q": times["ni_q"] / (k * grid.num_questions) if k else None,
        "ni_p": times["ni_p"] / (k * grid.num_passages) if k else None,
        "pairs": times["pairs"] / (upper * grid.num_pairs) if upper else None,
    }


def projected_total(times: dict[str, float], grid: GridSpec, num_questions: int,
                    num_passages: int) -> float:
    """Seconds this variant would take on another grid, from its measured per-input costs.

    Each phase is linear in its inputs: NI Q in q, NI P in p, I Q-P in q p (fixed-size batches
    and chunks), so T(q', p') = NI_Q q'/q + NI_P p'/p + I_QP q'p'/(q p). A projection, not a
    measurement; it ignores the padding of the last batch or chunk.
    """
    return (times["ni_q"] * num_questions / grid.num_questions
            + times["ni_p"] * num_passages / grid.num_passages
            + times["pairs"] * num_questions * num_passages / grid.num_pairs)
