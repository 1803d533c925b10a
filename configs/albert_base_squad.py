"""DilALBERT as in the paper: albert-base-v2, k = 10. The recipe, the data it needs and the
variants are configs/bert_base_squad.py's (`dil_jax.train.recipes.paper_squad_config`):

    dil-jax train --config configs/albert_base_squad.py \
        --config.data.squad_file=PATH/train-v1.1.json \
        --config.data.validation_file=PATH/dev-v1.1.json
"""

import ml_collections

from dil_jax.train.recipes import paper_squad_config


def get_config(variant: str = "") -> ml_collections.ConfigDict:
    return paper_squad_config("albert_base_squad", "albert-base-v2", variant)
