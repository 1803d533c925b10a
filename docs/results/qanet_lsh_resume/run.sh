#!/bin/bash
# Issue 42 experiment: LSH-QANet vs QANet from the same state over the same batches. The scaled QANet run's
# checkpoint 1600 (/work/runs/cpu/exp_wordscale) copied into /work/runs/cpu/exp_lsh and resumed with LSH attention
# in both encoders (2 hashes, buckets of 64: the repo's defaults), same optimizer state, schedule and data order;
# compared with the plain run at step 2,400. Code: worktree /work/exp-lsh (branch exp-lsh-resume at 7f0e272 of main),
# core 0 (the plain run is on core 1).
cd /work/exp-lsh
export PYTHONPATH=/work/exp-lsh
exec nice -n 5 taskset -c 0 python3 -m dil_jax.commands.train --config configs/qanet_squad.py:qanet,multi \
  --config.workdir=/work/runs/cpu/exp_lsh --config.num_epochs=3 \
  --config.checkpoint.every_steps=100 --config.eval.every_steps=800 --config.log.every_steps=20 \
  --config.model.reader.word_scale=18 --config.model.reader.lsh_encoders=embedding,model
