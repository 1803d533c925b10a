#!/bin/bash
# The served readers against Hugging Face's pipeline on the same weights (issue 63), one client:
# a server with --prune-windows all (exact), /v1/answer (p = 29) and /v1/read, each beside the
# pipeline in-process; then a server with --prune-windows calibrated, /v1/answer. Each server
# alone, measured once its idle warm-up is done (or after 300 s).
#   bash benchmarks/serve_peer.sh INDEX OUT PEER_PYTHON PEER_MODEL
# PEER_PYTHON: a venv's python with transformers 4.x; PEER_MODEL: the weights as an HF folder
# (benchmarks/serve_peer.py export). Writes OUT/{answer_all,read,answer_calibrated}.{md,json}.
# The delayed reader served is the bundled one of k = DELAYED_K (default 4: issue 63's targets
# name the k = 4 reader; DELAYED_K=2 serves the default delayed reader, minilm-squad-k2-open).
# MATMUL_DTYPE=bfloat16 serves both readers with --matmul-dtype bfloat16 (default float32: the
# pipeline's); EXACT_ONLY=1 stops after the exact server (no calibrated one).
set -euo pipefail
INDEX=${1:?INDEX}; OUT=${2:?OUT}; PEER_PYTHON=${3:?PEER_PYTHON}; PEER_MODEL=${4:?PEER_MODEL}
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
PEER=(--peer "$PEER_PYTHON" --peer-model "$PEER_MODEL")
DELAYED=(--k "${DELAYED_K:-4}" --matmul-dtype "${MATMUL_DTYPE:-float32}")
source benchmarks/wait_ready.sh
python3 -m dil_jax serve --index "$INDEX" --port 8790 --prune-windows all "${DELAYED[@]}" > "$OUT/server_all.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null' EXIT
wait_ready 8790
python3 benchmarks/serve.py --url all=http://127.0.0.1:8790 --route answer --reader delayed full \
  --clients 1 --requests 32 --sample-seed 0 --peer-batch-sizes 32 "${PEER[@]}" --index "$INDEX" \
  --out "$OUT/answer_all"
python3 benchmarks/serve.py --url all=http://127.0.0.1:8790 --route read --reader full delayed \
  --clients 1 --requests 64 --sample-seed 0 --peer-batch-sizes 1 "${PEER[@]}" --index "$INDEX" \
  --out "$OUT/read"
kill "$server"; wait "$server" 2>/dev/null || true
[ "${EXACT_ONLY:-0}" = 1 ] && exit 0
python3 -m dil_jax serve --index "$INDEX" --port 8791 --prune-windows calibrated "${DELAYED[@]}" \
  > "$OUT/server_calibrated.log" 2>&1 &
server=$!
wait_ready 8791
python3 benchmarks/serve.py --url calibrated=http://127.0.0.1:8791 --route answer \
  --reader delayed full --clients 1 --requests 32 --sample-seed 0 --index "$INDEX" \
  --out "$OUT/answer_calibrated"
kill "$server"; wait "$server" 2>/dev/null || true
