#!/bin/bash
# Run 42, call 1 (one H200; prepared in run 41): why round 48's __grid_constant__
# parameters cost the fused combine 19 us (docs/PERF_NOTES.md, round 56). Build here first:
#   scripts/build_device_extension.sh fromx && scripts/build_device_extension.sh gcfused MOE_BACKEND_FUSED_GRID_CONSTANT=1
#   gzip -f .devso/*.so; git rev-parse --short HEAD > .commit; cp results/gpu/2026-12-04-run42-single/call1/call.sh call.sh
# and run `bash call.sh` carrying .commit and .devso. Prefill at world size 1, fused combine forced:
# both builds timed alternately and compared (`moe-backend compare`), then `ncu` of one fused
# kernel launch of each (speed of light, warp states, source counters, instruction and L1/icache
# stats) with the details page and scripts/ncu_groups.py's loop groups and stretches; then the
# fused combine below its threshold at world size 1 (default against COMBINE_FUSED=1).
set -u
raw=$OUT/raw; mkdir -p $raw /tmp/w
for f in .devso/*.so.gz; do gunzip -f $f; done
export MOE_BACKEND_DEVSO=fromx MOE_BACKEND_COMMIT=$(cat .commit) MOE_BACKEND_NVSHMEM_BOOTSTRAP=native
export MOE_BACKEND_NVSHMEM_COMBINE_FUSED=1
T0=$(date +%s)
source scripts/gpu_env.sh > /dev/null 2>&1
so=moe_backend/_C.cpython-312-x86_64-linux-gnu.so
# Both builds alternately twice by the A/B script (a variant naming a carried build runs on it).
AB_BENCH_ARGS="--world-size 1 --iters 100" timeout 200 bash scripts/gpu_ab_bench.sh $raw/ab deepseek_prefill \
  MOE_BACKEND_DEVSO=fromx MOE_BACKEND_DEVSO=gcfused MOE_BACKEND_DEVSO=fromx MOE_BACKEND_DEVSO=gcfused > $raw/ab.log 2>&1
echo "ab rc $? at $(( $(date +%s) - T0 )) s"; cat $raw/ab/ab.txt
python3 -m moe_backend.cli compare $raw/ab/bench_1_MOE_BACKEND_DEVSO_fromx.json $raw/ab/bench_2_MOE_BACKEND_DEVSO_gcfused.json \
  --phases combine combine_recv | tee $raw/compare.txt
tar czf $OUT/call.tgz -C $raw .
for b in fromx gcfused; do
  cp .devso/$b.so $so
  timeout 120 ncu --section SpeedOfLight --section WarpStateStats --section SourceCounters --section InstructionStats \
    --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis --import-source yes \
    -k regex:combine_fused_kernel --launch-skip 4 --launch-count 1 --clock-control none -o /tmp/w/$b \
    python3 -m moe_backend.cli bench --config deepseek_prefill --backend nvshmem --world-size 1 --iters 5 --warmup 2 \
    > $raw/ncu_$b.log 2>&1
  echo "ncu $b rc $? at $(( $(date +%s) - T0 )) s"
  ncu -i /tmp/w/$b.ncu-rep --page details > $raw/details_$b.txt 2>&1
  ncu -i /tmp/w/$b.ncu-rep --page source --csv --print-source sass 2>/dev/null | gzip > $raw/${b}_sass.csv.gz
  python3 scripts/ncu_groups.py $raw/${b}_sass.csv.gz --runs --top 12 > $raw/groups_$b.txt 2>&1
  grep -E "Duration|Issue Slots Busy|No Instruction|Stall|L1/TEX Hit|Registers Per|Achieved Occupancy" $raw/details_$b.txt | head -30
done
# The fused combine below its threshold at world size 1 (arenas of 2048 and 4096 tokens, the
# two-kernel combine's by default): default against COMBINE_FUSED=1, alternately twice, main's build.
cp .devso/fromx.so $so
env -u MOE_BACKEND_NVSHMEM_COMBINE_FUSED AB_BENCH_ARGS="--world-size 1 --num-tokens 2048 4096" timeout 200 \
  bash scripts/gpu_ab_bench.sh $raw/ab_fused_each results/gpu/2026-12-04-run40-x2/call2/prefill_each.yaml \
  base MOE_BACKEND_NVSHMEM_COMBINE_FUSED=1 base MOE_BACKEND_NVSHMEM_COMBINE_FUSED=1 > $raw/ab_fused_each.log 2>&1
echo "ab fused per arena rc $? at $(( $(date +%s) - T0 )) s"; cat $raw/ab_fused_each/ab.txt
tar czf $OUT/call.tgz -C $raw .
