#!/bin/bash
# Run 32, call 3: the direct receive's dry pass (PREWARM=1, round 42): bit-exactness on one GPU
# (defaults; SELF_SEND with the untagged table; rounds and graphs) and at EP2 on the shared GPU,
# its A/B on DeepSeek decode at world size 1 (with SELF_SEND too), the fused dispatch's hot code
# with it under ncu; and how much of the other latency kernels waits for instructions (ncu source
# view of the decode combine's send and receive, the SELF_SEND fused dispatch, the prefill plan).
set -u
out=$OUT; mkdir -p $out /tmp/w/p
MOE_BACKEND_DEVSO=plain source scripts/gpu_env.sh > /tmp/w/env.log 2>&1
echo "commit $(cat .commit) devso_loaded=${devso_loaded:-?}"
T0=$(date +%s)
export MOE_BACKEND_COMMIT=$(cat .commit)
N=MOE_BACKEND_NVSHMEM
timeout 200 python3 -m pytest -q -m gpu tests/gpu/test_nvshmem_single.py -rA -k "prewarm" > /tmp/w/tests.log 2>&1
echo "pytest one-GPU rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed|Error" /tmp/w/tests.log | tail -6
env ${N}_PREWARM=1 MOE_TEST_SHARED_GPU=1 MOE_TEST_WORLD=2 timeout 120 python3 -m pytest -q -m gpu tests/gpu/test_nvshmem.py -rA \
  -k "both_transports or direct_receive_untagged" > /tmp/w/tests_ep2.log 2>&1
echo "pytest EP2 shared rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" /tmp/w/tests_ep2.log | tail -4
AB_BENCH_ARGS="--world-size 1 --num-tokens 1 32 128" timeout 200 scripts/gpu_ab_bench.sh /tmp/w/ab deepseek_decode \
  base ${N}_PREWARM=1 base ${N}_PREWARM=1 ${N}_SELF_SEND=1 ${N}_SELF_SEND=1,${N}_PREWARM=1 \
  ${N}_SELF_SEND=1 ${N}_SELF_SEND=1,${N}_PREWARM=1 > /dev/null 2>&1
echo "ab done at $(( $(date +%s) - T0 )) s"; cat /tmp/w/ab/ab.txt
prof() {  # name kernel-regex config extra-bench-args [env...]
  local name=$1 k=$2 cfg=$3 args=$4; shift 4
  env "$@" timeout 60 ncu --section WarpStateStats --section SourceCounters --section SpeedOfLight --cache-control none \
    --clock-control none -k regex:$k --launch-skip 5 --launch-count 1 -o /tmp/w/$name \
    python3 -m moe_backend.cli bench --config $cfg --backend nvshmem --world-size 1 --iters 5 $args > /tmp/w/$name.log 2>&1
  echo "$name rc $? at $(( $(date +%s) - T0 )) s"
  ncu -i /tmp/w/$name.ncu-rep --page source --csv --print-source sass 2>/dev/null | gzip > /tmp/w/p/${name}_sass.csv.gz
  ncu -i /tmp/w/$name.ncu-rep --page details > /tmp/w/p/${name}_details.txt 2>&1
  grep -E "^    Duration" /tmp/w/p/${name}_details.txt
}
prof fused1pw dispatch_fused_kernel deepseek_decode "--num-tokens 1" ${N}_PREWARM=1
prof fused1 dispatch_fused_kernel deepseek_decode "--num-tokens 1"
prof csend1 combine_send_kernel deepseek_decode "--num-tokens 1"
prof crecv1 combine_recv_kernel deepseek_decode "--num-tokens 1"
prof fused1ss dispatch_fused_kernel deepseek_decode "--num-tokens 1" ${N}_SELF_SEND=1
prof plan dispatch_recv_kernel deepseek_prefill ""
cp /tmp/w/tests.log /tmp/w/tests_ep2.log $out/ 2>/dev/null
(cd /tmp/w && tar czf $out/ab_ncu.tgz ab p)
echo "all done at $(( $(date +%s) - T0 )) s"
