#!/bin/bash
# Issue 42's open-domain table: QANet / BiDAF (cached passage side, k = 1) beside the MiniLM readers.
cd /work/main
A=/work/gpu-qanet-lend1/unpacked
common="--index runs/odqa-index --data ../shared/data/squad/dev-v1.1.35-articles.json --articles 28:35 --p 29 --batch-size 4 --chunk-size 64 --tokenizer default"
# 1. side by side, one after another on one core, the same 128 questions
for spec in "0 dil_jax/assets/minilm-squad-full full" "4 dil_jax/assets/minilm-squad-k4 k4" "1 $A/qanet_multi qanet" "1 $A/bidaf_multi bidaf"; do
  set -- $spec
  nice -n 5 taskset -c 0 dil-jax odqa-eval $common --k $1 --checkpoint $2 --limit 128 --out runs/odqa_char/sample128_$3
done
# 2. all 1,278 questions for the character readers
for r in qanet bidaf; do
  nice -n 5 taskset -c 0 dil-jax odqa-eval $common --k 1 --checkpoint $A/${r}_multi --out runs/odqa_char/all_$r
done
