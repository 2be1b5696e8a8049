#!/bin/bash
# Run 29, call 5: the plan's chunk size (MOE_BACKEND_NVSHMEM_PLAN_CHUNK, the least tokens a plan
# block takes: fewer blocks at its grid barrier, a smaller count matrix each reads), DeepSeek
# prefill at world size 1, own tokens from x and under SELF_SEND; then the timeline of the plan
# and the tests that run the plan with the larger chunks.
set -u
out=$OUT; mkdir -p $out /tmp/w
N=MOE_BACKEND_NVSHMEM
MOE_BACKEND_DEVSO=plain source scripts/gpu_env.sh > /tmp/w/env.log 2>&1
echo "commit $(cat .commit) devso_loaded=$devso_loaded"
T0=$(date +%s)
C=${N}_PLAN_CHUNK
S=${N}_SELF_SEND=1
AB_BENCH_ARGS="--world-size 1" timeout 200 scripts/gpu_ab_bench.sh /tmp/w/ab deepseek_prefill base $C=128 $C=256 base $C=128 $C=256 $S $S,$C=128 $S $S,$C=128 > /dev/null 2>&1
cp /tmp/w/ab/ab.txt $out/ab_prefill.txt; cat $out/ab_prefill.txt
echo "benches done at $(( $(date +%s) - T0 )) s"
for v in 32 128; do
  env $C=$v timeout 60 python3 scripts/profile_timeline.py /tmp/w/tl$v deepseek-prefill --world-size 1 > /tmp/w/tl$v.log 2>&1
  cp /tmp/w/tl$v/timeline.txt $out/profile_chunk$v.txt 2>/dev/null || tail -3 /tmp/w/tl$v.log
  head -9 $out/profile_chunk$v.txt 2>/dev/null
done
echo "timelines done at $(( $(date +%s) - T0 )) s"
env $C=128 timeout 100 python3 -m pytest -q -m gpu tests/gpu/test_nvshmem_single.py -rA -k "contract_on_one_gpu and (overlap or register-copy or self-send-copy-engine)" > $out/tests_single_chunk128.log 2>&1
grep -E "passed|failed|PASSED|FAILED|ERROR" $out/tests_single_chunk128.log | tail -6
echo "all done at $(( $(date +%s) - T0 )) s"
