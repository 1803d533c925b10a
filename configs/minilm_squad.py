"""The embedded MiniLM (all-MiniLM-L6-v2: 6 layers, hidden 384) fine-tuned on the shared SQuAD
v1.1 articles, split by article (0-27 train, 28-34 validation). CPU-sized: question 32 +
passage window 160 tokens, stride 80; up to 3 epochs with early stopping on validation F1
(an evaluation every 250 steps, about half an epoch; patience 2).

Variants (`configs/minilm_squad.py:VARIANT[,SUFFIX...]`), N = k in 1..5 of the 6 blocks:
  full       k = 0, the full model (also the teacher of the distilled variants)
  kN         delayed interaction at k = N from the pre-trained encoder, cross-entropy only
             (DilBERT's recipe)
  kN_distill k = N from the pre-trained encoder with DeFormer's KD + LRS from the fine-tuned
             full reader (DeFormer's recipe; the teacher is the bundled `full` reader,
             dil_jax/assets/minilm-squad-full)
  kN_warm    k = N initialised from the fine-tuned full reader's own weights (lr 1e-4), then
             KD + LRS from that same reader (the bundled one)
  full_warm  k = 0 with the kN_warm recipe: the bundled full reader trained on for the same
             schedule (lr 1e-4, KD + LRS from itself as it was). The control for the students'
             F1 ratios: a warm student has had the full reader's steps and then its own, so
             "student F1 / full F1" must also be read against what those extra steps give the
             full reader itself
Delayed variants number a passage's positions from 14, the median `[CLS] q [SEP]` length of the
training questions (EncoderConfig.passage_position_offset): where the full reader's passages
sit, yet the same for every question, so passages stay cacheable.

Suffixes (any order, each at most once):
  v2      SQuAD v2.0 instead (the same 35 articles with unanswerable questions, the same
          split; the evaluator chooses the null threshold on training questions,
          eval.threshold_questions, and the exported params record it); the teacher is the
          `full,v2` run
  shared  2 BM25 distractor windows per training question (other training paragraphs and
          Wikipedia leads) and a shared normalisation over groups of 4 windows per question;
          the teacher is the `full,shared` run
  extra   (kN_distill / kN_warm, v1.1 only) also distil on the 4,706 SQuAD v2.0 questions of
          the training articles that v1.1 lacks (data.distill_file): no labels, the teacher's
          KD and LRS only, twice the questions on the same paragraphs
  cloze   (kN_distill / kN_warm, v1.1 only) also distil on up to 30 cloze questions per
          training paragraph, made by rule from its sentences (data.cloze_per_paragraph,
          dil_jax.train.cloze; 10,030 questions): no labels, the teacher's KD and LRS only
The workdir is runs/minilm_squad_VARIANT[_SUFFIX...].

    dil-jax train --config configs/minilm_squad.py:full
    dil-jax train --config configs/minilm_squad.py:k4_warm
    dil-jax train --config configs/minilm_squad.py:full,v2
    dil-jax train --config configs/minilm_squad.py:k4_warm,extra
    dil-jax train --config configs/minilm_squad.py:k4_warm,extra,cloze
"""

import ml_collections

from dil_jax.defaults import SHARED_SQUAD_V2_FILE
from dil_jax.errors import UsageError
from dil_jax.train.recipes import distil_from, minilm_config, minilm_variant

V2_SUFFIX, SHARED_SUFFIX, EXTRA_SUFFIX, CLOZE_SUFFIX = "v2", "shared", "extra", "cloze"
SUFFIXES = (V2_SUFFIX, SHARED_SUFFIX, EXTRA_SUFFIX, CLOZE_SUFFIX)
UNLABELLED_SUFFIXES = (EXTRA_SUFFIX, CLOZE_SUFFIX)
USAGE = ("configs/minilm_squad.py:VARIANT[,v2][,shared][,extra][,cloze], VARIANT = full, "
         "full_warm, kN, kN_distill or kN_warm")
