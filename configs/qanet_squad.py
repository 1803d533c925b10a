"""QANet, its Reformer variants and BiDAF (issue 42, the "Inquisition" seed's readers) on the
complete SQuAD v1.1 training set (../shared/data/squad/train-v1.1.json, 87,599 questions),
validated on all 35 shared dev articles (6,013 questions), as configs/minilm_squad_v11.py:
question 32 + passage window 160 tokens, stride 80, the embedded MiniLM's WordPiece tokens.

Variants (`configs/qanet_squad.py:VARIANT[,multi]`):
  qanet             QANetConfig() as it stands: the paper's d_model 128, 8 heads, kernel 7,
                    1 embedding block of 4 convs, 7 model blocks of 2 convs (x3, shared); the
                    frozen MiniLM words times MINILM_WORD_SCALE (18), as every variant but
                    qanet_scratch
  qanet_lsh         the same with LSH attention in both encoders (the repo's defaults: 2 hashes,
                    buckets of 64 tokens; the seed's own settings are not known)
  qanet_reversible  the same with reversible encoder stacks
  qanet_scratch     QANet with its word table trained from random rows (model.word_table
                    "random", model.reader.train_word_table) instead of the frozen MiniLM table
  qanet_sd          QANet with the paper's stochastic depth (model.reader.layer_dropout 0.1)
  qanet_ema         QANet evaluated and exported with the paper's moving average of its weights
                    (optim.ema_decay 0.9999)
  bidaf             BiDAFConfig(): the paper's 100 filters of width 5 over 8-d characters,
                    hidden 100, dropout 0.2
Suffix `multi`: every occurrence of an ambiguous answer is a correct span
(data.answer_candidates_file), as configs/minilm_squad_v11.py's.

Words are MiniLM's frozen input embedding table (`config.model.word_table = "default"`), the
characters come from the texts (dil_jax.train.char_data); only windows that hold their answer
train (these readers have no no-answer score). Optimizer: the paper's Adam (b1 0.8, b2 0.999,
eps 1e-7) with 1,000 warm-up steps to lr 1e-3, then the project's linear decay (the paper keeps
lr constant and averages the weights, EMA 0.9999: the qanet_ema variant), gradients clipped
at norm 5 (as common QANet implementations do), weight decay 3e-7 (the paper's L2). Batch 32
(the paper's). BiDAF: Adam at lr 1e-3 instead of the paper's AdaDelta (0.5), b1 0.9.

    dil-jax train --config configs/qanet_squad.py:qanet
    dil-jax train --config configs/qanet_squad.py:bidaf,multi

The epochs here (num_epochs) are a CPU plan's ceiling, not the paper's ~55 epochs: a lent GPU
runs them with `tools/gpu_qanet_squad.py` (docs/qanet.md, "Train").
"""

import ml_collections

from dil_jax.defaults import CPU_DOC_STRIDE, CPU_MAX_PASSAGE_LEN, CPU_MAX_QUESTION_LEN
from dil_jax.errors import UsageError
from dil_jax.train.default_config import base_config
from dil_jax.train.reader_kinds import reader_section
from dil_jax.train.recipes import complete_squad_v11

# QANet reads the frozen MiniLM table's rows times 18 = 1 / the table's standard deviation
# (0.0556), so that the words enter its first projection at the scale of the character CNN's
# O(1) features: on the same batches it learned ~2x faster (docs/results/qanet_log.md, "The word
# table's scale": +4.98 F1 at step 1,600, +6.85 at 2,400). A table trained from N(0, 1) rows
# (qanet_scratch) is at that scale already; BiDAF keeps 1 (its runs were trained so).
MINILM_WORD_SCALE = 18.0
VARIANTS = {
    "qanet": ("qanet", {"word_scale": MINILM_WORD_SCALE}),
    "qanet_lsh": ("qanet", {"lsh_encoders": "embedding,model", "word_scale": MINILM_WORD_SCALE}),
    "qanet_reversible": ("qanet", {"reversible": True, "word_scale": MINILM_WORD_SCALE}),
    # Word embeddings trained from scratch (the comparison with the frozen MiniLM table).
    "qanet_scratch": ("qanet", {"train_word_table": True}),
    # The paper's stochastic depth (layer dropout 0.1 at each stack's last sublayer).
    "qanet_sd": ("qanet", {"layer_dropout": 0.1, "word_scale": MINILM_WORD_SCALE}),
    # The paper's exponential moving average of the weights (decay 0.9999, optim.ema_decay).
    "qanet_ema": ("qanet", {"word_scale": MINILM_WORD_SCALE}),
    "bidaf": ("bidaf", {}),
}
MULTI_SUFFIX = "multi"
USAGE = f"configs/qanet_squad.py:VARIANT[,multi], VARIANT = {', '.join(VARIANTS)}"
BATCH_SIZE = 32
LEARNING_RATE = 1e-3
WARMUP_STEPS = 1000
EMA_DECAY = 0.9999  # the paper's


def get_config(spec: str = "qanet") -> ml_collections.ConfigDict:
    variant, *suffixes = spec.split(",")
    if variant not in VARIANTS:
        raise UsageError(f"configs/qanet_squad.py: unknown variant {variant!r} ({USAGE})")
    for suffix in suffixes:
        if suffix != MULTI_SUFFIX or suffixes.count(suffix) > 1:
            raise UsageError(f"configs/qanet_squad.py: bad suffix {suffix!r} in {spec!r} "
                             f"({USAGE})")
    kind, fields = VARIANTS[variant]
    c = base_config()
    c.workdir = f"runs/qanet_squad_{variant}" + "".join(f"_{s}" for s in suffixes)
    c.model.kind = kind
    c.model.reader = reader_section(kind, fields)
    c.model.checkpoint = ""  # a fresh reader; its word table from model.word_table
    c.model.word_table = "random" if fields.get("train_word_table") else "default"
    c.model.max_question_len = CPU_MAX_QUESTION_LEN
    c.data.featurizer = "dil_jax.train.char_data:featurize"
    c.data.tokenizer = "default"
    complete_squad_v11(c, multi=MULTI_SUFFIX in suffixes)
    c.data.max_passage_len = CPU_MAX_PASSAGE_LEN
    c.data.doc_stride = CPU_DOC_STRIDE
    c.batch_size = BATCH_SIZE
    c.num_epochs = 8.0
    c.optim.learning_rate = LEARNING_RATE
    c.optim.warmup_steps = WARMUP_STEPS
    c.optim.max_grad_norm = 5.0
    if kind == "qanet":
        c.optim.b1, c.optim.b2, c.optim.eps, c.optim.weight_decay = 0.8, 0.999, 1e-7, 3e-7
    else:
        c.optim.b1, c.optim.b2, c.optim.eps, c.optim.weight_decay = 0.9, 0.999, 1e-7, 0.0
    c.optim.ema_decay = EMA_DECAY if variant == "qanet_ema" else 0.0
    c.eval.evaluator = "dil_jax.train.char_eval:evaluator"
    c.eval.use_validation_loss = False
    c.eval.batch_size = 64
    c.checkpoint.every_steps = 1000
    c.checkpoint.keep = 2
    c.log.every_steps = 50
    return c
