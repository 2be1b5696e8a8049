#!/usr/bin/env python3
"""What one dependent step of the kernels' chains costs on this GPU (benchmark only).

The prefill dispatch's plan and the send's table are chains of a few dependent steps (a load
round, a block barrier, a store and its system-scope release); in their timelines each step
takes ~3 us whatever it holds (docs/PERF_NOTES.md, rounds 39-41). This times each kind of step
alone: `blocks` blocks of 128 threads each run `--reps` steps of one kind one after another
(torch.ops.moe_backend.step_cost), and report the ns per step (median over blocks, then over
`--trials` launches), for 1 block, 32 blocks (the send's table portions) and one block per SM.

Steps: timer (the loop alone), l2_load / hbm_load (a load whose address is the previous load's
value, over lines that stay in L2 / over lines spread past the L2, each trial on fresh lines:
one block only), acquire_load (the same in L2 by ld.acquire.sys, the polls' load), store +
fence.sc.sys / fence.sc.gpu, release store (sys), release add (sys, the table's announce), atomic
chain, block barrier, and portion (every thread stores 64 B, barrier, a release add, barrier:
one 8 KB table portion without its loads). code_first_pass / code_again: ns per instruction of
~32 KB of straight-line dependent multiply-adds on their first pass through an SM (instruction
fetches included) and on later passes (warm). jumps_*: ns per step of branchy code, each step a
taken branch over ~1 KB of code it does not run: first pass, warm, and first pass after ~256 KB of
other code ran on every SM (code_evict, its ns per instruction), which evicts the SMs' instruction
caches (jumps_cold_sm, code_cold_sm), or after an L2 flush too (jumps_cold_l2); and after the
evictor, jumps over 64 B, 256 B and 4 KB instead of 1 KB (jumps_64b_cold_sm, ...).

    python3 scripts/step_costs.py [--device 0] [--reps 256] [--trials 9] [--out costs.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from moe_backend.bench import machine_info, stats  # noqa: E402  (after the repository is on the path)

# Step name -> the kernel's StepKind (csrc/probes.cuh).
KINDS = {"timer": 0, "l2_load": 1, "hbm_load": 1, "acquire_load": 2, "store_fence_sys": 3, "store_fence_gpu": 4,
         "release_store_sys": 5, "release_add_sys": 6, "atomic_chain": 7, "block_barrier": 8, "portion": 9,
         "code_first_pass": 10, "code_again": 11, "code_cold_sm": 10, "jumps_first_pass": 12,
         "jumps_cold_sm": 12, "jumps_cold_l2": 12, "jumps_again": 13, "code_evict": 14,
         "jumps_64b_cold_sm": 15, "jumps_256b_cold_sm": 16, "jumps_4kb_cold_sm": 17}
EVICT = 14  # StepKind STEP_CODE_EVICT: ~256 KB of code of its own, run on every SM
# Steps whose every launch follows the evictor on every SM ("sm"), or an L2 flush and then the
# evictor ("l2"): their first pass fetches the probe's code from the L2 / from memory.
COLD = {"code_cold_sm": "sm", "jumps_cold_sm": "sm", "jumps_cold_l2": "l2", "jumps_64b_cold_sm": "sm",
        "jumps_256b_cold_sm": "sm", "jumps_4kb_cold_sm": "sm"}
BLOCK_WORDS = 16 + 128 * 8  # STEP_BLOCK_WORDS: each block's own int64 words after the chain
LINE_WORDS = 16  # 128-byte lines
L2_NODES = 64  # an 8 KB cycle of lines: always in L2 after the first pass
HBM_SPACING = 1 << 13  # 64 KB between the memory chain's lines (past any cache's set locality)


def chain_layout(nodes: int, spacing: int, starts: list[int], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A load chain: `nodes` lines `spacing` int64 words apart (after a header of one start index
    per block, padded to a line) in one random cycle. Returns the words (each line's first word
    holds the next line's index; header word b the index of the line at position starts[b] of the
    cycle) and the lines' indices in visiting order."""
    if nodes < 2 or spacing < 1 or not starts:
        raise ValueError("chain_layout: nodes >= 2, spacing >= 1 and at least one start")
    head = -(-len(starts) // LINE_WORDS) * LINE_WORDS
    order = torch.randperm(nodes, generator=torch.Generator().manual_seed(seed))
    index = head + order * spacing  # the cycle's lines in visiting order
    words = torch.zeros(head + nodes * spacing, dtype=torch.int64)
    words[index] = torch.roll(index, -1)  # each line holds the next line's index
    words[: len(starts)] = index[torch.tensor(starts) % nodes]
    return words, index


def measure(device: torch.device, reps: int, trials: int, block_counts: list[int]) -> dict[str, dict[str, dict]]:
    """{step: {blocks: p10/median/p90 ns per step}} (per trial the median over blocks)."""
    from moe_backend.backends import nvshmem_runtime as rt

    op = rt.ops().step_cost.default
    flush = torch.empty(1 << 26, dtype=torch.int32, device=device)  # 256 MB: writing it evicts the L2
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    evict_scratch = torch.zeros(sms * BLOCK_WORDS, dtype=torch.int64, device=device)
    evict_out = torch.zeros(sms, dtype=torch.float64, device=device)
    out: dict[str, dict[str, dict]] = {}
    for name, kind in KINDS.items():
        counts = [1] if name == "hbm_load" else block_counts
        out[name] = {}
        for blocks in counts:
            if name == "hbm_load":  # trial t walks positions [t * reps, (t + 1) * reps) of the cycle
                chain, order = chain_layout(reps * (trials + 1) + 1, HBM_SPACING, [0], seed=1)
            elif name in ("l2_load", "acquire_load"):
                chain, order = chain_layout(L2_NODES, LINE_WORDS, list(range(blocks)), seed=2)
            else:
                chain = torch.zeros(0, dtype=torch.int64)
            words = chain.numel()
            scratch = torch.zeros(words + (words & 1) + blocks * BLOCK_WORDS, dtype=torch.int64, device=device)
            scratch[:words] = chain.to(device)
            res = torch.zeros(blocks, dtype=torch.float64, device=device)
            per_trial = []
            for trial in range(trials + 1):  # the first launch warms the code (and the L2 chains' lines)
                if name == "hbm_load":
                    scratch[0] = int(order[trial * reps])
                    flush.zero_()
                if name in COLD:
                    if COLD[name] == "l2":
                        flush.zero_()
                    op(evict_scratch, 0, evict_out, EVICT, 1, sms)
                op(scratch, words, res, kind, reps, blocks)
                torch.cuda.synchronize(device)
                if trial > 0:
                    per_trial.append(statistics.median(res.tolist()))
            out[name][str(blocks)] = stats(per_trial)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--reps", type=int, default=256, help="steps per block per launch")
    ap.add_argument("--trials", type=int, default=9, help="timed launches per step and block count")
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args(argv)
    if args.reps < 1 or args.trials < 1:
        ap.error("--reps and --trials must be >= 1")
    if not torch.cuda.is_available():
        print("step_costs: no CUDA device", file=sys.stderr)
        return 2
    dev = torch.device("cuda", args.device)
    torch.cuda.set_device(dev)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    res = measure(dev, args.reps, args.trials, [1, 32, sms])
    name = torch.cuda.get_device_name(dev)
    print(f"ns per step (median over {args.trials} launches of the median over blocks), {name}")
    for step, by_blocks in res.items():
        print(f"  {step:<18}" + "".join(f"  {b:>3} blocks {s['median']:8.0f}" for b, s in by_blocks.items()))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"machine": machine_info(), "device": name, "reps": args.reps, "trials": args.trials,
                       "ns_per_step": res}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
