#!/bin/bash
# Issue 42's open-domain table: the decayed BiDAF (69.60 F1) cached and read on all 1,278 questions.
cd /work/main
common="--index runs/odqa-index --data ../shared/data/squad/dev-v1.1.35-articles.json --articles 28:35 --p 29 --batch-size 4 --chunk-size 64 --tokenizer default"
taskset -c 0 dil-jax index --out runs/odqa-index --corpus squad:../shared/data/squad/dev-v1.1.35-articles.json --corpus wikipedia --checkpoint /work/runs/cpu/bidaf_decay/params --k 1 --max-passage-len 192 --doc-stride 96 --tokenizer default
taskset -c 0 dil-jax odqa-eval $common --k 1 --checkpoint /work/runs/cpu/bidaf_decay/params --out runs/odqa_char/all_bidaf_decay
