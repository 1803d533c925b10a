"""`dil-jax prescreen`: train the sentence prescreener on SQuAD articles and report accuracy.

    dil-jax prescreen --data ../shared/data/squad/dev-v1.1.35-articles.json \
        --train-articles 0:28 --val-articles 28:35 --out runs/prescreen

Sentence embeddings come from the embedded all-MiniLM-L6-v2 (mean pooling, normalised), computed
once; the prescreener ("Prototype 4") is trained on the training articles and scored on the
validation articles: top-1 and top-2 sentence accuracy next to the first-sentence baseline.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "prescreen", help="train/evaluate the sentence prescreener (SEP)", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="SQuAD JSON file")
    parser.add_argument("--train-articles", default="0:28")
    parser.add_argument("--val-articles", default="28:35")
    parser.add_argument("--encoder", default="default", help="sentence encoder checkpoint")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--readers", nargs="*", default=[],
                        help="reader checkpoints to run end to end with and without prescreening "
                             "on the validation questions")
    parser.add_argument("--top-m", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--eval-limit", type=int, default=400,
                        help="validation questions read end to end (the first N)")
    parser.add_argument("--max-passage-len", type=int, default=160,
                        help="passage window of the reader without prescreening")
    parser.add_argument("--sep-passage-len", type=int, default=96,
                        help="passage window of the reader over the kept sentences")
    parser.add_argument("--out", default=None, help="write results.json and params.msgpack here")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import flax.serialization

    from dil_jax.atomic import write_atomic
    from dil_jax.checkpoints import load_reader
    from dil_jax.data.squad import load_squad, select_articles
    from dil_jax.sep.model import PrescreenConfig
    from dil_jax.sep.train import (
        build_sentence_data,
        first_sentence_accuracy,
        sentence_scores,
        topk_accuracy,
        train_prescreener,
    )

    started = time.perf_counter()
    encoder, params, tokenizer = load_reader(args.encoder, None, 64)
    examples = load_squad(args.data).examples
    splits = {name: build_sentence_data(select_articles(examples, spec), encoder, params,
                                        tokenizer)
              for name, spec in (("train", args.train_articles), ("validation", args.val_articles))}
    embedded = time.perf_counter() - started
    config = PrescreenConfig(embedding_dim=splits["train"].question.shape[1], width=args.width,
                             mlp_dim=2 * args.width, num_layers=args.layers)
    result = train_prescreener(splits["train"], config, steps=args.steps, seed=args.seed)
    trained = time.perf_counter() - started - embedded
    report = {}
    for name, data in splits.items():
        scores = sentence_scores(result.params, config, data)
        report[name] = dict(questions=len(data.label), dropped=data.dropped,
                            first_sentence=first_sentence_accuracy(data),
                            **topk_accuracy(scores, data.label))
    print("| split | questions | first sentence | top-1 | top-2 |\n|---|---|---|---|---|")
    for name, row in report.items():
        print(f"| {name} | {row['questions']} | {100 * row['first_sentence']:.1f} | "
              f"{100 * row['top1']:.1f} | {100 * row['top2']:.1f} |")
    print(f"embeddings {embedded:.0f} s, training {trained:.0f} s ({args.steps} steps); final "
          f"train loss {sum(result.losses[-50:]) / 50:.3f}")
    if args.readers:
        report["end_to_end"] = end_to_end(args, splits["validation"], result.params, config)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        record = dict(report=report, config=config.__dict__, args=vars(args) | {"func": None},
                      seconds=dict(embeddings=embedded, training=trained))
        for name, payload in (("results.json", json.dumps(record, indent=2, default=str)
                               .encode()),
                              ("params.msgpack", flax.serialization.to_bytes(result.params))):
            write_atomic(out / name, payload)
    return 0


def end_to_end(args, data, prescreen_params, config) -> list[dict]:
    """EM/F1 and reader time with and without prescreening, per reader and top-m."""
    import numpy as np

    from dil_jax.checkpoints import load_reader
    from dil_jax.metrics.squad_metric import squad_scores
    from dil_jax.sep.integrate import prescreen_examples, timed_predict
    from dil_jax.sep.train import SentenceData, sentence_scores

    n = min(args.eval_limit, len(data.label))
    subset = SentenceData(data.question[:n], data.sentences[:n], data.sentence_mask[:n],
                          data.label[:n], data.qids[:n], 0, data.examples[:n], data.spans[:n])
    scores = sentence_scores(prescreen_params, config, subset)
    rows = []
    print("\n| reader | k | prescreen | EM | F1 | reader s | P(SEP) | EM given SEP kept answer |\n"
          "|---|---|---|---|---|---|---|---|")
    for checkpoint in args.readers:
        model, params, tokenizer = load_reader(checkpoint, None, 32)
        k = model.config.num_lower_layers
        runs = [("none", subset.examples, None, args.max_passage_len)]
        for m in args.top_m:
            screened = prescreen_examples(subset.examples, subset.spans, scores, subset.label, m)
            runs.append((f"top-{m}", screened.examples, screened.kept_answer_sentence,
                         args.sep_passage_len))
        for name, examples, kept, passage_len in runs:
            timed_predict(model, params, tokenizer, examples[:8], max_passage_len=passage_len,
                          doc_stride=passage_len // 2)  # compile outside the timing
            answers, seconds = timed_predict(model, params, tokenizer, examples,
                                             max_passage_len=passage_len,
                                             doc_stride=passage_len // 2)
            scores_all = squad_scores(subset.examples, answers, version="1.1")
            row = dict(reader=checkpoint, k=k, prescreen=name, EM=scores_all["exact"],
                       F1=scores_all["f1"], reader_seconds=seconds, questions=n)
            if kept is not None:
                inside = [e for e, keep in zip(subset.examples, kept, strict=True) if keep]
                row["P_sep"] = float(np.mean(kept))
                row["EM_given_sep"] = squad_scores(
                    inside, {e.qid: answers[e.qid] for e in inside}, version="1.1")["exact"]
            rows.append(row)
            print(f"| {checkpoint} | {k} | {name} | {row['EM']:.1f} | {row['F1']:.1f} | "
                  f"{seconds:.1f} | {100 * row.get('P_sep', 1.0):.1f} | "
                  f"{row.get('EM_given_sep', row['EM']):.1f} |")
    return rows
