#!/bin/bash
# Run 32, call 1: does branchy code pay for its instruction fetches? scripts/step_costs.py with
# the jump steps (first pass, warm, after ~256 KB of other code on every SM, after an L2 flush
# too); ncu's duration of every probe launch (--reps 1: the floor of a kernel of the send's
# shape); the 1-token fused dispatch's stall reasons (no-instruction share); the probe's GPU test.
set -u
out=$OUT; mkdir -p $out /tmp/w
MOE_BACKEND_DEVSO=plain source scripts/gpu_env.sh > /tmp/w/env.log 2>&1
echo "commit $(cat .commit) devso_loaded=${devso_loaded:-?}"
T0=$(date +%s)
export MOE_BACKEND_COMMIT=$(cat .commit)
timeout 150 python3 scripts/step_costs.py --out $out/step_costs.json 2>&1 | tee $out/step_costs.txt
echo "probe done at $(( $(date +%s) - T0 )) s"
timeout 120 ncu --metrics gpu__time_duration.sum --cache-control none --clock-control none -k regex:step_probe_kernel --csv \
  python3 scripts/step_costs.py --reps 1 --trials 1 > /tmp/w/ncu_floor.csv 2>&1
echo "ncu floor rc $? at $(( $(date +%s) - T0 )) s"
grep -E '"gpu__time_duration' /tmp/w/ncu_floor.csv | awk -F'","' '{print NR-1, $(NF)}' | tr -d '"' > $out/ncu_floor.txt
head -3 $out/ncu_floor.txt; wc -l $out/ncu_floor.txt
timeout 90 ncu --section WarpStateStats --section SourceCounters --section SpeedOfLight --cache-control none --clock-control none \
  -k regex:dispatch_fused_kernel --launch-skip 5 --launch-count 1 -o /tmp/w/fused1 \
  python3 -m moe_backend.cli bench --config deepseek_decode --backend nvshmem --world-size 1 --iters 5 --num-tokens 1 > /tmp/w/fused1.log 2>&1
echo "ncu fused rc $? at $(( $(date +%s) - T0 )) s"
ncu -i /tmp/w/fused1.ncu-rep --page details > $out/fused1_details.txt 2>&1
ncu -i /tmp/w/fused1.ncu-rep --page source --csv --print-source sass 2>/dev/null | gzip > $out/fused1_sass.csv.gz
grep -E "Duration|No Instruction|Stall" $out/fused1_details.txt | head
timeout 200 python3 -m pytest -q -m gpu tests/gpu/test_nvshmem_single.py -rA -k "step_costs" > $out/tests.log 2>&1
echo "pytest rc $?"; grep -E "PASSED|FAILED|ERROR|passed|failed|assert" $out/tests.log | tail -5
echo "all done at $(( $(date +%s) - T0 )) s"
