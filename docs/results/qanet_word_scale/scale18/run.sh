#!/bin/bash
# Experiment (not a record): QANet with the frozen MiniLM word table scaled to unit std (x18, EXP_WORD_SCALE),
# else the long run's config; compare its training loss with /work/runs/cpu/qanet_squad_qanet_multi at equal steps
# (same data order and seed). Worktree /work/exp-wordscale = 7459056 + the scale patch. Core 0.
cd /work/exp-wordscale
export PYTHONPATH=/work/exp-wordscale EXP_WORD_SCALE=18
exec taskset -c 0 nice -n 5 python3 -m dil_jax.commands.train --config configs/qanet_squad.py:qanet,multi \
  --config.workdir=/work/runs/cpu/exp_wordscale --config.num_epochs=3 \
  --config.checkpoint.every_steps=200 --config.eval.every_steps=800 --config.log.every_steps=20
