"""The embedded MiniLM (all-MiniLM-L6-v2: 6 layers, hidden 384) fine-tuned on the complete SQuAD
v1.1 training set (../shared/data/squad/train-v1.1.json: 442 articles, 87,599 questions) and
validated on all 35 shared dev articles (6,013 questions; the other 13 official dev articles are
held out elsewhere). Issue 38's protocol (docs/training.md, "The complete training set").

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

import re

import ml_collections

from dil_jax.defaults import (
    CPU_DOC_STRIDE,
    CPU_MAX_PASSAGE_LEN,
    CPU_MAX_QUESTION_LEN,
    SHARED_SQUAD_FILE,
    SHARED_SQUAD_TRAIN_CANDIDATES_FILE,
    SHARED_SQUAD_TRAIN_FILE,
)
from dil_jax.errors import UsageError
from dil_jax.train.default_config import base_config

VARIANT_PATTERN = re.compile(
    r"full(?P<full_recipe>_warm)?|k(?P<k>[1-5])(?P<recipe>_distill|_warm)?")
MULTI_SUFFIX, SHARED_SUFFIX = "multi", "shared"
SUFFIXES = (MULTI_SUFFIX, SHARED_SUFFIX)
USAGE = ("configs/minilm_squad_v11.py:VARIANT[,multi][,shared], VARIANT = full, full_warm, kN, "
         "kN_distill or kN_warm (N = 1..5)")
# The median length of `[CLS] q [SEP]` (MiniLM WordPiece), as configs/minilm_squad.py: a delayed
# reader's passages start where the full reader's mostly do, the same for every question.
PASSAGE_POSITION_OFFSET = 14
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
    match = VARIANT_PATTERN.fullmatch(variant)
    if not match:
        raise UsageError(f"configs/minilm_squad_v11.py: unknown variant {variant!r} ({USAGE})")
    k = int(match.group("k") or 0)
    recipe = (match.group("recipe") or match.group("full_recipe") or "").lstrip("_")
    c = base_config()
    c.workdir = f"runs/minilm_squad_v11_{variant}" + "".join(f"_{s}" for s in suffixes)
    c.model.checkpoint = "default"
    c.data.tokenizer = "default"
    c.data.squad_file = SHARED_SQUAD_TRAIN_FILE
    c.data.train_articles = ":"
    c.data.validation_file = SHARED_SQUAD_FILE
    c.data.validation_articles = ":"
    if MULTI_SUFFIX in suffixes:
        c.data.answer_candidates_file = SHARED_SQUAD_TRAIN_CANDIDATES_FILE
    if SHARED_SUFFIX in suffixes:
        c.data.distractors_per_question = 2
        c.data.windows_per_question = 4
        c.loss.shared_norm = True
    c.model.max_question_len = CPU_MAX_QUESTION_LEN
    c.data.max_passage_len = CPU_MAX_PASSAGE_LEN
    c.data.doc_stride = CPU_DOC_STRIDE
    c.batch_size = BATCH_SIZE
    c.num_epochs = 2.0
    c.optim.learning_rate = LEARNING_RATE
    c.optim.warmup_fraction = 0.1
    c.optim.frozen = "embeddings/word_embeddings"
    c.checkpoint.every_steps = 1000
    c.checkpoint.keep = 2
    # The best checkpoint by validation F1 (no early stopping: the schedule is the budget).
    c.eval.use_validation_loss = False
    c.eval.batch_size = 64
    c.log.every_steps = 50
    c.model.num_lower_layers = k
    if k:
        c.model.passage_position_offset = PASSAGE_POSITION_OFFSET
    if recipe:
        c.teacher.checkpoint = FULL_READER
        c.loss.kd_weight = 1.0
        c.loss.lrs_weight = 1.0
    if recipe == "warm":
        c.model.checkpoint = FULL_READER
        c.optim.learning_rate = WARM_LEARNING_RATE
    return c
