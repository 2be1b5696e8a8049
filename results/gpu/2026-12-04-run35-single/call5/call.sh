#!/bin/bash
# Run 35, call 5 (round 48b): warm_param_lines in the fused dispatch too (Params, SendIn and
# DirectOut __grid_constant__). r50 = round 48 (combine kernels only), r51 = r50 + the fused
# dispatch's warm-up. Decode at world size 1, `--backend all`, alternately twice; then tests on
# r51: one-GPU contract (self-send), EP2 on the shared GPU.
set -u
out=$OUT; mkdir -p $out
for v in r50 r51; do gunzip -f .devso/$v.so.gz; done
export MOE_BACKEND_DEVSO=r50 MOE_BACKEND_COMMIT=$(cat .commit)
T0=$(date +%s)
AB_BENCH_ARGS="--world-size 1 --backend all" timeout 150 bash scripts/gpu_ab_bench.sh /tmp/w/ab deepseek_decode \
  MOE_BACKEND_DEVSO=r50 MOE_BACKEND_DEVSO=r51 MOE_BACKEND_DEVSO=r50 MOE_BACKEND_DEVSO=r51 > /dev/null 2>&1
echo "ab rc $? at $(( $(date +%s) - T0 )) s"; grep -v reference /tmp/w/ab/ab.txt
(cd /tmp/w && tar czf $out/ab.tgz ab)
source scripts/gpu_env.sh > /dev/null 2>&1
MOE_BACKEND_DEVSO=r51 source scripts/gpu_devso.sh
F=tests/gpu/test_nvshmem_single.py
timeout 60 python3 -m pytest -q -m gpu -rA "$F::test_contract_on_one_gpu[self-send]" > $out/tests.log 2>&1
echo "pytest one-GPU (r51) rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" $out/tests.log | tail -5
MOE_TEST_SHARED_GPU=1 MOE_TEST_WORLD=2 timeout 45 python3 -m pytest -q -m gpu tests/gpu/test_nvshmem.py -rA \
  -k "both_transports" > $out/tests_ep2.log 2>&1
echo "pytest EP2 shared (r51) rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" $out/tests_ep2.log | tail -4
