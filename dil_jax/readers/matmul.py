"""Which dtype a reader's dense matmuls read (`--matmul-dtype`), chosen for this CPU.

    float32     exact: the default
    bfloat16    both operands rounded to bfloat16, float32 accumulation and everything else
                float32 (`EncoderConfig.matmul_dtype`): an approximation, named
    auto        bfloat16 where a short measurement at start-up finds its dot at least
                `BFLOAT16_MARGIN` times as fast as float32's (a CPU with AVX512-BF16 or AMX),
                else float32

A CPU without native bfloat16 products converts them in software, so a fixed choice would be
fitted to one machine; the measurement takes a dot of the shape a MiniLM block's
feed-forward reads (`MEASURED_SHAPE`), both ways, interleaved, the best of a few rounds.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from typing import Any

from dil_jax.defaults import BFLOAT16_MARGIN, MATMUL_CHOICES

log = logging.getLogger(__name__)

# [rows, hidden] x [hidden, intermediate]: one chunk's rows through a MiniLM feed-forward.
MEASURED_SHAPE = (256, 384, 1536)


@dataclasses.dataclass(frozen=True)
class MatmulTiming:
    """Seconds of one dot of `MEASURED_SHAPE` each way (the best of the rounds), and the
    choice they make (`choose_matmul_dtype`)."""

    float32_s: float
    bfloat16_s: float

    @property
    def speedup(self) -> float:
        return self.float32_s / self.bfloat16_s

    @property
    def chosen(self) -> str:
        return choose_matmul_dtype(self.float32_s, self.bfloat16_s)


def choose_matmul_dtype(float32_s: float, bfloat16_s: float,
                        margin: float = BFLOAT16_MARGIN) -> str:
    """"bfloat16" when its dot takes at most 1 / margin of float32's time, else "float32"."""
    return "bfloat16" if bfloat16_s * margin <= float32_s else "float32"


def _time_best(run: Any, rounds: int, calls: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            run()
        best = min(best, (time.perf_counter() - start) / calls)
    return best


@functools.cache
def measure_matmul(rounds: int = 5, calls: int = 10) -> MatmulTiming:
    """Times one dot of `MEASURED_SHAPE` in float32 and with bfloat16 operands (float32
    accumulation), interleaved round by round on the default device; once per process."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from dil_jax.model.attention import bfloat16_operands_dot

    rows, hidden, width = MEASURED_SHAPE
    rng = np.random.default_rng(0)
    lhs = jnp.asarray(rng.standard_normal((rows, hidden), np.float32))
    rhs = jnp.asarray(rng.standard_normal((hidden, width), np.float32))
    numbers = (((1,), (0,)), ((), ()))
    float32_dot = jax.jit(lambda a, b: jax.lax.dot_general(a, b, numbers))
    bfloat16_dot = jax.jit(lambda a, b: bfloat16_operands_dot(a, b, numbers))
    rhs_rounded = rhs.astype(jnp.bfloat16)  # held rounded, as `matmul_params` holds kernels
    runs = {"float32": lambda: float32_dot(lhs, rhs).block_until_ready(),
            "bfloat16": lambda: bfloat16_dot(lhs, rhs_rounded).block_until_ready()}
    for run in runs.values():
        run()  # compiled before timing
    best = {name: float("inf") for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            best[name] = min(best[name], _time_best(run, 1, calls))
    timing = MatmulTiming(best["float32"], best["bfloat16"])
    log.info("matmul dtype: a %s dot takes %.2f ms in float32, %.2f ms with bfloat16 operands "
             "(x%.2f): auto reads %s", "x".join(map(str, MEASURED_SHAPE)),
             timing.float32_s * 1e3, timing.bfloat16_s * 1e3, timing.speedup, timing.chosen)
    return timing


def resolve_matmul_dtype(choice: str, bfloat16_capable: bool) -> str:
    """The dtype a reader reads its matmuls in for a `--matmul-dtype` choice: "auto" ->
    `measure_matmul`'s choice for a reader that can read bfloat16 operands, float32 for one
    that cannot; "float32" / "bfloat16" as given."""
    if choice not in MATMUL_CHOICES:
        raise ValueError(f"matmul dtype {choice!r}: choose one of {list(MATMUL_CHOICES)}")
    if choice != "auto":
        return choice
    return measure_matmul().chosen if bfloat16_capable else "float32"


def matmul_reason(choice: str, reader: Any) -> str:
    """Why a reader's matmuls read what they read, in one line (`/v1/info`, the page): the
    `--matmul-dtype` choice, and for "auto" the start-up measurement behind it."""
    exactness = {"float32": "exact", "bfloat16": "approximate: operands rounded to bfloat16"}
    dtype = reader.matmul_dtype
    if choice != "auto":
        return f"--matmul-dtype {choice} ({exactness[dtype]})"
    if not reader.capabilities.bfloat16_matmuls:
        return f"--matmul-dtype auto: {reader.kind} readers read float32 only (exact)"
    timing = measure_matmul()
    return (f"--matmul-dtype auto: a bfloat16-operand dot ran x{timing.speedup:.2f} as fast as "
            f"float32's at start-up (bfloat16 from x{BFLOAT16_MARGIN}): {dtype} "
            f"({exactness[dtype]})")
