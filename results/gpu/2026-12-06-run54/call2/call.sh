#!/bin/bash
# Session 61: run 54 call 2, run 52 call 9's script run again, cold this time (run 52 call 9 ran
# both sides warm: the default-warm bug); carry `.commit .devso/pad32.so.gz`. It ran as a copy of
# that script; the steps are the same.
exec bash results/gpu/2026-12-06-run52/call9/call.sh
