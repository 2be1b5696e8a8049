#!/bin/bash
# Run 37, call 1 (round 50): the latency kernels' grids by the largest call's items (ITEM_GRIDS,
# default on) against the arena's tokens (=0), in one build. DeepSeek decode at world size 1,
# nvlink, alternately twice: with an arena per batch size (deepseek_decode_each; also the reviewed
# tagged partials against none, LL_COMBINE=0), and in the 128-token arena (also every call tagged,
# LL_COMBINE=128). Then the tests on the build: the grids by the profiler, the one-GPU contract
# with the old grids, and the EP2 contract suite on the shared GPU.
set -u
out=$OUT; mkdir -p $out /tmp/w
gunzip -f .devso/grids.so.gz
export MOE_BACKEND_DEVSO=grids MOE_BACKEND_COMMIT=$(cat .commit)
T0=$(date +%s)
N=MOE_BACKEND_NVSHMEM
AB_BENCH_ARGS="--world-size 1 --backend nvshmem" timeout 150 bash scripts/gpu_ab_bench.sh /tmp/w/ab_each deepseek_decode_each \
  base ${N}_ITEM_GRIDS=0 ${N}_LL_COMBINE=0 base ${N}_ITEM_GRIDS=0 ${N}_LL_COMBINE=0 > /tmp/w/ab_each.log 2>&1
echo "ab each rc $? at $(( $(date +%s) - T0 )) s"; cat /tmp/w/ab_each/ab.txt
AB_BENCH_ARGS="--world-size 1 --backend nvshmem" timeout 150 bash scripts/gpu_ab_bench.sh /tmp/w/ab_128 deepseek_decode \
  base ${N}_ITEM_GRIDS=0 ${N}_LL_COMBINE=128 base ${N}_ITEM_GRIDS=0 ${N}_LL_COMBINE=128 > /tmp/w/ab_128.log 2>&1
echo "ab 128 rc $? at $(( $(date +%s) - T0 )) s"; cat /tmp/w/ab_128/ab.txt
(cd /tmp/w && tar czf $out/ab.tgz ab_each ab_each.log ab_128 ab_128.log)
source scripts/gpu_env.sh > /dev/null 2>&1
timeout 150 python3 -m pytest -q -m gpu -rA tests/gpu/test_nvshmem_single.py \
  -k "grids_follow or token-grids or tagged-partials" > $out/tests.log 2>&1
echo "pytest one-GPU rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" $out/tests.log | tail -12
MOE_TEST_SHARED_GPU=1 MOE_TEST_WORLD=2 timeout 150 python3 -m pytest -q -m gpu tests/gpu/test_nvshmem.py -rA \
  -k "test_contract_suite_both_transports or test_contract_suite_tagged_partials" > $out/tests_ep2.log 2>&1
echo "pytest EP2 shared rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" $out/tests_ep2.log | tail -4
