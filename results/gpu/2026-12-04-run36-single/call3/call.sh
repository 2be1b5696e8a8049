#!/bin/bash
# Run 36, call 3 (round 49): the tagged receive's sum with one rolled poll for all its words
# (llc2; call 2's llc polled each word inline: the receive's code 1,128 -> 3,336 instructions,
# and its untagged path 0.5-0.9 us slower than notag's). Decode at world size 1, nvlink,
# alternately twice: notag, llc2 with LL_COMBINE=0, =16, =128; then tests on llc2: one-GPU
# contract (tagged, mixed), rounds and graphs (mixed), EP2 on the shared GPU (tagged partials,
# the timeouts).
set -u
out=$OUT; mkdir -p $out /tmp/w
for v in notag llc2; do gunzip -f .devso/$v.so.gz; done
export MOE_BACKEND_DEVSO=llc2 MOE_BACKEND_COMMIT=$(cat .commit)
T0=$(date +%s)
N=MOE_BACKEND_NVSHMEM
AB_BENCH_ARGS="--world-size 1 --backend nvshmem" timeout 240 bash scripts/gpu_ab_bench.sh /tmp/w/ab deepseek_decode \
  MOE_BACKEND_DEVSO=notag MOE_BACKEND_DEVSO=llc2,${N}_LL_COMBINE=0 MOE_BACKEND_DEVSO=llc2,${N}_LL_COMBINE=16 MOE_BACKEND_DEVSO=llc2,${N}_LL_COMBINE=128 \
  MOE_BACKEND_DEVSO=notag MOE_BACKEND_DEVSO=llc2,${N}_LL_COMBINE=0 MOE_BACKEND_DEVSO=llc2,${N}_LL_COMBINE=16 MOE_BACKEND_DEVSO=llc2,${N}_LL_COMBINE=128 \
  > /tmp/w/ab.log 2>&1
echo "ab rc $? at $(( $(date +%s) - T0 )) s"; cat /tmp/w/ab/ab.txt
(cd /tmp/w && tar czf $out/ab.tgz ab ab.log)
source scripts/gpu_env.sh > /dev/null 2>&1
MOE_BACKEND_DEVSO=llc2 source scripts/gpu_devso.sh
F=tests/gpu/test_nvshmem_single.py
timeout 130 python3 -m pytest -q -m gpu -rA "$F::test_contract_on_one_gpu[tagged-partials]" \
  "$F::test_contract_on_one_gpu[mixed-partials]" "$F::test_rounds_and_graphs_on_one_gpu[mixed-partials]" > $out/tests.log 2>&1
echo "pytest one-GPU (llc2) rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" $out/tests.log | tail -6
MOE_TEST_SHARED_GPU=1 MOE_TEST_WORLD=2 timeout 120 python3 -m pytest -q -m gpu tests/gpu/test_nvshmem.py -rA \
  -k "tagged_partials or timeout" > $out/tests_ep2.log 2>&1
echo "pytest EP2 shared (llc2) rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" $out/tests_ep2.log | tail -4
