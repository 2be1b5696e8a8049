#!/bin/bash
# Run 40, call 2 (one H200): the work-between pattern of run 39's EP2 time-out on one GPU's
# cross-rank path (SELF_SEND), default split send and the copy-engine send forced; then round 55
# (`fromx`) against main e768279 (`head54`) on the sweep's bf16 rows at world size 1 with
# SELF_SEND (put's rows from x at every size). Everything under raw/ is packed into call.tgz (the
# device tool returns few files).
set -u
raw=$OUT/raw; mkdir -p $raw
for f in .devso/*.so.gz; do gunzip -f $f; done
export MOE_BACKEND_COMMIT=$(cat .commit) MOE_BACKEND_DEVSO=fromx  # the build gpu_env.sh puts in place
T0=$(date +%s)
source scripts/gpu_env.sh > /dev/null 2>&1
F=tests/gpu/test_nvshmem_single.py
timeout 330 python3 -m pytest -q -m gpu -rA "$F::test_work_between_send_and_receive_on_one_gpu" > $raw/tests.log 2>&1
echo "pytest one-GPU rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed|Timeout|timed out" $raw/tests.log | tail -12
N=MOE_BACKEND_NVSHMEM
AB_BENCH_ARGS="--world-size 1 --num-tokens 1 16 128 1024" timeout 200 scripts/gpu_ab_bench.sh $raw/ab_sweep deepseek_sweep \
  MOE_BACKEND_DEVSO=head54,${N}_SELF_SEND=1 MOE_BACKEND_DEVSO=fromx,${N}_SELF_SEND=1 \
  MOE_BACKEND_DEVSO=head54,${N}_SELF_SEND=1 MOE_BACKEND_DEVSO=fromx,${N}_SELF_SEND=1 > $raw/ab_sweep.out 2>&1
echo "ab sweep rc $? at $(( $(date +%s) - T0 )) s"; cat $raw/ab_sweep/ab.txt
tar czf $OUT/call.tgz -C $raw . && rm -rf $raw
