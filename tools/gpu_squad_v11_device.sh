#!/bin/bash
# Device glue for tools/gpu_squad_v11.py (carried in .devcarry with the data, the bf16 base model
# and the wheels the device image lacks).
set -uo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .devcarry/whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p /tmp/data
for f in train-v1.1.json train-v1.1.ambiguous-offsets.json dev-v1.1.35-articles.json; do
  xz -dc .devcarry/$f.xz > /tmp/data/$f &
done
wait
nvidia-smi -L; nproc
python3 -c "import jax, flax, optax, orbax.checkpoint; print(jax.devices(), jax.__version__, flax.__version__, optax.__version__)"
python3 tools/gpu_squad_v11.py --data /tmp/data --base .devcarry/minilm --runs /tmp/runs \
  --out "$OUT" --deadline-seconds "${DEADLINE:-470}" --phase1-share 0.5 2>&1 | tee "$OUT/log.txt"
