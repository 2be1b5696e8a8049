#!/usr/bin/env bash
# A/B of two builds of the extension on one bench preset: this tree ("new") against a copy of it
# with the files under PREV_DIR laid over it ("prev": e.g. csrc/ of an earlier commit, made where
# git is by `mkdir -p .ab_prev && git archive REV csrc | tar -x -C .ab_prev`, then carried to the
# GPU machine). Both are built side by side; then scripts/gpu_ab_bench.sh runs the preset on
# each, alternately (new, prev, new, prev, ...), ROUNDS times (default 2), with the variables
# of AB_VARIANT (one gpu_ab_bench.sh variant, default "base") and its AB_BENCH_ARGS.
#   scripts/gpu_ab_build.sh OUT_DIR PRESET PREV_DIR [ROUNDS]
# Writes OUT_DIR/new<i>/ and OUT_DIR/prev<i>/ (gpu_ab_bench.sh's files), the build logs and
# OUT_DIR/ab.txt (every run's lines, labelled). The JSON of both sides name this tree's commit.
set -uo pipefail
usage() { echo "usage: scripts/gpu_ab_build.sh OUT_DIR PRESET PREV_DIR [ROUNDS]" >&2; exit 2; }
[ $# -ge 3 ] && [ $# -le 4 ] || usage
out=$1 bench_preset=$2 prev_src=$3 rounds=${4:-2}  # not "preset": nvshmem_env.sh sets that
[ -d "$prev_src" ] || { echo "gpu_ab_build.sh: PREV_DIR '$prev_src' is not a directory" >&2; exit 2; }
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "gpu_ab_build.sh: ROUNDS must be a positive integer, got '$rounds'" >&2; exit 2; }
prev_src=$(cd "$prev_src" && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
source scripts/gpu_wheels.sh
prev=$(mktemp -d /tmp/ab_prev.XXXXXX)
tar --exclude=./.git --exclude=./.venv --exclude=./build --exclude=./results --exclude='./moe_backend/_C*.so' -cf - . |
  tar -xf - -C "$prev"
cp -r "$prev_src"/. "$prev"/
(cd "$prev" && TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0a} MAX_JOBS=${MAX_JOBS:-8} \
  "$PYTHON" setup.py build_ext --inplace > "$out/build_prev.log" 2>&1) &
building_prev=$!
rm -f moe_backend/_C*.so
source scripts/gpu_env.sh  # builds this tree's extension (log: $out/build.log)
wait "$building_prev" || { echo "gpu_ab_build.sh: the prev build failed ($out/build_prev.log)" >&2; exit 1; }
ls moe_backend/_C*.so >/dev/null 2>&1 || { echo "gpu_ab_build.sh: the new build failed ($out/build.log)" >&2; exit 1; }
: > "$out/ab.txt"
for i in $(seq 1 "$rounds"); do
  for side in new prev; do
    root=$PWD
    [ "$side" = prev ] && root=$prev
    "$root/scripts/gpu_ab_bench.sh" "$out/$side$i" "$bench_preset" "${AB_VARIANT:-base}" > /dev/null
    sed "s/^/$side$i /" "$out/$side$i/ab.txt" >> "$out/ab.txt"
  done
done
rm -rf "$prev"
cat "$out/ab.txt"
