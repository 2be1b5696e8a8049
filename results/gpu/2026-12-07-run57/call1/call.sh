#!/bin/bash
# Session 63, one GPU; carry `.commit .devso/pad45.so.gz` (main's kernels).
# The warm penalty's third control (1ap). Run 56 call 2: `--warm-by launch` (a 16-byte reduction for
# each input before the sleep, inputs cold) costs the small whole contiguous ops what reading the
# inputs does, so the touching kernels cost it, not the memory they sweep. `--warm-by fill` runs as
# many kernels filling 16 bytes (no reduction, no output tensor from the allocator): as cold -> the
# reduction (its code, its allocation) costs it; as launch -> any kernel before the sleep does.
# Run 55 call 2's script (the decode bench, SELF_SEND=1, at 1 / 8 / 32 tokens) with these modes.
MODES="cold launch fill cold2" exec bash results/gpu/2026-12-07-run55/call2/call.sh
