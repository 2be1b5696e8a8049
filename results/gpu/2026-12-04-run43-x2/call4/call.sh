#!/bin/bash
# Run 43 on `nvidia-h200-x2`, call 4 (`newdef`: calls 2-3's findings as defaults: the fused combine
# in every arena past the overlap limit, its rows by bulk copies, the copy-engine chunks shrinking
# by 0.6; the work-between test's whole-dispatch check fixed). Tests at EP2, the prefill record
# (decode's paths are unchanged: call 1 stands), the one-GPU cp.async variant, the fused combine
# against two kernels at world size 1, then the sweep with its plot.
set -u
raw=$OUT/raw; mkdir -p $raw
for f in .devso/*.so.gz; do gunzip -f $f; done
export MOE_BACKEND_DEVSO=newdef MOE_BACKEND_COMMIT=$(cat .commit)
T0=$(date +%s)
source scripts/gpu_env.sh > /dev/null 2>&1
N=MOE_BACKEND_NVSHMEM
pack() { tar czf $OUT/call.tgz -C $raw .; }
timeout 240 python3 -m pytest -q -m gpu -rA tests/gpu/test_nvshmem.py \
  -k "work_between or both_transports or fused_combine or few_sms" > $raw/tests.log 2>&1
echo "tests rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" $raw/tests.log | tail -6
pack
timeout 110 python3 -m moe_backend.cli bench --config deepseek_prefill --backend all --sms 24 --world-size 2 \
  --out "$OUT/deepseek_prefill.json" > "$raw/deepseek_prefill.log" 2>&1
echo "prefill rc $? at $(( $(date +%s) - T0 )) s"; grep -vE "^\s*$" "$raw/deepseek_prefill.log" | tail -12
python3 -m moe_backend.cli compare results/gpu/2026-12-04-run43-x2/call1/deepseek_prefill.json "$OUT/deepseek_prefill.json" \
  | tee "$raw/compare_prefill.txt"
pack
timeout 80 python3 -m pytest -q -m gpu -rA tests/gpu/test_nvshmem_single.py -k "async-rows" > $raw/tests_single.log 2>&1
echo "one-GPU tests rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" $raw/tests_single.log | tail -3
AB_BENCH_ARGS="--backend nvshmem" timeout 70 bash scripts/gpu_ab_bench.sh $raw/ab_ws1 \
  results/gpu/2026-12-04-run43-x2/call4/prefill_ws1_each.yaml base ${N}_COMBINE_FUSED=0 > $raw/ab_ws1.log 2>&1
echo "ab ws1 rc $? at $(( $(date +%s) - T0 )) s"; cat $raw/ab_ws1/ab.txt
pack
timeout 130 python3 -m moe_backend.cli bench --config deepseek_sweep --backend all --world-size 2 \
  --out "$OUT/deepseek_sweep.json" --plot "$OUT/deepseek_sweep.png" > "$raw/deepseek_sweep.log" 2>&1
echo "sweep rc $? at $(( $(date +%s) - T0 )) s"; grep -E "^(nvshmem-nvlink|overlap nvshmem-nvlink) " "$raw/deepseek_sweep.log" | head -24
pack
