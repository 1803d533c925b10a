"""Abstention thresholds for the open-domain readers: chosen on TRAINING questions, measured on
validation ones (dil_jax/open_domain/abstention.py says what the threshold compares and why).

    # choose: training articles + Wikipedia leads as the corpus; half the sampled questions are
    # read as they are (in corpus), half with their own article's passages removed (out of
    # corpus); the thresholds go into each reader's manifest with --record
    python tools/abstention.py calibrate --train ../shared/data/squad/train-v1.1.json \
        --reader dil_jax/assets/minilm-squad-full --reader dil_jax/assets/minilm-squad-k4 \
        --work runs/abstention --articles 25 --questions 200 --leads 2500 --record

    # measure on validation with the recorded thresholds: an index holding the validation
    # articles (docs/open_domain.md's runs/odqa-index), questions of articles 28-34 in corpus and
    # with their article removed
    python tools/abstention.py measure --index runs/odqa-index \
        --data ../shared/data/squad/dev-v1.1.35-articles.json --articles 28:35 \
        --reader dil_jax/assets/minilm-squad-full --reader dil_jax/assets/minilm-squad-k4 \
        --questions 200 --out docs/results/abstention

An out-of-corpus question is an in-corpus one read with every passage of its article removed
from its retrieved list (and the Wikipedia lead of the same title): the corpus then lacks its
paragraph, as if the article had never been indexed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

P = 29      # passages read per question (the evaluation's p)
MU = 0.5    # the fusion weight of odqa-eval and ask
SLACK = 60  # hits retrieved beyond p, so that p remain after an article's passages go


class NotRecorded(ValueError):
    """A reader's chosen thresholds cannot go into its manifest (one is not finite)."""


@dataclasses.dataclass
class QuestionRead:
    """One question's picked answer per span score rule, without / with the IR score."""

    qid: str
    in_corpus: bool
    scores: dict  # rule -> {"score", "EM", "score_ir", "EM_ir"}


def sample_questions(examples: list, n: int, seed: int) -> tuple[list, list]:
    """Two disjoint seeded samples of n questions each: (in corpus, out of corpus)."""
    rng = np.random.default_rng(seed)
    chosen = rng.choice(len(examples), min(2 * n, len(examples)), replace=False)
    half = len(chosen) // 2
    return ([examples[i] for i in sorted(chosen[:half])],
            [examples[i] for i in sorted(chosen[half:])])


def read_questions(reader, examples: list, in_corpus: bool, block: int = 16
                   ) -> list[QuestionRead]:
    """Reads `examples` with `reader` (an OpenDomainReader); out of corpus: without the
    passages of each question's own article."""
    from dil_jax.open_domain.abstention import exclude_titles, normalized_title
    from dil_jax.open_domain.evaluate import question_record

    titles = [passage.title for passage in reader.index.passages]
    excluded = {e.question: {normalized_title(e.title)} for e in examples}
    search = reader.index.retriever.search_batch

    def retrieve(questions):
        hits = search(questions, P + (0 if in_corpus else SLACK))
        if in_corpus:
            return hits
        return [exclude_titles(h, titles, excluded[q], P) for q, h in zip(questions, hits,
                                                                         strict=True)]

    reader.retrieve = retrieve  # this reader instance only
    reads = []
    for start in range(0, len(examples), block):
        batch = examples[start:start + block]
        result = reader.read([e.question for e in batch])
        for i, (example, hits) in enumerate(zip(batch, result.hits, strict=True)):
            record = question_record(
                example, {rule: c[i] for rule, c in result.by_score.items()}, hits,
                [reader.index.passages[h.passage_index].text for h in hits], [P], MU)
            reads.append(QuestionRead(example.qid, in_corpus, {
                rule: {key: rows[str(P)][key] for key in ("score", "EM", "score_ir", "EM_ir")}
                for rule, rows in record["scores"].items()}))
        print(f"  {'in' if in_corpus else 'out'}: {len(reads)} of {len(examples)} read",
              file=sys.stderr, flush=True)
    return reads


