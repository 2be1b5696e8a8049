#!/bin/bash
# Device call 8 (run 27): the copy-engine send's flags behind one fence (CE_FLAG_FENCE, default
# on): its contract test under SELF_SEND, then the prefill A/B at world size 1 and the timeline.
set -u
out=$OUT; mkdir -p $out /tmp/w
N=MOE_BACKEND_NVSHMEM
MOE_BACKEND_DEVSO=plain source scripts/gpu_env.sh > /tmp/w/env.log 2>&1
echo "commit $(cat .commit)"
T0=$(date +%s)
timeout 100 python3 -m pytest -v -m gpu "tests/gpu/test_nvshmem_single.py::test_contract_on_one_gpu[self-send-copy-engine]" > $out/tests.log 2>&1
grep -E "passed|failed|PASSED|FAILED" $out/tests.log | tail -3
S=${N}_SELF_SEND=1
AB_BENCH_ARGS="--world-size 1" timeout 120 scripts/gpu_ab_bench.sh /tmp/w/ab deepseek_prefill $S $S,${N}_CE_FLAG_FENCE=0 $S $S,${N}_CE_FLAG_FENCE=0 > /dev/null 2>&1
cp /tmp/w/ab/ab.txt $out/ab_prefill.txt; cat $out/ab_prefill.txt
echo "benches done at $(( $(date +%s) - T0 )) s"
env $S timeout 60 python3 scripts/profile_timeline.py /tmp/w/tl deepseek-prefill --world-size 1 > $out/timeline_prefill.log 2>&1
cp /tmp/w/tl/timeline.txt $out/timeline_prefill_self.txt 2>/dev/null
head -16 $out/timeline_prefill_self.txt 2>/dev/null || tail -20 $out/timeline_prefill.log
echo "all done at $(( $(date +%s) - T0 )) s"
