#!/bin/bash
# Run 38, call 3 (round 52 kept): `wide2` = the whole combine on one stream by default, its receive
# launched by PDL with a warp per item (WIDE_RECV); WHOLE_COMBINE=0 the side stream as before.
# DeepSeek decode at world size 1, nvlink: the 128-token arena alternately twice, the sweep (an
# arena per size, 1-4096 tokens) once each. Then the whole one-GPU test file and, on the shared
# GPU at EP2, the new grid test and the side-stream combine.
set -u
out=$OUT; mkdir -p $out /tmp/w
gunzip -f .devso/wide2.so.gz
export MOE_BACKEND_DEVSO=wide2 MOE_BACKEND_COMMIT=$(cat .commit)
T0=$(date +%s)
N=MOE_BACKEND_NVSHMEM
AB_BENCH_ARGS="--world-size 1 --backend nvshmem" timeout 120 bash scripts/gpu_ab_bench.sh /tmp/w/ab_128 deepseek_decode \
  base ${N}_WHOLE_COMBINE=0 base ${N}_WHOLE_COMBINE=0 > /tmp/w/ab_128.log 2>&1
echo "ab 128 rc $? at $(( $(date +%s) - T0 )) s"; cat /tmp/w/ab_128/ab.txt
AB_BENCH_ARGS="--world-size 1 --backend nvshmem" timeout 150 bash scripts/gpu_ab_bench.sh /tmp/w/ab_sweep deepseek_sweep \
  base ${N}_WHOLE_COMBINE=0 > /tmp/w/ab_sweep.log 2>&1
echo "ab sweep rc $? at $(( $(date +%s) - T0 )) s"; cat /tmp/w/ab_sweep/ab.txt
(cd /tmp/w && tar czf $out/ab.tgz ab_128 ab_128.log ab_sweep ab_sweep.log)
source scripts/gpu_env.sh > /dev/null 2>&1
timeout 420 python3 -m pytest -q -m gpu -rA tests/gpu/test_nvshmem_single.py > $out/tests.log 2>&1
echo "pytest one-GPU rc $? at $(( $(date +%s) - T0 )) s"; grep -E "FAILED|ERROR|passed|failed" $out/tests.log | tail -8
MOE_TEST_SHARED_GPU=1 MOE_TEST_WORLD=2 timeout 150 python3 -m pytest -q -m gpu tests/gpu/test_nvshmem.py -rA \
  -k "test_whole_combine_receive_takes_a_warp_per_item or test_contract_suite_combine_on_the_side_stream" > $out/tests_ep2.log 2>&1
echo "pytest EP2 shared rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" $out/tests_ep2.log | tail -5
