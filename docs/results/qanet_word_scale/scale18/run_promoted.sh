#!/bin/bash
# Issue 42: the word-scale experiment's run (QANet, frozen MiniLM table x18) promoted to the long run, IF it wins the
# rule in docs/qanet.md ("The word table's scale"): at step 1,600 a lead of >= 2 F1 over the scale-1 run (18.07).
# Same workdir as the experiment (/work/runs/cpu/exp_wordscale), same pinned code (worktree /work/exp-wordscale,
# branch exp-wordscale at d45784f = 7459056 + $EXP_WORD_SCALE), now on core 1 alone. Resumes.
# ITS EXPORT (params/ at the end) RECORDS word_scale 1 (the pinned code read the scale from the environment): read it
# only through main's tools/export_train_step.py --workdir /work/runs/cpu/exp_wordscale --step BEST --reader word_scale=18.
cd /work/exp-wordscale
export PYTHONPATH=/work/exp-wordscale EXP_WORD_SCALE=18
exec taskset -c 1 python3 -m dil_jax.commands.train --config configs/qanet_squad.py:qanet,multi \
  --config.workdir=/work/runs/cpu/exp_wordscale --config.num_epochs=3 \
  --config.checkpoint.every_steps=100 --config.eval.every_steps=800 --config.log.every_steps=20
