#!/bin/bash
# Run 33, call 3: which of round 44's combine changes costs the 128-token combine its +0.5 us
# (call 2: r45 16.6-16.8 -> 17.2 us at world size 1, 1 and 32 tokens -0.2..0.4). Builds, all with
# round 45's dispatch: r45 (as committed), r46b (the receive's row batch without the +0.0f tail),
# r46c (neither the send's nor the receive's), r46d (round 43's combine). Decode at world size 1
# alternately, twice, SELF_SEND once, prefill once; the one-GPU contract on r46c.
set -u
out=$OUT; mkdir -p $out /tmp/w/ab
V="r45 r46b r46c r46d"
for v in $V; do gunzip -f .devso/$v.so.gz; done
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
  for v in $V; do
    bench $v ${i}_${v}_ss0 --config deepseek_decode --backend nvshmem
    [ $i = 1 ] && { export ${N}_SELF_SEND=1; bench $v ${i}_${v}_ss1 --config deepseek_decode --backend nvshmem; unset ${N}_SELF_SEND; }
  done
done
for v in $V; do bench $v prefill_$v --config deepseek_prefill --backend nvshmem; done
echo "ab done at $(( $(date +%s) - T0 )) s"
cp /tmp/w/ab/ab.txt $out/
MOE_BACKEND_DEVSO=r46c source scripts/gpu_devso.sh
F=tests/gpu/test_nvshmem_single.py
timeout 150 python3 -m pytest -q -m gpu -rA "$F::test_contract_on_one_gpu[overlap]" "$F::test_contract_on_one_gpu[self-send]" \
  "$F::test_contract_on_one_gpu[pdl-combine]" "$F::test_contract_with_few_sms_on_one_gpu" > $out/tests.log 2>&1
echo "pytest one-GPU (r46c) rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" $out/tests.log | tail -5
(cd /tmp/w && tar czf $out/ab.tgz ab)
echo "all done at $(( $(date +%s) - T0 )) s"
