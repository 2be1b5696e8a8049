#!/bin/bash
# Prepared in run 43 for `nvidia-h200-x2` (after call 4): round 60, the copy-engine send's flags
# copied by the copy engines behind each chunk's rows (MOE_BACKEND_NVSHMEM_CE_FLAG_COPY=1), no flag
# kernel. Build main (`scripts/build_device_extension.sh main43`, gzip it; carry `.commit .devso`).
# 1. Tests at EP2: the copy-engine contract suite (its third pass copies the flags) and the
#    work-between test with every send by copy engine, flags copied.
# 2. The prefill dispatch, default against CE_FLAG_COPY=1, alternately twice (predicted: the last
#    chunk's event-to-kernel latency off, ~3-5 us; run 43's default 211-212 us, issue 6's 210).
# 3. The sweep's overlap rows with every send by copy engine, flags copied (CE_SEND=1
#    CE_FLAG_COPY=1): no SM taken from the matmul by the send; against call 4's sweep.
set -u
raw=$OUT/raw; mkdir -p $raw
for f in .devso/*.so.gz; do gunzip -f $f; done
export MOE_BACKEND_DEVSO=main43 MOE_BACKEND_COMMIT=$(cat .commit)
T0=$(date +%s)
source scripts/gpu_env.sh > /dev/null 2>&1
N=MOE_BACKEND_NVSHMEM
pack() { tar czf $OUT/call.tgz -C $raw .; }
timeout 150 python3 -m pytest -q -m gpu -rA tests/gpu/test_nvshmem.py -k "copy_engine_send" > $raw/tests_ce.log 2>&1
echo "CE tests rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" $raw/tests_ce.log | tail -3
env ${N}_CE_SEND=1 ${N}_CE_FLAG_COPY=1 timeout 100 python3 -m pytest -q -m gpu -rA tests/gpu/test_nvshmem.py \
  -k "work_between" > $raw/tests_wb.log 2>&1
echo "work-between, flags copied, rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" $raw/tests_wb.log | tail -3
pack
AB_BENCH_ARGS="--backend nvshmem" timeout 120 bash scripts/gpu_ab_bench.sh $raw/ab_flagcopy deepseek_prefill \
  base ${N}_CE_FLAG_COPY=1 base ${N}_CE_FLAG_COPY=1 > $raw/ab_flagcopy.log 2>&1
echo "ab flag copy rc $? at $(( $(date +%s) - T0 )) s"; cat $raw/ab_flagcopy/ab.txt
pack
env ${N}_CE_SEND=1 ${N}_CE_FLAG_COPY=1 timeout 150 python3 -m moe_backend.cli bench --config deepseek_sweep \
  --backend nvshmem --world-size 2 --out "$OUT/sweep_ce.json" > "$raw/sweep_ce.log" 2>&1
echo "sweep (CE, flags copied) rc $? at $(( $(date +%s) - T0 )) s"; grep -E "^overlap " "$raw/sweep_ce.log" | head -12
pack
