#!/bin/bash
# Run 32, call 2: which jumps the instruction fetch does not cover (step_costs' jumps over 64 B,
# 256 B, 4 KB after the evictor); the one-warp direct table (WARP_TABLE=1, round 42): its
# bit-exactness on one GPU (tagged, untagged, self-send, split) and at EP2 on the shared GPU,
# its A/B on DeepSeek decode at world size 1 (1 / 4 / 32 tokens; with SELF_SEND too), and the
# 1-token fused dispatch's hot code under ncu with it.
set -u
out=$OUT; mkdir -p $out /tmp/w
MOE_BACKEND_DEVSO=plain source scripts/gpu_env.sh > /tmp/w/env.log 2>&1
echo "commit $(cat .commit) devso_loaded=${devso_loaded:-?}"
T0=$(date +%s)
export MOE_BACKEND_COMMIT=$(cat .commit)
N=MOE_BACKEND_NVSHMEM
timeout 100 python3 scripts/step_costs.py --out $out/step_costs.json > $out/step_costs.txt 2>&1
grep -E "jumps|code_" $out/step_costs.txt
echo "probe done at $(( $(date +%s) - T0 )) s"
timeout 280 python3 -m pytest -q -m gpu tests/gpu/test_nvshmem_single.py -rA -k "warp_table or step_costs" > /tmp/w/tests.log 2>&1
echo "pytest one-GPU rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed|Error" /tmp/w/tests.log | tail -8
env ${N}_WARP_TABLE=1 MOE_TEST_SHARED_GPU=1 MOE_TEST_WORLD=2 timeout 150 python3 -m pytest -q -m gpu tests/gpu/test_nvshmem.py -rA \
  -k "both_transports or direct_receive_untagged" > /tmp/w/tests_ep2.log 2>&1
echo "pytest EP2 shared rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" /tmp/w/tests_ep2.log | tail -4
AB_BENCH_ARGS="--world-size 1 --num-tokens 1 4 32" scripts/gpu_ab_bench.sh /tmp/w/ab deepseek_decode \
  base ${N}_WARP_TABLE=1 base ${N}_WARP_TABLE=1 ${N}_SELF_SEND=1 ${N}_SELF_SEND=1,${N}_WARP_TABLE=1 \
  ${N}_SELF_SEND=1 ${N}_SELF_SEND=1,${N}_WARP_TABLE=1 > /dev/null 2>&1
echo "ab done at $(( $(date +%s) - T0 )) s"; cat /tmp/w/ab/ab.txt
env ${N}_WARP_TABLE=1 timeout 90 ncu --section WarpStateStats --section SourceCounters --section SpeedOfLight --cache-control none \
  --clock-control none -k regex:dispatch_fused_kernel --launch-skip 5 --launch-count 1 -o /tmp/w/fused1wt \
  python3 -m moe_backend.cli bench --config deepseek_decode --backend nvshmem --world-size 1 --iters 5 --num-tokens 1 > /tmp/w/fused1wt.log 2>&1
echo "ncu rc $? at $(( $(date +%s) - T0 )) s"
ncu -i /tmp/w/fused1wt.ncu-rep --page source --csv --print-source sass 2>/dev/null | gzip > /tmp/w/fused1wt_sass.csv.gz
ncu -i /tmp/w/fused1wt.ncu-rep --page details > /tmp/w/fused1wt_details.txt 2>&1
grep -E "^    Duration" /tmp/w/fused1wt_details.txt
cp /tmp/w/tests.log /tmp/w/tests_ep2.log $out/ 2>/dev/null
(cd /tmp/w && tar czf $out/ab_ncu.tgz ab fused1wt_sass.csv.gz fused1wt_details.txt)
echo "all done at $(( $(date +%s) - T0 )) s"
