#!/bin/bash
# Session 62 (prepared), one GPU; carry `.commit .devso/pad45.so.gz` (main's kernels).
# The warm penalty's second control. Run 55 call 2: `--warm-by scratch` (the touching reads on a
# scratch buffer of each input's size, the inputs cold) is as slow as warm, so the touching kernels
# cost the small whole contiguous ops their ~1 us, not the inputs' warmth. `--warm-by launch` runs
# the same reads on 16 bytes each: as cold -> the memory the reads sweep costs it (what it evicts or
# the translations it refills); as scratch -> the kernels themselves do.
# Run 55 call 2's script (the decode bench, SELF_SEND=1, at 1 / 8 / 32 tokens) with these modes.
MODES="cold scratch launch cold2" exec bash results/gpu/2026-12-07-run55/call2/call.sh
