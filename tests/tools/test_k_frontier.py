"""tools/k_frontier.py reads each run's exported step (not its last or best-looking line) and
joins it with the bench record's pair-phase speedup of the same k."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import load_script

k_frontier = load_script("tools/k_frontier.py")


def _run(folder: Path, k: int, exported_step: int, evaluations: dict[int, tuple[float, float]]):
    (folder / "params").mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"model": {"num_lower_layers": k}}))
    (folder / "params" / "trained_from.json").write_text(json.dumps({"step": exported_step}))
    lines = [{"step": step, "split": "train", "loss": 1.0} for step in evaluations]
    lines += [{"step": step, "split": "eval", "exact": em, "f1": f1}
              for step, (em, f1) in evaluations.items()]
    (folder / "metrics.jsonl").write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return folder


def _bench(path: Path, pair_speedups: dict[int, float]) -> Path:
    results = {("full (k=0)" if k == 0 else f"k={k}"): {"k": k, "pair_speedup": speedup}
               for k, speedup in pair_speedups.items()}
    results["HF PyTorch"] = {"k": 0, "pair_speedup": 1.3}
    path.write_text(json.dumps({
        "command": "dil-jax bench --ks 4", "others_cpu_cores": 0.0,
        "machine": {"cpu": "test cpu", "cpu_count": 2},
        "suites": [{"grid": {"num_questions": 4, "num_passages": 2, "question_len": 32,
                             "passage_len": 160}, "results": results}]}))
    return path


def test_frontier_table_uses_the_exported_step_and_the_matching_speedup(tmp_path):
    full = _run(tmp_path / "full", 0, 500, {250: (30.0, 40.0), 500: (40.0, 50.0),
                                            750: (39.0, 49.0)})
    # The student's last evaluation (step 750) is better than its export: the table must still
    # report the exported step 250.
    student = _run(tmp_path / "k4", 4, 250, {250: (36.0, 45.0), 500: (20.0, 30.0),
                                             750: (38.0, 47.5)})
    bench = _bench(tmp_path / "bench.json", {0: 1.0, 4: 3.2})
    out = tmp_path / "figures" / "frontier"
    k_frontier.main(["--runs", str(full), str(student), "--bench", str(bench),
                     "--out", str(out)])
    rows = [line for line in out.with_suffix(".md").read_text().splitlines()
            if line.startswith("| 4 ")]
    # 45 / 50 = 90.0%, by hand.
    assert rows == [f"| 4 | `{student}` | 250 | 36.00 | 45.00 | 90.0% | 3.20x |"]
    assert out.with_suffix(".png").stat().st_size > 0


def test_a_k_the_bench_did_not_time_is_refused_by_name(tmp_path, capsys):
    full = _run(tmp_path / "full", 0, 10, {10: (1.0, 2.0)})
    student = _run(tmp_path / "k3", 3, 10, {10: (1.0, 2.0)})
    bench = _bench(tmp_path / "bench.json", {0: 1.0, 4: 3.2})
    with pytest.raises(SystemExit) as failure:
        k_frontier.main(["--runs", str(full), str(student), "--bench", str(bench),
                         "--out", str(tmp_path / "out")])
    assert failure.value.code == 2
    assert "k = 3 was not timed" in capsys.readouterr().err


def test_a_run_without_an_export_is_refused_by_name(tmp_path, capsys):
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    (unfinished / "config.json").write_text(json.dumps({"model": {"num_lower_layers": 0}}))
    bench = _bench(tmp_path / "bench.json", {0: 1.0})
    with pytest.raises(SystemExit):
        k_frontier.main(["--runs", str(unfinished), "--bench", str(bench),
                         "--out", str(tmp_path / "out")])
    assert "trained_from.json" in capsys.readouterr().err


def _bundled(folder: Path, k: int, exported_step: int, eval_step: int, em: float, f1: float):
    folder.mkdir(parents=True)
    (folder / "dil_jax_manifest.json").write_text(json.dumps({
        "reader": {"num_lower_layers": k}, "trained_from": {"step": exported_step},
        "final_eval": {"step": eval_step, "split": "eval", "exact": em, "f1": f1}}))
    return folder


def test_a_bundled_reader_counts_as_a_run(tmp_path):
    full = _bundled(tmp_path / "minilm-squad-full", 0, 1464, 1464, 56.0, 68.0)
    student = _run(tmp_path / "k5", 5, 96, {96: (20.0, 34.0)})
    bench = _bench(tmp_path / "bench.json", {0: 1.0, 5: 7.1})
    out = tmp_path / "frontier"
    k_frontier.main(["--runs", str(full), str(student), "--bench", str(bench),
                     "--out", str(out)])
    table = out.with_suffix(".md").read_text()
    # 34 / 68 = 50.0%, by hand.
    assert f"| 5 | `{student}` | 96 | 20.00 | 34.00 | 50.0% | 7.10x |" in table
    assert f"| 0 | `{full}` | 1464 | 56.00 | 68.00 | 100.0% | 1.00x |" in table


def test_a_bundled_reader_whose_evaluation_is_not_of_its_export_is_refused(tmp_path, capsys):
    stale = _bundled(tmp_path / "stale", 0, 1464, 1250, 50.0, 60.0)
    bench = _bench(tmp_path / "bench.json", {0: 1.0})
    with pytest.raises(SystemExit):
        k_frontier.main(["--runs", str(stale), "--bench", str(bench),
                         "--out", str(tmp_path / "out")])
    assert "final_eval is of step 1250, not of the exported step 1464" in capsys.readouterr().err


def test_recorded_rows_are_read_back_from_an_earlier_table(tmp_path, capsys):
    # A table as frontier_table writes it, by hand: the k = 3 and k = 5 runs are gone.
    table = tmp_path / "earlier.md"
    table.write_text(
        "Pair-phase speedup: `dil-jax bench` (cpu, 2 cores; grid 16 x 8).\n\n"
        "| k | run | exported step | validation EM | validation F1 | F1 / full F1 "
        "| pair-phase speedup |\n| --- | --- | --- | --- | --- | --- | --- |\n"
        "| 0 | `full` | 8308 | 74.04 | 83.57 | 100.0% | 1.00x |\n"
        "| 3 | `/gone/k3_warm` | 4154 | 71.63 | 81.42 | 97.4% | 2.18x |\n"
        "| 5 | `/gone/k5_warm` | 8308 | 54.86 | 65.98 | 79.0% | 8.93x |\n")
    k3, k5 = k_frontier.recorded_scores(f"{table}:3,5")
    assert (k3.k, str(k3.workdir), k3.step, k3.exact, k3.f1) == (3, "/gone/k3_warm", 4154,
                                                                 71.63, 81.42)
    assert (k5.k, k5.step, k5.f1, k5.recorded_in) == (5, 8308, 65.98, table)
    full = _run(tmp_path / "full", 0, 10, {10: (70.0, 80.0)})
    bench = _bench(tmp_path / "bench.json", {0: 1.0, 3: 2.0, 5: 8.0})
    k_frontier.main(["--runs", str(full), "--recorded", f"{table}:3,5", "--bench", str(bench),
                     "--out", str(tmp_path / "out")])
    written = (tmp_path / "out.md").read_text()
    # 81.42 / 80.0 of the new full reader: 101.8%; the row names the table it came from.
    assert f"| 3 | `/gone/k3_warm` (as recorded in `{table}`) | 4154 | 71.63 | 81.42 | 101.8% " \
           "| 2.00x |" in written
    for spec, problem in ((f"{table}:4", "no row of k = [4]"), (f"{table}", "expected TABLE:K"),
                          (f"{tmp_path / 'none.md'}:3", "no such file")):
        with pytest.raises(SystemExit):
            k_frontier.recorded_scores(spec)
        assert problem in capsys.readouterr().err
