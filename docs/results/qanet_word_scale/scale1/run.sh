#!/bin/bash
# Issue 42: QANet (the paper's shape, frozen MiniLM word table, multi-positive spans) on the complete
# SQuAD v1.1 training set, on the CPU; pinned code: worktree /work/pinned-7459056 at 7459056 (the train step without a scan for one micro-batch: 18x faster for QANet on CPU). Resumes.
# One core (taskset -c 1): the other stays for development and tests.
cd /work/pinned-7459056
export PYTHONPATH=/work/pinned-7459056
exec taskset -c 1 python3 -m dil_jax.commands.train --config configs/qanet_squad.py:qanet,multi \
  --config.workdir=/work/runs/cpu/qanet_squad_qanet_multi \
  --config.num_epochs=3 \
  --config.checkpoint.every_steps=100 --config.eval.every_steps=800 --config.log.every_steps=20
