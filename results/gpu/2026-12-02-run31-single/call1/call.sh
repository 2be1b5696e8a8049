#!/bin/bash
# Run 31, call 1: round 41 on one H200: COPY_META (the copy writes the rows' metadata, the plan
# only the row map) and TABLE_PORTION_BYTES=4096 (64 table portions of one vector pair a thread):
# the prefill A/B at world size 1 (own tokens, and under SELF_SEND), then their one-GPU tests
# (contract with bulk and register copies, rounds and graphs).
set -u
out=$OUT; mkdir -p $out /tmp/w
N=MOE_BACKEND_NVSHMEM
MOE_BACKEND_DEVSO=plain source scripts/gpu_env.sh > /tmp/w/env.log 2>&1
echo "commit $(cat .commit) devso_loaded=${devso_loaded:-?}"; nvidia-smi -L
T0=$(date +%s)
C=${N}_COPY_META=1
P=${N}_TABLE_PORTION_BYTES=4096
S=${N}_SELF_SEND=1
AB_BENCH_ARGS="--world-size 1" timeout 250 scripts/gpu_ab_bench.sh /tmp/w/ab deepseek_prefill base $C $P base $C $P $S $S,$C $S,$P > /dev/null 2>&1
cp /tmp/w/ab/ab.txt $out/ab_prefill.txt; cat $out/ab_prefill.txt
(cd /tmp/w/ab && tar czf $out/bench_json.tgz *.json)
grep -il "error\|Traceback" /tmp/w/ab/*.log | head -3
echo "benches done at $(( $(date +%s) - T0 )) s"
for k in "contract_on_one_gpu and copy-meta" "rounds_and_graphs and copy-meta"; do
  timeout 150 python3 -m pytest -q -m gpu tests/gpu/test_nvshmem_single.py -rA -k "$k" >> $out/tests.log 2>&1
  echo "pytest -k '$k': rc $? at $(( $(date +%s) - T0 )) s" | tee -a $out/tests.log
done
grep -E "PASSED|FAILED|ERROR|passed|failed" $out/tests.log | tail -12
echo "all done at $(( $(date +%s) - T0 )) s"
