#!/bin/bash
# Run 31, call 4: call 3 without the SASS-level sections (no instrumented code): is the pre-copy chain's time cold caches? ncu duration (and stall shares) of the
# prefill send (table only) and plan kernels, and of the 1-token decode fused dispatch, with
# ncu's cache flush before each kernel (--cache-control all, its default) and without (none:
# the caches as the bench loop left them), world size 1.
set -u
out=$OUT; mkdir -p $out /tmp/w
MOE_BACKEND_DEVSO=plain source scripts/gpu_env.sh > /tmp/w/env.log 2>&1
echo "commit $(cat .commit) devso_loaded=${devso_loaded:-?}"
T0=$(date +%s)
prof() {  # name kernel-regex config tokens cache
  timeout 80 ncu --section SpeedOfLight --section LaunchStats \
    --cache-control $5 -k regex:$2 --launch-skip 5 --launch-count 1 --clock-control none -o /tmp/w/$1_plain \
    python3 -m moe_backend.cli bench --config $3 --backend nvshmem --world-size 1 --iters 5 $4 > /tmp/w/$1.log 2>&1
  echo "$1 rc $? at $(( $(date +%s) - T0 )) s"
  ncu -i /tmp/w/$1_plain.ncu-rep --page details > $out/$1_sol.txt 2>&1

  grep -E "^    Duration" $out/$1_sol.txt
}
for c in all none; do
  prof send_$c dispatch_send_kernel deepseek_prefill "" $c
  prof plan_$c dispatch_recv_kernel deepseek_prefill "" $c
  prof fused1_$c dispatch_fused_kernel deepseek_decode "--num-tokens 1" $c
done

echo "all done at $(( $(date +%s) - T0 )) s"
