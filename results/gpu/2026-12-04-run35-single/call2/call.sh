#!/bin/bash
# Run 35, call 2 (round 48): the latency kernels' parameter lines fetched together at entry
# (warm_param_lines: thread 0 reads a word of each line by indexed loads, which do not block).
# r49 = main 159405a's kernels, r50 = r49 + the warm-up in the combine send and receive (their
# Params and arguments __grid_constant__). Decode at world size 1, `--backend all`, alternately
# three times; SELF_SEND and prefill once each; ncu of both builds' 1-token combine send and
# receive (nvlink); then tests on r50: one-GPU contract, few SMs, EP2 on the shared GPU.
set -u
out=$OUT; mkdir -p $out /tmp/w/p
for v in r49 r50; do gunzip -f .devso/$v.so.gz; done
export MOE_BACKEND_DEVSO=r49 MOE_BACKEND_COMMIT=$(cat .commit)
T0=$(date +%s)
N=MOE_BACKEND_NVSHMEM
AB_BENCH_ARGS="--world-size 1 --backend all" timeout 260 bash scripts/gpu_ab_bench.sh /tmp/w/ab deepseek_decode \
  MOE_BACKEND_DEVSO=r49 MOE_BACKEND_DEVSO=r50 MOE_BACKEND_DEVSO=r49 MOE_BACKEND_DEVSO=r50 \
  MOE_BACKEND_DEVSO=r49 MOE_BACKEND_DEVSO=r50 > /dev/null 2>&1
echo "ab rc $? at $(( $(date +%s) - T0 )) s"; grep -v reference /tmp/w/ab/ab.txt
AB_BENCH_ARGS="--world-size 1" timeout 100 bash scripts/gpu_ab_bench.sh /tmp/w/ab_ss deepseek_decode \
  MOE_BACKEND_DEVSO=r49,${N}_SELF_SEND=1 MOE_BACKEND_DEVSO=r50,${N}_SELF_SEND=1 > /dev/null 2>&1
AB_BENCH_ARGS="--world-size 1" timeout 100 bash scripts/gpu_ab_bench.sh /tmp/w/ab_prefill deepseek_prefill \
  MOE_BACKEND_DEVSO=r49 MOE_BACKEND_DEVSO=r50 > /dev/null 2>&1
echo "ab2 at $(( $(date +%s) - T0 )) s"; cat /tmp/w/ab_ss/ab.txt /tmp/w/ab_prefill/ab.txt
source scripts/gpu_env.sh > /dev/null 2>&1
for v in r49 r50; do
MOE_BACKEND_DEVSO=$v source scripts/gpu_devso.sh
for k in combine_send combine_recv; do
  timeout 45 ncu --section WarpStateStats --section SourceCounters --cache-control none --clock-control none \
    -k regex:${k}_kernel --launch-skip 5 --launch-count 1 -o /tmp/w/${k}_$v \
    python3 -m moe_backend.cli bench --config deepseek_decode --backend nvshmem --world-size 1 --iters 5 --num-tokens 1 > /tmp/w/${k}_$v.log 2>&1
  ncu -i /tmp/w/${k}_$v.ncu-rep --page source --csv --print-source sass 2>/dev/null | gzip > /tmp/w/p/${k}1_${v}_sass.csv.gz
  echo "$v $k 1 token"
  python3 scripts/ncu_groups.py /tmp/w/p/${k}1_${v}_sass.csv.gz --runs --top 8 --groups 0 > /tmp/w/p/${k}1_$v.txt
  grep -E "code run|stall_no_inst|stall_imc|^ +[0-9]+ \(" /tmp/w/p/${k}1_$v.txt | head -9
done
done
echo "ncu done at $(( $(date +%s) - T0 )) s"
(cd /tmp/w && tar czf $out/ab.tgz ab ab_ss ab_prefill p)
MOE_BACKEND_DEVSO=r50 source scripts/gpu_devso.sh
F=tests/gpu/test_nvshmem_single.py
timeout 200 python3 -m pytest -q -m gpu -rA "$F::test_contract_on_one_gpu[overlap]" "$F::test_contract_on_one_gpu[self-send]" \
  "$F::test_contract_on_one_gpu[pdl-combine]" "$F::test_contract_on_one_gpu[untagged]" "$F::test_contract_with_few_sms_on_one_gpu" > $out/tests.log 2>&1
echo "pytest one-GPU (r50) rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" $out/tests.log | tail -6
MOE_TEST_SHARED_GPU=1 MOE_TEST_WORLD=2 timeout 60 python3 -m pytest -q -m gpu tests/gpu/test_nvshmem.py -rA \
  -k "both_transports" > $out/tests_ep2.log 2>&1
echo "pytest EP2 shared (r50) rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" $out/tests_ep2.log | tail -4
