"""Issue 63 item 5 in the open domain: each reader without and with sentence prescreening, from
the per-question records of `run.sh`'s odqa-eval runs (OUT/NAME/progress/*.jsonl).

    python docs/results/prescreen_od/summarize.py OUT [NAME ...] [--p 29] [--rule logits]

For each reader: R@p (a gold answer in the first p passages) and, with prescreening, R_kept@p
(in their kept sentences: the seed's P(SEP)); EM without and with the IR score; EM given the
answer was there to read (among the questions with R = 1, or R_kept = 1 with prescreening: the
seed's P(reader | SEP) against the reader alone); the questions each read answers that the other
does not (with the IR score); the passage tokens the upper blocks read a question, and their
seconds a question (pair_upper; a speed only when nothing else ran beside the run). Prints a
markdown table.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def read_progress(path: Path) -> tuple[dict[str, dict], float]:
    """(question id -> record, the pair phase's seconds) of one odqa-eval progress file."""
    records, seconds = {}, 0.0
    lines = path.read_text().splitlines()
    for line in lines[1:]:  # the first line holds the settings
        block = json.loads(line)
        seconds += block["timings"].get("pair_upper", 0.0)
        for record in block["questions"]:
            records[record["id"]] = record
    return records, seconds


def summarize(base: dict[str, dict], screened: dict[str, dict], p: str, rule: str) -> dict:
    """The table's numbers for one reader (percentages over the questions both reads hold)."""
    # The questions both reads hold (all of them once run.sh has finished; fewer while the
    # prescreened read is under way: the row then says how many).
    ids = sorted(set(base) & set(screened))
    n = len(ids)

    def mean(values: list[float]) -> float:
        return 100 * sum(values) / len(values) if values else float("nan")

    def em(records: dict, qid: str, suffix: str) -> float:
        return records[qid]["scores"][rule][p]["EM" + suffix]

    retrieved = [qid for qid in ids if base[qid]["R"][p]]
    kept = [qid for qid in ids if screened[qid]["R_kept"][p]]
    row = dict(
        questions=n,
        R=mean([base[qid]["R"][p] for qid in ids]),
        R_kept=mean([screened[qid]["R_kept"][p] for qid in ids]),
        EM=mean([em(base, qid, "") for qid in ids]),
        EM_screened=mean([em(screened, qid, "") for qid in ids]),
        EM_ir=mean([em(base, qid, "_ir") for qid in ids]),
        EM_ir_screened=mean([em(screened, qid, "_ir") for qid in ids]),
        EM_ir_given_R=mean([em(base, qid, "_ir") for qid in retrieved]),
        EM_ir_given_kept=mean([em(screened, qid, "_ir") for qid in kept]),
        only_screened=sum(em(screened, q, "_ir") > em(base, q, "_ir") for q in ids),
        only_plain=sum(em(base, q, "_ir") > em(screened, q, "_ir") for q in ids),
    )
    for name, records in (("plain", base), ("screened", screened)):
        pairs = sum(records[qid].get("pairs", 0) for qid in ids)
        tokens = sum(records[qid].get("tokens", 0) for qid in ids)
        row[f"pairs_{name}"] = pairs / n
        row[f"tokens_{name}"] = tokens / n
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="run.sh's OUT folder")
    parser.add_argument("names", nargs="*", default=["full", "k2-open", "k4"])
    parser.add_argument("--p", default="29")
    parser.add_argument("--rule", default="logits", help="span score rule (logits, margin)")
    args = parser.parse_args()
    print("| reader | R | R_kept (P(SEP)) | EM: plain → prescreened | EM +IR: plain → prescreened "
          "| EM +IR given the answer there: plain (R) → prescreened (R_kept) | right only "
          "prescreened / only plain (+IR) | passage tokens a question: plain → prescreened "
          "| pair phase s a question: plain → prescreened |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.names:
        files = sorted((args.out / name / "progress").glob("*.jsonl"))
        plain = [f for f in files if "prescreen" not in f.name]
        screened = [f for f in files if "prescreen" in f.name]
        if len(plain) != 1 or len(screened) != 1:
            print(f"| {name} | (not read yet: {[f.name for f in files]}) |")
            continue
        base, base_s = read_progress(plain[0])
        kept, kept_s = read_progress(screened[0])
        row = summarize(base, kept, args.p, args.rule)
        print(f"| {name} ({row['questions']} q) | {row['R']:.1f} | {row['R_kept']:.1f} | "
              f"{row['EM']:.1f} → {row['EM_screened']:.1f} | "
              f"{row['EM_ir']:.1f} → {row['EM_ir_screened']:.1f} | "
              f"{row['EM_ir_given_R']:.1f} → {row['EM_ir_given_kept']:.1f} | "
              f"{row['only_screened']} / {row['only_plain']} | "
              f"{row['tokens_plain']:.0f} → {row['tokens_screened']:.0f} | "
              f"{base_s / len(base):.2f} → {kept_s / len(kept):.2f} |")


if __name__ == "__main__":
    main()
