#!/bin/bash
# Issue 42 on a lent GPU, one device command (carry [".devcarry"], tools/gpu_squad_v11_carry.sh):
# QANet readers side by side (tools/gpu_qanet_squad.py through .devcarry/run.sh, QANET=1), then,
# in the seconds left under LIMIT, benchmarks/qanet_memory.py on the device. Environment:
# OUT (the device's), DEADLINE (training, s), LIMIT (the command's, s), ARGS (the tool's), BENCH
# (the benchmark's lengths and variants). Smoke-tested on CPU with ARGS="... --smoke".
export OUT="${OUT:?}"; SECONDS=0
QANET=1 DEADLINE="${DEADLINE:-390}" ARGS="${ARGS:---readers qanet,qanet_lsh,bidaf --multi --epochs 2 --scan-blocks}" bash .devcarry/run.sh
left=$(( ${LIMIT:-585} - SECONDS ))
echo "training part: ${SECONDS} s; ${left} s left for the bench"
if [ "$left" -gt 60 ]; then
  PYTHONPATH=/tmp/site:$PWD timeout $((left - 10)) python3 benchmarks/qanet_memory.py --word-table .devcarry/minilm ${BENCH:---lengths 1024 4096 --time-lengths 1024 4096 --variants plain reformer} --out "$OUT/qanet_memory_gpu" > "$OUT/qanet_memory_gpu.log" 2>&1
  echo "bench exit $?"; tail -8 "$OUT/qanet_memory_gpu.log"
fi
ls -la "$OUT"
