"""Analytical matmul FLOPs of each phase, and the FLOP speedup they allow.

The formulas count 2 FLOPs per multiply-add of the matmuls only; `programs.flop_profile` sets
them next to XLA's count of the compiled programs (which also counts the elementwise work), and
tests/test_bench.py checks that the two agree within 5%. The measured (wall-time) speedups are
`suites.summarize`'s; it takes its FLOP bound from `grid_flops` here.
"""

from __future__ import annotations

from typing import Any

from dil_jax.bench.grids import FULL, PHASES, GridSpec
from dil_jax.config import EncoderConfig
from dil_jax.model.grid import hoists_projections


def block_flops(config: EncoderConfig, batch: int, seq: int) -> int:
    """Matmul FLOPs (2 per multiply-add) of one transformer block on [batch, seq] tokens.

    With hidden size h, feed-forward size f and n = seq tokens:
      Q, K, V projections  3 * 2 n h^2
      attention scores     2 n^2 h      (all heads: n^2 dot products of length h/heads each)
      attention context    2 n^2 h
      output projection    2 n h^2
      feed-forward         2 * 2 n h f
    total = batch * (8 n h^2 + 4 n h f + 4 n^2 h). Softmax, LayerNorm, GELU, bias adds and the
    residuals are elementwise (O(n h + heads n^2) per block): XLA's count includes them, this
    formula does not (benchmarks/README.md records by how much XLA's count exceeds it).
    """
    n, h, f = seq, config.hidden_size, config.intermediate_size
    return batch * (8 * n * h * h + 4 * n * h * f + 4 * n * n * h)


def embedding_flops(config: EncoderConfig, batch: int, seq: int) -> int:
    """ALBERT's E -> H projection, 2 n E h; lookups cost no matmul (0 for BERT/DistilBERT)."""
    if config.architecture != "albert":  # ALBERT projects even when E == H (as transformers)
        return 0
    return batch * 2 * seq * config.embedding_size * config.hidden_size


def projection_flops(config: EncoderConfig, batch: int, seq: int) -> int:
    """The Q, K, V projections of one block, 3 * 2 n h^2: the part of the first upper block
    that PairGrid computes per segment instead of per pair (0 < k < l)."""
    return batch * 6 * seq * config.hidden_size ** 2


def qa_head_flops(config: EncoderConfig, batch: int, seq: int) -> int:
    """The span head, a Dense(h -> 2) on every token: 2 n h * 2."""
    return batch * 4 * seq * config.hidden_size


def phase_flops(config: EncoderConfig, phase: str, batch: int, question_len: int,
                passage_len: int) -> int:
    """Analytical matmul FLOPs of ONE call of a phase's program on `batch` inputs.

    ni_q:  embeddings + k blocks on [batch, question_len] questions (+ the first upper
           block's q/k/v projections when 0 < k < l);
    ni_p:  the same on [batch, passage_len] passages;
    pairs: (k = 0: the passage embeddings) + l - k blocks on [batch, question_len + passage_len]
           pairs (less the first one's projections when 0 < k < l) + the span head.
    """
    k, l_ = config.num_lower_layers, config.num_layers
    hoisted = hoists_projections(config)
    if phase in ("ni_q", "ni_p"):
        n = question_len if phase == "ni_q" else passage_len
        return (embedding_flops(config, batch, n) + k * block_flops(config, batch, n)
                + (projection_flops(config, batch, n) if hoisted else 0))
    if phase == "pairs":
        n = question_len + passage_len
        embed = embedding_flops(config, batch, passage_len) if k == 0 else 0
        upper = (l_ - k) * block_flops(config, batch, n)
        if hoisted:
            upper -= projection_flops(config, batch, n)
        return embed + upper + qa_head_flops(config, batch, n)
    raise ValueError(f"unknown phase {phase!r}; phases: {PHASES}")


def grid_flops(config: EncoderConfig, grid: GridSpec) -> int:
    """Analytical FLOPs of a whole grid at split `config.num_lower_layers`, without padding.

    q * NI Q(1 question) + p * NI P(1 passage) + q p * I Q-P(1 pair); the full model (k = 0)
    has no NI P (its passages are embedded inside the pair program).
    """
    q_len, p_len = grid.question_len, grid.passage_len
    total = grid.num_pairs * phase_flops(config, "pairs", 1, q_len, p_len)
    total += grid.num_questions * phase_flops(config, "ni_q", 1, q_len, p_len)
    if config.num_lower_layers:
        total += grid.num_passages * phase_flops(config, "ni_p", 1, q_len, p_len)
    return total


def flop_speedups(programs: dict[str, dict[str, dict[str, Any]]]) -> dict[str, float]:
    """Analytical FLOPs of the full model's grid / each variant's: the speedup this grid allows.

    Counts every phase (and the padding of the last batch or chunk), so it is below
    l / (l - k) by exactly the cost of the lower blocks that the grid has to amortise.
    """
    totals = {name: sum(p["analytical_flops"] for p in phases.values())
              for name, phases in programs.items()}
    return {name: totals[FULL] / total for name, total in totals.items()}
