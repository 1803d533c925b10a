#!/bin/bash
# What batching across requests can gain on a device, without the server: one question's 29
# pairs read in one call (q1) against 16 questions' 464 pairs in one call (q16), MiniLM at the
# served readers' lengths (32 + 160 tokens), the full model and k = 4. Batching pays where the
# per-pair time (I Q-P, ms/block/pair) of q16 is well below q1's (docs/serving.md, "Batching
# on vs off").
#   bash benchmarks/pair_batching.sh OUT_DIR NAME_PREFIX      (from the repository root)
set -euo pipefail
OUT=${1:?usage: pair_batching.sh OUT_DIR NAME_PREFIX}
PREFIX=${2:?usage: pair_batching.sh OUT_DIR NAME_PREFIX}
for q in 1 16; do
    python3 -m dil_jax bench --suite minilm --questions $q --passages 29 --question-len 32 \
        --passage-len 160 --chunk-size $((q * 29)) --ks 4 --no-hf --repeats 3 \
        --out "$OUT" --name "${PREFIX}_q$q"
done
