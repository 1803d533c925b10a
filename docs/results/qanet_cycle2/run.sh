#!/bin/bash
# Issue 42: a second cycle for the QANet the fourth lend finished (docs/results/qanet_gpu_lend2: the
# continued run's schedule stretched to 10,000 steps and run to its end on one H100, 68.55 F1).
# Warm start from that export with fresh Adam moments and the paper's moving average of the weights
# (the qanet_ema variant: optim.ema_decay 0.9999 under TensorFlow's num_updates rule, so early in a
# run the average spans the last ~step/9 steps): 100 warm-up steps to 2e-4 (a fifth of the first
# cycle's peak), then linearly to 0 over 2,000 steps, in a fourth data order (data_seed 3). Every
# other setting is configs/qanet_squad.py:qanet,multi's. Evaluated and exported with the average.
# Code: worktree /work/exp-cycle2 (branch exp-qanet-cycle2 at ed0fe14), CPU core 1.
#   python3 tools/gpu_qanet_squad.py --unpack docs/results/qanet_gpu_lend2/qanet_lend2.tar.xz.00 \
#       --to /work/exports/qanet_lend2
cd /work/exp-cycle2
export PYTHONPATH=/work/exp-cycle2
exec nice -n 5 taskset -c 1 python3 -m dil_jax.commands.train --config configs/qanet_squad.py:qanet_ema,multi \
  --config.workdir=/work/runs/cpu/qanet_cycle2 \
  --config.model.checkpoint=/work/exports/qanet_lend2 \
  --config.num_train_steps=2000 --config.data_seed=3 --config.optim.warmup_steps=100 \
  --config.optim.learning_rate=2e-4 \
  --config.checkpoint.every_steps=100 --config.eval.every_steps=500 --config.log.every_steps=20
