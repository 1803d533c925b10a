"""QANet and BiDAF on a q x p grid: how much of their cost is per passage, and so cacheable.

QANet and BiDAF have one fixed split (`encode_lower` per segment, `encode_upper` per pair), so a
suite times two variants instead of the BERT family's k:

  whole    every pair through the whole reader (`CharReader.outputs`: question and passage
           encoded again in every pair, as QANet normally runs), `chunk_size` pairs a call; all
           of its time is I Q-P;
  delayed  `CharPairGrid`: NI Q (`encode_questions`), NI P (`encode_passages`, what an offline
           cache holds) and I Q-P (`read_grid`: `encode_upper` per pair).

Both are timed in the same process, interleaved in every repeat (`timing.timed_repeats`), on the
same random ids and characters (`grids.random_char_grid`). The summary gives NI P's share of the
delayed total and the speedup of the online part (NI Q + I Q-P, passages cached) over whole;
`char_program_profile` adds XLA's cost analysis of each compiled phase program (the BERT formula
of `flops.py` does not apply). XLA counts a while loop's body once (BiDAF's LSTMs are
`lax.scan`s): such programs are flagged `counts_loop_body_once` and their FLOPs are a lower bound.
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from dil_jax.bench.grids import DELAYED, PHASES, WHOLE, CharGridInputs, GridSpec, random_char_grid
from dil_jax.bench.machine import cpu_snapshot, others_cpu_share, thread_counts
from dil_jax.bench.peer import max_logit_difference
from dil_jax.bench.programs import program_stats
from dil_jax.bench.timing import Runner, median_times, projected_total, timed_repeats, warm_up
from dil_jax.defaults import BENCH_CHAR_SUITES
from dil_jax.mesh import DATA_AXIS, data_mesh
from dil_jax.model.bidaf_config import BiDAFConfig
from dil_jax.model.char_reader import char_model, config_fields
from dil_jax.model.qanet import Variables
from dil_jax.model.qanet_config import QANetConfig
from dil_jax.model.span_reader import PADDED_LOGIT
from dil_jax.readers.char import CharReader
from dil_jax.readers.protocol import TokenRows
from dil_jax.reading.char_grid import CharPairGrid
from dil_jax.reading.pairs import SpanScores
from dil_jax.rounding import ceil_div, round_up

CHAR_SUITES = BENCH_CHAR_SUITES
# Tiny shapes for tests: every stage present, each small. The vocabulary holds grids.CLS_ID and
# SEP_ID (101, 102): an id past the table would read NaN.
_TINY = {
    "qanet-tiny": dict(vocab_size=1000, word_dim=12, max_chars=6, char_dim=8, char_filters=10,
                       char_kernel=3, d_model=16, num_heads=2, ffn_dim=20, embedding_kernel=5,
                       model_blocks=2, model_kernel=3),
    "bidaf-tiny": dict(vocab_size=1000, word_dim=12, max_chars=6, char_dim=4, char_filters=8,
                       char_kernel=3, hidden=8),
}
_CONFIG_TYPES = {"qanet": QANetConfig, "bidaf": BiDAFConfig}


def char_suite_model(name: str, question_len: int, seed: int = 0
                     ) -> tuple[CharReader, str]:
    """(the reader, where its variables came from) of a QANet / BiDAF suite.

    qanet, bidaf: the papers' shapes (`QANetConfig()`, `BiDAFConfig()`: the 30522 x 384 word
    table), randomly initialised (the table too: the cost does not depend on the weights);
    qanet-tiny, bidaf-tiny: tiny shapes, for tests.
    """
    if name not in CHAR_SUITES:
        raise ValueError(f"unknown QANet / BiDAF suite {name!r}; suites: {list(CHAR_SUITES)}")
    config_type = _CONFIG_TYPES[CHAR_SUITES[name]]
    config = config_type(max_question_len=question_len, **_TINY.get(name, {}))
    model = char_model(config)
    shape = "tiny" if name in _TINY else f"{config_type.__name__}() shape"
    return (CharReader(model, model.init(jax.random.key(seed))),
            f"random init, {shape} (word table random too)")


@dataclasses.dataclass
class CharSuiteSpec:
    """One QANet / BiDAF reader on one grid: the whole and the delayed variants."""

    name: str
    reader: CharReader
    grid: GridSpec
    weights: str  # where the variables came from, for the record
    repeats: int = 3
    batch_size: int = 8
    chunk_size: int = 8
    seed: int = 0


class WholeReaderGrid:
    """Every pair of a grid through the whole reader (`CharReader.outputs`), in chunks.

    The same mesh, shardings and chunking as `CharPairGrid`'s pair program: the segments' ids,
    characters and masks are replicated, each device gathers its own pairs from them by index
    and reads them whole (both segments encoded in the pair).
    """

    def __init__(self, reader: CharReader, mesh: Mesh | None = None, chunk_size: int = 8):
        self.reader = reader
        self.mesh = data_mesh() if mesh is None else mesh
        self.chunk_size = round_up(chunk_size, self.mesh.devices.size)
        self.replicated = NamedSharding(self.mesh, P())
        self.sharded = NamedSharding(self.mesh, P(DATA_AXIS))

    def _read_chunk(self, variables, q_ids, q_chars, q_mask, p_ids, p_chars, p_mask, q_index,
                    p_index):
        out = self.reader.outputs(variables, {
            "q_ids": q_ids[q_index], "q_chars": q_chars[q_index], "q_mask": q_mask[q_index],
            "p_ids": p_ids[p_index], "p_chars": p_chars[p_index], "p_mask": p_mask[p_index]})
        return out.start_logits, out.end_logits, out.null_start_logits, out.null_end_logits

    @functools.cached_property
    def _pair_fn(self):
        rep, shard = self.replicated, self.sharded
        return jax.jit(self._read_chunk, in_shardings=(rep,) * 7 + (shard, shard),
                       out_shardings=shard)

    def lowered(self, *abstract_args: Any) -> jax.stages.Lowered:
        """The pair program lowered for these argument shapes (those of `_read_chunk`)."""
        return self._pair_fn.lower(*abstract_args)

    def iter_pair_chunks(self, variables: Variables, inputs: CharGridInputs,
                         q_index: np.ndarray, p_index: np.ndarray
                         ) -> Iterator[tuple[np.ndarray, tuple[jax.Array, ...]]]:
        """(rows of the pair list, device outputs) per chunk, as `CharPairGrid.iter_pair_chunks`
        (the last chunk padded with its first pair; only the first len(rows) rows are real)."""
        segments = [jax.device_put(np.asarray(a), self.replicated) for a in (
            inputs.q_ids, inputs.q_chars, inputs.q_mask, inputs.p_ids, inputs.p_chars,
            inputs.p_mask)]
        q_index, p_index = np.asarray(q_index, np.int32), np.asarray(p_index, np.int32)
        for begin in range(0, len(q_index), self.chunk_size):
            rows = np.arange(begin, min(begin + self.chunk_size, len(q_index)))
            pad = self.chunk_size - len(rows)
            chunk_q = np.pad(q_index[rows], (0, pad), mode="edge")
            chunk_p = np.pad(p_index[rows], (0, pad), mode="edge")
            yield rows, self._pair_fn(variables, *segments, chunk_q, chunk_p)

    def read_grid(self, variables: Variables, inputs: CharGridInputs) -> SpanScores:
        """Every (question, passage) pair: scores [nq, np, p_len] / [nq, np], as
        `CharPairGrid.read_grid`."""
        nq, np_ = len(inputs.q_ids), len(inputs.p_ids)
        q_index, p_index = (a.ravel() for a in np.meshgrid(np.arange(nq), np.arange(np_),
                                                           indexing="ij"))
        out = SpanScores.full(nq * np_, inputs.p_ids.shape[1], np.nan, np.nan)
        for rows, outputs in self.iter_pair_chunks(variables, inputs, q_index, p_index):
            out.set_rows(rows, SpanScores(*(np.asarray(v)[:len(rows)] for v in outputs)))
        return out.reshape(nq, np_)


def _ready(x: Any) -> Any:
    return jax.block_until_ready(x)


def run_whole_grid(whole: WholeReaderGrid, variables: Variables, inputs: CharGridInputs,
                   max_pairs: int | None = None) -> tuple[dict[str, float], SpanScores | None]:
    """One timed pass of the whole reader: all its time is I Q-P (NI Q and NI P are 0, as the
    peer's). With `max_pairs`, only that many pairs and no output (the warm-up)."""
    start = time.perf_counter()
    if max_pairs is None:
        output = whole.read_grid(variables, inputs)
    else:
        output, index = None, np.zeros(max_pairs, np.int32)
        for _, chunk in whole.iter_pair_chunks(variables, inputs, index, index):
            _ready(chunk)
    return {"ni_q": 0.0, "ni_p": 0.0, "pairs": time.perf_counter() - start}, output


def run_char_delayed_grid(reader: CharReader, grid: CharPairGrid, variables: Variables,
                          inputs: CharGridInputs, max_pairs: int | None = None
                          ) -> tuple[dict[str, float], SpanScores | None]:
    """One timed pass of the reader's `CharPairGrid`: NI Q, NI P, I Q-P in seconds, and the
    grid's span scores (as `timing.run_delayed_grid` times a `PairGrid`)."""
    reader = reader.with_params(variables)
    times = {}
    start = time.perf_counter()
    q_state = _ready(reader.encode_questions(
        grid, TokenRows(inputs.q_ids, inputs.q_mask, inputs.q_chars)))
    times["ni_q"] = time.perf_counter() - start
    start = time.perf_counter()
    p_state = _ready(reader.passage_side(
        grid, TokenRows(inputs.p_ids, inputs.p_mask, inputs.p_chars)))
    times["ni_p"] = time.perf_counter() - start
    start = time.perf_counter()
    if max_pairs is None:
        output = grid.read_grid(variables, q_state, inputs.q_mask, p_state, inputs.p_mask)
    else:
        output, index = None, np.zeros(max_pairs, np.int32)
        for _, chunk in grid.iter_pair_chunks(variables, q_state, inputs.q_mask, p_state,
                                              inputs.p_mask, index, index):
            _ready(chunk)
    times["pairs"] = time.perf_counter() - start
    return times, output


def _spec(shape: tuple[int, ...], dtype: Any) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype)


