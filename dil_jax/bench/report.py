"""Markdown and PNG views of a benchmark record (the JSON is the record; these render it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dil_jax.atomic import write_atomic
from dil_jax.bench.grids import DELAYED, FULL, HF_PEER, PHASE_TITLES, PHASES, WHOLE
from dil_jax.bench.suites import ratio_checks

MIB = 2 ** 20


def _ms(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds * 1e3:.2f}"


def _times(value: float | None) -> str:
    return "—" if value is None else f"×{value:.2f}"


def _table(columns: list[str], rows: list[list[Any]]) -> list[str]:
    """A Markdown table: its header, the separator and one line per row of cells."""
    return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)] + [
        "| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]


def _timing_cell(seconds: float, normalized: float | None) -> str:
    """The paper's style: phase time in s, per-block-per-input time in ms in parentheses."""
    if seconds == 0.0 and normalized is None:
        return "—"
    suffix = "" if normalized is None else f" ({_ms(normalized)})"
    return f"{seconds:.3f}{suffix}"


def timing_table(suite: dict[str, Any]) -> list[str]:
    """Rows of NI Q, NI P, I Q-P and total per variant, with speedups over the full model."""
    grid = suite["grid"]
    pq, pp = next(iter(suite["results"].values()))["projection_grid"]
    rows = []
    for name, row in suite["results"].items():
        sec, norm = row["seconds"], row["per_block_per_input"]
        # The full model (and the peer) has no passage-only phase: its cell would be a timer's
        # few microseconds around nothing.
        cells = ["—" if p == "ni_p" and row["k"] == 0 else _timing_cell(sec[p], norm[p])
                 for p in PHASES]
        rows.append([name, *cells, f"{sec['total']:.3f}", f"×{row['speedup']:.2f}",
                     _times(row.get("flop_speedup")), f"×{row['ideal_speedup']:.2f}",
                     f"×{row['pair_speedup']:.2f}",
                     f"×{row['projected_speedup']:.2f} "
                     f"({_times(row.get('projected_flop_bound'))})"])
    lines = _table(["variant", "NI Q s (ms/block/q)", "NI P s (ms/block/p)",
                    "I Q-P s (ms/block/pair)", "total s", "speedup", "FLOP bound", "l/(l−k)",
                    "I Q-P speedup", f"projected speedup at q={pq}, p={pp} (FLOP bound)"], rows)
    lines.append("")
    lines.append(f"Grid: q = {grid['num_questions']} questions × p = {grid['num_passages']} "
                 f"passages = {grid['num_questions'] * grid['num_passages']} pairs; question "
                 f"{grid['question_len']} + passage {grid['passage_len']} tokens; chunk "
                 f"{suite['chunk_size']} pairs, lower batch {suite['batch_size']}; median of "
                 f"{suite['repeats']} repeats, warm-up excluded. Normalised times in "
                 "parentheses: ms per block per input. FLOP bound: analytical FLOPs of the full "
                 "model's grid / the variant's (lower blocks included). For 0 < k < l, NI Q "
                 "and NI P include the first upper block's q/k/v projections, computed once "
                 "per segment instead of once per pair, so I Q-P can beat l/(l−k). "
                 + REUSE_NOTE[suite.get("reuse", False)])
    return lines


# What the record's pair program reused (records before the reuses have no "reuse" key).
REUSE_NOTE = {
    True: "Pair program with its exact reuses (every variant, the full model's included): the "
          "last block computes only [CLS] and the passage rows, and for 0 < k < l NI P also "
          "computes each passage's first-upper-block attention statistics, so that the pairs' "
          "passage rows score only the question's keys.",
    False: "Reference pair program (no reuse of the last block's rows or of the passages' "
           "attention statistics).",
}