def open_reader(index_dir: str, checkpoint: str):
    from dil_jax.checkpoints import load_reader
    from dil_jax.open_domain.index.folder import open_index
    from dil_jax.open_domain.reader import OpenDomainReader

    index = open_index(index_dir)
    reader = load_reader(checkpoint, None, 32)
    return OpenDomainReader(index, reader, index.open_cache(reader), top_p=P, batch_size=4,
                            chunk_size=64)


def thresholds_of(reads: list[QuestionRead]) -> dict:
    """rule -> the chosen thresholds without / with the IR score and what they do here."""
    from dil_jax.open_domain.abstention import choose_threshold

    inside = [r for r in reads if r.in_corpus]
    outside = [r for r in reads if not r.in_corpus]
    chosen = {}
    for rule in inside[0].scores:
        row = {}
        for suffix in ("", "_ir"):
            choice = choose_threshold([r.scores[rule]["score" + suffix] for r in inside],
                                      [r.scores[rule]["EM" + suffix] for r in inside],
                                      [r.scores[rule]["score" + suffix] for r in outside])
            row["threshold" + suffix] = choice.threshold
            row["on_calibration" + suffix] = dataclasses.asdict(choice)
        chosen[rule] = row
    return chosen


def applied(reads: list[QuestionRead], rule: str, threshold: float, suffix: str) -> dict:
    """What `threshold` does to `reads` (percent): coverage and EM of the answered in-corpus
    questions, EM of all in-corpus ones with refusals counted wrong, out-of-corpus refused."""
    inside = [r.scores[rule] for r in reads if r.in_corpus]
    outside = [r.scores[rule] for r in reads if not r.in_corpus]

    def answers(row):
        return row["score" + suffix] is not None and row["score" + suffix] >= threshold

    answered = [row for row in inside if answers(row)]
    return dict(
        questions_in=len(inside), questions_out=len(outside),
        EM_without_abstention=100 * float(np.mean([row["EM" + suffix] for row in inside])),
        coverage=100 * len(answered) / len(inside),
        EM_of_answered=100 * float(np.mean([row["EM" + suffix] for row in answered]))
        if answered else 0.0,
        EM_counting_refusals_wrong=100 * sum(row["EM" + suffix] for row in answered)
        / len(inside),
        out_of_corpus_refused=100 * sum(not answers(row) for row in outside) / len(outside))


def calibration_file(train: Path, n_articles: int, seed: int, out: Path) -> Path:
    """A SQuAD file of `n_articles` training articles drawn with `seed`."""
    data = json.loads(train.read_text())
    rng = np.random.default_rng(seed)
    picked = sorted(rng.choice(len(data["data"]), n_articles, replace=False))
    out.write_text(json.dumps({"version": data.get("version", "1.1"),
                               "data": [data["data"][i] for i in picked]}))
    return out


def check_not_validation(calibration: Path, validation: Path) -> None:
    """Refuses calibration articles that are validation articles: the thresholds are chosen on
    training questions only."""
    titles = {a["title"] for a in json.loads(validation.read_text())["data"]}
    shared = sorted(titles & {a["title"] for a in json.loads(calibration.read_text())["data"]})
    if shared:
        raise SystemExit(f"{calibration}: {len(shared)} article(s) are validation articles of "
                         f"{validation} ({', '.join(shared[:3])}...); calibrate on training "
                         "articles only")


def why_not_finite(threshold: float, on_calibration: dict) -> str:
    """Why `choose_threshold` gave a non-finite threshold, from what it does on the calibration
    questions (`ThresholdChoice` as a dict)."""
    if math.isnan(threshold):
        return "a reader score was NaN"
    if threshold > 0:
        return ("refusing every question was right most often on the calibration questions: no "
                "threshold answered more of them exactly than it let out-of-corpus ones through")
    if on_calibration["refused_out"] == 1.0:
        return ("no out-of-corpus question was scored (none had a candidate answer), so "
                "nothing tells where answers should stop")
    return ("answering every question was right most often on the calibration questions: no "
            "threshold refused more out-of-corpus questions than it cost exact answers")