def char_phase_programs(whole: WholeReaderGrid, delayed: CharPairGrid, variables: Variables,
                        spec: GridSpec) -> dict[str, dict[str, tuple[list[Any], int, int]]]:
    """{variant: {phase: ([the Lowered programs of one call], calls, inputs per call)}}, from
    shapes (nothing runs): whole's pair program over `whole.chunk_size` pairs; delayed's
    `encode_lower` over a batch of questions, of passages, and its pair program (untrimmed)."""
    config = whole.reader.config
    abstract = jax.tree.map(lambda x: _spec(np.shape(x), x.dtype), variables)
    nq, np_, q_len, p_len = (spec.num_questions, spec.num_passages, spec.question_len,
                             spec.passage_len)
    batch, chunk, chars = delayed.batch_size, delayed.chunk_size, config.max_chars
    i32, u16, f32 = jnp.int32, jnp.uint16, jnp.float32

    def segment(n: int, length: int) -> tuple[jax.ShapeDtypeStruct, ...]:
        return _spec((n, length), i32), _spec((n, length, chars), u16), _spec((n, length), i32)

    width = config.hidden_size  # encode_lower's: QANet's d_model, BiDAF's 2 x hidden
    whole_chunk, index = _spec((whole.chunk_size,), i32), _spec((chunk,), i32)
    whole_programs = [whole.lowered(abstract, *segment(nq, q_len),
                                    *segment(np_, p_len), whole_chunk, whole_chunk)]
    pairs = [delayed.lowered("pairs", abstract, _spec((nq, q_len, width), f32),
                             _spec((nq, q_len), i32), _spec((np_, p_len, width), f32),
                             _spec((np_, p_len), i32), index, index, None, None)]
    return {
        WHOLE: {"pairs": (whole_programs, ceil_div(spec.num_pairs, whole.chunk_size),
                          whole.chunk_size)},
        DELAYED: {
            "ni_q": ([delayed.lowered("lower", abstract, *segment(batch, q_len))],
                     ceil_div(nq, batch), batch),
            "ni_p": ([delayed.lowered("lower", abstract, *segment(batch, p_len))],
                     ceil_div(np_, batch), batch),
            "pairs": (pairs, ceil_div(spec.num_pairs, chunk), chunk)},
    }


