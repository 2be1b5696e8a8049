#!/bin/bash
# Run 39, call 2. First main's build (`main53`): the rest of the one-GPU test file (the slots, the
# grids, the wide receive, the task contract, the probes). Then `percall53` (branch
# exp/round53-percall: main + WHOLE_COMBINE=2, the PDL combine only for calls whose wide receive
# grid passes the side stream's; host code only, the same SASS): DeepSeek decode at world size 1,
# nvlink, the 128-token arena with the default (PDL always), WHOLE_COMBINE=0 (side stream always)
# and WHOLE_COMBINE=2, alternately twice; the arena per size once each; then the branch's test of
# the per-call choice (its test files carried as pc_tests/).
set -u
out=$OUT; mkdir -p $out /tmp/w
gunzip -f .devso/main53.so.gz .devso/percall53.so.gz
export MOE_BACKEND_DEVSO=main53 MOE_BACKEND_COMMIT=$(cat .commit)
T0=$(date +%s)
source scripts/gpu_env.sh > /dev/null 2>&1
timeout 170 python3 -m pytest -q -m gpu -rA tests/gpu/test_nvshmem_single.py \
  -k "slots or grids_follow or warp_per_item or tasks or probe" > $out/tests.log 2>&1
echo "pytest one-GPU rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" $out/tests.log | tail -12
N=MOE_BACKEND_NVSHMEM
P=MOE_BACKEND_DEVSO=percall53
AB_BENCH_ARGS="--world-size 1 --backend nvshmem" timeout 150 bash scripts/gpu_ab_bench.sh /tmp/w/ab_128 deepseek_decode \
  $P $P,${N}_WHOLE_COMBINE=0 $P,${N}_WHOLE_COMBINE=2 $P $P,${N}_WHOLE_COMBINE=0 $P,${N}_WHOLE_COMBINE=2 > /tmp/w/ab_128.log 2>&1
echo "ab 128 rc $? at $(( $(date +%s) - T0 )) s"; cat /tmp/w/ab_128/ab.txt
AB_BENCH_ARGS="--world-size 1 --backend nvshmem" timeout 100 bash scripts/gpu_ab_bench.sh /tmp/w/ab_each deepseek_decode_each \
  $P $P,${N}_WHOLE_COMBINE=0 $P,${N}_WHOLE_COMBINE=2 > /tmp/w/ab_each.log 2>&1
echo "ab each rc $? at $(( $(date +%s) - T0 )) s"; cat /tmp/w/ab_each/ab.txt
(cd /tmp/w && tar czf $out/ab.tgz ab_128 ab_128.log ab_each ab_each.log)
cp pc_tests/*.py tests/gpu/
MOE_BACKEND_DEVSO=percall53 source scripts/gpu_devso.sh
timeout 90 python3 -m pytest -q -m gpu -rA tests/gpu/test_nvshmem_single.py -k "by_call" > $out/tests_percall.log 2>&1
echo "pytest per-call rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" $out/tests_percall.log | tail -4
