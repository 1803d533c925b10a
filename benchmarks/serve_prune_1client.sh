#!/bin/bash
# Served window pruning, one client: a server with --prune-windows calibrated, then one with
# --prune-windows all, over the same index, each measured alone once its idle warm-up is done
# (or after 300 s), one client, REQUESTS seeded questions of articles 28-34 (benchmarks/serve.py
# --sample-seed), both readers.
#   bash benchmarks/serve_prune_1client.sh INDEX OUT [REQUESTS=256] [SEED=0] [MODES="calibrated all"]
# Writes OUT/bench_MODE.{md,json} (each answer included) and each server's log. The delayed
# reader is the bundled one of k = DELAYED_K (default 4, the reader issue 63's targets name).
set -euo pipefail
INDEX=${1:?INDEX}; OUT=${2:?OUT}; REQUESTS=${3:-256}; SEED=${4:-0}; MODES=${5:-calibrated all}
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
source benchmarks/wait_ready.sh
for mode in $MODES; do
  port=$([ "$mode" = calibrated ] && echo 8781 || echo 8782)
  python3 -m dil_jax serve --index "$INDEX" --port "$port" --prune-windows "$mode" --k "${DELAYED_K:-4}" \
    > "$OUT/$mode.log" 2>&1 &
  server=$!
  trap 'kill $server 2>/dev/null' EXIT
  wait_ready "$port"
  python3 benchmarks/serve.py --url "$mode=http://127.0.0.1:$port" --clients 1 \
    --requests "$REQUESTS" --sample-seed "$SEED" --reader delayed full --index "$INDEX" \
    --out "$OUT/bench_$mode"
  kill "$server"; wait "$server" 2>/dev/null || true
done
