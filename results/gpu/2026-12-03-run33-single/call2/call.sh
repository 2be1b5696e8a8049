#!/bin/bash
# Run 33, call 2: rounds 44-45 (r45: the combine's and the direct receive's loops
# over topk / ranks rolled, the combine send's weighting chosen once per item, a row batch's tail
# adding +0.0f instead of branching; the lean fused dispatch only where L <= 512, so one scan form)
# against round 43 (main), DeepSeek decode at world size 1, alternately, twice (SELF_SEND once);
# r45's tests (one GPU, EP2 on the shared GPU); then both builds with every backend (put too) and
# on DeepSeek prefill, and ncu of r45's 1-token combine kernels.
set -u
out=$OUT; mkdir -p $out /tmp/w/ab /tmp/w/p
gunzip -f .devso/r43.so.gz .devso/r45.so.gz
MOE_BACKEND_DEVSO=r45 source scripts/gpu_env.sh > /tmp/w/env.log 2>&1
echo "commit $(cat .commit) devso_loaded=${devso_loaded:-?}"
T0=$(date +%s)
export MOE_BACKEND_COMMIT=$(cat .commit)
N=MOE_BACKEND_NVSHMEM
summary() {  # json label
  python3 - "$1" "$2" <<'PY'
import json, sys
path, label = sys.argv[1:]
try:
    rows = json.load(open(path))["results"][0]["rows"]
except (OSError, KeyError, IndexError, ValueError) as err:
    print(f"{label}: no result ({err})"); sys.exit()
for r in rows:
    ph = r["phases"]
    if "combine" in ph:
        print(f"{label:<24} {r['backend']:<22} {r['num_tokens']:>5}: dispatch {ph['dispatch']['median']:6.1f} us  combine {ph['combine']['median']:6.1f} us")
PY
}
bench() {  # devso name, label, bench args...
  local v=$1 label=$2; shift 2
  MOE_BACKEND_DEVSO=$v source scripts/gpu_devso.sh
  timeout 90 python3 -m moe_backend.cli bench --world-size 1 --out /tmp/w/ab/$label.json "$@" > /tmp/w/ab/$label.log 2>&1
  summary /tmp/w/ab/$label.json "$label loaded=$devso_loaded" | tee -a /tmp/w/ab/ab.txt
}
for i in 1 2; do
  for v in r43 r45; do
    bench $v ${i}_${v}_ss0 --config deepseek_decode --backend nvshmem
    [ $i = 1 ] && { export ${N}_SELF_SEND=1; bench $v ${i}_${v}_ss1 --config deepseek_decode --backend nvshmem; unset ${N}_SELF_SEND; }
  done
done
echo "ab done at $(( $(date +%s) - T0 )) s"
cp /tmp/w/ab/ab.txt $out/
MOE_BACKEND_DEVSO=r45 source scripts/gpu_devso.sh
F=tests/gpu/test_nvshmem_single.py
timeout 200 python3 -m pytest -q -m gpu -rA "$F::test_contract_on_one_gpu[overlap]" "$F::test_contract_on_one_gpu[self-send]" \
  "$F::test_contract_on_one_gpu[bulk-rows]" "$F::test_contract_on_one_gpu[pdl-combine]" "$F::test_contract_with_few_sms_on_one_gpu" \
  "$F::test_rounds_and_graphs_on_one_gpu[overlap]" > $out/tests.log 2>&1
echo "pytest one-GPU rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" $out/tests.log | tail -7
MOE_TEST_SHARED_GPU=1 MOE_TEST_WORLD=2 timeout 80 python3 -m pytest -q -m gpu tests/gpu/test_nvshmem.py -rA \
  -k "both_transports" > $out/tests_ep2.log 2>&1
echo "pytest EP2 shared rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" $out/tests_ep2.log | tail -3
for v in r43 r45; do bench $v all_$v --config deepseek_decode --backend all --num-tokens 1 128; done
for v in r43 r45; do bench $v prefill_$v --config deepseek_prefill --backend nvshmem; done
echo "extra benches done at $(( $(date +%s) - T0 )) s"
cp /tmp/w/ab/ab.txt $out/
MOE_BACKEND_DEVSO=r45 source scripts/gpu_devso.sh
for k in combine_send combine_recv; do
  timeout 45 ncu --section WarpStateStats --section SourceCounters --cache-control none --clock-control none \
    -k regex:${k}_kernel --launch-skip 5 --launch-count 1 -o /tmp/w/$k \
    python3 -m moe_backend.cli bench --config deepseek_decode --backend nvshmem --world-size 1 --iters 5 --num-tokens 1 > /tmp/w/$k.log 2>&1
  ncu -i /tmp/w/$k.ncu-rep --page source --csv --print-source sass 2>/dev/null | gzip > /tmp/w/p/${k}1_r45_sass.csv.gz
  python3 scripts/ncu_groups.py /tmp/w/p/${k}1_r45_sass.csv.gz --runs --top 0 --groups 0 | grep -E "code run|stall_no_inst|stall_imc"
done
(cd /tmp/w && tar czf $out/ab_ncu.tgz ab p)
echo "all done at $(( $(date +%s) - T0 )) s"
