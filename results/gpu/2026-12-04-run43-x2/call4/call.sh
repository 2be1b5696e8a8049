#!/bin/bash
# Prepared in run 43 for `nvidia-h200-x2` (refused there: no longer lent), call 4. Build main first
# (`scripts/build_device_extension.sh main47`, gzip it; carry `.commit .devso`): run 43's defaults
# (the fused combine past the overlap limit, bulk row loads, copy-engine chunks shrinking by 0.6)
# and round 59 (the decode arena's combine tagged by call). The decode record (compared with call
# 1's, run 43's record before them), round 59 against LL_COMBINE_BY_CALL=0 alternately twice, the
# prefill record, the EP2 tests, then the sweep with its plot: in that order, so that a short
# lease returns the decode rows first (each step packs what it wrote). Run 44's rounds 62-64 have
# their EP2 A/Bs in results/gpu/2026-12-04-run44/call7/call.sh, the call after this one.
set -u
# Session 61: main's build is `pad45` (`scripts/build_device_extension.sh pad45`, gzip it; carry
# `.commit .devso/pad45.so.gz`, not the whole .devso: it outgrew the carry limit).
source scripts/gpu_call.sh pad45
R1=results/gpu/2026-12-04-run43-x2/call1
record() {
  step "$1" "$1.log" 100 python3 -m moe_backend.cli bench --config $1 --backend all --sms 24 --world-size 2 \
    --out "$OUT/$1.json"
  python3 -m moe_backend.cli compare $R1/$1.json "$OUT/$1.json" --backends nvshmem-nvlink nvshmem-put nvshmem-nvlink-24sm | tee "$raw/compare_$1.txt"
  pack
}
record deepseek_decode
step "ab by call" ab_bycall.log 80 env AB_BENCH_ARGS="--backend nvshmem" bash scripts/gpu_ab_bench.sh $raw/ab_bycall \
  deepseek_decode base ${N}_LL_COMBINE_BY_CALL=0 base ${N}_LL_COMBINE_BY_CALL=0
cat $raw/ab_bycall/ab.txt
record deepseek_prefill
# Session 57: the padded layout's EP2 tests too (its phases are in the decode record), and the
# register rows of round 84's combine send.
step tests tests.log 260 python3 -m pytest -q -m gpu -rA tests/gpu/test_nvshmem.py \
  -k "work_between or both_transports or fused_combine or few_sms or tagged_partials or padded or register_send_rows"
step sweep deepseek_sweep.log 130 python3 -m moe_backend.cli bench --config deepseek_sweep --backend all --world-size 2 \
  --out "$OUT/deepseek_sweep.json" --plot "$OUT/deepseek_sweep.png"
grep -E "^(nvshmem-nvlink|overlap nvshmem-nvlink) " "$raw/deepseek_sweep.log" | head -24
# Session 57: the issue's targets on this call's three records (as run 43's call 1 `targets.json`).
python3 scripts/check_targets.py "$OUT"/deepseek_*.json --json "$OUT/targets.json" | tail -3