def flop_table(suite: dict[str, Any]) -> list[str]:
    """Per variant and phase: XLA's FLOPs of the compiled program vs the analytical count."""
    rows = []
    for name, phases in suite["programs"].items():
        for phase, p in phases.items():
            ratio = p["xla_over_analytical"]
            footprint = (p["argument_bytes"] + p["output_bytes"] + p["temp_bytes"]) / MIB
            rows.append([name, PHASE_TITLES[phase], p["calls"],
                         f"{p['xla_flops_per_call'] / 1e9:.3f}",
                         f"{p['analytical_flops_per_call'] / 1e9:.3f}",
                         "—" if ratio is None else f"{ratio:.4f}",
                         f"{p['temp_bytes'] / MIB:.1f}", f"{footprint:.1f}",
                         f"{p['compile_s']:.2f}"])
    return _table(["variant", "phase", "calls", "XLA GFLOP/call", "analytical GFLOP/call",
                   "XLA/analytical", "temp MiB", "args+out+temp MiB", "compile s"], rows)


def memory_table(suite: dict[str, Any]) -> list[str]:
    """Compiled memory of the pair program as the grid grows."""
    rows = [[name, f"{r['num_questions']} × {r['num_passages']}", r["num_pairs"],
             f"{r['argument_bytes'] / MIB:.1f}", f"{r['temp_bytes'] / MIB:.1f}",
             f"{r['output_bytes'] / MIB:.2f}", f"{r['footprint_bytes'] / MIB:.1f}",
             f"{r['xla_peak_bytes'] / MIB:.1f}"]
            for name, scaling in suite["pair_memory_scaling"].items() for r in scaling]
    return _table(["variant", "q × p", "pairs", "arguments MiB", "temp MiB", "output MiB",
                   "args+out+temp MiB", "XLA peak MiB"], rows)


def checks_table(suite: dict[str, Any]) -> list[str]:
    return _table(["target", "measured", "target value", "met"],
                  [[name, f"{check['measured']:.2f}", f"{check['target']:.2f}",
                    "yes" if check["met"] else "no"]
                   for name, check in ratio_checks(suite).items()])


def is_char_suite(suite: dict[str, Any]) -> bool:
    """A QANet / BiDAF suite's record (variants whole and delayed, no k)."""
    return suite.get("kind") in ("qanet", "bidaf")


def _pct(share: float) -> str:
    return f"{100 * share:.1f}%"


def char_heading(suite: dict[str, Any]) -> str:
    cfg = suite["config"]
    if suite["kind"] == "qanet":
        shape = (f"QANet, d_model {cfg['d_model']}, {cfg['num_heads']} heads, embedding encoder "
                 f"{cfg['embedding_blocks']} block(s), model encoder {cfg['model_blocks']} "
                 "blocks x 3 passes")
    else:
        shape = f"BiDAF, hidden {cfg['hidden']}"
    return (f"## {suite['name']}: {shape}, word table {cfg['vocab_size']} x {cfg['word_dim']}, "
            f"{cfg['max_chars']} characters a token ({suite['weights']})")


