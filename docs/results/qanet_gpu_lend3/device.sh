#!/bin/bash
# Issue 42, fifth lend: a third QANet cycle with the moving average, warm-started from the CPU
# second cycle's average at step 661 (69.41 F1), scanned stacks, alone on the card.
# Environment: OUT (the device's), DEADLINE (training, s), STEPS (the schedule), EXTRA (more of
# tools/gpu_qanet_squad.py's options, e.g. --smoke on CPU).
# It ran as .devcarry/lend3.sh (its `cd` goes to the repo root from there): to rerun, copy it to
# .devcarry/ after tools/gpu_squad_v11_carry.sh, with the warm start packed into .devcarry/warm/
# (docs/qanet.md, "The fifth lend").
set -uo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .devcarry/whl/*.whl || exit 3
xz -dc .devcarry/minilm/model.safetensors.xz > .devcarry/minilm/model.safetensors || exit 4
PYTHONPATH=/tmp/site:$PWD python3 tools/gpu_qanet_squad.py --unpack \
  .devcarry/warm/qanet_cycle2_s661.tar.xz.00 --to /tmp/warm --base .devcarry/minilm || exit 5
R=qanet_ema
ARGS="--readers $R --multi --scan-blocks --set $R:model.checkpoint=/tmp/warm \
  --set $R:num_train_steps=${STEPS:-10000} --set $R:data_seed=4 --set $R:optim.warmup_steps=200 \
  --set $R:optim.learning_rate=5e-4 ${EXTRA:-}" LIMIT=0 bash tools/gpu_qanet_lend.sh
