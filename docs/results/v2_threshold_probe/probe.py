"""Where does a SQuAD v2.0 reader lose: its null threshold, or its null score? A probe.

Reads the training articles' threshold questions (the evaluator's `spread_subset` of them) and
the validation articles once each with no threshold, then prints the official v2.0 scores of
each set (exact, f1, HasAns_f1, NoAns_f1) when always answering, at the threshold chosen on the
training questions (what training reports), and at the threshold that would be best on the set
itself. The last one, on validation, is a diagnosis only (it is tuned on the questions it
scores) and is never a reported result: if it is close to the training threshold's score, the
threshold is not what the reader lacks.

    python docs/results/v2_threshold_probe/probe.py --reader runs/minilm_squad_full_v2/params \\
        --k 0 --tokenizer dil_jax/assets/minilm-squad-full
"""

from __future__ import annotations

import argparse
import math

from dil_jax.checkpoints.readers import load_reader
from dil_jax.data.decoding import answers, null_score_differences
from dil_jax.data.squad import gold_answers, load_squad, select_articles
from dil_jax.defaults import (
    CPU_DOC_STRIDE,
    CPU_MAX_PASSAGE_LEN,
    CPU_MAX_QUESTION_LEN,
    SHARED_SQUAD_V2_FILE,
)
from dil_jax.metrics.squad_metric import best_null_threshold, squad_scores
from dil_jax.predict import predict_squad_spans
from dil_jax.train.squad_data import spread_subset

REPORTED = ("exact", "f1", "HasAns_f1", "NoAns_f1")


def scores_at(examples, best_spans: dict, differences: dict, threshold: float) -> str:
    """Official v2.0 scores when a question is answered "" where its difference > threshold."""
    predictions = {qid: "" if differences[qid] > threshold else text
                   for qid, text in best_spans.items()}
    scores = squad_scores(gold_answers(examples), predictions, version="2.0")
    return " ".join(f"{key}={float(scores[key]):.2f}" for key in REPORTED if key in scores)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reader", required=True, help="a v2.0 reader's params folder")
    parser.add_argument("--k", type=int, default=None, help="split (default: the reader's own)")
    parser.add_argument("--tokenizer", default=None,
                        help="tokenizer folder when the reader has none (a run's params)")
    parser.add_argument("--data", default=SHARED_SQUAD_V2_FILE)
    parser.add_argument("--train-articles", default="0:28")
    parser.add_argument("--validation-articles", default="28:35")
    parser.add_argument("--threshold-questions", type=int, default=1000)
    args = parser.parse_args()
    reader = load_reader(args.reader, args.k, CPU_MAX_QUESTION_LEN, args.tokenizer)
    examples = load_squad(args.data).examples
    train = spread_subset(select_articles(examples, args.train_articles),
                          args.threshold_questions)
    validation = select_articles(examples, args.validation_articles)
    options = dict(max_passage_len=CPU_MAX_PASSAGE_LEN, doc_stride=CPU_DOC_STRIDE,
                   batch_size=32, progress=False)
    chosen = None
    for name, subset in (("training threshold questions", train), ("validation", validation)):
        spans = predict_squad_spans(reader, subset, null_threshold=math.inf, **options)
        best_spans, differences = answers(spans), null_score_differences(spans)
        own, _ = best_null_threshold(gold_answers(subset), best_spans, differences)
        chosen = own if chosen is None else chosen
        rows = (("always answer", math.inf), (f"training threshold {chosen:+.3f}", chosen),
                (f"its own best {own:+.3f}", own))
        print(f"{name} ({len(subset)} questions)")
        for label, threshold in rows:
            print(f"  {label:<28} {scores_at(subset, best_spans, differences, threshold)}",
                  flush=True)


if __name__ == "__main__":
    main()
