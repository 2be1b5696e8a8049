#!/bin/bash
# Run 42, call 3 (one H200): the tests call 2's 200 s did not reach, on the warp-wide wait
# (`warpw`, commit 48977a5): one-GPU contract variants self-send, untagged-partials and
# mixed-partials, few SMs, rounds and graphs, the whole combine by call; then decode on the
# cross-rank path (SELF_SEND) on both transports, main (`fromx`) against `warpw`, alternately twice.
set -u
raw=$OUT/raw; mkdir -p $raw
for f in .devso/*.so.gz; do gunzip -f $f; done
export MOE_BACKEND_DEVSO=warpw MOE_BACKEND_COMMIT=$(cat .commit) MOE_BACKEND_NVSHMEM_BOOTSTRAP=native
T0=$(date +%s)
source scripts/gpu_env.sh > /dev/null 2>&1
so=moe_backend/_C.cpython-312-x86_64-linux-gnu.so
D=MOE_BACKEND_DEVSO
cp .devso/warpw.so $so
F=tests/gpu/test_nvshmem_single.py
C="$F::test_contract_on_one_gpu"
timeout 380 python3 -m pytest -q -m gpu -rA --durations=0 "$C[self-send]" "$C[untagged-partials]" "$C[mixed-partials]" \
  "$F::test_contract_with_few_sms_on_one_gpu" "$F::test_rounds_and_graphs_on_one_gpu[overlap]" \
  "$F::test_rounds_and_graphs_on_one_gpu[untagged]" "$F::test_whole_combine_by_call" > $raw/tests.log 2>&1
echo "pytest one-GPU rc $? at $(( $(date +%s) - T0 )) s"; grep -E "FAILED|ERROR|passed|failed" $raw/tests.log | tail -6
tar czf $OUT/call.tgz -C $raw .
MOE_BACKEND_NVSHMEM_SELF_SEND=1 AB_BENCH_ARGS="--world-size 1 --backend all" timeout 150 bash scripts/gpu_ab_bench.sh \
  $raw/ab_decode_self deepseek_decode $D=fromx $D=warpw $D=fromx $D=warpw > $raw/ab_decode_self.log 2>&1
echo "ab decode self-send rc $? at $(( $(date +%s) - T0 )) s"; cat $raw/ab_decode_self/ab.txt
tar czf $OUT/call.tgz -C $raw .