def unrecordable(chosen: dict) -> list[str]:
    """Each threshold of `chosen` (`thresholds_of`) that is not a finite number, named, with
    why: a manifest holding one is refused when a reader loads it (a server does not start),
    and +-inf would refuse all or nothing."""
    problems = []
    for rule, row in chosen.items():
        for suffix in ("", "_ir"):
            threshold = row["threshold" + suffix]
            if not math.isfinite(threshold):
                problems.append(f"{rule} threshold{suffix} = {threshold}: "
                                f"{why_not_finite(threshold, row['on_calibration' + suffix])}")
    return problems


def record_in_manifest(folder: Path, chosen: dict, chosen_on: str) -> None:
    """Adds (or replaces) the manifest's `abstention` record, written atomically; NotRecorded
    (the manifest untouched) when a threshold is not finite."""
    problems = unrecordable(chosen)
    if problems:
        raise NotRecorded(f"--reader {folder}: thresholds not recorded: {'; '.join(problems)}; "
                          "calibrate on more questions (--questions, --articles) or leave this "
                          "reader without abstention (no --record)")
    from dil_jax.atomic import write_atomic
    from dil_jax.checkpoints import MANIFEST_FILE, ExportManifest
    from dil_jax.open_domain.abstention import MANIFEST_KEY

    manifest = ExportManifest.read(folder).to_json()
    manifest[MANIFEST_KEY] = {"chosen_on": chosen_on, "p": P, "mu": MU, "by_rule": chosen}
    write_atomic(folder / MANIFEST_FILE, json.dumps(manifest, indent=2) + "\n")


def require_file(path: str, flag: str) -> Path:
    """`path` as a Path, or a one-line exit naming the flag when it is no file."""
    if not Path(path).is_file():
        raise SystemExit(f"abstention: {flag} {path}: no such file")
    return Path(path)


def require_readers(readers: list[str]) -> None:
    """Every --reader a folder with a dil_jax manifest (thresholds are recorded there)."""
    from dil_jax.checkpoints import MANIFEST_FILE

    for reader in readers:
        if not (Path(reader) / MANIFEST_FILE).is_file():
            raise SystemExit(f"abstention: --reader {reader}: not a reader folder with "
                             f"{MANIFEST_FILE} (e.g. dil_jax/assets/minilm-squad-full)")


def calibrate(args: argparse.Namespace) -> int:
    from dil_jax.data.squad import load_squad

    require_file(args.train, "--train")
    require_file(args.validation, "--validation")
    require_readers(args.reader)
    articles = len(json.loads(Path(args.train).read_text())["data"])
    if not 1 <= args.articles <= articles:
        raise SystemExit(f"abstention: --articles {args.articles}: {args.train} has {articles} "
                         "articles")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    squad = calibration_file(Path(args.train), args.articles, args.seed,
                             work / "calibration-articles.json")
    check_not_validation(squad, Path(args.validation))
    index = work / "index"
    if not (index / "index.json").is_file():
        from dil_jax.checkpoints import ExportManifest

        ks = [str((ExportManifest.read(c).reader or {}).get("num_lower_layers", 0))
              for c in args.reader]  # each reader at the k it was trained for
        subprocess.run([sys.executable, "-m", "dil_jax", "index", "--out", str(index),
                        "--corpus", f"squad:{squad}", "--corpus", "wikipedia",
                        "--corpus-limit", str(args.leads), "--checkpoint", *args.reader, "--k", *ks,
                        "--max-passage-len", "192", "--doc-stride", "96"], check=True)
    examples = [e for e in load_squad(squad).examples if e.answer_texts]
    inside, outside = sample_questions(examples, args.questions, args.seed)
    chosen_on = (f"{len(inside)} + {len(outside)} questions (in corpus + their article removed) "
                 f"of {args.articles} training articles of {Path(args.train).name} (seed "
                 f"{args.seed}) over those articles and the first {args.leads} Wikipedia leads, "
                 f"p = {P}, mu = {MU}: tools/abstention.py calibrate")
    report = {"chosen_on": chosen_on, "readers": {}}
    refused = []  # one line per reader whose thresholds could not be recorded
    for checkpoint in args.reader:
        started = time.perf_counter()
        reader = open_reader(str(index), checkpoint)
        reads = read_questions(reader, inside, True) + read_questions(reader, outside, False)
        chosen = thresholds_of(reads)
        report["readers"][checkpoint] = {"by_rule": chosen,
                                         "seconds": round(time.perf_counter() - started, 1)}
        if args.record:
            try:
                record_in_manifest(Path(checkpoint), chosen, chosen_on)
            except NotRecorded as error:  # the other readers are still calibrated, recorded
                refused.append(f"abstention: {error}")
        print(json.dumps({checkpoint: chosen}, indent=2))
    (work / "calibration.json").write_text(json.dumps(report, indent=2))
    if refused:
        raise SystemExit("\n".join(refused))
    return 0


