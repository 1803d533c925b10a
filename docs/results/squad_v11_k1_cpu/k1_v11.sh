#!/bin/bash
# k = 1 student on the complete SQuAD v1.1 training set, from the bundled full reader (KD + LRS),
# a short CPU budget (350 steps, 0.08 epoch). Pinned code: worktree /work/exp-k2 at 09b0876.
cd /work/exp-k2
FULL=/work/exp-k2/dil_jax/assets/minilm-squad-full
exec env PYTHONPATH=/work/exp-k2 chrt -i 0 python3 -m dil_jax.cli train \
    --config configs/minilm_squad_v11.py:k1_warm,multi \
    --config.workdir=/work/runs/cpu/minilm_squad_v11_k1_warm_multi_350 \
    --config.model.checkpoint=$FULL --config.teacher.checkpoint=$FULL \
    --config.num_train_steps=350 --config.optim.warmup_fraction=0.05 \
    --config.checkpoint.every_steps=35 --config.eval.every_steps=350 --config.log.every_steps=10
