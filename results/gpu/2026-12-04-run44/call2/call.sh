#!/bin/bash
# Run 44, call 2 on `nvidia-h200` (one GPU; two are not lent): round 60's correctness with both
# EP2 ranks on the one GPU (MOE_TEST_SHARED_GPU=1 MOE_TEST_WORLD=2), main's build `main44`.
# 1. The copy-engine contract suite (its third pass copies the token flags by copy engine,
#    CE_FLAG_COPY=1, no flag kernel).
# 2. The work-between test with every send by copy engine, flags copied (CE_SEND=1 CE_FLAG_COPY=1).
# 3. The fused-combine, tagged-partials and few-SM suites under CE_FLAG_COPY=1 (the dispatch's
#    flags from the copy engines, the rest of the op unchanged).
set -u
source scripts/gpu_call.sh main44
export MOE_TEST_SHARED_GPU=1 MOE_TEST_WORLD=2
step "CE tests" tests_ce.log 150 python3 -m pytest -q -m gpu -rA tests/gpu/test_nvshmem.py -k "copy_engine_send"
step "work-between, CE send, flags copied" tests_wb.log 120 env ${N}_CE_SEND=1 ${N}_CE_FLAG_COPY=1 \
  python3 -m pytest -q -m gpu -rA tests/gpu/test_nvshmem.py -k "work_between"
step "suites, flags copied" tests_flagcopy.log 200 env ${N}_CE_FLAG_COPY=1 python3 -m pytest -q -m gpu -rA \
  tests/gpu/test_nvshmem.py -k "tagged_partials or fused_combine or few_sms"
