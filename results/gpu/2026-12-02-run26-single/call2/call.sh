#!/bin/bash
# Device call 2 (ce7412f): prebuilt extension (torch 2.11, .devso/): timelines with ITEM_SPREAD on/off, table-block A/B.
set -u
out=$OUT; mkdir -p $out /tmp/w
N=MOE_BACKEND_NVSHMEM
SO=moe_backend/_C.cpython-312-x86_64-linux-gnu.so
NVLIB=$(python3 -c "import nvidia,os;print([os.path.join(p,'nvshmem','lib') for p in nvidia.__path__ if os.path.isdir(os.path.join(p,'nvshmem','lib'))][0])")
export LD_LIBRARY_PATH=$NVLIB:${LD_LIBRARY_PATH:-}
cp .devso/stamps.so $SO
python3 -c "import torch, moe_backend._C" 2>/dev/null || { echo "PREBUILT FAILED: building"; rm -f $SO; }
source scripts/gpu_env.sh > /tmp/w/env.log 2>&1
for v in 1 0; do
  env ${N}_ITEM_SPREAD=$v timeout 150 python3 scripts/kernel_timeline.py --world-size 1 --tokens 1 32 128 --iters 200 --out /tmp/w/tl$v.json > $out/timeline_spread$v.log 2>&1
done
cp .devso/plain.so $SO
AB_BENCH_ARGS="--world-size 1" scripts/gpu_ab_bench.sh /tmp/w/ab deepseek_decode ${N}_DIRECT_TABLE_BLOCKS=1 base ${N}_DIRECT_TABLE_BLOCKS=4 ${N}_DIRECT_TABLE_BLOCKS=1 base ${N}_DIRECT_TABLE_BLOCKS=4 > /dev/null 2>&1
cp /tmp/w/ab/ab.txt $out/ab_table_blocks.txt
