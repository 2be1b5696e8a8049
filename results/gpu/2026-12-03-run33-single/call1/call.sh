#!/bin/bash
# Run 33, call 1: round 43's smaller fused dispatch (the table's format fixed per instance, the
# loops over groups / ranks / mask words rolled, and a SMALL instance for calls of <= 512 / topk
# tokens) against main's build (plain, bcce7a1's kernels), DeepSeek decode at world size 1,
# alternately, twice (with SELF_SEND too); SMALL_FUSED=0/1 and DIRECT_TABLE_BLOCKS=1 (default 2)
# in r43's build; ncu's source view of
# r43's 1-token fused dispatch (ncu_groups.py --runs: its stretches and jumps); then r43's tests.
set -u
out=$OUT; mkdir -p $out /tmp/w/ab /tmp/w/p
gunzip -f .devso/plain.so.gz .devso/r43.so.gz
MOE_BACKEND_DEVSO=r43 source scripts/gpu_env.sh > /tmp/w/env.log 2>&1
echo "commit $(cat .commit) devso_loaded=${devso_loaded:-?}"
T0=$(date +%s)
export MOE_BACKEND_COMMIT=$(cat .commit)
N=MOE_BACKEND_NVSHMEM
summary() {  # json label
  python3 - "$1" "$2" <<'PY'
import json, sys
path, label = sys.argv[1:]
for r in json.load(open(path))["results"][0]["rows"]:
    ph = r["phases"]
    if "combine" in ph:
        print(f"{label:<28} {r['num_tokens']:>5}: dispatch {ph['dispatch']['median']:6.1f} us  combine {ph['combine']['median']:6.1f} us")
PY
}
for i in 1 2; do
  for v in plain r43; do
    MOE_BACKEND_DEVSO=$v source scripts/gpu_devso.sh
    for ss in 0 1; do
      env ${N}_SELF_SEND=$ss timeout 60 python3 -m moe_backend.cli bench --config deepseek_decode --backend nvshmem \
        --world-size 1 --num-tokens 1 32 128 --out /tmp/w/ab/bench_${i}_${v}_ss$ss.json > /tmp/w/ab/bench_${i}_${v}_ss$ss.log 2>&1
      summary /tmp/w/ab/bench_${i}_${v}_ss$ss.json "$v loaded=$devso_loaded SELF_SEND=$ss" | tee -a /tmp/w/ab/ab.txt
    done
  done
done
echo "ab done at $(( $(date +%s) - T0 )) s"
MOE_BACKEND_DEVSO=r43 source scripts/gpu_devso.sh
for i in 1 2; do
  for s in SMALL_FUSED=0 SMALL_FUSED=1 DIRECT_TABLE_BLOCKS=1; do
    env ${N}_$s timeout 60 python3 -m moe_backend.cli bench --config deepseek_decode --backend nvshmem \
      --world-size 1 --num-tokens 1 32 --out /tmp/w/ab/small_${i}_${s%=*}${s#*=}.json > /tmp/w/ab/small_${i}_${s%=*}${s#*=}.log 2>&1
    summary /tmp/w/ab/small_${i}_${s%=*}${s#*=}.json "r43 $s" | tee -a /tmp/w/ab/ab.txt
  done
done
echo "small ab done at $(( $(date +%s) - T0 )) s"
timeout 60 ncu --section WarpStateStats --section SourceCounters --cache-control none --clock-control none \
  -k regex:dispatch_fused_kernel --launch-skip 5 --launch-count 1 -o /tmp/w/f_r43 \
  python3 -m moe_backend.cli bench --config deepseek_decode --backend nvshmem --world-size 1 --iters 5 --num-tokens 1 > /tmp/w/f_r43.log 2>&1
echo "ncu rc $? at $(( $(date +%s) - T0 )) s"
ncu -i /tmp/w/f_r43.ncu-rep --page source --csv --print-source sass 2>/dev/null | gzip > /tmp/w/p/fused1_r43_sass.csv.gz
ncu -i /tmp/w/f_r43.ncu-rep --page details > /tmp/w/p/fused1_r43_details.txt 2>&1
grep -E "^    Duration" /tmp/w/p/fused1_r43_details.txt
python3 scripts/ncu_groups.py /tmp/w/p/fused1_r43_sass.csv.gz --runs --top 0 --groups 0 | grep -E "code run|stall_no_inst"
cp /tmp/w/ab/ab.txt $out/
(cd /tmp/w && tar czf $out/ab_ncu.tgz ab p)
F=tests/gpu/test_nvshmem_single.py
timeout 240 python3 -m pytest -q -m gpu -rA "$F::test_contract_on_one_gpu[self-send]" "$F::test_contract_on_one_gpu[lean-not-small]" \
  "$F::test_contract_on_one_gpu[no-overlap]" "$F::test_contract_on_one_gpu[general-fused]" \
  "$F::test_rounds_and_graphs_on_one_gpu[self-send]" > $out/tests.log 2>&1
echo "pytest one-GPU rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" $out/tests.log | tail -7
MOE_TEST_SHARED_GPU=1 MOE_TEST_WORLD=2 timeout 90 python3 -m pytest -q -m gpu tests/gpu/test_nvshmem.py -rA \
  -k "both_transports" > $out/tests_ep2.log 2>&1
echo "pytest EP2 shared rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" $out/tests_ep2.log | tail -3
echo "all done at $(( $(date +%s) - T0 )) s"
