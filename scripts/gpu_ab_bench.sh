#!/usr/bin/env bash
# A/B of kernel variants selected by environment variables: one `moe-backend bench` of one
# preset on the nvshmem backend per variant, in the order given (repeat a variant to see the
# run-to-run spread). A variant is a comma-separated list of VAR=VALUE, or "base" for none.
#   scripts/gpu_ab_bench.sh OUT_DIR PRESET VARIANT...
# e.g. scripts/gpu_ab_bench.sh $OUT/ab deepseek_prefill base MOE_BACKEND_NVSHMEM_X=1 base
# Writes OUT_DIR/bench_<i>_<variant>.json/.log and prints each variant's median dispatch and
# combine (slowest rank) to OUT_DIR/ab.txt. AB_BENCH_ARGS adds bench options (e.g. "--sms 24").
set -uo pipefail
out=$1 bench_preset=$2
shift 2
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh
: > "$out/ab.txt"
i=0
for variant in "$@"; do
  i=$((i + 1))
  env=()
  [ "$variant" = base ] || IFS=, read -r -a env <<< "$variant"
  name="bench_${i}_${variant//[^A-Za-z0-9_]/_}"  # no "=": the device tool does not return such names
  env "${env[@]}" "$PYTHON" -m moe_backend.cli bench --config "$bench_preset" --backend nvshmem ${AB_BENCH_ARGS:-} \
    --out "$out/$name.json" > "$out/$name.log" 2>&1
  "$PYTHON" - "$out/$name.json" "$variant" >> "$out/ab.txt" <<'PY'
import json, sys
path, variant = sys.argv[1:]
try:
    rows = json.load(open(path))["results"][0]["rows"]
except (OSError, KeyError, IndexError, ValueError) as err:
    print(f"{variant}: no result ({err})")
    sys.exit()
for r in rows:
    ph = r["phases"]
    if "combine" in ph:
        print(f"{variant:<60} {r['backend']:<16}{r['num_tokens']:>6}: dispatch {ph['dispatch']['median']:7.1f} us"
              f"  combine {ph['combine']['median']:7.1f} us")
PY
done
cat "$out/ab.txt"
