#!/bin/bash
# Prepared in run 43 for `nvidia-h200-x2` (after call 4): round 60, the copy-engine send's flags
# copied by the copy engines behind each chunk's rows (MOE_BACKEND_NVSHMEM_CE_FLAG_COPY=1), no flag
# kernel. Build main (`scripts/build_device_extension.sh main47`, gzip it; carry `.commit .devso`).
# 1. Tests at EP2: the copy-engine contract suite (its third pass copies the flags) and the
#    work-between test with every send by copy engine, flags copied.
# 2. The prefill dispatch, default against CE_FLAG_COPY=1, alternately twice (predicted: the last
#    chunk's event-to-kernel latency off, ~3-5 us; run 43's default 211-212 us, issue 6's 210);
#    then with 6 and 8 chunks (added in run 44): without a flag kernel a chunk costs less, so more,
#    smaller chunks may pay (round 15 measured 4 / 6 / 8 equal chunks 231 / 242 / 246 us with the
#    kernels; CE_DECAY 0.6 shrinks each).
# 3. The sweep's overlap rows with every send by copy engine, flags copied (CE_SEND=1
#    CE_FLAG_COPY=1): no SM taken from the matmul by the send; against call 4's sweep.
set -u
# Session 61: main's build is `pad45` (`scripts/build_device_extension.sh pad45`, gzip it; carry
# `.commit .devso/pad45.so.gz`, not the whole .devso: it outgrew the carry limit).
source scripts/gpu_call.sh pad45
step "CE tests" tests_ce.log 150 python3 -m pytest -q -m gpu -rA tests/gpu/test_nvshmem.py -k "copy_engine_send"
step "work-between, flags copied" tests_wb.log 100 env ${N}_CE_SEND=1 ${N}_CE_FLAG_COPY=1 python3 -m pytest -q -m gpu \
  -rA tests/gpu/test_nvshmem.py -k "work_between"
step "ab flag copy" ab_flagcopy.log 180 env AB_BENCH_ARGS="--backend nvshmem" bash scripts/gpu_ab_bench.sh \
  $raw/ab_flagcopy deepseek_prefill base ${N}_CE_FLAG_COPY=1 base ${N}_CE_FLAG_COPY=1 \
  ${N}_CE_FLAG_COPY=1,${N}_CE_CHUNKS=6 ${N}_CE_FLAG_COPY=1,${N}_CE_CHUNKS=8
cat $raw/ab_flagcopy/ab.txt
step "sweep (CE, flags copied)" sweep_ce.log 150 env ${N}_CE_SEND=1 ${N}_CE_FLAG_COPY=1 python3 -m moe_backend.cli \
  bench --config deepseek_sweep --backend nvshmem --world-size 2 --out "$OUT/sweep_ce.json"
grep -E "^overlap " "$raw/sweep_ce.log" | head -12