def char_program_profile(whole: WholeReaderGrid, delayed: CharPairGrid, variables: Variables,
                         spec: GridSpec, log: Callable[[str], None] | None = None
                         ) -> dict[str, dict[str, dict[str, Any]]]:
    """Per variant and phase: XLA's FLOPs of one call and of the grid (the padding of the last
    batch or chunk counted: the program does it), per input, memory and compile time."""
    num_devices = delayed.mesh.devices.size
    profile: dict[str, dict[str, dict[str, Any]]] = {}
    for variant, phases in char_phase_programs(whole, delayed, variables, spec).items():
        profile[variant] = {}
        for phase, (programs, calls, per_call) in phases.items():
            stats = program_stats(programs, num_devices)
            if log is not None:
                log(f"{variant} {phase}: compiled in {stats.compile_s:.1f} s")
            profile[variant][phase] = {
                "calls": calls, "inputs_per_call": per_call,
                "xla_flops_per_call": stats.flops, "xla_flops_per_input": stats.flops / per_call,
                "xla_flops": stats.flops * calls,
                "counts_loop_body_once": stats.has_loop,
                "bytes_accessed_per_call": stats.bytes_accessed,
                "argument_bytes": stats.argument_bytes, "output_bytes": stats.output_bytes,
                "temp_bytes": stats.temp_bytes, "xla_peak_bytes": stats.peak_bytes,
                "compile_s": stats.compile_s}
    return profile


