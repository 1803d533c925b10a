"""The embedded MiniLM (all-MiniLM-L6-v2: 6 layers, hidden 384) fine-tuned on the complete SQuAD
v1.1 training set (../shared/data/squad/train-v1.1.json: 442 articles, 87,599 questions) and
validated on all 35 shared dev articles (6,013 questions; the other 13 official dev articles are
held out elsewhere). Issue 38's protocol (docs/results/training_log.md, "The complete training
set").

Question 32 + passage window 160 tokens, stride 80 (the open-domain readers' lengths, as
configs/minilm_squad.py): 132,928 training windows, 4,154 steps of batch 32 an epoch. AdamW,
10% warmup then linear decay, word embeddings frozen (the bundled readers ship without them); an
evaluation every 1,000 steps; the exported reader is the best checkpoint by validation F1.

Variants (`configs/minilm_squad_v11.py:VARIANT[,multi][,shared]`), N = k in 1..5 of the 6 blocks:
  full       k = 0 from the pre-trained encoder, 2 epochs (also the students' teacher)
  kN         k = N from the pre-trained encoder, cross-entropy only (DilBERT's recipe)
  kN_distill k = N from the pre-trained encoder with DeFormer's KD + LRS from the fine-tuned full
             reader (DeFormer's recipe)
  kN_warm    k = N initialised from the fine-tuned full reader, then KD + LRS from it
  full_warm  k = 0 with the kN_warm recipe: the control for the students' extra steps
The teacher (and the warm start) is `runs/minilm_squad_v11_full/params`, the `full` run's export;
point `teacher.checkpoint` and `model.checkpoint` elsewhere with overrides.

Suffixes:
  multi   every occurrence of an ambiguous answer is a correct span (data.answer_candidates_file
          = ../shared/data/squad/train-v1.1.ambiguous-offsets.json; the span loss is minus the log
          of their summed probability) instead of the file's first occurrence
  shared  2 BM25 distractor windows per training question (other training paragraphs and
          Wikipedia leads) and one softmax over each question's group of 4 windows
          (docs/training.md, "Distractors and shared normalisation"): the open-domain stage,
          run as a second stage from a reader (`model.checkpoint`, `num_train_steps`)

    dil-jax train --config configs/minilm_squad_v11.py:full
    dil-jax train --config configs/minilm_squad_v11.py:k4_warm
"""

import ml_collections

from dil_jax.errors import UsageError
from dil_jax.train.recipes import (
    complete_squad_v11,
    distil_from,
    minilm_config,
    minilm_variant,
)

MULTI_SUFFIX, SHARED_SUFFIX = "multi", "shared"
SUFFIXES = (MULTI_SUFFIX, SHARED_SUFFIX)
USAGE = ("configs/minilm_squad_v11.py:VARIANT[,multi][,shared], VARIANT = full, full_warm, kN, "
         "kN_distill or kN_warm (N = 1..5)")
BATCH_SIZE = 32
# BERT-style fine-tuning rates for a 6-block, 384-wide encoder at batch 32 (the CPU protocol's
# sweep at batch 16 on 4.7k questions favoured higher rates for its short schedules).
LEARNING_RATE = 1e-4
WARM_LEARNING_RATE = 1e-4
FULL_READER = "runs/minilm_squad_v11_full/params"


def get_config(spec: str = "full") -> ml_collections.ConfigDict:
    variant, *suffixes = spec.split(",")
    for suffix in suffixes:
        if suffix not in SUFFIXES or suffixes.count(suffix) > 1:
            raise UsageError(f"configs/minilm_squad_v11.py: bad suffix {suffix!r} in {spec!r} "
                             f"({USAGE})")
    k, recipe = minilm_variant("configs/minilm_squad_v11.py", variant, USAGE)
    c = minilm_config(f"runs/minilm_squad_v11_{variant}" + "".join(f"_{s}" for s in suffixes), k)
    complete_squad_v11(c, multi=MULTI_SUFFIX in suffixes)
    if SHARED_SUFFIX in suffixes:
        c.data.distractors_per_question = 2
        c.data.windows_per_question = 4
        c.loss.shared_norm = True
    c.batch_size = BATCH_SIZE
    c.num_epochs = 2.0
    c.optim.learning_rate = LEARNING_RATE
    c.checkpoint.every_steps = 1000
    c.checkpoint.keep = 2
    # No early stopping: the schedule is the budget.
    c.log.every_steps = 50
    distil_from(c, recipe, FULL_READER, WARM_LEARNING_RATE)
    return c
