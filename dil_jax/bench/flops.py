"""Analytical matmul FLOPs of each phase, and the FLOP speedup they allow.

The formulas count 2 FLOPs per multiply-add of the matmuls only; `programs.flop_profile` sets
them next to XLA's count of the compiled programs (which also counts the elementwise work), and
tests/bench/test_bench.py checks that the two agree within 2% per phase, with the pair program's
exact reuses (`PairGrid(reuse=True)`, the default) and without. The measured (wall-time)
speedups are `suites.summarize`'s; it takes its FLOP bound from `grid_flops` here.
"""

from __future__ import annotations

from typing import Any

from dil_jax.bench.grids import FULL, PHASES, GridSpec
from dil_jax.model.encoder_config import EncoderConfig
from dil_jax.reading.plan import ReusePlan


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
    return batch * (8 * n * h * h + 4 * n * h * f + 4 * n * n * h) + xlnet_position_flops(
        config, batch, seq, seq)


def xlnet_position_flops(config: EncoderConfig, batch: int, keys: int, rows: int) -> int:
    """What XLNet's relative attention (model/xlnet.py) adds to a block, 0 for the others.

    With n = keys tokens (2n - 1 relative distances) and r = query rows:
      position keys        2 (2n - 1) h^2   (the sinusoid table times W_r: once per block
                                             and call, not per batch element)
      position scores      2 r (2n - 1) h   (every row against every distance, before the
                                             gather picks n of them)
      segment scores       2 r 2 h          (against the two segment embeddings)
    """
    if config.architecture != "xlnet":
        return 0
    h, distances = config.hidden_size, 2 * keys - 1
    return 2 * distances * h * h + batch * (2 * rows * distances * h + 4 * rows * h)


def embedding_flops(config: EncoderConfig, batch: int, seq: int) -> int:
    """The E -> H projection of ALBERT (even when E == H, as transformers) and of ELECTRA with
    E != H, 2 n E h; lookups cost no matmul (0 for the others)."""
    if not config.projects_embeddings:
        return 0
    return batch * 2 * seq * config.embedding_size * config.hidden_size


def projection_flops(config: EncoderConfig, batch: int, seq: int) -> int:
    """The Q, K, V projections of one block, 3 * 2 n h^2: the part of the first upper block
    that PairGrid computes per segment instead of per pair (0 < k < l)."""
    return batch * 6 * seq * config.hidden_size ** 2


def passage_stats_flops(config: EncoderConfig, batch: int, passage_len: int) -> int:
    """The first upper block's passage x passage attention of one passage, 4 p^2 h (scores
    and weighted values, all heads): `PairGrid.passage_attention_stats`, computed per passage
    (NI P) and taken out of every pair's attention when the pair program reuses it."""
    return batch * 4 * passage_len ** 2 * config.hidden_size


def pair_block_flops(config: EncoderConfig, batch: int, question_len: int, passage_len: int,
                     *, projections: bool = True, question_rows: int | None = None,
                     passage_stats: bool = False) -> int:
    """Matmul FLOPs of one upper block on [batch] pairs of q + p tokens, as the pair program
    runs it.

    projections: whether the Q, K, V projections run in the pair (False: hoisted per segment);
    question_rows: how many question rows the block computes (None: all q; 1 in the last block
    when only `[CLS]` and the passage rows are read); passage_stats: whether the passage rows
    attend only the question's keys (the passage part comes from `passage_stats_flops`).
    With n = q + p key rows, r = question_rows + p computed rows and keys per passage row
    k_p = q (statistics) or n:
      K, V projections     2 * 2 n h^2   (every row is a key and a value)
      Q projection         2 r h^2
      scores and context   4 h (question_rows n + p k_p)
      output projection    2 r h^2
      feed-forward         4 r h f
    With every row, no statistics and the projections in, this is `block_flops` on n tokens.
    """
    h, f = config.hidden_size, config.intermediate_size
    n = question_len + passage_len
    asked = question_len if question_rows is None else question_rows
    rows = asked + passage_len
    passage_keys = question_len if passage_stats else n
    total = 4 * h * (asked * n + passage_len * passage_keys) + 2 * rows * h * h
    total += 4 * rows * h * f
    if projections:
        total += 4 * n * h * h + 2 * rows * h * h
    return batch * total + xlnet_position_flops(config, batch, n, rows)


