#!/bin/bash
# Issue 63, item 5 in the open domain: the seed's hypothesis (does the reader read better given
# the prescreened sentences?) on the 1,278 questions of dev articles 28-34 at p = 29, over the
# 12,047-window index of docs/open_domain.md, "What it reaches" (the 35 shared dev articles +
# the 10,033 Wikipedia leads, windows of 192 tokens, stride 96), with the sentence embeddings
# of the bundled prescreener stored in it. Each reader is read twice in one run, without and
# with prescreening (the mass rule, 0.9: on gold paragraphs the rule closest to reading every
# sentence, docs/prescreening.md): EM / F1 without and with the IR score, both span rules, the
# pairs and tokens its upper blocks read, and R_kept (a gold answer still in the kept sentences
# of the first p passages: the seed's P(SEP)). Each step resumes where a killed run stopped.
#   bash docs/results/prescreen_od/run.sh [INDEX] [OUT] [READER:K ...]   (from the repo root)
set -euo pipefail
INDEX=${1:-runs/odqa-index}
OUT=${2:-runs/prescreen_od}
shift 2 2>/dev/null || shift $#
[ $# -gt 0 ] && READERS=("$@") || READERS=(full:0 k2-open:2 k4:4)
DATA=../shared/data/squad/dev-v1.1.35-articles.json
A=dil_jax/assets
for reader in "${READERS[@]}"; do
    name=${reader%:*} k=${reader#*:}
    python3 -m dil_jax index --out "$INDEX" --corpus squad:$DATA --corpus wikipedia \
        --checkpoint "$A/minilm-squad-$name" --k "$k" --max-passage-len 192 --doc-stride 96 \
        --prescreen default
    python3 -m dil_jax odqa-eval --index "$INDEX" --data $DATA --articles 28:35 --p 29 \
        --batch-size 4 --chunk-size 64 --k "$k" --checkpoint "$A/minilm-squad-$name" \
        --prescreen default --mass 0.9 --out "$OUT/$name"
done
