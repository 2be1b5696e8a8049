#!/bin/bash
# Run 37, call 4 (round 51): rows = grids2 with the dispatch's rows in round-tagged words by default
# in nvlink arenas of at most 32 tokens (LL_ROWS=k, the fused dispatch's lean and small ROWS
# instances). DeepSeek decode with an arena per batch size at world size 1, alternately twice:
# grids2 (no tagged rows), rows, rows LL_ROWS=0; and the cross-rank path (SELF_SEND=1) with
# LL_ROWS default and 0. Then the one-GPU tests on rows.
set -u
out=$OUT; mkdir -p $out /tmp/w
for v in grids2 rows; do gunzip -f .devso/$v.so.gz; done
export MOE_BACKEND_DEVSO=rows MOE_BACKEND_COMMIT=$(cat .commit)
T0=$(date +%s)
N=MOE_BACKEND_NVSHMEM
V="MOE_BACKEND_DEVSO=grids2 base ${N}_LL_ROWS=0 ${N}_SELF_SEND=1 ${N}_SELF_SEND=1,${N}_LL_ROWS=0"
AB_BENCH_ARGS="--world-size 1 --backend nvshmem" timeout 240 bash scripts/gpu_ab_bench.sh /tmp/w/ab_each deepseek_decode_each \
  $V $V > /tmp/w/ab_each.log 2>&1
echo "ab each rc $? at $(( $(date +%s) - T0 )) s"; cat /tmp/w/ab_each/ab.txt
(cd /tmp/w && tar czf $out/ab.tgz ab_each ab_each.log)
source scripts/gpu_env.sh > /dev/null 2>&1
timeout 240 python3 -m pytest -q -m gpu -rA tests/gpu/test_nvshmem_single.py \
  -k "self-send or tagged-rows or lean-not-small or general-fused or test_contract_on_one_gpu[overlap]" > $out/tests.log 2>&1
echo "pytest one-GPU rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" $out/tests.log | tail -14