def measure(args: argparse.Namespace) -> int:
    from dil_jax.data.squad import load_squad, select_articles
    from dil_jax.open_domain.abstention import abstention_of

    require_file(args.data, "--data")
    require_readers(args.reader)
    examples = [e for e in select_articles(load_squad(args.data).examples, args.articles)
                if e.answer_texts]
    inside, outside = sample_questions(examples, args.questions, args.seed)
    results = {}
    for checkpoint in args.reader:
        abstention = abstention_of(checkpoint)
        if abstention is None:
            raise SystemExit(f"{checkpoint}: no abstention record in its manifest; run "
                             "`tools/abstention.py calibrate --record` first")
        reader = open_reader(args.index, checkpoint)
        reads = read_questions(reader, inside, True) + read_questions(reader, outside, False)
        results[checkpoint] = {
            f"{rule}{' +IR' if fused else ''}": applied(
                reads, rule, abstention.threshold(rule, fused), "_ir" if fused else "")
            | {"threshold": abstention.threshold(rule, fused)}
            for rule in abstention.thresholds for fused in (False, True)}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lines = ["| reader | rule | threshold | EM (all answered) | coverage | EM of answered | "
             "EM, refusals wrong | out of corpus refused |", "|---|---|---|---|---|---|---|---|"]
    for checkpoint, rows in results.items():
        for name, row in rows.items():
            lines.append(f"| `{Path(checkpoint).name}` | {name} | {row['threshold']:.2f} | "
                         f"{row['EM_without_abstention']:.1f} | {row['coverage']:.1f} | "
                         f"{row['EM_of_answered']:.1f} | {row['EM_counting_refusals_wrong']:.1f}"
                         f" | {row['out_of_corpus_refused']:.1f} |")
    command = "python tools/abstention.py " + " ".join(sys.argv[1:])
    (out / "abstention.md").write_text(f"`{command}` ({len(inside)} questions in corpus, "
                                       f"{len(outside)} with their article removed)\n\n"
                                       + "\n".join(lines) + "\n")
    (out / "abstention.json").write_text(json.dumps({"command": command, "results": results},
                                                    indent=2))
    print("\n".join(lines))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    cal = commands.add_parser("calibrate", help="choose thresholds on training questions")
    cal.add_argument("--train", required=True, help="SQuAD training file")
    cal.add_argument("--reader", action="append", required=True, help="reader folder")
    cal.add_argument("--work", required=True, help="folder for the calibration index")
    cal.add_argument("--validation", default=str(Path(__file__).resolve().parents[1].parent
                                                 / "shared/data/squad/dev-v1.1.35-articles.json"),
                     help="the validation file none of whose articles may be calibrated on")
    cal.add_argument("--articles", type=int, default=25)
    cal.add_argument("--questions", type=int, default=200, help="per side (in / out)")
    cal.add_argument("--leads", type=int, default=2500, help="Wikipedia leads in the corpus")
    cal.add_argument("--seed", type=int, default=0)
    cal.add_argument("--record", action="store_true",
                     help="write the thresholds into each reader's manifest")
    mea = commands.add_parser("measure", help="apply recorded thresholds to validation")
    mea.add_argument("--index", required=True)
    mea.add_argument("--data", required=True)
    mea.add_argument("--articles", default="28:35")
    mea.add_argument("--reader", action="append", required=True)
    mea.add_argument("--questions", type=int, default=200, help="per side (in / out)")
    mea.add_argument("--seed", type=int, default=0)
    mea.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    return calibrate(args) if args.command == "calibrate" else measure(args)


if __name__ == "__main__":
    sys.exit(main())
