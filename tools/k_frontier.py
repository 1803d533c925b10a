"""The accuracy / speed frontier (the paper's Figure 3): each trained reader's validation F1 next to
the measured pair-phase speedup of its split k, as a table and a plot.

Every run folder is a finished `dil-jax train` workdir: its k comes from its `config.json`
(`model.num_lower_layers`), its F1 from the evaluation of the exported step (`params/
trained_from.json` names the step, `metrics.jsonl` holds that step's evaluation). A bundled
reader (`dil_jax/assets/minilm-squad-*`) counts as a run: its manifest records k, the exported
step and that step's evaluation (`final_eval`). The speedups come
from a `dil-jax bench` record timed at the readers' own lengths, e.g.

    dil-jax bench --suite minilm --ks 1,2,3,4,5 --question-len 32 --passage-len 160 \\
        --no-hf --out benchmarks/results --name minilm_frontier
    python tools/k_frontier.py --bench benchmarks/results/minilm_frontier.json \\
        --runs runs/minilm_squad_full runs/minilm_squad_k1_warm ... runs/minilm_squad_k5_warm \\
        --out docs/figures/k_frontier

writes `k_frontier.md` (table) and `k_frontier.png` (F1 relative to the full reader vs pair-phase
speedup). A run without an export, or a k the record did not time, is refused by name.

`--recorded TABLE:K[,K...]` takes the rows of those k from an earlier table this tool wrote,
for readers whose run folders are no longer on this machine (a lent GPU's runs); the new table
names the table each such row comes from.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RunScore:
    """One trained reader: its split, the exported step and that step's validation scores."""

    workdir: Path
    k: int
    step: int
    exact: float
    f1: float
    recorded_in: Path | None = None  # the earlier table the row was taken from (--recorded)


def fail(message: str) -> None:
    print(f"k_frontier: {message}", file=sys.stderr)
    raise SystemExit(2)


