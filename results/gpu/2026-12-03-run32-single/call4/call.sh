#!/bin/bash
# Run 32, call 4: does a smaller fused dispatch take fewer jumps and less time? main's build
# (plain) against a scratch build (lean: main with the fused path's switches fixed at their
# defaults at compile time, `results/.../call4/lean.diff`; 143 KB of SASS for the 1-token
# kernel instead of 160 KB; valid at the defaults only), DeepSeek decode at world size 1,
# alternately, twice (with SELF_SEND too); then ncu's source view of the 1-token fused dispatch
# of each (ncu_groups.py --runs counts the jumps).
set -u
out=$OUT; mkdir -p $out /tmp/w/ab /tmp/w/p
gunzip -f .devso/plain.so.gz .devso/lean.so.gz
MOE_BACKEND_DEVSO=plain source scripts/gpu_env.sh > /tmp/w/env.log 2>&1
echo "commit $(cat .commit)"
T0=$(date +%s)
export MOE_BACKEND_COMMIT=$(cat .commit)
N=MOE_BACKEND_NVSHMEM
summary() {  # json label
  python3 - "$1" "$2" <<'PY'
import json, sys
path, label = sys.argv[1:]
for r in json.load(open(path))["results"][0]["rows"]:
    ph = r["phases"]
    print(f"{label:<24} {r['num_tokens']:>5}: dispatch {ph['dispatch']['median']:6.1f} us  combine {ph['combine']['median']:6.1f} us")
PY
}
for i in 1 2; do
  for v in plain lean; do
    MOE_BACKEND_DEVSO=$v source scripts/gpu_devso.sh
    for ss in 0 1; do
      env ${N}_SELF_SEND=$ss timeout 60 python3 -m moe_backend.cli bench --config deepseek_decode --backend nvshmem \
        --world-size 1 --num-tokens 1 32 128 --out /tmp/w/ab/bench_${i}_${v}_ss$ss.json > /tmp/w/ab/bench_${i}_${v}_ss$ss.log 2>&1
      summary /tmp/w/ab/bench_${i}_${v}_ss$ss.json "$v loaded=$devso_loaded SELF_SEND=$ss" | tee -a /tmp/w/ab/ab.txt
    done
  done
done
echo "ab done at $(( $(date +%s) - T0 )) s"
for v in plain lean; do
  MOE_BACKEND_DEVSO=$v source scripts/gpu_devso.sh
  timeout 60 ncu --section WarpStateStats --section SourceCounters --cache-control none --clock-control none \
    -k regex:dispatch_fused_kernel --launch-skip 5 --launch-count 1 -o /tmp/w/f_$v \
    python3 -m moe_backend.cli bench --config deepseek_decode --backend nvshmem --world-size 1 --iters 5 --num-tokens 1 > /tmp/w/f_$v.log 2>&1
  echo "ncu $v rc $? at $(( $(date +%s) - T0 )) s"
  ncu -i /tmp/w/f_$v.ncu-rep --page source --csv --print-source sass 2>/dev/null | gzip > /tmp/w/p/fused1_${v}_sass.csv.gz
  ncu -i /tmp/w/f_$v.ncu-rep --page details > /tmp/w/p/fused1_${v}_details.txt 2>&1
  grep -E "^    Duration" /tmp/w/p/fused1_${v}_details.txt
  python3 scripts/ncu_groups.py /tmp/w/p/fused1_${v}_sass.csv.gz --runs --top 0 --groups 0 | grep -E "code run|stall_no_inst"
done
cp /tmp/w/ab/ab.txt $out/
(cd /tmp/w && tar czf $out/ab_ncu.tgz ab p)
echo "all done at $(( $(date +%s) - T0 )) s"
