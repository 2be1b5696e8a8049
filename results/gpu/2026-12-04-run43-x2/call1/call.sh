#!/bin/bash
# Run 43 on `nvidia-h200-x2`, call 1 (`fromx`: main's kernels, rounds 55-58): at EP2 on two GPUs,
# first the tests of rounds 54-55 (the work-between test by default, then with the copy-engine
# send forced, which run 39's analysis predicts to time out at 2048 tokens, and with it the
# register copy, predicted to pass; the contract suite on both transports), then the decode and
# prefill record with 24-SM rows (compared with run 39's), then the sweep with its plot (call 2:
# the prefill A/B).
# Summaries on stdout; logs packed into call.tgz after each step (what ran comes back on a time-out).
set -u
raw=$OUT/raw; mkdir -p $raw
for f in .devso/*.so.gz; do gunzip -f $f; done
export MOE_BACKEND_DEVSO=fromx MOE_BACKEND_COMMIT=$(cat .commit)
T0=$(date +%s)
source scripts/gpu_env.sh > /dev/null 2>&1
N=MOE_BACKEND_NVSHMEM
T=tests/gpu/test_nvshmem.py
pack() { tar czf $OUT/call.tgz -C $raw .; }
timeout 150 python3 -m pytest -q -m gpu -rA $T -k "work_between or both_transports" > $raw/tests.log 2>&1
echo "tests rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" $raw/tests.log | tail -5
env ${N}_CE_SEND=1 timeout 100 python3 -m pytest -q -m gpu -rA $T -k "work_between" > $raw/tests_ce.log 2>&1
echo "tests CE_SEND=1 rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" $raw/tests_ce.log | tail -4
env ${N}_CE_SEND=1 ${N}_COPY_BULK=0 timeout 100 python3 -m pytest -q -m gpu -rA $T -k "work_between" > $raw/tests_ce_reg.log 2>&1
echo "tests CE_SEND=1 COPY_BULK=0 rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" $raw/tests_ce_reg.log | tail -4
pack
for preset in deepseek_decode deepseek_prefill; do
  timeout 110 python3 -m moe_backend.cli bench --config $preset --backend all --sms 24 --world-size 2 \
    --out "$OUT/$preset.json" > "$raw/$preset.log" 2>&1
  echo "$preset rc $? at $(( $(date +%s) - T0 )) s"; grep -vE "^\s*$" "$raw/$preset.log" | tail -14
  # against run 39's record (same commands): SLOWER marks a whole op slower by > 3% and > 1 us
  python3 -m moe_backend.cli compare results/gpu/2026-12-04-run39-x2/call1/$preset.json "$OUT/$preset.json" \
    | tee "$raw/compare_$preset.txt"
done
pack
timeout 150 python3 -m moe_backend.cli bench --config deepseek_sweep --backend all --world-size 2 \
  --out "$OUT/deepseek_sweep.json" --plot "$OUT/deepseek_sweep.png" > "$raw/deepseek_sweep.log" 2>&1
echo "sweep rc $? at $(( $(date +%s) - T0 )) s"; grep -E "^(nvshmem|reference|dense)" "$raw/deepseek_sweep.log" | head -40
pack
