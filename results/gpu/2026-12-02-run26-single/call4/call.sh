#!/bin/bash
# Device call 4: prebuilt extension (torch 2.11, .devso/): PARAM_WARM, COMB_LATE_W and POLL_ISSUE A/B, timelines, tests with all on.
set -u
out=$OUT; mkdir -p $out /tmp/w
N=MOE_BACKEND_NVSHMEM
SO=moe_backend/_C.cpython-312-x86_64-linux-gnu.so
NVLIB=$(python3 -c "import nvidia,os;print([os.path.join(p,'nvshmem','lib') for p in nvidia.__path__ if os.path.isdir(os.path.join(p,'nvshmem','lib'))][0])")
export LD_LIBRARY_PATH=$NVLIB:${LD_LIBRARY_PATH:-}
cp .devso/plain.so $SO
python3 -c "import torch, moe_backend._C" 2>/dev/null || { echo "PREBUILT FAILED: building"; rm -f $SO; }
source scripts/gpu_env.sh > /tmp/w/env.log 2>&1
echo "commit $(cat .commit)"
T0=$(date +%s)
AB_BENCH_ARGS="--world-size 1" scripts/gpu_ab_bench.sh /tmp/w/ab deepseek_decode base ${N}_PARAM_WARM=1 ${N}_COMB_LATE_W=1 ${N}_POLL_ISSUE=1 base ${N}_PARAM_WARM=1 ${N}_COMB_LATE_W=1 ${N}_POLL_ISSUE=1 > /dev/null 2>&1
cp /tmp/w/ab/ab.txt $out/ab.txt; cat $out/ab.txt; echo "ab took $(( $(date +%s) - T0 )) s"
cp .devso/stamps.so $SO
for v in base ${N}_PARAM_WARM=1 ${N}_COMB_LATE_W=1 ${N}_POLL_ISSUE=1; do
  e=(); [ $v = base ] || e=($v)
  echo "#### $v" >> $out/timelines.log
  env "${e[@]}" timeout 150 python3 scripts/kernel_timeline.py --world-size 1 --tokens 1 128 --iters 200 >> $out/timelines.log 2>&1
done
grep -v Warn $out/timelines.log | grep "####\|events\|table\|send_\|recv_start\|waited\|barrier\|rows_exit\|copied\|copy_exit\|==\|combine\." | grep -v "plan_entry\|plan_last\|plan_exit\|copy_entry\|copy_last\|send_exit  \|send_entry\|send_last"
echo "timelines done at $(( $(date +%s) - T0 )) s"
cp .devso/plain.so $SO
F=tests/gpu/test_nvshmem_single.py::
env ${N}_PARAM_WARM=1 ${N}_COMB_LATE_W=1 ${N}_POLL_ISSUE=1 timeout 200 python3 -m pytest -q -m gpu "${F}test_contract_on_one_gpu[overlap]" "${F}test_rounds_and_graphs_on_one_gpu[overlap]" > $out/tests_warm_late.log 2>&1
tail -3 $out/tests_warm_late.log
echo "all done at $(( $(date +%s) - T0 )) s"
