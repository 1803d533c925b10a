"""What XLA says of PairGrid's compiled phase programs: FLOPs, memory, compile time.

The programs are lowered from shapes (`PairGrid.lowered`) and compiled, never run; their
`Compiled.cost_analysis()` and `.memory_analysis()` are read next to the analytical count of
`flops.phase_flops`.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dil_jax.bench.flops import phase_flops
from dil_jax.bench.grids import PHASES, GridSpec
from dil_jax.model.attention import PassageAttentionStats
from dil_jax.model.delayed import DelayedInteractionModel
from dil_jax.model.span_reader import PASSAGE_SEGMENT, QUESTION_SEGMENT
from dil_jax.reading.grid import PairGrid
from dil_jax.rounding import ceil_div


@dataclasses.dataclass
class ProgramStats:
    """What XLA says of one compiled program (one call; bytes per device).

    flops: XLA's count, all ops (matmuls and elementwise), summed over the mesh's devices.
    has_loop: the compiled program holds a while loop (`lax.map`, `lax.scan`), whose body
      XLA's cost analysis counts once, not once per trip: `flops` is then a lower bound.
    peak_bytes: `peak_memory_in_bytes` as the backend reports it (0 where it reports none);
      argument + output + temp bytes is the footprint the buffer assignment allocates.
    """

    flops: float
    bytes_accessed: float
    argument_bytes: int
    output_bytes: int
    temp_bytes: int
    peak_bytes: int
    compile_s: float
    has_loop: bool = False


def _cost_dict(compiled: Any) -> dict[str, float]:
    """`cost_analysis()` is a dict in current JAX, a list with one dict per program in older."""
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else {}
    return dict(cost or {})


def _one_program_stats(lowered: Any, num_devices: int) -> ProgramStats:
    start = time.perf_counter()
    compiled = lowered.compile()
    compile_s = time.perf_counter() - start
    cost = _cost_dict(compiled)
    memory = compiled.memory_analysis()
    peak = getattr(memory, "peak_memory_in_bytes", None)
    return ProgramStats(
        flops=float(cost.get("flops", float("nan"))) * num_devices,
        bytes_accessed=float(cost.get("bytes accessed", float("nan"))),
        argument_bytes=int(getattr(memory, "argument_size_in_bytes", 0)),
        output_bytes=int(getattr(memory, "output_size_in_bytes", 0)),
        temp_bytes=int(getattr(memory, "temp_size_in_bytes", 0)),
        peak_bytes=int(peak or 0), compile_s=compile_s, has_loop=_has_loop(compiled))


# A while instruction in HLO text: `%while.3 = (...) while(...)`.
_WHILE = re.compile(r"\bwhile\(")


def _has_loop(compiled: Any) -> bool:
    """Whether the compiled program's HLO holds a while loop (False where no text is given)."""
    try:
        text = compiled.as_text()
    except Exception:  # backends without HLO text: nothing to say
        return False
    return bool(text and _WHILE.search(text))


def program_stats(lowered: Sequence[Any], num_devices: int = 1) -> ProgramStats:
    """Compiles the programs of one phase call (`jax.stages.Lowered`, run one after the other)
    and reads their cost and memory analyses: FLOPs, bytes and compile time add up; memory
    figures are the largest single program's (a projection's input, the lower states, counts
    as its arguments)."""
    stats = [_one_program_stats(one, num_devices) for one in lowered]
    return ProgramStats(
        flops=sum(s.flops for s in stats), bytes_accessed=sum(s.bytes_accessed for s in stats),
        argument_bytes=max(s.argument_bytes for s in stats),
        output_bytes=max(s.output_bytes for s in stats),
        temp_bytes=max(s.temp_bytes for s in stats), peak_bytes=max(s.peak_bytes for s in stats),
        compile_s=sum(s.compile_s for s in stats), has_loop=any(s.has_loop for s in stats))


def _spec(shape: Sequence[int], dtype: Any) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(tuple(shape), dtype)


def lower_phase(reader: PairGrid, params: Any, phase: str, num_questions: int,
                num_passages: int, question_len: int, passage_len: int) -> list[Any]:
    """The `jax.stages.Lowered` programs PairGrid runs for one call of `phase`, from shapes.

    These are PairGrid's own jitted programs (`PairGrid.lowered`), lowered with the shapes
    of one call: a batch of `PairGrid.batch_size` segments
    (encode_lower, then project_upper when 0 < k < l, then for passages
    passage_attention_stats when the reader uses them), or a chunk of `PairGrid.chunk_size` pairs
    over replicated [num_questions, ...] / [num_passages, ...] states (and their q/k/v and
    statistics).
    """
    config = reader.model.config
    abstract = jax.tree.map(lambda x: _spec(np.shape(x), jnp.float32), params)
    batch, chunk = reader.batch_size, reader.chunk_size
    h, heads, dtype = config.hidden_size, config.num_heads, config.compute_dtype

    def qkv(n: int, length: int) -> tuple[jax.ShapeDtypeStruct, ...]:
        return (_spec((n, heads, length, config.head_dim), dtype),) * 3

    def stats(n: int) -> PassageAttentionStats:
        row = _spec((n, heads, passage_len), jnp.float32)
        return PassageAttentionStats(
            row, row, _spec((n, heads, passage_len, config.head_dim), jnp.float32))

    if phase in ("ni_q", "ni_p"):
        length = question_len if phase == "ni_q" else passage_len
        segment = QUESTION_SEGMENT if phase == "ni_q" else PASSAGE_SEGMENT
        ids = _spec((batch, length), jnp.int32)
        programs = [reader.lowered("lower", abstract, ids, ids, segment)]
        if reader.plan.hoists_projections:
            lower = _spec((batch, length, h), dtype)
            programs.append(reader.lowered("project", abstract, lower))
        if phase == "ni_p" and reader.plan.passage_stats:
            mask = _spec((batch, passage_len), jnp.int32)
            programs.append(reader.lowered("stats", *qkv(batch, passage_len), mask))
        return programs
    if phase != "pairs":
        raise ValueError(f"unknown phase {phase!r}; phases: {PHASES}")
    q_lower = _spec((num_questions, question_len, h), dtype)
    if reader.plan.reads_passage_ids:
        p_source = _spec((num_passages, passage_len), jnp.int32)
    else:
        p_source = _spec((num_passages, passage_len, h), dtype)
    q_mask = _spec((num_questions, question_len), jnp.int32)
    p_mask = _spec((num_passages, passage_len), jnp.int32)
    index = _spec((chunk,), jnp.int32)
    q_qkv = p_qkv = p_stats = None
    if reader.plan.hoists_projections:
        q_qkv, p_qkv = qkv(num_questions, question_len), qkv(num_passages, passage_len)
    if reader.plan.passage_stats:
        p_stats = stats(num_passages)
    return [reader.lowered("pairs", abstract, q_lower, q_mask, p_source, p_mask, index, index,
                           None, q_qkv, p_qkv, p_stats)]


