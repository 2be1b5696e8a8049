# Sourced by a prepared GPU call (results/gpu/<run>/callN/call.sh, run on the device machine with
# `carry: .commit .devso`): `source scripts/gpu_call.sh BUILD` unpacks the carried builds, puts
# .devso/BUILD.so in place (scripts/build_device_extension.sh BUILD, then gzip), records .commit
# as MOE_BACKEND_COMMIT, and defines:
#   raw   the folder the call writes, packed into $OUT/call.tgz by `pack` (outside $OUT: only the
#         one file comes back, however many steps wrote; run 55's first command lost every file to
#         the device tool's count of them);
#   N     the nvshmem switches' prefix (env ${N}_CE_SEND=1 ...);
#   step NAME LOG LIMIT CMD...   runs CMD for at most LIMIT seconds, its output into $raw/LOG,
#         prints NAME's exit status, the seconds since the call began and the log's test summary
#         lines, then packs: a call cut short still returns every finished step.
#   use_build NAME   puts another carried build, .devso/NAME.so, in place for the steps after it.
#   decode_bench_ws1 BUILD [TAG [ARG...]]   a step: DeepSeek decode at world size 1 on BUILD, the
#         contiguous ops through their cross-rank path (SELF_SEND=1), with the bench's ARGs (e.g.
#         --num-tokens 1 8 32), into $raw/decode_ws1_BUILDTAG.json.
#   decode_ab_ws1 "NAME:TAG ..." [ARG...]   decode_bench_ws1 NAME TAG ARG... for each build in the
#         list, in order (an A/B: main before and after, e.g. "pad45:a pad46: pad45:b").
#   padded_tests NAME   two steps on the build in place: the padded tests at world size 1, then at
#         EP2 with both ranks on the one GPU (8 cases), logs tests_padded_{single,shared}_NAME.log.
for f in .devso/*.so.gz; do [ -e "$f" ] && gunzip -f "$f"; done
export MOE_BACKEND_DEVSO=$1 MOE_BACKEND_COMMIT=$(cat .commit 2>/dev/null || echo unknown)
raw=$(mktemp -d)/raw
mkdir -p "$raw"
T0=$(date +%s)
source scripts/gpu_env.sh > /dev/null 2>&1
N=MOE_BACKEND_NVSHMEM
pack() { tar czf "$OUT/call.tgz" -C "$raw" .; }
step() {
  local name=$1 log=$raw/$2 limit=$3 rc
  shift 3
  timeout "$limit" "$@" > "$log" 2>&1
  rc=$?
  echo "$name rc $rc at $(( $(date +%s) - T0 )) s"
  grep -E "PASSED|FAILED|ERROR|[0-9]+ (passed|failed)" "$log" | tail -8
  pack
  return 0
}
use_build() {
  MOE_BACKEND_DEVSO=$1
  source scripts/gpu_devso.sh
}
decode_bench_ws1() {
  local name=$1${2:-}
  use_build "$1"
  shift $(( $# < 2 ? $# : 2 ))
  step "decode bench ws1 $name" "bench_$name.log" 60 env ${N}_SELF_SEND=1 python3 -m moe_backend.cli bench \
    --config deepseek_decode --backend nvshmem --world-size 1 --iters 100 "$@" --out "$raw/decode_ws1_$name.json"
  grep -E "^nvshmem" "$raw/bench_$name.log"
}
decode_ab_ws1() {
  local b builds=$1
  shift
  for b in $builds; do
    decode_bench_ws1 "${b%%:*}" "${b#*:}" "$@"
  done
}
padded_tests() {
  step "padded one GPU $1" "tests_padded_single_$1.log" 150 python3 -m pytest -q -m gpu -rA \
    tests/gpu/test_nvshmem_single.py -k padded
  step "padded shared EP2 $1" "tests_padded_shared_$1.log" 200 env MOE_TEST_SHARED_GPU=1 MOE_TEST_WORLD=2 \
    MOE_TEST_CASES=8 python3 -m pytest -q -m gpu -rA tests/gpu/test_nvshmem.py -k padded
}
