"""DilBERT as in the paper: bert-base-uncased, k = 10, lr 3e-5, 2 epochs, batch 12, length 384
(question 64 + passage window 320), stride 128, linear decay with 10% warmup.

    dil-jax train --config configs/bert_base_squad.py \
        --config.data.squad_file=PATH/train-v1.1.json \
        --config.data.validation_file=PATH/dev-v1.1.json

Needs the Hugging Face checkpoint (a local folder, or the hub id when online) and real SQuAD train
data: the shared data here has only dev articles. `:distill` adds DeFormer's KD + LRS from a
fine-tuned full-model teacher (set --config.teacher.checkpoint).
"""

import ml_collections

from dil_jax.train.recipes import paper_squad_config


def get_config(variant: str = "") -> ml_collections.ConfigDict:
    return paper_squad_config("bert_base_squad", "bert-base-uncased", variant)
