"""`--matmul-dtype bfloat16` in the open domain: two odqa-eval runs of one reader compared
question by question (their progress files: float32, then bfloat16 matmul operands).

    python3 -m dil_jax odqa-eval --index INDEX \\
        --data ../shared/data/squad/dev-v1.1.35-articles.json --articles 28:35 --p 29 \\
        --batch-size 4 --chunk-size 64 --k 4 \\
        --checkpoint dil_jax/assets/minilm-squad-k4 --matmul-dtype bfloat16 --out OUT
    python benchmarks/matmul_dtype_od.py FLOAT32.jsonl BFLOAT16.jsonl [--p 29]

Prints, for each span rule, EM without and EM / F1 with the IR score both ways over the
questions both runs read, and how many questions got the same EM with the IR score.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def records(path: Path) -> dict[str, dict]:
    """Question id -> its record, from an odqa-eval progress file (line 1: the settings)."""
    found = {}
    for line in path.read_text().splitlines()[1:]:
        for record in json.loads(line)["questions"]:
            found[record["id"]] = record
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("float32", type=Path)
    parser.add_argument("bfloat16", type=Path)
    parser.add_argument("--p", default="29")
    args = parser.parse_args()
    exact, rounded = records(args.float32), records(args.bfloat16)
    ids = sorted(set(exact) & set(rounded))
    print(f"{len(ids)} questions read by both\n")
    print("| span rule | EM float32 → bfloat16 | EM +IR | F1 +IR | same EM +IR |")
    print("|---|---|---|---|---|")
    for rule in ("logits", "margin"):
        cells = []
        for key in ("EM", "EM_ir", "F1_ir"):
            before, after = (100 * sum(run[i]["scores"][rule][args.p][key] for i in ids)
                             / len(ids) for run in (exact, rounded))
            cells.append(f"{before:.2f} → {after:.2f}")
        same = sum(exact[i]["scores"][rule][args.p]["EM_ir"]
                   == rounded[i]["scores"][rule][args.p]["EM_ir"] for i in ids)
        print(f"| `{rule}` | {' | '.join(cells)} | {same} / {len(ids)} |")


if __name__ == "__main__":
    main()
