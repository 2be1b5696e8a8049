#!/usr/bin/env bash
# A/B of kernel variants selected by environment variables: one `moe-backend bench` of one
# preset on the nvshmem backend per variant, in the order given (repeat a variant to see the
# run-to-run spread). A variant is a comma-separated list of VAR=VALUE, or "base" for none.
# MOE_BACKEND_DEVSO=NAME in a variant runs it on the carried build .devso/NAME.so
# (scripts/build_device_extension.sh); the other variants run on the build gpu_env.sh put in place.
#   scripts/gpu_ab_bench.sh OUT_DIR PRESET VARIANT...
# e.g. scripts/gpu_ab_bench.sh $OUT/ab deepseek_prefill base MOE_BACKEND_NVSHMEM_X=1 base
#      AB_BENCH_ARGS="--world-size 1" scripts/gpu_ab_bench.sh $OUT/ab deepseek_decode \
#        MOE_BACKEND_DEVSO=old MOE_BACKEND_DEVSO=new MOE_BACKEND_DEVSO=new,MOE_BACKEND_NVSHMEM_SELF_SEND=1
# Writes OUT_DIR/bench_<i>_<variant>.json/.log and prints each variant's median dispatch and
# combine (slowest rank) to OUT_DIR/ab.txt. AB_BENCH_ARGS adds bench options (e.g. "--sms 24").
set -uo pipefail
out=$1 bench_preset=$2
shift 2
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh
# The build in place now serves the variants that name none; a named one is swapped in for its run.
base_dir=$(mktemp -d)
trap 'rm -rf "$base_dir"' EXIT
base_so=$base_dir/base.so
cp moe_backend/_C*.so "$base_so"
so_suffix=$("$PYTHON" -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
: > "$out/ab.txt"
i=0
for variant in "$@"; do
  i=$((i + 1))
  env=()
  [ "$variant" = base ] || IFS=, read -r -a env <<< "$variant"
  name="bench_${i}_${variant//[^A-Za-z0-9_]/_}"  # no "=": the device tool does not return such names
  build=
  for kv in "${env[@]}"; do [[ $kv == MOE_BACKEND_DEVSO=* ]] && build=${kv#MOE_BACKEND_DEVSO=}; done
  if [ -n "$build" ]; then
    MOE_BACKEND_DEVSO=$build source scripts/gpu_devso.sh
    if [ "$devso_loaded" != 1 ]; then
      echo "$variant: no result (.devso/$build.so missing or not loadable)" >> "$out/ab.txt"
      cp "$base_so" "moe_backend/_C$so_suffix"
      continue
    fi
  else
    cp "$base_so" "moe_backend/_C$so_suffix"
  fi
  env "${env[@]}" "$PYTHON" -m moe_backend.cli bench --config "$bench_preset" --backend nvshmem ${AB_BENCH_ARGS:-} \
    --out "$out/$name.json" > "$out/$name.log" 2>&1
  "$PYTHON" - "$out/$name.json" "$variant" "$out/$name.log" >> "$out/ab.txt" <<'PY'
import json, re, sys
path, variant, log = sys.argv[1:]
try:
    rows = json.load(open(path))["results"][0]["rows"]
except (OSError, KeyError, IndexError, ValueError) as err:
    # The run's own last error says why (e.g. a carried build from a tree with another config vector).
    errors = [line.strip() for line in open(log, errors="replace") if re.match(r"\w+(Error|Exception): ", line.strip())]
    print(f"{variant}: no result ({errors[-1] if errors else err}; see {log.rsplit('/', 1)[-1]})")
    sys.exit()
for r in rows:
    ph = r["phases"]
    if "combine" in ph:
        o = r.get("overlap")  # presets with overlap rows: overlapped / the longer alone
        print(f"{variant:<60} {r['backend']:<16}{r['num_tokens']:>6}: dispatch {ph['dispatch']['median']:7.1f} us"
              f"  combine {ph['combine']['median']:7.1f} us"
              + (f"  overlap {o['overlapped_us']:6.1f} us {o['ratio']:.2f}x" if o else ""))
PY
done
cat "$out/ab.txt"
