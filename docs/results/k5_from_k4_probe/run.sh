#!/bin/bash
# The bundled k = 4 reader read at k = 4 and at k = 5 without training, and the bundled full
# reader at k = 5, first 600 validation questions (file order) of the 35 shared dev articles:
# the starting points of a k = 5 student warm-started from either
# (`tools/gpu_squad_v11.py --init-of k5_warm=...`; the full reader is `k5_warm`'s own init).
#   bash docs/results/k5_from_k4_probe/run.sh OUT_DIR      (from the repository root)
set -euo pipefail
OUT=${1:?usage: run.sh OUT_DIR}
DATA=../shared/data/squad/dev-v1.1.35-articles.json
mkdir -p "$OUT"
for k in 4 5; do
    python3 -m dil_jax predict --checkpoint dil_jax/assets/minilm-squad-k4 --data $DATA \
        --output "$OUT/k4_read_at_k$k.json" --k $k --limit 600 --no-progress
done
python3 -m dil_jax predict --checkpoint dil_jax/assets/minilm-squad-full --data $DATA \
    --output "$OUT/full_read_at_k5.json" --k 5 --limit 600 --no-progress
# Score against the 600 questions predicted (the official script counts a missing one as 0).
python3 - "$OUT" "$DATA" <<'PY'
import json, subprocess, sys
out, data_path = sys.argv[1], sys.argv[2]
data = json.load(open(data_path))
ids = set(json.load(open(f"{out}/k4_read_at_k4.json")))
for article in data["data"]:
    for paragraph in article["paragraphs"]:
        paragraph["qas"] = [qa for qa in paragraph["qas"] if qa["id"] in ids]
json.dump(data, open(f"{out}/questions.json", "w"))
scores = {}
for name in ("k4_read_at_k4", "k4_read_at_k5", "full_read_at_k5"):
    text = subprocess.run([sys.executable, "-m", "dil_jax", "evaluate", "--data",
                           f"{out}/questions.json", "--predictions", f"{out}/{name}.json"],
                          check=True, capture_output=True, text=True).stdout
    scores[name] = json.loads(text)
print(json.dumps(scores, indent=1))
json.dump(scores, open(f"{out}/scores.json", "w"), indent=1)
PY
