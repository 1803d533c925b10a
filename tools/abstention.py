"""Abstention thresholds for the open-domain readers: chosen on TRAINING questions, measured on
validation ones (dil_jax/open_domain/abstention.py says what the threshold compares and why).
Beside each threshold, a logistic rule over the reader score and the retrieval match (the best
BM25 score over the question's attainable one) is fitted on the same questions and recorded;
`measure` reports both rules side by side. calibrate writes every question's features to
WORK/calibration.json, and `fit` refits and records from that file without reading again:

    python tools/abstention.py fit --calibration runs/abstention/calibration.json \
        --reader dil_jax/assets/minilm-squad-k4 --record

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


@dataclasses.dataclass(frozen=True)
class QuestionRead:
    """One question's picked answer per span score rule, without / with the IR score, and how
    well BM25 matched it (`retrieval_match`; None in a calibration file written before it)."""

    qid: str
    in_corpus: bool
    scores: dict  # rule -> {"score", "EM", "score_ir", "EM_ir"}
    retrieval_match: float | None = None

    def features(self, rule: str, suffix: str) -> tuple[float, float] | None:
        """(reader score, retrieval match) of the picked answer, None without a candidate."""
        score = self.scores[rule]["score" + suffix]
        if score is None:
            return None
        if self.retrieval_match is None:
            raise ValueError(f"question {self.qid}: no retrieval match recorded (a calibration "
                             "file of an older tools/abstention.py): calibrate again")
        return (score, self.retrieval_match)


def reads_from_json(rows: list) -> list[QuestionRead]:
    """The questions of a calibration file's `questions` (`dataclasses.asdict` of each)."""
    return [QuestionRead(row["qid"], row["in_corpus"], row["scores"],
                         row.get("retrieval_match")) for row in rows]


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
    from dil_jax.open_domain.abstention import (
        exclude_titles,
        normalized_title,
        retrieval_match,
    )
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
            match = retrieval_match(hits, reader.index.retriever.attainable(example.question))
            reads.append(QuestionRead(example.qid, in_corpus, {
                rule: {key: rows[str(P)][key] for key in ("score", "EM", "score_ir", "EM_ir")}
                for rule, rows in record["scores"].items()}, match))
        print(f"  {'in' if in_corpus else 'out'}: {len(reads)} of {len(examples)} read",
              file=sys.stderr, flush=True)
    return reads


def open_reader(index_dir: str, checkpoint: str):
    from dil_jax.open_domain.index.folder import open_index
    from dil_jax.open_domain.reader import OpenDomainReader
    from dil_jax.readers import load_reader

    index = open_index(index_dir)
    reader = load_reader(checkpoint, None, 32)
    return OpenDomainReader(index, reader, index.open_cache(reader), top_p=P, batch_size=4,
                            chunk_size=64)


def thresholds_of(reads: list[QuestionRead]) -> dict:
    """rule -> the chosen thresholds without / with the IR score and what they do here, and,
    when every read has its retrieval match, the logistic rules (`combined_of`)."""
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
        if all(r.retrieval_match is not None for r in reads):
            row.update(combined_of(inside, outside, rule))
        chosen[rule] = row
    return chosen


def combined_of(inside: list[QuestionRead], outside: list[QuestionRead], rule: str) -> dict:
    """The logistic rules of `rule` without / with the IR score (`choose_combined`) and what
    they do on these questions: {"combined", "on_calibration_combined", "combined_ir", ...};
    both or neither: when one cannot be recorded (no fit, or a probability threshold that
    refuses all or nothing), {"combined_not_recorded": why} (the threshold then decides)."""
    from dil_jax.open_domain.abstention import choose_combined

    row = {}
    for suffix in ("", "_ir"):
        try:
            logistic, choice = choose_combined([r.features(rule, suffix) for r in inside],
                                               [r.scores[rule]["EM" + suffix] for r in inside],
                                               [r.features(rule, suffix) for r in outside])
        except ValueError as error:
            return {"combined_not_recorded": f"combined{suffix}: {error}"}
        if not math.isfinite(logistic.probability):
            why = why_not_finite(logistic.probability, dataclasses.asdict(choice))
            return {"combined_not_recorded": f"combined{suffix}: probability threshold "
                                             f"{logistic.probability}: {why}"}
        row["combined" + suffix] = logistic.to_json()
        row["on_calibration_combined" + suffix] = dataclasses.asdict(choice)
    return row


def applied(reads: list[QuestionRead], rule: str, suffix: str, answers) -> dict:
    """What a decision rule does to `reads` (percent): coverage and EM of the answered
    in-corpus questions, EM of all in-corpus ones with refusals counted wrong, out-of-corpus
    refused. answers(read) -> whether the read's picked answer is shown (False without one)."""
    inside = [r for r in reads if r.in_corpus]
    outside = [r for r in reads if not r.in_corpus]
    answered = [r.scores[rule] for r in inside if answers(r)]
    return dict(
        questions_in=len(inside), questions_out=len(outside),
        EM_without_abstention=100 * float(np.mean([r.scores[rule]["EM" + suffix]
                                                   for r in inside])),
        coverage=100 * len(answered) / len(inside),
        EM_of_answered=100 * float(np.mean([row["EM" + suffix] for row in answered]))
        if answered else 0.0,
        EM_counting_refusals_wrong=100 * sum(row["EM" + suffix] for row in answered)
        / len(inside),
        out_of_corpus_refused=100 * sum(not answers(r) for r in outside) / len(outside))


