#!/bin/bash
# Issue 42 probe: how much of QANet's mid-run F1 is held down by its still-high learning rate? The scaled CPU run's
# step-2,400 checkpoint (exported by tools/export_train_step.py --reader word_scale=18) trained on for 400 steps
# with the rate decayed: 50 warm-up steps (fresh Adam moments) to the long run's rate at step 2,400
# (1e-3 x (9633 - 2400) / (9633 - 1000) = 8.4e-4), then linearly to 0; another data order (data_seed 1); every other setting the long run's; evaluated at the end on all
# 35 shared dev articles. As the BiDAF decay (docs/qanet.md). Code: worktree /work/exp-decay (branch exp-qanet-decay,
# main at the commit recorded in the run's config_history), core 0.
cd /work/exp-decay
export PYTHONPATH=/work/exp-decay
exec nice -n 5 taskset -c 0 python3 -m dil_jax.commands.train --config configs/qanet_squad.py:qanet,multi \
  --config.workdir=/work/runs/cpu/qanet_decay2400 \
  --config.model.checkpoint=/work/exports/qanet_s18_step2400 --config.model.reader.word_scale=18 \
  --config.num_train_steps=400 --config.data_seed=1 --config.optim.warmup_steps=50 \
  --config.optim.learning_rate=8.4e-4 \
  --config.checkpoint.every_steps=100 --config.eval.every_steps=400 --config.log.every_steps=20
