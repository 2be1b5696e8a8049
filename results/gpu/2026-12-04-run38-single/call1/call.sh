#!/bin/bash
# Run 38, call 1: the put transport's A/B of round 50's grids (never timed: run 37 ran out of
# device time), on `mend` (6643175's kernels = main's), an arena per batch size, `--backend all`,
# alternately twice; ncu of the 128-token combine send / receive (the largest decode number) and
# the 1-token fused dispatch in their own arenas; then tests of mend's Python (the review's
# tagged choices read on every transport): one-GPU contract subset, EP2 on the shared GPU.
set -u
out=$OUT; mkdir -p $out /tmp/w/p
gunzip -f .devso/mend.so.gz
export MOE_BACKEND_DEVSO=mend MOE_BACKEND_COMMIT=$(cat .commit)
T0=$(date +%s)
N=MOE_BACKEND_NVSHMEM
AB_BENCH_ARGS="--world-size 1 --backend all" timeout 200 bash scripts/gpu_ab_bench.sh /tmp/w/ab_each deepseek_decode_each \
  base ${N}_ITEM_GRIDS=0 base ${N}_ITEM_GRIDS=0 > /tmp/w/ab_each.log 2>&1
echo "ab each rc $? at $(( $(date +%s) - T0 )) s"; cat /tmp/w/ab_each/ab.txt
source scripts/gpu_env.sh > /dev/null 2>&1
source scripts/gpu_devso.sh
prof() {  # kernel regex, tokens, tag
  timeout 60 ncu --section WarpStateStats --section SourceCounters --section SpeedOfLight --cache-control none --clock-control none \
    -k regex:$1 --launch-skip 5 --launch-count 1 -o /tmp/w/$3 \
    python3 -m moe_backend.cli bench --config deepseek_decode_each --backend nvshmem --world-size 1 --iters 5 --num-tokens $2 > /tmp/w/$3.log 2>&1
  ncu -i /tmp/w/$3.ncu-rep --page details --csv 2>/dev/null > /tmp/w/p/$3_details.csv
  ncu -i /tmp/w/$3.ncu-rep --page source --csv --print-source sass 2>/dev/null | gzip > /tmp/w/p/$3_sass.csv.gz
  python3 scripts/ncu_groups.py /tmp/w/p/$3_sass.csv.gz --runs --top 10 --groups 0 > /tmp/w/p/$3.txt
  echo "== $3"; grep -E "Duration|Elapsed Cycles|Registers Per|Grid Size" /tmp/w/p/$3_details.csv | cut -d, -f12- | head -5
  head -30 /tmp/w/p/$3.txt
}
prof combine_send_kernel 128 csend128
prof combine_recv_kernel 128 crecv128
prof dispatch_fused_kernel 1 fused1
echo "ncu done at $(( $(date +%s) - T0 )) s"
(cd /tmp/w && tar czf $out/ab.tgz ab_each ab_each.log p)
F=tests/gpu/test_nvshmem_single.py
timeout 200 python3 -m pytest -q -m gpu -rA "$F::test_contract_on_one_gpu[overlap]" "$F::test_contract_on_one_gpu[self-send]" \
  "$F::test_contract_on_one_gpu[tagged-partials]" "$F::test_contract_on_one_gpu[self-send-untagged-rows]" \
  "$F::test_self_send_goes_through_the_slots" > $out/tests.log 2>&1
echo "pytest one-GPU rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" $out/tests.log | tail -10
MOE_TEST_SHARED_GPU=1 MOE_TEST_WORLD=2 timeout 150 python3 -m pytest -q -m gpu tests/gpu/test_nvshmem.py -rA \
  -k "test_contract_suite_both_transports or test_contract_suite_tagged_rows" > $out/tests_ep2.log 2>&1
echo "pytest EP2 shared rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" $out/tests_ep2.log | tail -5