def largest_real_logit(scores: SpanScores) -> float:
    """The largest |start| or |end| logit over real passage tokens (padding scores
    PADDED_LOGIT; QANet's and BiDAF's null logits are PADDED_LOGIT too)."""
    values = np.concatenate([scores.start_logits.ravel(), scores.end_logits.ravel()])
    real = values[values > PADDED_LOGIT / 2]
    return float(np.max(np.abs(real))) if real.size else 0.0


def summarize_char(runs: dict[str, list[dict[str, float]]], grid: GridSpec,
                   programs: dict[str, dict[str, dict[str, Any]]] | None = None
                   ) -> dict[str, Any]:
    """Medians per phase and what caching the passages buys, from the timed passes.

    delayed: ni_p_share = median NI P / median total; online_s = the median of the passes'
    NI Q + I Q-P (passages cached); speedup = whole's median total / delayed's, online_speedup =
    whole's / online_s; pair_speedup = whole's I Q-P / delayed's (many questions per passage).
    per_input_ms: NI Q per question, NI P per passage, I Q-P per pair. one_question: projected
    to one question per passage (`timing.projected_total` at q = p = 1, from per-input costs):
    NI P's share of a pair's delayed cost and the online speedup, what caching saves when every
    passage is asked once (SQuAD-style reading). With `programs` (char_program_profile), the same
    shares in XLA FLOPs.
    """
    medians = {name: median_times(values) for name, values in runs.items()}
    whole, delayed = medians[WHOLE], medians[DELAYED]
    online = statistics.median(run["ni_q"] + run["pairs"] for run in runs[DELAYED])

    def per_input(times: dict[str, float]) -> dict[str, float]:
        counts = {"ni_q": grid.num_questions, "ni_p": grid.num_passages,
                  "pairs": grid.num_pairs}
        return {phase: 1e3 * times[phase] / counts[phase] for phase in PHASES}

    whole_pair = projected_total(whole, grid, 1, 1)
    one_total = projected_total(delayed, grid, 1, 1)
    one_online = projected_total({**delayed, "ni_p": 0.0}, grid, 1, 1)
    results: dict[str, Any] = {
        WHOLE: {"seconds": whole, "per_input_ms": per_input(whole),
                "min_total_s": min(sum(run.values()) for run in runs[WHOLE])},
        DELAYED: {
            "seconds": delayed, "per_input_ms": per_input(delayed),
            "min_total_s": min(sum(run.values()) for run in runs[DELAYED]),
            "online_s": online, "ni_p_share": delayed["ni_p"] / delayed["total"],
            "speedup": whole["total"] / delayed["total"],
            "online_speedup": whole["total"] / online,
            "pair_speedup": whole["pairs"] / delayed["pairs"],
            "one_question": {"ni_p_share": (one_total - one_online) / one_total,
                             "speedup": whole_pair / one_total,
                             "online_speedup": whole_pair / one_online}},
    }
    if programs is not None:
        flops = {phase: stats["xla_flops"] for phase, stats in programs[DELAYED].items()}
        per = {phase: stats["xla_flops_per_input"] for phase, stats in programs[DELAYED].items()}
        whole_flops = programs[WHOLE]["pairs"]["xla_flops"]
        whole_per_pair = programs[WHOLE]["pairs"]["xla_flops_per_input"]
        results[DELAYED]["flops"] = {
            "ni_p_share": flops["ni_p"] / sum(flops.values()),
            "ratio": whole_flops / sum(flops.values()),
            "online_ratio": whole_flops / (flops["ni_q"] + flops["pairs"]),
            "one_question_ni_p_share": per["ni_p"] / sum(per.values()),
            "one_question_online_ratio": whole_per_pair / (per["ni_q"] + per["pairs"]),
            "whole_per_pair_over_phases": whole_per_pair / sum(per.values()),
            "counts_loop_body_once": any(s["counts_loop_body_once"] for phases in
                                         programs.values() for s in phases.values())}
    return results


