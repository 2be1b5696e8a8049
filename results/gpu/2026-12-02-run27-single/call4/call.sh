#!/bin/bash
# Device call 4 (run 27, LL_ROWS_MAX): the tagged-rows tests (every count, mixed by count, split)
# under SELF_SEND, then the decode A/B: flagged slots, tagged rows, tagged rows up to 16 tokens.
set -u
out=$OUT; mkdir -p $out /tmp/w
N=MOE_BACKEND_NVSHMEM
MOE_BACKEND_DEVSO=plain source scripts/gpu_env.sh > /tmp/w/env.log 2>&1
grep -i "does not load\|build" /tmp/w/env.log | head -3
echo "commit $(cat .commit)"
T0=$(date +%s)
timeout 300 python3 -m pytest -v -m gpu tests/gpu/test_nvshmem_single.py -k "tagged-rows" > $out/tests.log 2>&1
grep -E "passed|failed|PASSED|FAILED|Error" $out/tests.log | tail -12
echo "tests took $(( $(date +%s) - T0 )) s"
S=${N}_SELF_SEND=1
AB_BENCH_ARGS="--world-size 1" scripts/gpu_ab_bench.sh /tmp/w/ab deepseek_decode $S $S,${N}_LL_ROWS=1 $S,${N}_LL_ROWS=1,${N}_LL_ROWS_MAX=16 $S $S,${N}_LL_ROWS=1 $S,${N}_LL_ROWS=1,${N}_LL_ROWS_MAX=16 > /dev/null 2>&1
cp /tmp/w/ab/ab.txt $out/ab_decode.txt; cat $out/ab_decode.txt
echo "all done at $(( $(date +%s) - T0 )) s"
