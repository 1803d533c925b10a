"""Where should a delayed reader's passage positions start? A probe with no training.

A full reader (k = 0) read at split k with each passage numbered from OFFSET
(`EncoderConfig.passage_position_offset`), on SQuAD questions of the training articles that the
reader was not trained on; prints official EM/F1 per offset. It shows how far the position
convention alone moves a warm-started student from its teacher before any training.

    python tools/passage_offset_probe.py --reader dil_jax/assets/minilm-squad-full --k 4 \\
        --offsets 0 14 24 --questions 4000:4400
"""

from __future__ import annotations

import argparse
import time

from dil_jax.checkpoints.readers import load_reader
from dil_jax.data.squad import load_squad, select_articles
from dil_jax.defaults import CPU_DOC_STRIDE, CPU_MAX_PASSAGE_LEN, CPU_MAX_QUESTION_LEN
from dil_jax.metrics.squad_metric import squad_scores
from dil_jax.model.delayed import DelayedInteractionModel
from dil_jax.predict import predict_squad


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reader", required=True, help="a full reader's params folder")
    parser.add_argument("--k", type=int, required=True)
    parser.add_argument("--offsets", type=int, nargs="+", required=True)
    parser.add_argument("--data", default="../shared/data/squad/dev-v1.1.35-articles.json")
    parser.add_argument("--articles", default="0:28", help="the training articles")
    parser.add_argument("--questions", default="4000:4400",
                        help="slice of those articles' questions (ones the reader did not see)")
    args = parser.parse_args()
    model, params, tokenizer = load_reader(args.reader, args.k, CPU_MAX_QUESTION_LEN)
    begin, end = (int(part) for part in args.questions.split(":"))
    examples = select_articles(load_squad(args.data).examples, args.articles)[begin:end]
    for offset in args.offsets:
        shifted = DelayedInteractionModel(model.config.replace(passage_position_offset=offset))
        started = time.perf_counter()
        predictions = predict_squad(shifted, params, tokenizer, examples,
                                    max_passage_len=CPU_MAX_PASSAGE_LEN,
                                    doc_stride=CPU_DOC_STRIDE, batch_size=64, progress=False)
        scores = squad_scores(examples, predictions, version="1.1")
        print(f"k={args.k} offset={offset} questions={len(examples)} "
              f"EM={scores['exact']:.2f} F1={scores['f1']:.2f} "
              f"({time.perf_counter() - started:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
