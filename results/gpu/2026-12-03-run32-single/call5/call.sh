#!/bin/bash
# Run 32, call 5: the lean fused dispatch as landed (LEAN_FUSED, default on): the one-GPU
# contract with it (defaults, SELF_SEND), with the general instance (general-fused) and with
# the switches off (untagged: the general instance), rounds and graphs through the slots, EP2
# on the shared GPU; then its A/B against LEAN_FUSED=0 in the same build (DeepSeek decode,
# world size 1).
set -u
out=$OUT; mkdir -p $out /tmp/w
MOE_BACKEND_DEVSO=plain source scripts/gpu_env.sh > /tmp/w/env.log 2>&1
echo "commit $(cat .commit) devso_loaded=${devso_loaded:-?}"
T0=$(date +%s)
export MOE_BACKEND_COMMIT=$(cat .commit)
N=MOE_BACKEND_NVSHMEM
F=tests/gpu/test_nvshmem_single.py
timeout 200 python3 -m pytest -q -m gpu -rA "$F::test_contract_on_one_gpu[no-overlap]" "$F::test_contract_on_one_gpu[self-send]" \
  "$F::test_contract_on_one_gpu[general-fused]" "$F::test_contract_on_one_gpu[untagged]" \
  "$F::test_rounds_and_graphs_on_one_gpu[self-send]" > $out/tests.log 2>&1
echo "pytest one-GPU rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" $out/tests.log | tail -6
MOE_TEST_SHARED_GPU=1 MOE_TEST_WORLD=2 timeout 90 python3 -m pytest -q -m gpu tests/gpu/test_nvshmem.py -rA \
  -k "both_transports" > $out/tests_ep2.log 2>&1
echo "pytest EP2 shared rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" $out/tests_ep2.log | tail -3
AB_BENCH_ARGS="--world-size 1 --num-tokens 1 32 128" timeout 80 scripts/gpu_ab_bench.sh /tmp/w/ab deepseek_decode \
  base ${N}_LEAN_FUSED=0 base ${N}_LEAN_FUSED=0 > /dev/null 2>&1
echo "ab done at $(( $(date +%s) - T0 )) s"; cat /tmp/w/ab/ab.txt
(cd /tmp/w && tar czf $out/ab.tgz ab)
echo "all done at $(( $(date +%s) - T0 )) s"