def qa_head_flops(config: EncoderConfig, batch: int, seq: int) -> int:
    """The span head, a Dense(h -> 2) on every token: 2 n h * 2."""
    return batch * 4 * seq * config.hidden_size


def phase_flops(config: EncoderConfig, phase: str, batch: int, question_len: int,
                passage_len: int, reuse: bool = True) -> int:
    """Analytical matmul FLOPs of ONE call of a phase's program on `batch` inputs.

    ni_q:  embeddings + k blocks on [batch, question_len] questions (+ the first upper
           block's q/k/v projections when 0 < k < l);
    ni_p:  the same on [batch, passage_len] passages (+ with reuse, 0 < k < l: the first upper
           block's passage x passage attention statistics, `passage_stats_flops`);
    pairs: (k = 0: the passage embeddings) + l - k upper blocks on [batch] pairs of
           question_len + passage_len tokens (`pair_block_flops`: the first without its
           projections when 0 < k < l; with reuse its passage rows scoring only the question's
           keys when 0 < k < l, and the last computing only `[CLS]` and the passage rows) + the
           span head on the rows the last block computed.
    reuse: the pair program's exact reuses on (`PairGrid.reuse`, the default) or off.
    """
    k, l_ = config.num_lower_layers, config.num_layers
    hoisted = ReusePlan.for_config(config).hoists_projections
    # XLNet's pair program has no passage statistics (ReusePlan.passage_stats).
    stats = reuse and hoisted and config.architecture != "xlnet"
    if phase in ("ni_q", "ni_p"):
        n = question_len if phase == "ni_q" else passage_len
        total = (embedding_flops(config, batch, n) + k * block_flops(config, batch, n)
                 + (projection_flops(config, batch, n) if hoisted else 0))
        if phase == "ni_p" and stats:
            total += passage_stats_flops(config, batch, passage_len)
        return total
    if phase == "pairs":
        reads_ids = ReusePlan.for_config(config).reads_passage_ids
        embed = embedding_flops(config, batch, passage_len) if reads_ids else 0
        upper = 0
        for layer in range(k, l_):
            first, last = layer == k, layer == l_ - 1
            upper += pair_block_flops(
                config, batch, question_len, passage_len,
                projections=not (first and hoisted),
                question_rows=1 if reuse and last else None, passage_stats=first and stats)
        head_rows = (1 if reuse and l_ > k else question_len) + passage_len
        return embed + upper + qa_head_flops(config, batch, head_rows)
    raise ValueError(f"unknown phase {phase!r}; phases: {PHASES}")


def grid_flops(config: EncoderConfig, grid: GridSpec, reuse: bool = True) -> int:
    """Analytical FLOPs of a whole grid at split `config.num_lower_layers`, without padding,
    with the pair program's exact reuses on or off (`phase_flops`).

    q * NI Q(1 question) + p * NI P(1 passage) + q p * I Q-P(1 pair); the full model (k = 0)
    has no NI P (its passages are embedded inside the pair program).
    """
    q_len, p_len = grid.question_len, grid.passage_len
    total = grid.num_pairs * phase_flops(config, "pairs", 1, q_len, p_len, reuse)
    total += grid.num_questions * phase_flops(config, "ni_q", 1, q_len, p_len, reuse)
    if config.num_lower_layers:
        total += grid.num_passages * phase_flops(config, "ni_p", 1, q_len, p_len, reuse)
    return total


def flop_speedups(programs: dict[str, dict[str, dict[str, Any]]]) -> dict[str, float]:
    """Analytical FLOPs of the full model's grid / each variant's: the speedup this grid allows.

    Counts every phase (and the padding of the last batch or chunk), so it is below
    l / (l - k) by exactly the cost of the lower blocks that the grid has to amortise.
    """
    totals = {name: sum(p["analytical_flops"] for p in phases.values())
              for name, phases in programs.items()}
    return {name: totals[FULL] / total for name, total in totals.items()}