def char_timing_table(suite: dict[str, Any]) -> list[str]:
    """Per variant: NI Q, NI P, I Q-P (ms per input), total, the online part (NI Q + I Q-P),
    NI P's share, and the speedups over whole."""
    grid, results = suite["grid"], suite["results"]
    rows = []
    for name in (WHOLE, DELAYED):
        row = results[name]
        sec, per = row["seconds"], row["per_input_ms"]
        cells = ["—" if name == WHOLE and p != "pairs" else f"{sec[p]:.3f} ({per[p]:.2f})"
                 for p in PHASES]
        online = row.get("online_s", sec["total"])
        rows.append([name, *cells, f"{sec['total']:.3f}", f"{online:.3f}",
                     _pct(row["ni_p_share"]) if "ni_p_share" in row else "—",
                     _times(row.get("speedup", 1.0)), _times(row.get("online_speedup", 1.0)),
                     _times(row.get("pair_speedup", 1.0))])
    lines = _table(["variant", "NI Q s (ms/question)", "NI P s (ms/passage)",
                    "I Q-P s (ms/pair)", "total s", "online s (NI Q + I Q-P)",
                    "NI P share of total", "speedup (total)", "online speedup",
                    "I Q-P speedup"], rows)
    one = results[DELAYED]["one_question"]
    lines += ["", (f"Grid: q = {grid['num_questions']} questions × p = {grid['num_passages']} "
              f"passages = {grid['num_questions'] * grid['num_passages']} pairs; question "
              f"{grid['question_len']} + passage {grid['passage_len']} tokens; chunk "
              f"{suite['chunk_size']} pairs, segment batch {suite['batch_size']}; median of "
              f"{suite['repeats']} repeats, interleaved, warm-up excluded. whole: every pair "
              "through the whole reader (both segments encoded in the pair), all its time is "
              "I Q-P; delayed: questions and passages through `encode_lower` once each (NI Q, "
              "NI P), pairs through `encode_upper` (I Q-P). Online = NI Q + I Q-P, the "
              "passages' states read from a cache; speedups are whole's total over the "
              "delayed figure (I Q-P speedup: whole's per-pair cost over `encode_upper`'s, "
              "the many-questions-per-passage limit)."),
              "", (f"One question per passage (projected from the per-input costs above, "
                   f"SQuAD-style reading): NI P is {_pct(one['ni_p_share'])} of a pair's "
                   f"delayed cost; delayed ×{one['speedup']:.2f}, online (passage cached) "
                   f"×{one['online_speedup']:.2f} over whole."),
              "", (f"Span scores: delayed vs whole, largest difference "
                   f"{suite['max_logit_difference']:.2e} over the grid (largest real logit "
                   f"{suite['largest_real_logit']:.3g})."),
              f"Other processes kept {suite.get('others_cpu_cores')} cores busy on average "
              "during this suite's timed passes."]
    return lines


def char_flop_table(suite: dict[str, Any]) -> list[str]:
    """Per variant and phase: XLA's FLOPs of the compiled program (one call, per input, the
    grid), memory and compile time; then the shares they give."""
    rows = []
    for name, phases in suite["programs"].items():
        for phase, p in phases.items():
            footprint = (p["argument_bytes"] + p["output_bytes"] + p["temp_bytes"]) / MIB
            rows.append([name, PHASE_TITLES[phase], p["calls"], p["inputs_per_call"],
                         f"{p['xla_flops_per_call'] / 1e9:.3f}",
                         f"{p['xla_flops_per_input'] / 1e6:.1f}",
                         f"{p['xla_flops'] / 1e9:.3f}",
                         "yes" if p["counts_loop_body_once"] else "no",
                         f"{p['temp_bytes'] / MIB:.1f}", f"{footprint:.1f}",
                         f"{p['compile_s']:.2f}"])
    lines = _table(["variant", "phase", "calls", "inputs/call", "XLA GFLOP/call",
                    "XLA MFLOP/input", "XLA GFLOP (grid)", "loop body counted once",
                    "temp MiB", "args+out+temp MiB", "compile s"], rows)
    flops = suite["results"][DELAYED].get("flops")
    if flops:
        bound = (" **Lower bounds**: a program holds a while loop (BiDAF's LSTMs), whose body "
                 "XLA counts once, not once per step." if flops["counts_loop_body_once"] else "")
        lines += ["", (f"In XLA FLOPs: NI P is {_pct(flops['ni_p_share'])} of the delayed "
                  f"grid; whole / delayed ×{flops['ratio']:.2f}, whole / online "
                  f"×{flops['online_ratio']:.2f}. One question per passage: NI P "
                  f"{_pct(flops['one_question_ni_p_share'])} of a pair, whole / online "
                  f"×{flops['one_question_online_ratio']:.2f}. Whole's FLOPs per pair / "
                  f"(NI Q + NI P + I Q-P per input): {flops['whole_per_pair_over_phases']:.4f} "
                  "(the same work split in two)." + bound)]
    return lines


def char_suite_lines(suite: dict[str, Any]) -> list[str]:
    """A QANet / BiDAF suite as Markdown: timing, then the compiled programs."""
    return ([char_heading(suite), ""] + char_timing_table(suite)
            + ["", "### XLA's cost analysis of the compiled phase programs", ""]
            + char_flop_table(suite) + [""])


