#!/bin/bash
# Issue 61's readers (train.sh's exports) in the open domain and on gold paragraphs, each as the
# bundled readers were measured (docs/results/odqa_squad_v11_k2/run.sh, gold_2834/run.sh): its
# cache added to the 12k-passage index (35 dev articles + 10,033 Wikipedia leads, windows of 192
# tokens, stride 96), all 1,278 questions of articles 28-34 at p = 29 with and without the IR
# score, both span score rules; then `predict` on the gold paragraphs of those articles. The
# caches are float32, as the first rows' were (before int8 became the default: within 0.16 EM).
# Run from the repository root; each step resumes where a killed run stopped. A run that has not
# finished (no trained_from.json) is skipped with a line.
#   bash docs/results/odqa_claim_cpu/eval.sh [RUNS] [INDEX] [OUT] [NAME:K ...]
set -euo pipefail
RUNS=${1:-/work/runs/cpu}
INDEX=${2:-runs/odqa-index}
OUT=${3:-runs/odqa_claim_cpu}
shift 3 2>/dev/null || shift $#
[ $# -gt 0 ] && READERS=("$@") || READERS=(k2_stage:2 full_stage:0 k3:3 k3_stage:3)
DATA=../shared/data/squad/dev-v1.1.35-articles.json
# Training exports carry no tokenizer files: they use the bundled readers' (one vocabulary).
TOK=dil_jax/assets/minilm-squad-full
mkdir -p "$OUT"
if [ ! -f "$OUT/articles_28_34.json" ]; then
    python3 - "$OUT" <<'PY'
import json, sys
data = json.load(open("../shared/data/squad/dev-v1.1.35-articles.json"))
data["data"] = data["data"][28:35]
json.dump(data, open(f"{sys.argv[1]}/articles_28_34.json.tmp", "w"))
PY
    mv "$OUT/articles_28_34.json.tmp" "$OUT/articles_28_34.json"
fi
for reader in "${READERS[@]}"; do
    name=${reader%:*} k=${reader#*:}
    ckpt=$RUNS/minilm_squad_v11_$name/params
    if [ ! -f "$ckpt/trained_from.json" ]; then echo "$name: not finished ($ckpt)"; continue; fi
    python3 -m dil_jax index --out "$INDEX" --corpus squad:$DATA --corpus wikipedia \
        --checkpoint "$ckpt" --tokenizer $TOK --k "$k" --max-passage-len 192 --doc-stride 96 \
        --cache-dtype float32
    python3 -m dil_jax odqa-eval --index "$INDEX" --data $DATA --articles 28:35 --p 29 \
        --batch-size 4 --chunk-size 64 --k "$k" --checkpoint "$ckpt" --tokenizer $TOK --out "$OUT/$name"
    [ -f "$OUT/$name.gold.json" ] || python3 -m dil_jax predict --checkpoint "$ckpt" --tokenizer $TOK \
        --data "$OUT/articles_28_34.json" --output "$OUT/$name.gold.json" --no-progress
    python3 -m dil_jax evaluate --data "$OUT/articles_28_34.json" \
        --predictions "$OUT/$name.gold.json" > "$OUT/$name.gold.scores.json"
done
