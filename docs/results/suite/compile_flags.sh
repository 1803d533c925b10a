#!/usr/bin/env bash
# docs/results/suite/compile_flags.md: three compile-heavy tests under three XLA settings, one
# pytest process on core 0, a fresh compilation cache for each setting.
cd "$(dirname "$0")/../../.."
T="tests/train/test_train_curves.py::test_train_redraws_curves_png_at_each_evaluation tests/model/test_qanet_reformer.py::test_reversible_gradients_equal_plain_autodiff[False] tests/model/test_backbones.py::test_check_and_predict_commands[roberta]"
for setting in base opt0 effort; do
  rm -rf /tmp/flagcache
  case $setting in
    base) X=""; E="0.0";;
    opt0) X="--xla_backend_optimization_level=0"; E="0.0";;
    effort) X=""; E="-1.0";;
  esac
  echo "== $setting"
  XLA_FLAGS="$X" JAX_EXEC_TIME_OPTIMIZATION_EFFORT=$E JAX_COMPILATION_CACHE_DIR=/tmp/flagcache taskset -c 0 python3 -m pytest -q -p no:cacheprovider --durations=5 $T 2>&1 | grep -E "passed|failed|call|Error" | head -8
done
