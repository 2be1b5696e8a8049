#!/usr/bin/env bash
# End-to-end step-time benchmark on a 2-GPU machine: the same Megatron-core GPT MoE model
# and seed trained with each available dispatcher (nvshmem, reference, alltoall,
# allgather, flex if DeepEP/HybridEP is installed); per config a table, a JSON and a PNG.
#   scripts/gpu_train_bench.sh OUT_DIR [STEPS]
# TRAIN_BENCH_DISPATCHERS="nvshmem alltoall ..." limits the dispatchers (default: all available);
# TRAIN_BENCH_WORLD=N runs the 2-GPU configs on N GPUs with EP N (--world-size N --ep N).
# The dispatchers take turns step by step (train-bench --schedule interleaved).
# Writes OUT_DIR/train_bench_<config>/{table.txt,bench.json,bench.png,<dispatcher>/train_log.*}
# and OUT_DIR/train_bench_<config>.log. Exit status: 0, or the first failing command's.
# Runs after scripts/gpu_check.sh (which builds moe_backend._C in place); builds it here
# when missing. Uses $PYTHON (default python3) with this checkout on PYTHONPATH.
set -uo pipefail
out=${1:-${OUT:-/tmp/moe_gpu_train_bench}}
steps=${2:-30}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh
rc=0
# Smoke: the tiny config end to end with our kernels (auto = nvshmem when they load).
"$PYTHON" -m moe_backend.cli train --config tiny --out "$out/train_tiny" 2>&1 | tee "$out/train_tiny.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
for config in mixtral_2gpu deepseek_2gpu; do
  echo "=== train-bench $config ($steps steps per dispatcher)"
  # shellcheck disable=SC2086  # the dispatcher list splits into words on purpose
  "$PYTHON" -m moe_backend.cli train-bench --config "$config" --steps "$steps" \
    ${TRAIN_BENCH_DISPATCHERS:+--dispatchers $TRAIN_BENCH_DISPATCHERS} \
    ${TRAIN_BENCH_WORLD:+--world-size $TRAIN_BENCH_WORLD --ep $TRAIN_BENCH_WORLD} \
    --out "$out/train_bench_$config" 2>&1 | tee "$out/train_bench_$config.log"
  status=${PIPESTATUS[0]}
  [ "$status" -eq 0 ] || { echo "train-bench $config: exit $status (3 = a dispatcher failed or its loss disagreed)"; [ "$rc" -ne 0 ] || rc=$status; }
done
echo "gpu_train_bench: rc=$rc; results in $out"
exit $rc