def _allowed(machine: dict[str, Any]) -> str:
    """"; this process pinned to core(s) 0" where it ran on fewer cores than the machine has
    (`taskset`); "" otherwise and for records written before `cpus_allowed`."""
    allowed = machine.get("cpus_allowed")
    if allowed is None or len(allowed) >= machine["cpu_count"]:
        return ""
    return f"; this process pinned to core(s) {', '.join(map(str, allowed))}"


def compile_note(record: dict[str, Any]) -> str:
    """What the "compile s" column measured: XLA compiling, or (with JAX's persistent
    compilation cache on) possibly reading back a program an earlier run compiled."""
    folder = record.get("compilation_cache")
    if folder is None:
        return "XLA compiling each program (no persistent compilation cache)"
    return (f"with the persistent compilation cache in `{folder}` a program an earlier run "
            "compiled is read back, not compiled (`--no-compilation-cache` times compilation)")


def render_markdown(record: dict[str, Any]) -> str:
    """The whole record as Markdown: machine, then per suite timing, targets, FLOPs, memory."""
    m, threads = record["machine"], record.get("threads", {})
    lines = [
        "# Speed of a question × passage grid",
        "",
        f"- command: `{record['command']}`",
        f"- when: {record['started']}; wall time {record['wall_s']:.0f} s",
        (f"- machine: {m['cpu']} ({m['cpu_count']} cores{_allowed(m)}), JAX platform "
         f"{m['platform']} ({m['device_kind']}, {m['num_devices']} device(s))"),
        f"- load average (1, 5, 15 min) before {record['load_before']}, after "
        f"{record['load_after']}; other processes kept {record.get('others_cpu_cores')} "
        "cores busy on average during the run"
        + (" — **shared machine: timings are noisy and slower than on an idle one**"
           if record.get("shared") else ""),
        (f"- versions: jax {m['jax']}, jaxlib {m['jaxlib']}, flax {m['flax']}, torch {m['torch']}, "
        f"transformers {m['transformers']}"),
        (f"- threads: XLA intra-op {threads.get('xla_intra_op_threads')}, torch intra-op "
        f"{threads.get('torch_intra_op_threads')} (inter-op "
        f"{threads.get('torch_inter_op_threads')}); XLA_FLAGS=`{threads.get('xla_flags', '')}`"),
        f"- malloc: {record.get('malloc', 'as the process found it')}",
        f"- compile times: {compile_note(record)}",
        "- token ids are random (a dense transformer's cost does not depend on them); float32"
        + ("; QANet / BiDAF read random characters too (their character CNN reads every "
           "slot whatever it holds)" if any(map(is_char_suite, record["suites"])) else ""),
        "",
    ]
    for suite in record["suites"]:
        if is_char_suite(suite):
            lines += char_suite_lines(suite)
            continue
        cfg = suite["config"]
        lines += [(f"## {suite['name']}: l = {cfg['num_layers']} blocks, hidden "
                  f"{cfg['hidden_size']}, {cfg['num_heads']} heads, FFN "
                  f"{cfg['intermediate_size']} ({suite['weights']})"), ""]
        lines += timing_table(suite)
        lines.append(f"Other processes kept {suite.get('others_cpu_cores')} cores busy on "
                     "average during this suite's timed passes.")
        if HF_PEER in suite["results"]:
            # Records written before the other backbones' suites existed ran BERT's class.
            hf_class = suite.get("hf_class", "BertForQuestionAnswering")
            lines += ["", (f"{HF_PEER}: `{hf_class}` on "
                      f"{suite.get('hf_device', 'cpu')}, attention "
                      f"`{suite.get('hf_attention')}`, same weights (largest span-score "
                      f"difference from {FULL} over the grid: "
                      f"{suite.get('hf_max_logit_difference', float('nan')):.2e}).")]
        elif suite.get("hf_device_reason"):
            lines += ["", f"{HF_PEER}: not run — {suite['hf_device_reason']}."]
        lines += ["", "### Targets (this run)", ""] + checks_table(suite)
        lines += ["", "### FLOPs and memory of the compiled programs (one call)", ""]
        lines += flop_table(suite)
        lines += ["", "### Pair-phase memory as q × p grows (compiled, not executed)", ""]
        lines += memory_table(suite)
        lines.append("")
    return "\n".join(lines) + "\n"


