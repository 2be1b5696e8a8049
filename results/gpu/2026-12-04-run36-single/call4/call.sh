#!/bin/bash
# Run 36, call 4 (round 49): a tagged item branches off whole (send: after its rows are known,
# receive: after its ranks are), the two paths no longer interleaved inside the sums (llc4), and
# with the branch marked unlikely (__builtin_expect), which places the tagged code after the
# plain path's (llc5: the same SASS as llc4 but for register names, so not run). Decode at world
# size 1, nvlink, alternately twice: notag, llc4 with LL_COMBINE=0, =16, =128; then tests on llc4:
# one-GPU contract (tagged, mixed), rounds and graphs (mixed), EP2 on the shared GPU (tagged
# partials, the timeouts).
set -u
out=$OUT; mkdir -p $out /tmp/w
for v in notag llc4; do gunzip -f .devso/$v.so.gz; done
export MOE_BACKEND_DEVSO=llc4 MOE_BACKEND_COMMIT=$(cat .commit)
T0=$(date +%s)
N=MOE_BACKEND_NVSHMEM
AB_BENCH_ARGS="--world-size 1 --backend nvshmem" timeout 240 bash scripts/gpu_ab_bench.sh /tmp/w/ab deepseek_decode \
  MOE_BACKEND_DEVSO=notag MOE_BACKEND_DEVSO=llc4,${N}_LL_COMBINE=0 MOE_BACKEND_DEVSO=llc4,${N}_LL_COMBINE=16 \
  MOE_BACKEND_DEVSO=llc4,${N}_LL_COMBINE=128 \
  MOE_BACKEND_DEVSO=notag MOE_BACKEND_DEVSO=llc4,${N}_LL_COMBINE=0 MOE_BACKEND_DEVSO=llc4,${N}_LL_COMBINE=16 \
  MOE_BACKEND_DEVSO=llc4,${N}_LL_COMBINE=128 \
  > /tmp/w/ab.log 2>&1
echo "ab rc $? at $(( $(date +%s) - T0 )) s"; cat /tmp/w/ab/ab.txt
(cd /tmp/w && tar czf $out/ab.tgz ab ab.log)
source scripts/gpu_env.sh > /dev/null 2>&1
MOE_BACKEND_DEVSO=llc4 source scripts/gpu_devso.sh
F=tests/gpu/test_nvshmem_single.py
timeout 130 python3 -m pytest -q -m gpu -rA "$F::test_contract_on_one_gpu[tagged-partials]" \
  "$F::test_contract_on_one_gpu[mixed-partials]" "$F::test_rounds_and_graphs_on_one_gpu[mixed-partials]" > $out/tests.log 2>&1
echo "pytest one-GPU (llc4) rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" $out/tests.log | tail -6
MOE_TEST_SHARED_GPU=1 MOE_TEST_WORLD=2 timeout 120 python3 -m pytest -q -m gpu tests/gpu/test_nvshmem.py -rA \
  -k "tagged_partials or timeout" > $out/tests_ep2.log 2>&1
echo "pytest EP2 shared (llc4) rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" $out/tests_ep2.log | tail -4
