#!/bin/bash
# Device call 3 (run 27, 10eb614): LL_ROWS (round-tagged rows, no token flag) under SELF_SEND at
# world size 1: its tests, the decode A/B against the flagged slots, and its timeline.
set -u
out=$OUT; mkdir -p $out /tmp/w
N=MOE_BACKEND_NVSHMEM
MOE_BACKEND_DEVSO=plain source scripts/gpu_env.sh > /tmp/w/env.log 2>&1
grep -i "does not load\|build" /tmp/w/env.log | head -3
echo "commit $(cat .commit)"
T0=$(date +%s)
timeout 300 python3 -m pytest -v -m gpu tests/gpu/test_nvshmem_single.py -k "tagged-rows or self_send or self-send]" > $out/tests.log 2>&1
grep -E "passed|failed|PASSED|FAILED|Error" $out/tests.log | tail -12
echo "tests took $(( $(date +%s) - T0 )) s"
S=${N}_SELF_SEND=1
AB_BENCH_ARGS="--world-size 1" scripts/gpu_ab_bench.sh /tmp/w/ab deepseek_decode $S $S,${N}_LL_ROWS=1 $S $S,${N}_LL_ROWS=1 base > /dev/null 2>&1
cp /tmp/w/ab/ab.txt $out/ab_decode.txt; cat $out/ab_decode.txt
echo "benches done at $(( $(date +%s) - T0 )) s"
cp .devso/stamps.so moe_backend/_C.cpython-312-x86_64-linux-gnu.so
env $S ${N}_LL_ROWS=1 timeout 100 python3 scripts/kernel_timeline.py --world-size 1 --tokens 1 128 --iters 200 --out /tmp/w/tl.json > $out/timeline_ll_rows.log 2>&1
grep "dispatch" $out/timeline_ll_rows.log | head -40
echo "all done at $(( $(date +%s) - T0 )) s"
