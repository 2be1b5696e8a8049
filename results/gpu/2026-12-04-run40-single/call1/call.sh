#!/bin/bash
# Run 40, call 1 (one H200; nvidia-h200-x2 not lent): round 55 (`fromx`: the put send's rows
# without scales go from x to P2P peers, unstaged) against main e768279 (`head54`, round 54's host
# code, whose kernels are round 53's). World size 1 with SELF_SEND (the cross-rank path on one GPU):
# the prefill preset's put and nvlink rows, alternately; decode as a check that the Params change
# moved nothing. Then the tests on `fromx`: the one-GPU contract with the put staged and not, the
# slots test, rounds and graphs; at EP2 on the shared GPU round 54's work-between test and the
# contract suite on both transports.
set -u
out=$OUT; mkdir -p $out
for f in .devso/*.so.gz; do gunzip -f $f; done
export MOE_BACKEND_COMMIT=$(cat .commit) MOE_BACKEND_DEVSO=fromx  # the build gpu_env.sh puts in place
T0=$(date +%s)
N=MOE_BACKEND_NVSHMEM
AB_BENCH_ARGS="--world-size 1 --backend all" timeout 240 scripts/gpu_ab_bench.sh $out/ab_prefill deepseek_prefill \
  MOE_BACKEND_DEVSO=head54,${N}_SELF_SEND=1 MOE_BACKEND_DEVSO=fromx,${N}_SELF_SEND=1 \
  MOE_BACKEND_DEVSO=fromx,${N}_SELF_SEND=1,${N}_PUT_FROM_X=0 MOE_BACKEND_DEVSO=head54,${N}_SELF_SEND=1 \
  MOE_BACKEND_DEVSO=fromx,${N}_SELF_SEND=1 > $out/ab_prefill.out 2>&1
echo "ab prefill rc $? at $(( $(date +%s) - T0 )) s"; cat $out/ab_prefill/ab.txt
AB_BENCH_ARGS="--world-size 1 --backend all" timeout 150 scripts/gpu_ab_bench.sh $out/ab_decode deepseek_decode \
  MOE_BACKEND_DEVSO=head54 MOE_BACKEND_DEVSO=fromx MOE_BACKEND_DEVSO=head54 MOE_BACKEND_DEVSO=fromx > $out/ab_decode.out 2>&1
echo "ab decode rc $? at $(( $(date +%s) - T0 )) s"; cat $out/ab_decode/ab.txt
source scripts/gpu_env.sh > /dev/null 2>&1
F=tests/gpu/test_nvshmem_single.py
timeout 200 python3 -m pytest -q -m gpu -rA "$F::test_contract_on_one_gpu[self-send]" "$F::test_contract_on_one_gpu[self-send-staged-put]" \
  "$F::test_self_send_goes_through_the_slots" "$F::test_rounds_and_graphs_on_one_gpu[self-send]" > $out/tests.log 2>&1
echo "pytest one-GPU rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" $out/tests.log | tail -12
MOE_TEST_SHARED_GPU=1 MOE_TEST_WORLD=2 timeout 240 python3 -m pytest -q -m gpu tests/gpu/test_nvshmem.py -rA \
  -k "work_between or both_transports" > $out/tests_ep2.log 2>&1
echo "pytest EP2 shared rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" $out/tests_ep2.log | tail -6
