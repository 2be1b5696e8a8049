#!/bin/bash
# Run 29, call 1: round 39's ranked table and receive (one kernel, no plan) on one H200: the
# one-GPU tests that run it, the EP2 tests with both ranks on the GPU, then the prefill A/B at
# world size 1 (own tokens from x, and under SELF_SEND through the slots and the copy-engine send).
set -u
out=$OUT; mkdir -p $out /tmp/w
N=MOE_BACKEND_NVSHMEM
MOE_BACKEND_DEVSO=plain source scripts/gpu_env.sh > $out/env.log 2>&1
echo "commit $(cat .commit)"; nvidia-smi -L > $out/smi.txt 2>&1
T0=$(date +%s)
S=${N}_SELF_SEND=1
AB_BENCH_ARGS="--world-size 1" timeout 170 scripts/gpu_ab_bench.sh /tmp/w/ab deepseek_prefill base ${N}_RANKED_TABLE=0 base ${N}_RANKED_TABLE=0 $S $S,${N}_RANKED_TABLE=0 $S $S,${N}_RANKED_TABLE=0 > /dev/null 2>&1
cp /tmp/w/ab/ab.txt $out/ab_prefill.txt; cp /tmp/w/ab/*.json $out/ 2>/dev/null; cat $out/ab_prefill.txt
grep -il "error\|Traceback" /tmp/w/ab/*.log | head -3; tail -5 $(ls /tmp/w/ab/*.log | head -1)
echo "benches done at $(( $(date +%s) - T0 )) s"
timeout 170 python3 -m pytest -q -m gpu tests/gpu/test_nvshmem_single.py -rA -k "contract_on_one_gpu and (overlap or plan-receive or register-copy or self-send-copy-engine or self-send-untagged) or few_sms or (rounds_and_graphs and self-send)" > $out/tests_single.log 2>&1
grep -E "passed|failed|PASSED|FAILED|ERROR" $out/tests_single.log | tail -14
echo "single tests done at $(( $(date +%s) - T0 )) s"
MOE_TEST_SHARED_GPU=1 MOE_TEST_WORLD=2 timeout 200 python3 -m pytest -q -m gpu tests/gpu/test_nvshmem.py -rA -k "both_transports or plan_receive or copy_engine or few_sms" > $out/tests_ep2_shared.log 2>&1
grep -E "passed|failed|PASSED|FAILED|ERROR" $out/tests_ep2_shared.log | tail -8
echo "all done at $(( $(date +%s) - T0 )) s"
