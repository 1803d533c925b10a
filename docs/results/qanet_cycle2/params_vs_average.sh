#!/bin/bash
# Issue 42: what the moving average is worth at one step of the second cycle (CPU): the params of
# the checkpoint at STEP (tools/export_train_step.py --weights trained) read by predict at the
# trainer's windows on the 35 shared dev articles and scored, beside the trainer's own evaluation
# of the average at that step (metrics.jsonl). Core CORE (default 1) of the 2-core AMD EPYC.
#   bash docs/results/qanet_cycle2/params_vs_average.sh STEP
set -euo pipefail
STEP=$1
CORE=${CORE:-1}
DEV=../shared/data/squad/dev-v1.1.35-articles.json
OUT=docs/results/qanet_cycle2/step${STEP}_params
EXPORT=/work/exports/qanet_cycle2_s${STEP}_trained
mkdir -p "$OUT"
[ -d "$EXPORT" ] || nice -n 5 taskset -c "$CORE" python3 tools/export_train_step.py \
    --workdir /work/runs/cpu/qanet_cycle2 --step "$STEP" --out "$EXPORT" --weights trained
nice -n 5 taskset -c "$CORE" python3 -m dil_jax predict --checkpoint "$EXPORT" --data $DEV \
    --output "/work/exports/pred_cycle2_s${STEP}_trained.json" --max-passage-len 160 \
    --doc-stride 80 --max-question-len 32 --no-progress 2>&1 | grep "predictions (" | tee "$OUT/predict.log"
python3 -m dil_jax evaluate --data $DEV --predictions "/work/exports/pred_cycle2_s${STEP}_trained.json" \
    > "$OUT/params.json"
cat "$OUT/params.json"