def by_threshold(rule: str, suffix: str, threshold: float):
    """`applied`'s `answers` of today's rule: the reader score >= the threshold."""
    def answers(read: QuestionRead) -> bool:
        score = read.scores[rule]["score" + suffix]
        return score is not None and score >= threshold
    return answers


def by_logistic(rule: str, suffix: str, logistic):
    """`applied`'s `answers` of a `LogisticRule`: its probability >= its threshold."""
    def answers(read: QuestionRead) -> bool:
        features = read.features(rule, suffix)
        return features is not None and \
            logistic.probability_of(*features) >= logistic.probability
    return answers


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
    by_rule = {rule: {key: value for key, value in row.items()
                      if key != "combined_not_recorded"} for rule, row in chosen.items()}
    manifest[MANIFEST_KEY] = {"chosen_on": chosen_on, "p": P, "mu": MU, "by_rule": by_rule}
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
        report["readers"][checkpoint] = {
            "seconds": round(time.perf_counter() - started, 1),
            # every question's features: `fit` refits from them without reading again
            "questions": [dataclasses.asdict(read) for read in reads]}
        # written after each reader: a later failure keeps what was read
        (work / "calibration.json").write_text(json.dumps(report, indent=2))
        refused += fit_and_record(checkpoint, reads, chosen_on, args.record, report)
        (work / "calibration.json").write_text(json.dumps(report, indent=2))
    if refused:
        raise SystemExit("\n".join(refused))
    return 0


def fit_and_record(checkpoint: str, reads: list[QuestionRead], chosen_on: str, record: bool,
                   report: dict) -> list[str]:
    """Chooses the thresholds and fits the logistic rules of one reader's `reads`, puts them
    in `report["readers"][checkpoint]["by_rule"]`, prints them and, with `record`, writes them
    into its manifest; returns the line saying why they were not recorded, if so."""
    chosen = thresholds_of(reads)
    report["readers"].setdefault(checkpoint, {})["by_rule"] = chosen
    print(json.dumps({checkpoint: chosen}, indent=2))
    for rule, row in chosen.items():
        if "combined_not_recorded" in row:
            print(f"abstention: {checkpoint} {rule}: no logistic rule recorded "
                  f"({row['combined_not_recorded']}); its threshold decides", file=sys.stderr)
    if not record:
        return []
    try:
        record_in_manifest(Path(checkpoint), chosen, chosen_on)
    except NotRecorded as error:  # the other readers are still calibrated, recorded
        return [f"abstention: {error}"]
    return []


def fit(args: argparse.Namespace) -> int:
    """Refits (and with --record records) from a calibration file's recorded features."""
    path = require_file(args.calibration, "--calibration")
    report = json.loads(path.read_text())
    readers = report.get("readers", {})
    refused = []
    for checkpoint in args.reader:
        rows = readers.get(checkpoint, {}).get("questions")
        if not rows:
            raise SystemExit(f"abstention: --calibration {path}: no questions recorded for "
                             f"--reader {checkpoint} (readers there: {', '.join(readers)})")
        try:
            reads = reads_from_json(rows)
            refused += fit_and_record(checkpoint, reads, report["chosen_on"], args.record,
                                      {"readers": {}})
        except (KeyError, TypeError, ValueError) as error:
            raise SystemExit(f"abstention: --calibration {path}: the questions of {checkpoint} "
                             f"cannot be read ({type(error).__name__}: {error})") from error
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
        results[checkpoint] = measured(reads, abstention)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lines = ["| reader | rule | decided by | EM (all answered) | coverage | EM of answered | "
             "EM, refusals wrong | out of corpus refused |", "|---|---|---|---|---|---|---|---|"]
    for checkpoint, rows in results.items():
        for name, row in rows.items():
            lines.append(f"| `{Path(checkpoint).name}` | {name} | {row['decided_by']} | "
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


def measured(reads: list[QuestionRead], abstention) -> dict:
    """Both rules side by side on `reads`: for each span rule, without and with the IR score,
    the threshold's row and, where the reader records one, the logistic rule's."""
    rows = {}
    for rule in abstention.thresholds:
        for fused in (False, True):
            suffix, name = ("_ir", f"{rule} +IR") if fused else ("", rule)
            threshold = abstention.threshold(rule, fused)
            rows[name] = applied(reads, rule, suffix, by_threshold(rule, suffix, threshold)) \
                | {"decided_by": f"reader score >= {threshold:.2f}", "threshold": threshold}
            logistic = abstention.logistic(rule, fused)
            if logistic is not None:
                rows[f"{name}, with retrieval match"] = applied(
                    reads, rule, suffix, by_logistic(rule, suffix, logistic)) | {
                    "decided_by": f"p >= {logistic.probability:.2f}, p = sigmoid("
                                  f"{logistic.bias:.2f} + {logistic.reader_score:.3f} x score + "
                                  f"{logistic.retrieval_match:.2f} x match)",
                    "rule": logistic.to_json()}
    return rows


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
    refit = commands.add_parser("fit", help="refit from a calibration file's recorded "
                                             "features, without reading")
    refit.add_argument("--calibration", required=True, help="WORK/calibration.json")
    refit.add_argument("--reader", action="append", required=True,
                       help="reader folder, as given to calibrate")
    refit.add_argument("--record", action="store_true",
                       help="write the thresholds and rules into each reader's manifest")
    args = parser.parse_args(argv)
    return {"calibrate": calibrate, "measure": measure, "fit": fit}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
