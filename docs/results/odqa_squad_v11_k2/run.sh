#!/bin/bash
# The complete-set k = 2 reader (bundled minilm-squad-k2) in the open domain: its cache added to
# the index of docs/training.md's open-domain table (35 dev articles + 10,033 Wikipedia leads,
# windows of 192 tokens, stride 96), then all 1,278 questions of articles 28-34 at p = 29, with
# and without the IR score, both span score rules. Resumes where a killed run stopped.
#   bash docs/results/odqa_squad_v11_k2/run.sh [INDEX] [OUT]      (from the repository root)
set -euo pipefail
INDEX=${1:-runs/odqa-index}
OUT=${2:-runs/odqa_squad_v11_k2}
DATA=../shared/data/squad/dev-v1.1.35-articles.json
K2=dil_jax/assets/minilm-squad-k2
python3 -m dil_jax index --out "$INDEX" --corpus squad:$DATA --corpus wikipedia \
    --checkpoint $K2 --k 2 --max-passage-len 192 --doc-stride 96
python3 -m dil_jax odqa-eval --index "$INDEX" --data $DATA --articles 28:35 --p 29 \
    --batch-size 4 --chunk-size 64 --k 2 --checkpoint $K2 --out "$OUT"
