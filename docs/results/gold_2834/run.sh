#!/bin/bash
# The bundled full, k = 2 and k = 4 readers on the gold paragraphs of the 1,278 open-domain
# validation questions (articles 28-34 of the 35 shared dev articles): the reading gap the
# open-domain gap is compared with (docs/training.md, "Where issue 38's targets stand").
#   bash docs/results/gold_2834/run.sh OUT_DIR [READER ...]   (from the repository root;
#   READER: full, k2, k4 = dil_jax/assets/minilm-squad-READER; all three by default)
set -euo pipefail
OUT=${1:?usage: run.sh OUT_DIR [READER ...]}
shift
[ $# -gt 0 ] && READERS=("$@") || READERS=(full k2 k4)
mkdir -p "$OUT"
python3 - "$OUT" <<'PY'
import json, sys
data = json.load(open("../shared/data/squad/dev-v1.1.35-articles.json"))
data["data"] = data["data"][28:35]
json.dump(data, open(f"{sys.argv[1]}/articles_28_34.json", "w"))
PY
for reader in "${READERS[@]}"; do
    python3 -m dil_jax predict --checkpoint dil_jax/assets/minilm-squad-$reader \
        --data "$OUT/articles_28_34.json" --output "$OUT/$reader.json" --no-progress
    python3 -m dil_jax evaluate --data "$OUT/articles_28_34.json" \
        --predictions "$OUT/$reader.json" > "$OUT/$reader.scores.json"
done
for reader in "${READERS[@]}"; do echo "$reader: $(cat "$OUT/$reader.scores.json")"; done
