#!/bin/bash
# Issue 42: LSH-QANet as a trained QANet read with LSH attention in both encoders (no LSH training): the scaled
# CPU run's checkpoint STEP exported (tools/export_train_step.py; --reader word_scale=18: its pinned code read
# the scale from the environment), then predict on the 35 shared dev articles at the trainer's windows
# (question 32, window 160, stride 80), plain and with --lsh-layers embedding,model (the repo's LSH defaults:
# 2 hashes, buckets of 64), each scored by the official metric. Core 0 of the 2-core AMD EPYC (core 1 trains).
#   bash docs/results/qanet_lsh_swap/run.sh STEP [OUT_DIR]
#   EXPORT=FOLDER bash docs/results/qanet_lsh_swap/run.sh NAME OUT_DIR     # an export already written
set -euo pipefail
STEP=$1
OUT=${2:-docs/results/qanet_lsh_swap/step$STEP}
DEV=../shared/data/squad/dev-v1.1.35-articles.json
EXPORT=${EXPORT:-/work/exports/qanet_s18_step$STEP}
WINDOWS="--max-passage-len 160 --doc-stride 80 --max-question-len 32 --no-progress"
mkdir -p "$OUT"
[ -d "$EXPORT" ] || nice -n 5 taskset -c 0 python3 tools/export_train_step.py \
    --workdir /work/runs/cpu/exp_wordscale --step "$STEP" --out "$EXPORT" --reader word_scale=18
for read in plain lsh; do
  flags=""; [ $read = lsh ] && flags="--lsh-layers embedding,model"
  nice -n 5 taskset -c 0 dil-jax predict --checkpoint "$EXPORT" --data $DEV \
      --output /work/exports/pred_step${STEP}_$read.json $WINDOWS $flags 2>&1 | grep "predictions (" | tee "$OUT/$read.log"
  dil-jax evaluate --data $DEV --predictions /work/exports/pred_step${STEP}_$read.json > "$OUT/$read.json"
  cat "$OUT/$read.json"
done