# Cloze questions per training paragraph for the `cloze` suffix: every one the rule finds in
# most paragraphs (946 paragraphs give 10,030), a cap only for the longest.
CLOZE_PER_PARAGRAPH = 30
# Learning rate: the best of the recorded sweep (docs/results/training_log.md, "Learning-rate
# sweep").
LEARNING_RATE = 4e-4
# The bundled full reader (repository-relative, as runs/). Until commit 3da2a83 it was this
# config's own `full` run's export, which every kN_warm / kN_distill number of issue 14 in
# docs/training.md used (`git checkout 3da2a83 -- dil_jax/assets/minilm-squad-full` restores
# it); since then it is the complete-training-set reader (configs/minilm_squad_v11.py), a
# stronger teacher that also never saw these articles.
BUNDLED_FULL_READER = "dil_jax/assets/minilm-squad-full"
# kN_warm students start from a fine-tuned reader: the best of their own sweep
# (docs/results/training_log.md, "Warm students: learning rate"; 1e-4 and 4e-4 were within
# 0.6 F1, the lower one ahead).
WARM_LEARNING_RATE = 1e-4


def split_suffixes(spec: str) -> tuple[str, frozenset[str]]:
    """"k4,v2" -> ("k4", {"v2"}). Parsed before the variant is looked up, so it works for any
    variant name; an unknown or repeated suffix is refused by name."""
    variant, *suffixes = spec.split(",")
    for suffix in suffixes:
        if suffix not in SUFFIXES:
            raise UsageError(f"configs/minilm_squad.py: unknown suffix {suffix!r} in {spec!r}; "
                             f"suffixes are {list(SUFFIXES)} ({USAGE})")
    if len(set(suffixes)) != len(suffixes):
        raise UsageError(f"configs/minilm_squad.py: repeated suffix in {spec!r} ({USAGE})")
    return variant, frozenset(suffixes)


def get_config(spec: str = "k4_warm") -> ml_collections.ConfigDict:
    variant, suffixes = split_suffixes(spec)
    k, recipe = minilm_variant("configs/minilm_squad.py", variant, USAGE)
    for suffix in UNLABELLED_SUFFIXES:
        if suffix in suffixes and (not recipe or V2_SUFFIX in suffixes):
            raise UsageError(f"configs/minilm_squad.py: {spec!r}: the {suffix!r} suffix adds "
                             "questions without labels, for a distilled v1.1 student "
                             "(kN_distill or kN_warm, without v2)")
    tail = "".join(f"_{suffix}" for suffix in SUFFIXES if suffix in suffixes)
    c = minilm_config(f"runs/minilm_squad_{variant}{tail}", k)
    c.batch_size = 16
    c.num_epochs = 3.0
    c.optim.learning_rate = LEARNING_RATE
    c.checkpoint.every_steps = 250
    c.eval.patience = 2
    c.log.every_steps = 10
    if V2_SUFFIX in suffixes:
        c.data.squad_file = SHARED_SQUAD_V2_FILE
    if SHARED_SUFFIX in suffixes:
        c.data.distractors_per_question = 2
        c.data.windows_per_question = 4
        c.loss.shared_norm = True
    if EXTRA_SUFFIX in suffixes:
        c.data.distill_file = SHARED_SQUAD_V2_FILE
    if CLOZE_SUFFIX in suffixes:
        c.data.cloze_per_paragraph = CLOZE_PER_PARAGRAPH
    # The teacher read the same data (a v1.1 teacher never learned the null answer); the extra
    # questions are the student's only, so its teacher is the plain one.
    teacher_tail = "".join(f"_{suffix}" for suffix in (V2_SUFFIX, SHARED_SUFFIX)
                           if suffix in suffixes)
    # The plain v1.1 teacher is the bundled full reader: the `full` run's export, committed
    # (bfloat16, word embeddings from the base package), so a student trains the same on any
    # machine; runs/ is not kept between sessions.
    teacher = (f"runs/minilm_squad_full{teacher_tail}/params" if teacher_tail
               else BUNDLED_FULL_READER)
    distil_from(c, recipe, teacher, WARM_LEARNING_RATE)
    return c
