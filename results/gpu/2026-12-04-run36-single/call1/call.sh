#!/bin/bash
# Run 36, call 1 (round 49): the combine's partials in round-tagged words for small calls
# (LL_COMBINE). base = main 498319e's kernels, llc = the working tree's (default: calls of at
# most 8 source tokens tagged). Decode at world size 1, nvlink, alternately twice: base, llc,
# llc with LL_COMBINE=0 (never tagged), llc with LL_COMBINE=128 (every call tagged); then tests
# on llc: one-GPU contract (tagged, mixed, overlap), rounds and graphs (mixed), EP2 on the
# shared GPU (tagged partials, both transports, the timeouts with and without tagged partials).
set -u
out=$OUT; mkdir -p $out /tmp/w
for v in base llc; do gunzip -f .devso/$v.so.gz; done
export MOE_BACKEND_DEVSO=llc MOE_BACKEND_COMMIT=$(cat .commit)
T0=$(date +%s)
N=MOE_BACKEND_NVSHMEM
AB_BENCH_ARGS="--world-size 1 --backend nvshmem" timeout 240 bash scripts/gpu_ab_bench.sh /tmp/w/ab deepseek_decode \
  MOE_BACKEND_DEVSO=base MOE_BACKEND_DEVSO=llc MOE_BACKEND_DEVSO=llc,${N}_LL_COMBINE=0 MOE_BACKEND_DEVSO=llc,${N}_LL_COMBINE=128 \
  MOE_BACKEND_DEVSO=base MOE_BACKEND_DEVSO=llc MOE_BACKEND_DEVSO=llc,${N}_LL_COMBINE=0 MOE_BACKEND_DEVSO=llc,${N}_LL_COMBINE=128 \
  > /tmp/w/ab.log 2>&1
echo "ab rc $? at $(( $(date +%s) - T0 )) s"; cat /tmp/w/ab/ab.txt
(cd /tmp/w && tar czf $out/ab.tgz ab ab.log)
source scripts/gpu_env.sh > /dev/null 2>&1
MOE_BACKEND_DEVSO=llc source scripts/gpu_devso.sh
F=tests/gpu/test_nvshmem_single.py
timeout 170 python3 -m pytest -q -m gpu -rA "$F::test_contract_on_one_gpu[tagged-partials]" \
  "$F::test_contract_on_one_gpu[mixed-partials]" "$F::test_rounds_and_graphs_on_one_gpu[mixed-partials]" \
  "$F::test_contract_on_one_gpu[overlap]" > $out/tests.log 2>&1
echo "pytest one-GPU (llc) rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" $out/tests.log | tail -6
MOE_TEST_SHARED_GPU=1 MOE_TEST_WORLD=2 timeout 150 python3 -m pytest -q -m gpu tests/gpu/test_nvshmem.py -rA \
  -k "tagged_partials or both_transports or timeout" > $out/tests_ep2.log 2>&1
echo "pytest EP2 shared (llc) rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" $out/tests_ep2.log | tail -4
