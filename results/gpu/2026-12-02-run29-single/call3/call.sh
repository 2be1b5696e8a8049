#!/bin/bash
# Run 29, call 3: round 39's ranked receive after the first timeline's fixes (the table's id loads
# batched, the weight loaded with the id, 13 row buffers): the prefill A/B at world size 1 (own
# tokens from x; under SELF_SEND through the slots and the copy-engine send), Mixtral, the stamps
# timeline, then the tests on one GPU and with 2 and 4 ranks sharing it.
set -u
out=$OUT; mkdir -p $out /tmp/w
N=MOE_BACKEND_NVSHMEM
MOE_BACKEND_DEVSO=plain source scripts/gpu_env.sh > /tmp/w/env.log 2>&1
echo "commit $(cat .commit) devso_loaded=$devso_loaded"
T0=$(date +%s)
S=${N}_SELF_SEND=1
AB_BENCH_ARGS="--world-size 1" timeout 170 scripts/gpu_ab_bench.sh /tmp/w/ab deepseek_prefill base ${N}_RANKED_TABLE=0 base ${N}_RANKED_TABLE=0 $S $S,${N}_RANKED_TABLE=0 $S $S,${N}_RANKED_TABLE=0 > /dev/null 2>&1
cp /tmp/w/ab/ab.txt $out/ab_prefill.txt; cat $out/ab_prefill.txt
AB_BENCH_ARGS="--world-size 1 --iters 100" timeout 80 scripts/gpu_ab_bench.sh /tmp/w/abm mixtral base ${N}_RANKED_TABLE=0 base ${N}_RANKED_TABLE=0 > /dev/null 2>&1
cp /tmp/w/abm/ab.txt $out/ab_mixtral.txt; cat $out/ab_mixtral.txt
echo "benches done at $(( $(date +%s) - T0 )) s"
MOE_BACKEND_DEVSO=stamps source scripts/gpu_devso.sh
timeout 60 python3 scripts/kernel_timeline.py --config deepseek_prefill --world-size 1 --iters 40 > $out/stamps_ranked1.txt 2>&1
env $S timeout 60 python3 scripts/kernel_timeline.py --config deepseek_prefill --world-size 1 --iters 40 > $out/stamps_ranked1_self.txt 2>&1
grep -E "send_table_exit|plan_waited|plan_barrier|copy_entry|copy_exit" $out/stamps_ranked1.txt $out/stamps_ranked1_self.txt
MOE_BACKEND_DEVSO=plain source scripts/gpu_devso.sh; echo "plain devso_loaded=$devso_loaded"
echo "timelines done at $(( $(date +%s) - T0 )) s"
timeout 150 python3 -m pytest -q -m gpu tests/gpu/test_nvshmem_single.py -rA -k "contract_on_one_gpu and (overlap or register-copy or self-send-copy-engine or self-send-untagged) or few_sms or (rounds_and_graphs and self-send)" > $out/tests_single.log 2>&1
grep -E "passed|failed|PASSED|FAILED|ERROR" $out/tests_single.log | tail -10
echo "single tests done at $(( $(date +%s) - T0 )) s"
MOE_TEST_SHARED_GPU=1 MOE_TEST_WORLD=2 timeout 120 python3 -m pytest -q -m gpu tests/gpu/test_nvshmem.py -rA -k "both_transports or plan_receive or copy_engine or few_sms" > $out/tests_ep2_shared.log 2>&1
grep -E "passed|failed|PASSED|FAILED|ERROR" $out/tests_ep2_shared.log | tail -6
MOE_TEST_SHARED_GPU=1 MOE_TEST_WORLD=4 timeout 100 python3 -m pytest -q -m gpu tests/gpu/test_nvshmem.py -rA -k "both_transports or copy_variants" > $out/tests_ep4_shared.log 2>&1
grep -E "passed|failed|PASSED|FAILED|ERROR" $out/tests_ep4_shared.log | tail -4
echo "all done at $(( $(date +%s) - T0 )) s"