def phase_calls(reader: PairGrid, phase: str, spec: GridSpec) -> int:
    """How many calls a phase makes on the grid (batches or chunks, the last padded; a batch
    of segments is one encode_lower call, plus one project_upper call when 0 < k < l, plus for
    passages one passage_attention_stats call when the reader uses them)."""
    if phase == "ni_q":
        return ceil_div(spec.num_questions, reader.batch_size)
    if phase == "ni_p":
        if reader.plan.reads_passage_ids:
            return 0
        return ceil_div(spec.num_passages, reader.batch_size)
    return ceil_div(spec.num_pairs, reader.chunk_size)


def flop_profile(reader: PairGrid, params: Any, spec: GridSpec,
                 log: Callable[[str], None] | None = None) -> dict[str, dict[str, Any]]:
    """Per phase: XLA and analytical FLOPs of one call and of the whole grid, memory, compile.

    Memory and compile time are those of the program PairGrid runs; XLA's FLOPs are counted on
    the batched-attention form of the same program (`attention_form="batched"`). Why: on CPU the
    reader loops attention over the batch (`lax.map`, a while loop), and XLA's cost analysis
    counts a while-loop body once, not once per trip, so the attention FLOPs of all but one
    example would vanish from the count. The batched form is the same operations on the same
    shapes (outputs equal to float32 rounding), so its count is the program's FLOPs. Padding of
    the last batch or chunk is counted: it is work the program does. `log` gets one line per
    phase as its programs are compiled (minutes in all on a small CPU).
    """
    config = reader.model.config
    num_devices = reader.mesh.devices.size
    # Only lowered and compiled for its cost analysis, never run.
    accounting = PairGrid(DelayedInteractionModel(config.replace(attention_form="batched")),
                          reader.mesh, reader.batch_size, reader.chunk_size, reader.reuse)
    shapes = (spec.num_questions, spec.num_passages, spec.question_len, spec.passage_len)
    profile = {}
    for phase in PHASES:
        calls = phase_calls(reader, phase, spec)
        if calls == 0:
            continue
        stats = program_stats(lower_phase(reader, params, phase, *shapes), num_devices)
        counted = program_stats(lower_phase(accounting, params, phase, *shapes), num_devices)
        flops = counted.flops
        if log is not None:
            log(f"{phase}: compiled in {stats.compile_s:.1f} s (its FLOP-count form in "
                f"{counted.compile_s:.1f} s)")
        per_call = reader.chunk_size if phase == "pairs" else reader.batch_size
        analytical = phase_flops(config, phase, per_call, spec.question_len, spec.passage_len,
                                 reader.reuse)
        profile[phase] = {
            "calls": calls, "inputs_per_call": per_call,
            "xla_flops_per_call": flops, "analytical_flops_per_call": analytical,
            "xla_over_analytical": flops / analytical if analytical else None,
            "xla_flops": flops * calls, "analytical_flops": analytical * calls,
            # XLA's own count of the program as run (attention loop body counted once).
            "xla_flops_per_call_as_run": stats.flops,
            "bytes_accessed_per_call": stats.bytes_accessed,
            "argument_bytes": stats.argument_bytes, "output_bytes": stats.output_bytes,
            "temp_bytes": stats.temp_bytes, "xla_peak_bytes": stats.peak_bytes,
            "compile_s": stats.compile_s,
        }
    return profile


def pair_memory_scaling(reader: PairGrid, params: Any, grids: Sequence[tuple[int, int]],
                        question_len: int, passage_len: int,
                        log: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Compiled memory of the pair program for growing (q, p) grids; nothing is executed.

    The program reads one fixed-size chunk of pairs, so its temporaries are independent of q*p;
    only its arguments (the replicated lower states, [q + p] segments) grow, linearly in q + p.
    """
    rows = []
    for num_questions, num_passages in grids:
        stats = program_stats(lower_phase(reader, params, "pairs", num_questions, num_passages,
                                          question_len, passage_len))
        if log is not None:
            log(f"pairs program for q = {num_questions}, p = {num_passages}: compiled in "
                f"{stats.compile_s:.1f} s")
        rows.append({"num_questions": num_questions, "num_passages": num_passages,
                     "num_pairs": num_questions * num_passages,
                     "argument_bytes": stats.argument_bytes, "output_bytes": stats.output_bytes,
                     "temp_bytes": stats.temp_bytes, "xla_peak_bytes": stats.peak_bytes,
                     "footprint_bytes": (stats.argument_bytes + stats.output_bytes
                                         + stats.temp_bytes)})
    return rows