def run_char_suite(suite: CharSuiteSpec, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Times the whole and the delayed reader on one grid, interleaved; returns the record."""
    grid, reader = suite.grid, suite.reader
    config = reader.config
    inputs = random_char_grid(grid, config.vocab_size, config.max_chars, suite.seed)
    mesh = data_mesh()
    variables = jax.device_put(reader.params, NamedSharding(mesh, P()))
    # Capped by the grid, as `suites._readers`: a batch past the segments would time padding.
    batch = min(suite.batch_size, grid.num_questions, grid.num_passages)
    chunk = min(suite.chunk_size, grid.num_pairs)
    # No padding in a random grid, so trimming would cut nothing: both variants read full widths.
    delayed = reader.pair_grid(mesh, batch, chunk, trim_padding=False)
    whole = WholeReaderGrid(reader, mesh, chunk)
    runners: dict[str, Runner] = {
        WHOLE: lambda max_pairs: run_whole_grid(whole, variables, inputs, max_pairs),
        DELAYED: lambda max_pairs: run_char_delayed_grid(reader, delayed, variables, inputs,
                                                         max_pairs)}

    def say(line: str) -> None:
        log(f"[{suite.name}] {line}")

    record: dict[str, Any] = {
        "name": suite.name, "kind": reader.kind, "weights": suite.weights,
        "config": config_fields(config), "grid": dataclasses.asdict(grid),
        "variants": [WHOLE, DELAYED], "batch_size": delayed.batch_size,
        "chunk_size": delayed.chunk_size, "repeats": suite.repeats,
        "threads": thread_counts()}
    say("compiling and analysing the phase programs (a line per phase)")
    record["programs"] = char_program_profile(whole, delayed, variables, grid, say)
    say("warm-up: one chunk per variant")
    record["warmup_s"] = warm_up(runners, chunk, say)
    cpu_before, start = cpu_snapshot(), time.perf_counter()
    runs, outputs = timed_repeats(runners, suite.repeats, say)
    record["timed_s"] = time.perf_counter() - start
    record["others_cpu_cores"] = others_cpu_share(cpu_before, cpu_snapshot(), record["timed_s"])
    record["max_logit_difference"] = max_logit_difference(outputs[WHOLE], outputs[DELAYED])
    record["largest_real_logit"] = largest_real_logit(outputs[WHOLE])
    record["runs"] = runs
    record["results"] = summarize_char(runs, grid, record["programs"])
    return record
