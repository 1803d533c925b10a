#!/bin/bash
# Issue 42: the scaled QANet's CPU run, continued on a new machine. The first run (word scale 18,
# docs/results/qanet_word_scale/scale18, evaluated through step 3,200: 31.56 F1) lost its
# checkpoints (step 3,400+) when the development machine was replaced between sessions; its
# committed descendant is the decay probe's export (its step 2,400 + 400 steps decayed to 0:
# 30.46 F1, docs/results/qanet_decay2400). This run warm-starts from that export with fresh Adam
# moments: 100 warm-up steps to 7.9e-4 (the first run's rate at step 2,800 = 2,400 + 400), then
# linearly to 0 over the 6,833 steps the first run's 3 epochs (9,633) had left, in a third data
# order (data_seed 2). Every other setting is configs/qanet_squad.py:qanet,multi's (word scale 18).
# Code: worktree /work/exp-continue (branch exp-qanet-continue at ed993ec), CPU core 1.
#   python3 tools/gpu_qanet_squad.py --unpack docs/results/qanet_decay2400/qanet_decay2400.tar.xz.00 \
#       --to /work/exports/qanet_decay2400
# Its state travelled between sessions as pieces (tools/train_state_pieces.py pack / unpack); a lent H100
# finished it (schedule stretched to 10,000 steps): docs/results/qanet_gpu_lend2, docs/qanet.md.
cd /work/exp-continue
export PYTHONPATH=/work/exp-continue
exec nice -n 5 taskset -c 1 python3 -m dil_jax.commands.train --config configs/qanet_squad.py:qanet,multi \
  --config.workdir=/work/runs/cpu/qanet_continued \
  --config.model.checkpoint=/work/exports/qanet_decay2400 \
  --config.num_train_steps=6833 --config.data_seed=2 --config.optim.warmup_steps=100 \
  --config.optim.learning_rate=7.9e-4 \
  --config.checkpoint.every_steps=100 --config.eval.every_steps=800 --config.log.every_steps=20
