#!/bin/bash
# Device call 1 (ce7412f): prebuilt extension (torch 2.11, .devso/), decode A/B of ITEM_SPREAD, one-GPU tests.
# (Its timeline step, `${N}_ITEM_SPREAD=$v python3 scripts/kernel_timeline.py ...`, failed: a
# variable name built by expansion is no assignment; call 2 ran the timelines with `env`.)
set -u
out=$OUT; mkdir -p $out /tmp/w
N=MOE_BACKEND_NVSHMEM
SO=moe_backend/_C.cpython-312-x86_64-linux-gnu.so
NVLIB=$(python3 -c "import nvidia,os;print([os.path.join(p,'nvshmem','lib') for p in nvidia.__path__ if os.path.isdir(os.path.join(p,'nvshmem','lib'))][0])")
export LD_LIBRARY_PATH=$NVLIB:${LD_LIBRARY_PATH:-}
cp .devso/plain.so $SO
python3 -c "import torch, moe_backend._C" 2>/dev/null || { echo "PREBUILT FAILED: building"; rm -f $SO; }
source scripts/gpu_env.sh > /tmp/w/env.log 2>&1
AB_BENCH_ARGS="--world-size 1" scripts/gpu_ab_bench.sh /tmp/w/ab deepseek_decode base ${N}_ITEM_SPREAD=0 base ${N}_ITEM_SPREAD=0 > /dev/null 2>&1
cp /tmp/w/ab/ab.txt $out/ab.txt
F=tests/gpu/test_nvshmem_single.py::
timeout 330 python3 -m pytest -q -m gpu "${F}test_contract_on_one_gpu[overlap]" "${F}test_contract_on_one_gpu[untagged]" "${F}test_contract_on_one_gpu[pdl-combine]" "${F}test_rounds_and_graphs_on_one_gpu[pdl-combine]" > $out/tests.log 2>&1
