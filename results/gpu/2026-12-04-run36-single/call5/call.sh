#!/bin/bash
# Run 36, call 5 (round 49): tagged partials as kernel instances of their own, chosen per arena
# (llc6: nvlink arenas of at most LL_COMBINE = 32 tokens by default; the plain instances' SASS is
# notag's). DeepSeek decode at world size 1 with an arena per token count (the decode preset with
# size_each: the 1- and 32-token arenas take the tagged instances, the 128-token one the plain),
# nvlink, alternately twice: notag, llc6; then tests on llc6: one-GPU contract (tagged), EP2 on
# the shared GPU (tagged partials).
set -u
out=$OUT; mkdir -p $out /tmp/w
for v in notag llc6; do gunzip -f .devso/$v.so.gz; done
export MOE_BACKEND_DEVSO=llc6 MOE_BACKEND_COMMIT=$(cat .commit)
T0=$(date +%s)
sed 's/^  iters: 200$/  iters: 200\n  size_each: true/; s/^name: deepseek-decode$/name: deepseek-decode-each/' \
  configs/bench/deepseek_decode.yaml > /tmp/w/decode_each.yaml
cp /tmp/w/decode_each.yaml $out/
AB_BENCH_ARGS="--world-size 1 --backend nvshmem" timeout 110 bash scripts/gpu_ab_bench.sh /tmp/w/ab /tmp/w/decode_each.yaml \
  MOE_BACKEND_DEVSO=notag MOE_BACKEND_DEVSO=llc6 MOE_BACKEND_DEVSO=notag MOE_BACKEND_DEVSO=llc6 > /tmp/w/ab.log 2>&1
echo "ab rc $? at $(( $(date +%s) - T0 )) s"; cat /tmp/w/ab/ab.txt
(cd /tmp/w && tar czf $out/ab.tgz ab ab.log)
source scripts/gpu_env.sh > /dev/null 2>&1
MOE_BACKEND_DEVSO=llc6 source scripts/gpu_devso.sh
timeout 45 python3 -m pytest -q -m gpu -rA "tests/gpu/test_nvshmem_single.py::test_contract_on_one_gpu[tagged-partials]" > $out/tests.log 2>&1
echo "pytest one-GPU (llc6) rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" $out/tests.log | tail -3
MOE_TEST_SHARED_GPU=1 MOE_TEST_WORLD=2 timeout 60 python3 -m pytest -q -m gpu tests/gpu/test_nvshmem.py -rA \
  -k "tagged_partials" > $out/tests_ep2.log 2>&1
echo "pytest EP2 shared (llc6) rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" $out/tests_ep2.log | tail -3