def bundled_score(folder: Path) -> RunScore:
    """The evaluation a bundled reader's manifest records (`tools/bundle_readers.py` copies the
    run's evaluation of its exported step into `final_eval`); refused unless it is that step's."""
    manifest_file = folder / "dil_jax_manifest.json"
    try:
        manifest = json.loads(manifest_file.read_text())
        k = int(manifest["reader"]["num_lower_layers"])
        step = int(manifest["trained_from"]["step"])
        evaluation = manifest["final_eval"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        fail(f"{manifest_file}: not a bundled reader's manifest ({error!r})")
    if evaluation.get("step") != step:
        fail(f"{manifest_file}: final_eval is of step {evaluation.get('step')}, not of the "
             f"exported step {step}")
    return RunScore(folder, k, step, float(evaluation["exact"]), float(evaluation["f1"]))


def run_score(workdir: Path) -> RunScore:
    """The exported step's evaluation of one run folder, or of a bundled reader (a folder with
    `dil_jax_manifest.json`, e.g. `dil_jax/assets/minilm-squad-full`; see the module docstring)."""
    if (workdir / "dil_jax_manifest.json").is_file():
        return bundled_score(workdir)
    config_file = workdir / "config.json"
    trained_from = workdir / "params" / "trained_from.json"
    metrics_file = workdir / "metrics.jsonl"
    for needed in (config_file, trained_from, metrics_file):
        if not needed.is_file():
            fail(f"{workdir}: no {needed.name} ({needed}); is the run finished and exported?")
    k = int(json.loads(config_file.read_text())["model"]["num_lower_layers"])
    step = int(json.loads(trained_from.read_text())["step"])
    evaluations = [record for record in map(json.loads, metrics_file.read_text().splitlines())
                   if record.get("split") == "eval" and record.get("step") == step]
    if not evaluations:
        fail(f"{metrics_file}: no evaluation at the exported step {step}")
    last = evaluations[-1]
    return RunScore(workdir, k, step, float(last["exact"]), float(last["f1"]))


def recorded_scores(spec: str) -> list[RunScore]:
    """The rows of the k listed in `TABLE:K[,K...]`, from a table `frontier_table` wrote."""
    table, _, ks_text = spec.rpartition(":")
    try:
        ks = [int(k) for k in ks_text.split(",")]
    except ValueError:
        ks = []
    if not table or not ks:
        fail(f"--recorded {spec!r}: expected TABLE:K[,K...], e.g. "
             "docs/results/k_frontier_squad_v11.md:3,5")
    path = Path(table)
    if not path.is_file():
        fail(f"--recorded {spec!r}: no such file {path}")
    rows = {}
    for line in path.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 7 and cells[0].isdigit():
            # k | run | exported step | EM | F1 | F1 / full | speedup
            run = cells[1].split("`")[1] if "`" in cells[1] else cells[1]
            rows[int(cells[0])] = RunScore(Path(run), int(cells[0]), int(cells[2]),
                                           float(cells[3]), float(cells[4]), path)
    missing = [k for k in ks if k not in rows]
    if missing:
        fail(f"--recorded {spec!r}: {path} has no row of k = {missing} (rows: {sorted(rows)})")
    return [rows[k] for k in ks]


def pair_speedups(bench_file: Path) -> tuple[dict[int, float], dict]:
    """k -> the measured pair-phase speedup over the full model, from a `dil-jax bench` record
    (its first suite), and the record's grid/machine for the table's caption."""
    record = json.loads(bench_file.read_text())
    suite = record["suites"][0]
    speedups = {int(result["k"]): float(result["pair_speedup"])
                for name, result in suite["results"].items() if name.startswith(("k=", "full"))}
    return speedups, {"grid": suite["grid"], "cpu": record["machine"]["cpu"],
                      "cpu_count": record["machine"]["cpu_count"],
                      "others_cpu_cores": record.get("others_cpu_cores"),
                      "command": record["command"]}


def frontier_table(scores: list[RunScore], speedups: dict[int, float], caption: dict) -> str:
    full = [score for score in scores if score.k == 0]
    if len(full) != 1:
        fail(f"need exactly one full reader (k = 0) among --runs, got {len(full)}")
    full_f1 = full[0].f1
    grid = caption["grid"]
    lines = [
        f"Pair-phase speedup: `{caption['command']}` ({caption['cpu']}, {caption['cpu_count']} "
        f"cores, other load {caption['others_cpu_cores']} cores; grid "
        f"{grid['num_questions']} x {grid['num_passages']}, question {grid['question_len']} + "
        f"passage {grid['passage_len']} tokens).",
        "",
        "| k | run | exported step | validation EM | validation F1 | F1 / full F1 "
        "| pair-phase speedup |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for score in sorted(scores, key=lambda score: (score.k, str(score.workdir))):
        if score.k not in speedups:
            fail(f"{score.workdir}: k = {score.k} was not timed in the bench record "
                 f"(timed: {sorted(speedups)})")
        run = f"`{score.workdir}`" + (f" (as recorded in `{score.recorded_in}`)"
                                      if score.recorded_in else "")
        lines.append(f"| {score.k} | {run} | {score.step} | {score.exact:.2f} | "
                     f"{score.f1:.2f} | {100 * score.f1 / full_f1:.1f}% | "
                     f"{speedups[score.k]:.2f}x |")
    return "\n".join(lines) + "\n"


def frontier_plot(scores: list[RunScore], speedups: dict[int, float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    full_f1 = next(score.f1 for score in scores if score.k == 0)
    figure, axes = plt.subplots(figsize=(5.5, 4))
    # The line joins the best reader of each k (the frontier); other readers of a k (another
    # recipe, a shorter run) are open markers below it.
    best: dict[int, RunScore] = {}
    for score in scores:
        if score.k not in best or score.f1 > best[score.k].f1:
            best[score.k] = score
    ordered = [best[k] for k in sorted(best)]
    others = [score for score in scores if best[score.k] is not score]
    axes.plot([speedups[score.k] for score in ordered],
              [100 * score.f1 / full_f1 for score in ordered], "o-", label="best of each k")
    if others:
        axes.plot([speedups[score.k] for score in others],
                  [100 * score.f1 / full_f1 for score in others], "o", fillstyle="none",
                  color="C0", label="other readers (see the table)")
        axes.legend(loc="lower left", fontsize="small")
    for position, score in enumerate(ordered):
        # Neighbouring k sit close together at small speedups, on a line falling to the right:
        # alternate above-right / below the point (both off the line), the first above.
        offset = (-8, 8) if position == 0 else (6, 6) if position % 2 else (-10, -16)
        axes.annotate(f"k={score.k}", (speedups[score.k], 100 * score.f1 / full_f1),
                      textcoords="offset points", xytext=offset)
    axes.set_xlabel("measured pair-phase speedup over the full reader")
    axes.set_ylabel("validation F1, % of the full reader")
    axes.grid(alpha=0.3)
    figure.tight_layout()
    staging = path.with_name(path.name + ".new.png")
    figure.savefig(staging, dpi=120)
    os.replace(staging, path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=Path, nargs="+", required=True,
                        help="finished run folders, one of them the full reader (k = 0)")
    parser.add_argument("--recorded", action="append", default=[], metavar="TABLE:K[,K...]",
                        help="rows of these k from an earlier table of this tool (runs no "
                             "longer on this machine)")
    parser.add_argument("--bench", type=Path, required=True, help="a `dil-jax bench` record")
    parser.add_argument("--out", type=Path, required=True,
                        help="output stem: writes STEM.md and STEM.png")
    args = parser.parse_args(argv)
    if not args.bench.is_file():
        fail(f"--bench {args.bench}: no such file")
    scores = [run_score(workdir) for workdir in args.runs]
    scores += [score for spec in args.recorded for score in recorded_scores(spec)]
    speedups, caption = pair_speedups(args.bench)
    table = frontier_table(scores, speedups, caption)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    table_path = args.out.with_suffix(".md")
    staging = table_path.with_name(table_path.name + ".new")
    staging.write_text(table)
    os.replace(staging, table_path)
    frontier_plot(scores, speedups, args.out.with_suffix(".png"))
    print(table)


if __name__ == "__main__":
    main()
