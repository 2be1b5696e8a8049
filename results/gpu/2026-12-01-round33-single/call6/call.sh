#!/usr/bin/env bash
export out=/tmp/call6; mkdir -p $out
save(){ cp .commit $out/commit.txt; cp call.sh $out/; tar czf $OUT/call6.tgz -C /tmp call6; }
trap save EXIT
rm -f moe_backend/_C*.so
source scripts/gpu_env.sh > $out/build.log 2>&1
timeout 120 python3 -m pytest -x -q -m gpu tests/gpu/test_nvshmem_single.py -k "register-copy" > $out/tests.log 2>&1; echo "tests rc=$?" >> $out/tests.log
tail -3 $out/tests.log
