#!/usr/bin/env bash
# Step-time probe for one training config on a 2-GPU machine: each variant is its own
# `moe-backend train` launch, the variants alternate (A B C A B C ...) so that a drifting
# host does not favour one of them, and one extra launch per variant records a GPU-only
# profile (`--profile-device-only`: both ranks' kernel timelines).
#   scripts/gpu_train_probe.sh OUT_DIR [CONFIG] [STEPS] [ROUNDS]
# Variants (PROBE_VARIANTS, default "nvshmem nvshmem-no-overlap alltoall"): "nvshmem"
# (defaults), "nvshmem-no-overlap" (MOE_BACKEND_NVSHMEM_OVERLAP=0 and
# MOE_BACKEND_NVSHMEM_COMBINE_OVERLAP=0), "nvshmem-no-proxy" (NVSHMEM_DISABLE_LOCAL_ONLY_PROXY=1:
# no NVSHMEM proxy thread polling on the CPU), or any Megatron dispatcher name. PROBE_PROFILE=0
# skips the profiled launches. Writes OUT_DIR/probe.txt (median step time per launch) and
# OUT_DIR/probe.tgz (every log, CSV and trace).
set -uo pipefail
out=${1:-${OUT:-/tmp/moe_gpu_train_probe}}
config=${2:-mixtral_2gpu}
steps=${3:-14}
rounds=${4:-2}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh
work=$out/probe
mkdir -p "$work"
launch() {  # variant, run name, extra train arguments...
  local variant=$1 name=$2
  shift 2
  local env=() dispatcher=$variant
  case $variant in
    nvshmem-no-overlap) env=(MOE_BACKEND_NVSHMEM_OVERLAP=0 MOE_BACKEND_NVSHMEM_COMBINE_OVERLAP=0) dispatcher=nvshmem ;;
    nvshmem-no-proxy) env=(NVSHMEM_DISABLE_LOCAL_ONLY_PROXY=1) dispatcher=nvshmem ;;
  esac
  env "${env[@]}" "$PYTHON" -m moe_backend.cli train --config "$config" --steps "$steps" --dispatcher "$dispatcher" \
    --out "$work/$name" --quiet "$@" > "$work/$name.log" 2>&1
  local rc=$?
  # The run's own summary: the median over its timed steps (after train.timing_warmup).
  "$PYTHON" - "$work/$name/train_log.json" "$name" "$rc" >> "$out/probe.txt" <<'PY'
import json, sys
path, name, rc = sys.argv[1:]
try:
    s = json.load(open(path))["summary"]
    print(f"{name:<34} rc={rc} median step {s['median_step_ms']:8.1f} ms over {s['timed_steps']} steps")
except (OSError, KeyError, ValueError) as err:
    print(f"{name:<34} rc={rc} no step times ({err})")
PY
}
: > "$out/probe.txt"
variants=${PROBE_VARIANTS:-nvshmem nvshmem-no-overlap alltoall}
for r in $(seq 1 "$rounds"); do
  for v in $variants; do launch "$v" "${v}_$r"; done
done
if [ "${PROBE_PROFILE:-1}" != 0 ]; then
  for v in $variants; do
    launch "$v" "${v}_profile" --profile "$work/${v}_profile/trace" --profile-device-only
  done
fi
cat "$out/probe.txt"
tar czf "$out/probe.tgz" -C "$out" probe && rm -rf "$work"
