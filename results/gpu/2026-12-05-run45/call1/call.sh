#!/bin/bash
# Session 47, one H200 (`nvidia-h200`), builds `main46` (main's kernels) and `stamps47` (the same
# with the timeline stamps); carry `.commit .devso`.
# 1. Why run 44 call 6's compiled decode step differed: the test's stand-in expert took a float
#    remainder (`g.float() % 7`); compare inductor's GPU code for it with eager's, and the integer
#    remainder the stand-in now takes. Then the compiled-step test again.
# 2. Round 64 gained nothing (64 tokens 32.2 us either way): the overlap row's GPU timeline
#    (torch.profiler) at 16, 64 and 128 tokens, default and TWO_PART_RECV=1: do the receive blocks
#    launched with the send run beside the matmul, or after its blocks drain?
# 3. The decode dispatch's kernel timeline at world size 1 (call 8's `ws1` part), and
#    examples/decode_step.py on the kernels at world size 1 (its step in a CUDA graph).
set -u
source scripts/gpu_call.sh main46
step "compiled remainder" remainder.log 120 python3 -c '
import torch
g = torch.arange(0, 4096, device="cuda")
for name, f in (("float", lambda a: a.float() % 7), ("int", lambda a: (a % 7).float())):
    e, c = f(g), torch.compile(f)(g)
    bad = (e != c).nonzero().flatten()
    print(f"{name} remainder: {bad.numel()} of {g.numel()} differ compiled; first: {g[bad[:4]].tolist()} eager {e[bad[:4]].tolist()} compiled {c[bad[:4]].tolist()}")
'
cat "$raw/remainder.log" | grep remainder
step "compile test" tests_compile.log 150 python3 -m pytest -q -m gpu -rA tests/gpu/test_nvshmem_single.py -k compiled_decode_step
for v in base TWO_PART_RECV=1; do
  e=(); [ "$v" != base ] && e=(${N}_$v)
  step "overlap timeline $v" "overlap_timeline_$v.log" 120 env "${e[@]}" python3 scripts/profile_timeline.py \
    "$raw/overlap_timeline_$v" --world-size 1 --overlap 16 64 128
  grep -v "^\s*$" "$raw/overlap_timeline_$v/timeline.txt" | head -70
done
step "timeline ws1" timeline_ws1.log 130 env MOE_BACKEND_DEVSO=stamps47 python3 scripts/kernel_timeline.py \
  --config deepseek_decode --tokens 1 32 128 --iters 200 --out "$raw/timeline_ws1.json" --world-size 1
grep -E "^==|events|_exit" "$raw/timeline_ws1.log" | head -60
step "decode example" decode_example.log 90 env WORLD_SIZE=1 python3 examples/decode_step.py
tail -2 "$raw/decode_example.log"
