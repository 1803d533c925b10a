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
import os
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
    parser.add_argument("--out", default=None, help="write results.json and params.msgpack here")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import flax.serialization

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
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        record = dict(report=report, config=config.__dict__, args=vars(args) | {"func": None},
                      seconds=dict(embeddings=embedded, training=trained))
        for name, payload in (("results.json", json.dumps(record, indent=2, default=str)
                               .encode()),
                              ("params.msgpack", flax.serialization.to_bytes(result.params))):
            temporary = out / f".{name}.tmp"
            temporary.write_bytes(payload)
            os.replace(temporary, out / name)
    return 0
