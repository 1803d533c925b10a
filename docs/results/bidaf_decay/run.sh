#!/bin/bash
# Issue 42: BiDAF from the first lend's export (1.08 epochs at full learning rate, F1 63.2) on
# with a short decay: 1,600 steps of 32 (half an epoch) in another data order (data_seed 1),
# 100 warm-up steps (fresh Adam moments), lr 1e-3 -> 0. Code: the pinned worktree /work/pinned-2d0f34b (2d0f34b),
# as its log records. One core (taskset -c 0): core 1 trains QANet.
cd /work/pinned-2d0f34b
export PYTHONPATH=/work/pinned-2d0f34b
git log --oneline -1
exec taskset -c 0 python3 -m dil_jax.commands.train --config configs/qanet_squad.py:bidaf,multi \
  --config.workdir=/work/runs/cpu/bidaf_decay \
  --config.model.checkpoint=/work/gpu-qanet-lend1/unpacked/bidaf_multi \
  --config.num_train_steps=1600 --config.data_seed=1 --config.optim.warmup_steps=100 \
  --config.checkpoint.every_steps=100 --config.eval.every_steps=800 --config.log.every_steps=20
