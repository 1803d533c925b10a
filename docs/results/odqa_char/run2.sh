#!/bin/bash
# Issue 42's open-domain table, part 2: BiDAF on all 1,278 questions; then the four readers' speed
# one after another on an otherwise idle core 0 (core 1: the CPU training run), 64 questions.
cd /work/main
A=/work/gpu-qanet-lend1/unpacked
common="--index runs/odqa-index --data ../shared/data/squad/dev-v1.1.35-articles.json --articles 28:35 --p 29 --batch-size 4 --chunk-size 64 --tokenizer default"
taskset -c 0 dil-jax odqa-eval $common --k 1 --checkpoint $A/bidaf_multi --out runs/odqa_char/all_bidaf
for spec in "0 dil_jax/assets/minilm-squad-full full" "4 dil_jax/assets/minilm-squad-k4 k4" "1 $A/qanet_multi qanet" "1 $A/bidaf_multi bidaf"; do
  set -- $spec
  taskset -c 0 dil-jax odqa-eval $common --k $1 --checkpoint $2 --limit 64 --seed 1 --out runs/odqa_char/speed64_$3
done
