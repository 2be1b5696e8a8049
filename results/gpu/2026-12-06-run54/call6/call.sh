#!/bin/bash
# Session 61: run 54 call 6, half 2 of the one-GPU test file on `pad39` (call 5 is half 1); carry
# `.commit .devso/pad39.so.gz`. The same steps as call 5's script (it ran as a copy of it with
# half 2 as its default).
SHARD=2/2 exec bash results/gpu/2026-12-06-run54/call5/call.sh
