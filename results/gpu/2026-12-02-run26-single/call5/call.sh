#!/bin/bash
# Device call 5: prebuilt extension (torch 2.11, .devso/): the decode bench of record at world size 1,
# then the one-GPU tests not yet run on ITEM_SPREAD's kernels.
set -u
out=$OUT; mkdir -p $out /tmp/w
N=MOE_BACKEND_NVSHMEM
MOE_BACKEND_DEVSO=plain source scripts/gpu_env.sh > /tmp/w/env.log 2>&1
grep -i "does not load\|build" /tmp/w/env.log | head -3
python3 -c "import moe_backend._C, torch; print('extension loads; torch', torch.__version__)"
echo "commit $(cat .commit)"
T0=$(date +%s)
python3 -m moe_backend.cli bench --config deepseek_decode --backend all --world-size 1 --out $out/decode.json > /tmp/w/decode.log 2>&1
grep -v "Warn\|warn" /tmp/w/decode.log | tail -22 > $out/decode.txt; cat $out/decode.txt
echo "bench took $(( $(date +%s) - T0 )) s"
F=tests/gpu/test_nvshmem_single.py::
timeout 420 python3 -m pytest -v -m gpu "${F}test_contract_on_one_gpu[no-overlap]" "${F}test_contract_on_one_gpu[split-dispatch]" "${F}test_contract_on_one_gpu[register-copy]" "${F}test_rounds_and_graphs_on_one_gpu[overlap]" "${F}test_rounds_and_graphs_on_one_gpu[untagged]" "${F}test_contract_tasks_on_one_gpu" "${F}test_contract_with_few_sms_on_one_gpu" "${F}test_contract_on_one_gpu[bulk-rows]" > $out/tests.log 2>&1
grep -E "passed|failed|PASSED|FAILED" $out/tests.log | tail -12
echo "all done at $(( $(date +%s) - T0 )) s"
