#!/usr/bin/env bash
# Layer benchmark on a 2-GPU machine: one Megatron MoELayer, forward + backward, with each
# dispatcher (nvshmem, reference, alltoall, allgather, flex if DeepEP/HybridEP imports) on
# the DeepSeek-like and Mixtral-like shapes; the dispatch+combine share of the layer time.
#   scripts/gpu_layer_bench.sh OUT_DIR [extra layer-bench arguments, e.g. --quick]
# Writes OUT_DIR/layer_bench.json, OUT_DIR/layer_bench.log (the table is in the log).
# Runs after scripts/gpu_check.sh (which builds moe_backend._C in place); builds it here
# when missing. Uses $PYTHON (default python3) with this checkout on PYTHONPATH.
# Exit status: layer-bench's (0; 3 = a dispatcher failed, its error is in the JSON).
set -uo pipefail
out=${1:-${OUT:-/tmp/moe_gpu_layer_bench}}
shift || true
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv 2>&1
"$PYTHON" -m moe_backend.cli layer-bench --shapes deepseek mixtral --out "$out/layer_bench.json" "$@" \
  2>&1 | tee "$out/layer_bench.log"
rc=${PIPESTATUS[0]}
echo "gpu_layer_bench: rc=$rc; results in $out/layer_bench.json"
exit $rc
