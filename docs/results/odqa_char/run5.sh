#!/bin/bash
# Issue 42's open-domain table, the trained QANet: the fourth lend's export (4 epochs, 68.57 F1 on
# the gold paragraphs; docs/results/qanet_gpu_lend2) cached beside the decay probe's QANet in the
# same index and read on all 1,278 questions of articles 28-34, p = 29, on core 0 (core 1 trains; CORE picks another).
# Unpack the export first:
#   python3 tools/gpu_qanet_squad.py --unpack docs/results/qanet_gpu_lend2/qanet_lend2.tar.xz.00 \
#       --to /work/exports/qanet_lend2
set -e
cd /work/main
export_dir=${EXPORT:-/work/exports/qanet_lend2}
out=${OUT:-runs/odqa_char/all_qanet_lend2}
common="--index runs/odqa-index --data ../shared/data/squad/dev-v1.1.35-articles.json --articles 28:35 --p 29 --batch-size 4 --chunk-size 64 --tokenizer default"
taskset -c ${CORE:-0} python3 -m dil_jax index --out runs/odqa-index --corpus squad:../shared/data/squad/dev-v1.1.35-articles.json --corpus wikipedia --checkpoint "$export_dir" --k 1 --max-passage-len 192 --doc-stride 96 --tokenizer default
taskset -c ${CORE:-0} python3 -m dil_jax odqa-eval $common --k 1 --checkpoint "$export_dir" --out "$out"