def plot_char_phases(ax: Any, suite: dict[str, Any]) -> None:
    """A QANet / BiDAF panel: seconds per phase (medians) as stacked bars, whole, delayed, and
    delayed online (NI P left out: the passages cached)."""
    results = suite["results"]
    bars = [(WHOLE, results[WHOLE]["seconds"], PHASES),
            (DELAYED, results[DELAYED]["seconds"], PHASES),
            ("online", results[DELAYED]["seconds"], ("ni_q", "pairs"))]
    colors = {"ni_q": "tab:blue", "ni_p": "tab:orange", "pairs": "tab:green"}
    for x, (_, seconds, phases) in enumerate(bars):
        bottom = 0.0
        for phase in phases:
            ax.bar(x, seconds[phase], bottom=bottom, color=colors[phase],
                   label=PHASE_TITLES[phase] if x == 1 else None)
            bottom += seconds[phase]
    ax.set_xticks(range(len(bars)), [name for name, _, _ in bars])
    grid = suite["grid"]
    ax.set_title(f"{suite['name']}, q={grid['num_questions']}, p={grid['num_passages']}")
    ax.set_ylabel("seconds (median)")
    ax.legend(fontsize=8)


def plot_speedups(record: dict[str, Any], path: Path) -> Path:
    """Speedup over the full model vs k, one panel per suite, with the l/(l−k) line (a QANet /
    BiDAF suite: its phases as stacked bars, `plot_char_phases`)."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    suites = record["suites"]
    fig, axes = plt.subplots(1, len(suites), figsize=(5.5 * len(suites), 4.2), squeeze=False)
    for ax, suite in zip(axes[0], suites):
        if is_char_suite(suite):
            plot_char_phases(ax, suite)
            continue
        l_ = suite["config"]["num_layers"]
        rows = [(r["k"], r) for n, r in suite["results"].items() if n != HF_PEER]
        rows.sort(key=lambda kr: kr[0])
        ks_line = [k / 10 for k in range(10 * (l_ - 1) + 1)]
        ax.plot(ks_line, [l_ / (l_ - k) for k in ks_line], "k-", lw=1, label="l/(l−k)")
        ax.plot(ks_line, [0.9 * l_ / (l_ - k) for k in ks_line], "k:", lw=1,
                label="0.9·l/(l−k) (target)")
        ks = [k for k, _ in rows]
        # Markers only: between the measured k there is nothing measured to draw a line through.
        ax.plot(ks, [r["speedup"] for _, r in rows], "o", ms=7, label="measured, total")
        ax.plot(ks, [r["pair_speedup"] for _, r in rows], "s", mfc="none", ms=9,
                label="measured, I Q-P only")
        ax.plot(ks, [r.get("flop_speedup", float("nan")) for _, r in rows], "x", ms=8,
                label="FLOP bound of this grid")
        pq, pp = rows[0][1]["projection_grid"]
        ax.plot(ks, [r["projected_speedup"] for _, r in rows], "^",
                label=f"projected to q={pq}, p={pp}")
        grid = suite["grid"]
        ax.set_title(f"{suite['name']} (l={l_}), q={grid['num_questions']}, "
                     f"p={grid['num_passages']}")
        ax.set_xlabel("k (blocks run on question and passage separately)")
        ax.set_ylabel("speedup over the full model")
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_yticks([t for t in (1, 2, 3, 4, 6, 8, 12) if t <= l_])
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        write_atomic(path, lambda out: fig.savefig(out, format="png", dpi=110))
    finally:
        plt.close(fig)
    return path
