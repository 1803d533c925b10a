"""`dil-jax evaluate`: the official SQuAD scores of a predictions file, printed as JSON."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

log = logging.getLogger(__name__)


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "evaluate", help="score SQuAD predictions (official EM/F1)",
        description="Prints the official SQuAD v1.1 / v2.0 scores of a predictions file "
                    "({question id: answer}) as JSON.")
    parser.add_argument("--data", required=True, help="SQuAD JSON file (v1.1 or v2.0)")
    parser.add_argument("--predictions", required=True, help="predictions JSON file")
    parser.add_argument("--only-predicted", action="store_true",
                        help="score only the questions the file predicts (e.g. predictions of "
                             "`predict --limit N`) instead of every question of --data, where "
                             "a missing prediction scores 0 as in the official script")
    parser.set_defaults(func=run)


def load_predictions(path: str | Path) -> dict[str, str]:
    """qid -> answer from a predictions file; errors (InputFileError) name the file and the
    question id."""
    from dil_jax.errors import InputFileError

    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputFileError(f"{path}: no such predictions file") from None
    except IsADirectoryError:
        raise InputFileError(f"{path} is a folder, not a predictions file; give the "
                             "predictions JSON file itself") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise InputFileError(f"{path}: not valid JSON ({error})") from None
    if not isinstance(raw, dict):
        raise InputFileError(f"{path}: expected a JSON object {{question id: answer}}, got "
                             f"{type(raw).__name__}")
    for qid, answer in raw.items():
        if not isinstance(answer, str):
            raise InputFileError(f"{path}: question {qid!r}: answer must be a string, got "
                                 f"{type(answer).__name__}")
    return raw


def run(args: argparse.Namespace) -> int:
    from dil_jax.commands.arguments import require_file
    from dil_jax.data.squad import load_squad
    from dil_jax.metrics.squad_metric import squad_scores

    # Both files are checked before either is parsed: a folder given for one of them would
    # otherwise surface as an OS error from deep inside the reader.
    require_file(args.data, "--data", "SQuAD file")
    require_file(args.predictions, "--predictions", "predictions file")
    # Answer spans are not needed to score, and the official scripts do not check them.
    dataset = load_squad(args.data, check_spans=False)
    predictions = load_predictions(args.predictions)
    gold = dataset.gold_answers
    if args.only_predicted:
        gold = {qid: answers for qid, answers in gold.items() if qid in predictions}
        if not gold:
            from dil_jax.errors import InputFileError

            raise InputFileError(f"{args.predictions}: no prediction is for a question of "
                                 f"{args.data}: nothing to score with --only-predicted")
    scores = squad_scores(gold, predictions, dataset.version)
    if scores.get("missing"):
        log.warning("%d question(s) of %s have no prediction; they score 0 (--only-predicted "
                    "scores only the %d predicted ones)", scores["missing"], args.data,
                    len(gold) - scores["missing"])
    unknown = len(set(predictions) - {example.qid for example in dataset.examples})
    if unknown:
        log.warning("%d prediction(s) are for question ids not in %s", unknown, args.data)
    print(json.dumps(scores, indent=2))
    return 0
