#!/bin/bash
# The bundled full, k = 2, k = 4 and default delayed (k2-open) readers over the squad-open corpus (every paragraph of SQuAD
# v1.1 train + the 35 shared dev articles + the 10,033 Wikipedia leads: 2.5 times the passages
# of docs/training.md's open-domain table), all 1,278 questions of articles 28-34 at p = 29,
# with and without the IR score, both span score rules; windows of 192 tokens, stride 96, as
# that table's; float32 caches, as the recorded rows were read (int8, today's default, is within
# 0.16 EM of them). Each step resumes where a killed run stopped.
#   bash docs/results/odqa_squad_open/run.sh [INDEX] [OUT]      (from the repository root)
set -euo pipefail
INDEX=${1:-runs/odqa-squad-open}
OUT=${2:-runs/odqa_squad_open}
DATA=../shared/data/squad/dev-v1.1.35-articles.json
A=dil_jax/assets
python3 -m dil_jax index --out "$INDEX" --corpus squad-open \
    --checkpoint $A/minilm-squad-full $A/minilm-squad-k2 $A/minilm-squad-k4 \
    $A/minilm-squad-k2-open --k 0 2 4 2 --max-passage-len 192 --doc-stride 96 \
    --cache-dtype float32
for reader in full:0 k2:2 k4:4 k2-open:2; do
    python3 -m dil_jax odqa-eval --index "$INDEX" --data $DATA --articles 28:35 --p 29 \
        --batch-size 4 --chunk-size 16 --k "${reader#*:}" \
        --checkpoint "$A/minilm-squad-${reader%:*}" --out "$OUT/${reader%:*}"
done
