#!/bin/bash
# Device glue for tools/gpu_squad_v11.py (carried in .devcarry with the data, the bf16 base model
# (xz) and the wheels the device image lacks). With .devcarry/teacher/full_multi.tar.xz.NN (a
# reader an earlier lend packed; tools/gpu_squad_v11_carry.sh TEACHER_DIR puts it there) the
# students learn from it beside phase 1 (--concurrent); ARGS adds options. QANET=1 trains
# QANet, LSH-QANet and BiDAF instead (tools/gpu_qanet_squad.py; ARGS adds its options).
set -uo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .devcarry/whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p /tmp/data
for f in train-v1.1.json train-v1.1.ambiguous-offsets.json dev-v1.1.35-articles.json; do
  xz -dc .devcarry/$f.xz > /tmp/data/$f &
done
[ -f .devcarry/minilm/model.safetensors.xz ] && xz -dc .devcarry/minilm/model.safetensors.xz > .devcarry/minilm/model.safetensors
wait
nvidia-smi -L; nproc
python3 -c "import jax, flax, optax, orbax.checkpoint; print(jax.devices(), jax.__version__, flax.__version__, optax.__version__)"
if [ -n "${QANET:-}" ]; then  # issue 42's readers instead (tools/gpu_qanet_squad.py)
  python3 tools/gpu_qanet_squad.py --data /tmp/data --base .devcarry/minilm --runs /tmp/runs \
    --out "$OUT" --deadline-seconds "${DEADLINE:-420}" ${ARGS:-} 2>&1 | tee "$OUT/log.txt"
  exit "${PIPESTATUS[0]}"
fi
teacher=()
if ls .devcarry/teacher/full_multi.tar.xz.00 >/dev/null 2>&1; then
  python3 tools/unpack_gpu_readers.py --pieces .devcarry/teacher --name full_multi \
    --out /tmp/teacher --base .devcarry/minilm || exit 4
  teacher=(--teacher /tmp/teacher --concurrent)
fi
python3 tools/gpu_squad_v11.py --data /tmp/data --base .devcarry/minilm --runs /tmp/runs \
  --out "$OUT" --deadline-seconds "${DEADLINE:-470}" --phase1-share 0.5 "${teacher[@]}" ${ARGS:-} \
  2>&1 | tee "$OUT/log.txt"
