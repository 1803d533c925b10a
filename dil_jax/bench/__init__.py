"""Speed, FLOP and memory benchmark of a question x passage grid (the DeFormer/DilBert Table 1).

q questions and p passages, every (question, passage) pair read, by the full model (k = 0), by
each split k and by the Hugging Face PyTorch peer. Where each piece lives:

  grids.py     the grid (GridSpec, random_grid), its three phases and the variants' names
  flops.py     analytical FLOPs per phase, and the FLOP speedup of a split
  programs.py  XLA's FLOPs and memory of the compiled phase programs (nothing runs)
  timing.py    timed passes of our reader, warm-up, interleaved repeats, medians, normalisation
  peer.py      the PyTorch peer: its config, its model from our params, its device, its pass
  machine.py   versions, CPU, threads, load and the allocator setting of the machine
  suites.py    a suite (one model, one grid): run_suite, summarize, ratio_checks, the record
  char_suites.py  QANet / BiDAF: the whole reader on every pair vs CharPairGrid (passages once,
               cacheable), per phase, NI P's share, the online speedup, XLA's FLOPs
  report.py    Markdown tables and the PNG plot of a record

`dil-jax bench` (dil_jax/commands/bench.py) and benchmarks/speed_grid.py run it; the names below
are re-exported so that `from dil_jax import bench; bench.run_suite(...)` keeps working.
"""

from dil_jax.bench.char_suites import (
    CHAR_SUITES,
    CharSuiteSpec,
    WholeReaderGrid,
    char_program_profile,
    char_suite_model,
    run_char_suite,
    summarize_char,
)
from dil_jax.bench.flops import (
    block_flops,
    embedding_flops,
    flop_speedups,
    grid_flops,
    pair_block_flops,
    passage_stats_flops,
    phase_flops,
    projection_flops,
    qa_head_flops,
)
from dil_jax.bench.grids import (
    DELAYED,
    FULL,
    HF_PEER,
    PHASE_TITLES,
    PHASES,
    WHOLE,
    CharGridInputs,
    GridInputs,
    GridSpec,
    random_char_grid,
    random_grid,
    variant_name,
)
from dil_jax.bench.machine import (
    cpu_snapshot,
    load_average,
    machine_record,
    others_cpu_share,
    retain_freed_memory,
    thread_counts,
)
from dil_jax.bench.peer import (
    hf_model_from_params,
    hf_peer_config,
    max_logit_difference,
    peer_device,
    run_hf_grid,
)
from dil_jax.bench.programs import (
    ProgramStats,
    flop_profile,
    lower_phase,
    pair_memory_scaling,
    phase_calls,
    program_stats,
)
from dil_jax.bench.suites import (
    SUITE_GRIDS,
    SUITES,
    TINY_LENGTHS,
    SuiteSpec,
    default_ks,
    ratio_checks,
    run_suite,
    suite_model,
    summarize,
    write_json,
)
from dil_jax.bench.timing import normalized_times, projected_total, run_delayed_grid
from dil_jax.model.encoder_config import (
    EncoderConfig,  # the type of every suite's config (tests build some)
)

__all__ = [
    "CHAR_SUITES",
    "DELAYED",
    "FULL",
    "HF_PEER",
    "PHASES",
    "PHASE_TITLES",
    "SUITES",
    "SUITE_GRIDS",
    "TINY_LENGTHS",
    "WHOLE",
    "CharGridInputs",
    "CharSuiteSpec",
    "EncoderConfig",
    "GridInputs",
    "GridSpec",
    "ProgramStats",
    "SuiteSpec",
    "WholeReaderGrid",
    "block_flops",
    "char_program_profile",
    "char_suite_model",
    "cpu_snapshot",
    "default_ks",
    "embedding_flops",
    "flop_profile",
    "flop_speedups",
    "grid_flops",
    "hf_model_from_params",
    "hf_peer_config",
    "load_average",
    "lower_phase",
    "machine_record",
    "max_logit_difference",
    "normalized_times",
    "others_cpu_share",
    "pair_block_flops",
    "pair_memory_scaling",
    "passage_stats_flops",
    "peer_device",
    "phase_calls",
    "phase_flops",
    "program_stats",
    "projected_total",
    "projection_flops",
    "qa_head_flops",
    "random_char_grid",
    "random_grid",
    "ratio_checks",
    "retain_freed_memory",
    "run_char_suite",
    "run_delayed_grid",
    "run_hf_grid",
    "run_suite",
    "suite_model",
    "summarize",
    "summarize_char",
    "thread_counts",
    "variant_name",
    "write_json",
]
