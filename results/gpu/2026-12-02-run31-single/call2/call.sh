#!/bin/bash
# Run 31, call 2: round 41's COPY_META and 4 KB table portions at EP2 with both ranks on the one
# GPU (the plan-and-copy contract, rounds and replays), ncu of the send kernel alone, then the
# prefill timeline (stamps build): defaults, COPY_META=1, TABLE_PORTION_BYTES=4096.
set -u
out=$OUT; mkdir -p $out /tmp/w
N=MOE_BACKEND_NVSHMEM
MOE_BACKEND_DEVSO=plain source scripts/gpu_env.sh > /tmp/w/env.log 2>&1
echo "commit $(cat .commit) devso_loaded=${devso_loaded:-?}"
T0=$(date +%s)
env ${N}_COPY_META=1 ${N}_TABLE_PORTION_BYTES=4096 MOE_TEST_SHARED_GPU=1 MOE_TEST_WORLD=2 timeout 160 python3 -m pytest -q -m gpu tests/gpu/test_nvshmem.py -rA -k "without_direct_receive" > $out/tests_ep2_shared.log 2>&1
echo "ep2 shared rc $? at $(( $(date +%s) - T0 )) s"; grep -E "passed|failed|PASSED|FAILED|ERROR" $out/tests_ep2_shared.log | tail -6
# ncu of the send kernel alone at prefill (world size 1 it writes only the table): the ~7 us
# the timeline gives the table before the plan sees it.
timeout 90 ncu --section SourceCounters --section WarpStateStats --section SpeedOfLight --section LaunchStats --import-source yes \
  -k regex:dispatch_send_kernel --launch-skip 5 --launch-count 1 --clock-control none -o /tmp/w/send \
  python3 -m moe_backend.cli bench --config deepseek_prefill --backend nvshmem --world-size 1 --iters 5 > /tmp/w/ncu.log 2>&1
echo "ncu rc $? at $(( $(date +%s) - T0 )) s"; tail -2 /tmp/w/ncu.log
ncu -i /tmp/w/send.ncu-rep --page details > $out/send_details.txt 2>&1
ncu -i /tmp/w/send.ncu-rep --page source --csv --print-source sass 2>&1 | gzip > $out/send_sass.csv.gz
grep -E "Duration|Warp Cycles Per Issued|Block Size|Grid Size" $out/send_details.txt
MOE_BACKEND_DEVSO=stamps source scripts/gpu_devso.sh; echo "stamps devso_loaded=$devso_loaded"
for v in ${N}_COPY_META=0 ${N}_COPY_META=1 ${N}_TABLE_PORTION_BYTES=4096; do
  env $v timeout 80 python3 scripts/kernel_timeline.py --config deepseek_prefill --world-size 1 --iters 40 >> $out/stamps.txt 2>&1
done
grep -E "events|dispatch\.(send|plan|copy)" $out/stamps.txt
timeout 120 python3 -m pytest -q -m gpu tests/gpu/test_nvshmem_single.py -rA -k "contract_on_one_gpu and copy-meta-register" > $out/tests_register.log 2>&1; echo "register rc $?"; tail -2 $out/tests_register.log
echo "all done at $(( $(date +%s) - T0 )) s"
