#!/bin/bash
# Device call 1 (run 27): prebuilt extensions (torch 2.11, .devso/): the SELF_SEND tests (the
# dispatch's cross-rank path on one GPU), then what the path costs at world size 1: decode A/B.
set -u
out=$OUT; mkdir -p $out /tmp/w
N=MOE_BACKEND_NVSHMEM
MOE_BACKEND_DEVSO=plain source scripts/gpu_env.sh > /tmp/w/env.log 2>&1
grep -i "does not load\|build" /tmp/w/env.log | head -3
python3 -c "import moe_backend._C, torch; print('extension loads; torch', torch.__version__)"
echo "commit $(cat .commit)"
T0=$(date +%s)
timeout 330 python3 -m pytest -v -m gpu tests/gpu/test_nvshmem_single.py -k "self_send or self-send" > $out/tests.log 2>&1
grep -E "passed|failed|PASSED|FAILED|Error" $out/tests.log | tail -12
echo "tests took $(( $(date +%s) - T0 )) s"
AB_BENCH_ARGS="--world-size 1" scripts/gpu_ab_bench.sh /tmp/w/ab deepseek_decode base ${N}_SELF_SEND=1 base ${N}_SELF_SEND=1 > /dev/null 2>&1
cp /tmp/w/ab/ab.txt $out/ab_decode.txt; cat $out/ab_decode.txt
echo "all done at $(( $(date +%s) - T0 )) s"
