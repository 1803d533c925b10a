"""DilALBERT as in the paper: albert-base-v2, k = 10, lr 3e-5, 2 epochs, batch 12, length 384
(question 64 + passage window 320), stride 128, linear decay with 10% warmup.

    dil-jax train --config configs/albert_base_squad.py \
        --config.data.squad_file=PATH/train-v1.1.json \
        --config.data.validation_file=PATH/dev-v1.1.json

Needs the Hugging Face checkpoint (a local folder, or the hub id when online) and real SQuAD train
data: the shared data here has only dev articles. `:distill` adds DeFormer's KD + LRS from a
fine-tuned full-model teacher (set --config.teacher.checkpoint).
"""

import ml_collections

from dil_jax.train.default_config import base_config


def get_config(variant: str = "") -> ml_collections.ConfigDict:
    c = base_config()
    c.workdir = "runs/albert_base_squad" + (f"_{variant}" if variant else "")
    c.model.checkpoint = "albert-base-v2"
    c.data.tokenizer = "albert-base-v2"
    c.model.num_lower_layers = 10
    c.model.max_question_len = 64
    c.data.max_passage_len = 384 - 64
    c.data.stride = 128
    c.data.train_articles = ":"
    # Validate on the official dev set (set its path); all of its articles.
    c.data.validation_file = "PATH/dev-v1.1.json"
    c.data.validation_articles = ":"
    c.batch_size = 12
    c.num_epochs = 2.0
    c.optim.learning_rate = 3e-5
    c.optim.warmup_fraction = 0.1
    c.checkpoint.every_steps = 2000
    c.log.every_steps = 50
    if variant == "distill":
        c.teacher.checkpoint = "runs/albert_base_squad_full/params"
        # DeFormer tunes alpha/beta per task; these are starting points, not the paper's values.
        c.loss.kd_weight = 1.0
        c.loss.lrs_weight = 1.0
    elif variant == "full":
        c.model.num_lower_layers = 0
    elif variant:
        raise ValueError(f"unknown variant {variant!r}: '', 'full' or 'distill'")
    return c
