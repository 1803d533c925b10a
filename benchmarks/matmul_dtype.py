"""What `--matmul-dtype bfloat16` costs in answers, and what it saves in time, on gold paragraphs.

    python benchmarks/matmul_dtype.py --out benchmarks/results/matmul_dtype_amd
    python benchmarks/matmul_dtype.py --readers full:0 --articles 28:35 --out OUT

Each reader answers the questions of the chosen dev articles (default: 28-34 of the 35 shared,
1,278 questions; their gold paragraphs, `dil-jax predict`'s windows) twice in one run, float32
and with bfloat16 matmul operands, alternating readers so that other load falls on both; each
predict runs in its own process (`dil-jax predict`, wall seconds of the whole command). Scored
with the official SQuAD v1.1 rules: EM / F1 both ways, their difference, and the share of
questions whose answer text is the same. The start-up measurement of `--matmul-dtype auto`
(`readers.matmul.measure_matmul`) is recorded with the machine. Writes OUT.json and OUT.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dil_jax.bench.machine import machine_record
from dil_jax.data.squad import load_squad
from dil_jax.metrics.squad_metric import squad_scores
from dil_jax.readers.matmul import BFLOAT16_MARGIN, MEASURED_SHAPE, measure_matmul

ASSETS = Path(__file__).resolve().parents[1] / "dil_jax" / "assets"
DTYPES = ("float32", "bfloat16")


def article_subset(data: Path, articles: str, out: Path) -> Path:
    """The articles [a, b) of a SQuAD file, written to `out`."""
    first, last = (int(v) for v in articles.split(":"))
    dataset = json.loads(data.read_text())
    dataset["data"] = dataset["data"][first:last]
    out.write_text(json.dumps(dataset))
    return out


def predict(checkpoint: Path, k: int, data: Path, dtype: str, output: Path) -> float:
    """Wall seconds of one `dil-jax predict` at `dtype`."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "dil_jax", "predict", "--checkpoint", str(checkpoint),
                    "--k", str(k), "--data", str(data), "--output", str(output),
                    "--matmul-dtype", dtype], check=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path,
                        default=Path("../shared/data/squad/dev-v1.1.35-articles.json"))
    parser.add_argument("--articles", default="28:35")
    parser.add_argument("--readers", nargs="+", default=["full:0", "k2-open:2", "k4:4"],
                        metavar="NAME:K", help="bundled readers (minilm-squad-NAME) and k")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    timing = measure_matmul()
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        subset = article_subset(args.data, args.articles, Path(scratch) / "dev.json")
        gold = {ex.qid: ex.answer_texts for ex in load_squad(subset).examples}
        for spec in args.readers:
            name, k = spec.rsplit(":", 1)
            answers, seconds = {}, {}
            for dtype in DTYPES:
                output = Path(scratch) / f"{name}-{dtype}.json"
                seconds[dtype] = predict(ASSETS / f"minilm-squad-{name}", int(k), subset,
                                         dtype, output)
                answers[dtype] = json.loads(output.read_text())
            scores = {dtype: squad_scores(gold, answers[dtype], "1.1") for dtype in DTYPES}
            same = sum(answers["float32"][q] == answers["bfloat16"].get(q) for q in gold)
            rows.append({"reader": name, "k": int(k), "questions": len(gold),
                         **{f"{dtype}_{m}": scores[dtype][m] for dtype in DTYPES
                            for m in ("exact", "f1")},
                         **{f"{dtype}_s": seconds[dtype] for dtype in DTYPES},
                         "same_answer": same / len(gold)})
    record = {"machine": machine_record(), "articles": args.articles,
              "measured_dot": {"shape": MEASURED_SHAPE, "float32_ms": timing.float32_s * 1e3,
                               "bfloat16_ms": timing.bfloat16_s * 1e3,
                               "speedup": timing.speedup, "auto_chooses": timing.chosen,
                               "margin": BFLOAT16_MARGIN},
              "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{args.out}.json").write_text(json.dumps(record, indent=2))
    lines = [f"# --matmul-dtype bfloat16 on gold paragraphs (dev articles {args.articles})", "",
             f"Machine: {record['machine']['cpu']}, {record['machine']['cpu_count']} cores. "
             f"Start-up dot {'x'.join(map(str, MEASURED_SHAPE))}: "
             f"float32 {timing.float32_s * 1e3:.2f} ms, bfloat16 operands "
             f"{timing.bfloat16_s * 1e3:.2f} ms (x{timing.speedup:.2f}): auto reads "
             f"{timing.chosen}.", "",
             "| reader | questions | EM / F1 float32 | EM / F1 bfloat16 | Δ EM / F1 | same answer "
             "| predict s float32 / bfloat16 |", "|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(
            f"| {row['reader']} (k = {row['k']}) | {row['questions']} | "
            f"{row['float32_exact']:.2f} / {row['float32_f1']:.2f} | "
            f"{row['bfloat16_exact']:.2f} / {row['bfloat16_f1']:.2f} | "
            f"{row['bfloat16_exact'] - row['float32_exact']:+.2f} / "
            f"{row['bfloat16_f1'] - row['float32_f1']:+.2f} | {100 * row['same_answer']:.1f}% | "
            f"{row['float32_s']:.0f} / {row['bfloat16_s']:.0f} |")
    Path(f"{args.out}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
