#!/bin/bash
# Run 34, call 1 (round 46): Params reordered so the latency kernels' fields fill the constant-cache
# lines 0x200-0x2c0 and the arguments start on a line (combine receive 8 -> 5 lines first-touched).
# r46b = committed 6e3e1c5 (the receive's batch without the +0.0f tail), r47 = r46b + the reorder.
# Decode at world size 1 alternately three times, SELF_SEND once, prefill once each; the one-GPU
# contract and few-SM tests on r47; ncu of r47's 1-token combine kernels (imc stalls).
set -u
out=$OUT; mkdir -p $out /tmp/w/ab /tmp/w/p
V="r46b r47"
for v in $V; do gunzip -f .devso/$v.so.gz; done
MOE_BACKEND_DEVSO=r47 source scripts/gpu_env.sh > /tmp/w/env.log 2>&1
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
for i in 1 2 3; do
  for v in $V; do
    bench $v ${i}_${v}_ss0 --config deepseek_decode --backend nvshmem
    [ $i = 1 ] && { export ${N}_SELF_SEND=1; bench $v ${i}_${v}_ss1 --config deepseek_decode --backend nvshmem; unset ${N}_SELF_SEND; }
  done
done
for v in $V; do bench $v all_$v --config deepseek_decode --backend all --num-tokens 1 128; done
for v in $V; do bench $v prefill_$v --config deepseek_prefill --backend nvshmem; done
echo "ab done at $(( $(date +%s) - T0 )) s"
cp /tmp/w/ab/ab.txt $out/
MOE_BACKEND_DEVSO=r47 source scripts/gpu_devso.sh
F=tests/gpu/test_nvshmem_single.py
timeout 150 python3 -m pytest -q -m gpu -rA "$F::test_contract_on_one_gpu[overlap]" "$F::test_contract_on_one_gpu[self-send]" \
  "$F::test_contract_on_one_gpu[pdl-combine]" "$F::test_contract_with_few_sms_on_one_gpu" > $out/tests.log 2>&1
echo "pytest one-GPU (r47) rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" $out/tests.log | tail -5
for v in $V; do
  MOE_BACKEND_DEVSO=$v source scripts/gpu_devso.sh
  for k in combine_send combine_recv; do
    timeout 45 ncu --section WarpStateStats --section SourceCounters --cache-control none --clock-control none \
      -k regex:${k}_kernel --launch-skip 5 --launch-count 1 -o /tmp/w/${k}_$v \
      python3 -m moe_backend.cli bench --config deepseek_decode --backend nvshmem --world-size 1 --iters 5 --num-tokens 1 > /tmp/w/${k}_$v.log 2>&1
    ncu -i /tmp/w/${k}_$v.ncu-rep --page source --csv --print-source sass 2>/dev/null | gzip > /tmp/w/p/${k}1_${v}_sass.csv.gz
    echo "$v $k" | tee -a $out/ab.txt
    python3 scripts/ncu_groups.py /tmp/w/p/${k}1_${v}_sass.csv.gz --runs --top 0 --groups 0 | grep -E "code run|stall_no_inst|stall_imc" | tee -a $out/ab.txt
  done
done
(cd /tmp/w && tar czf $out/ab.tgz ab p)
echo "all done at $(( $(date +%s) - T0 )) s"
