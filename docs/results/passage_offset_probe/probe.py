"""Where should a delayed reader's passage positions start? A probe with no training.

A full reader (k = 0) read at split k with each passage numbered from OFFSET
(`EncoderConfig.passage_position_offset`), on SQuAD questions of the training articles; prints
official EM/F1 per offset. It shows how far the position convention alone moves a warm-started
student from its teacher before any training.

`--prefixes` also tries special tokens put before the passage in the lower blocks only (`cls`,
`sep`, `cls+sep`, at the positions just below OFFSET, token type 0 as in the full reader's
`[CLS] q [SEP]`) and dropped before the upper blocks, which see `[CLS] q [SEP] p [SEP]` as
always: in the full reader every passage token can attend to `[CLS]` and the question's `[SEP]`
in every block, and many heads park their attention there. The passage stays question-independent.
A probe only: the prefix is not a model option.

    python docs/results/passage_offset_probe/probe.py --reader dil_jax/assets/minilm-squad-full \\
        --k 4 --offsets 0 14 24 --questions 4000:4400
    python docs/results/passage_offset_probe/probe.py --reader dil_jax/assets/minilm-squad-full \\
        --k 4 --offsets 14 --prefixes none cls sep cls+sep --questions 4000:4400
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import jax.numpy as jnp

from dil_jax.checkpoints.readers import load_reader
from dil_jax.data.squad import gold_answers, load_squad, select_articles
from dil_jax.defaults import CPU_DOC_STRIDE, CPU_MAX_PASSAGE_LEN, CPU_MAX_QUESTION_LEN
from dil_jax.metrics.squad_metric import squad_scores
from dil_jax.model.delayed import PASSAGE_SEGMENT, DelayedInteractionModel
from dil_jax.predict import predict_squad


class PrefixedPassageModel(DelayedInteractionModel):
    """A delayed reader whose passages carry `prefix_ids` in the lower blocks only."""

    def __init__(self, config, prefix_ids: list[int]):
        super().__init__(config)
        self.prefix_ids = prefix_ids

    def encode_lower(self, params, ids, mask, segment, position_offset=None, **options):
        """[batch, seq] passage ids -> [batch, seq, hidden], the prefix read and dropped."""
        if segment != PASSAGE_SEGMENT or not self.prefix_ids or position_offset is not None:
            return super().encode_lower(params, ids, mask, segment, position_offset, **options)
        config, count = self.config, len(self.prefix_ids)
        start = config.passage_position_offset - count  # >= 0: checked by main

        def lower(module, ids, mask):
            batch = ids.shape[0]
            prefix = jnp.broadcast_to(jnp.asarray(self.prefix_ids, ids.dtype), (batch, count))
            all_ids = jnp.concatenate([prefix, ids], axis=1)
            all_mask = jnp.concatenate([jnp.ones((batch, count), mask.dtype), mask], axis=1)
            positions = jnp.broadcast_to(jnp.arange(start, start + all_ids.shape[1]),
                                         all_ids.shape)
            types = jnp.concatenate([jnp.zeros((batch, count), jnp.int32),
                                     jnp.ones(ids.shape, jnp.int32)], axis=1)
            states = module.embeddings(all_ids, types, positions, True)
            states = module._run_layers(states, all_mask, range(config.num_lower_layers), True)
            return states[-1][:, count:]

        return self.module.apply({"params": params}, ids, mask, method=lower)


def prefix_token_ids(tokenizer, name: str) -> list[int]:
    """`none`, `cls`, `sep` or `cls+sep` -> the tokenizer's ids."""
    by_name = {"cls": tokenizer.cls_token_id, "sep": tokenizer.sep_token_id}
    return [] if name == "none" else [by_name[part] for part in name.split("+")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reader", required=True, help="a full reader's params folder")
    parser.add_argument("--k", type=int, required=True)
    parser.add_argument("--offsets", type=int, nargs="+", required=True)
    parser.add_argument("--data", default="../shared/data/squad/dev-v1.1.35-articles.json")
    parser.add_argument("--articles", default="0:28", help="the training articles")
    parser.add_argument("--questions", default="4000:4400",
                        help="slice of those articles' questions (ones the reader did not see)")
    parser.add_argument("--prefixes", nargs="+", default=["none"],
                        choices=["none", "cls", "sep", "cls+sep"],
                        help="special tokens before the passage in the lower blocks only")
    args = parser.parse_args()
    longest = max(len(prefix.split("+")) for prefix in args.prefixes if prefix != "none") \
        if set(args.prefixes) - {"none"} else 0
    if min(args.offsets) < longest:
        parser.error(f"--offsets {min(args.offsets)}: a prefix of {longest} token(s) needs "
                     f"offsets >= {longest} (its tokens sit just below the passage)")
    reader = load_reader(args.reader, args.k, CPU_MAX_QUESTION_LEN)
    begin, end = (int(part) for part in args.questions.split(":"))
    examples = select_articles(load_squad(args.data).examples, args.articles)[begin:end]
    for offset, prefix in ((offset, prefix) for offset in args.offsets
                           for prefix in args.prefixes):
        shifted = PrefixedPassageModel(reader.config.replace(passage_position_offset=offset),
                                       prefix_token_ids(reader.tokenizer, prefix))
        started = time.perf_counter()
        predictions = predict_squad(dataclasses.replace(reader, model=shifted), examples,
                                    max_passage_len=CPU_MAX_PASSAGE_LEN,
                                    doc_stride=CPU_DOC_STRIDE, batch_size=64, progress=False)
        scores = squad_scores(gold_answers(examples), predictions, version="1.1")
        print(f"k={args.k} offset={offset} prefix={prefix} questions={len(examples)} "
              f"EM={scores['exact']:.2f} F1={scores['f1']:.2f} "
              f"({time.perf_counter() - started:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
