"""Session 47's diagnosis of run 44 call 6 / run 45 call 1's compiled decode step (one GPU): which
part of `_StaticStep.run` differs under torch.compile. Run from the repository root."""
import sys
import time

import torch

sys.path[:0] = ["tests/gpu", "tests"]
import _workers  # noqa: E402

from moe_backend import launch  # noqa: E402
from moe_backend.testing import ROUTINGS, Case, bitwise_equal, expert_fn, oracle_combine  # noqa: E402


def same(a: torch.Tensor, b: torch.Tensor, n: int) -> bool:
    return bitwise_equal(a[:n].cpu(), b[:n].cpu())


def combine_diff(step, out: torch.Tensor, groups) -> str:
    """Which output rows differ from the oracle's, and whether they are zero (never written)."""
    want = oracle_combine(step.spec, groups, step.rank // step.spec.tp_size, True)
    got = out[: want.shape[0]].cpu()
    bad = (got.view(torch.int16) != want.view(torch.int16)).any(dim=1).nonzero().flatten()
    if bad.numel() == 0:
        return "combine rows all equal"
    zero = int((got[bad] == 0).all(dim=1).sum())
    return (f"{bad.numel()} of {want.shape[0]} rows differ (first {bad[:8].tolist()}), {zero} of them all zero, "
            f"max abs diff {float((got[bad].float() - want[bad].float()).abs().max()):.3g}")


def report(label: str, step, res, out: torch.Tensor, groups, case: Case) -> None:
    """Whether a step's results match the oracle; if not, which combine rows differ."""
    try:
        step.check(res, out, groups, case)
        print(f"  {label}: matches the oracle", flush=True)
    except AssertionError as err:
        print(f"  {label}: FAILS {err}; {combine_diff(step, out, groups)}", flush=True)


def expert_part(res, rank: int, L: int):
    """`_StaticStep.run`'s part between dispatch and combine."""
    rows = torch.arange(res.tokens.shape[0], device=res.tokens.device)
    local = torch.searchsorted(res.expert_offsets[1:], rows, right=True).clamp(max=L - 1)
    return expert_fn(res.tokens, local + rank * L, torch.bfloat16), local


def worker(seed: int) -> None:
    # A plain-torch check first: searchsorted over a slice with a storage offset, compiled.
    base = torch.arange(0, 400, 7, device="cuda")
    seq, q = base[3:12], torch.arange(0, 100, device="cuda")
    f = lambda s, r: torch.searchsorted(s[1:], r, right=True)  # noqa: E731
    print("searchsorted on an offset slice, compiled == eager:", same(f(seq, q), torch.compile(f)(seq, q), 100),
          "| on a clone:", same(f(seq.clone(), q), torch.compile(f)(seq.clone(), q), 100), flush=True)
    for transport in ("nvlink", "put"):
        step = _workers._StaticStep(transport, 32, check_inputs=False)
        L = step.spec.num_local_experts

        compiled_part = torch.compile(expert_part)
        for i in range(1):  # the first call is the one that differed
            case = Case(step.spec, ROUTINGS[i % 4], seed + 100 + i, True, "tensor")
            groups = step.load(case)
            res = step.comm.dispatch(step.x, step.ids, step.w, None, step.n)
            total = int(res.tokens_per_expert.sum())
            off = res.expert_offsets
            print(f"{transport} case {i}: expert_offsets storage_offset {off.storage_offset()} "
                  f"stride {off.stride()} dtype {off.dtype}; tokens storage_offset {res.tokens.storage_offset()}",
                  flush=True)
            ye, le = expert_part(res, step.rank, L)
            yc, lc = compiled_part(res, step.rank, L)
            print(f"  local same {same(le, lc, total)}, y same {same(ye, yc, total)}", flush=True)
            out = step.comm.combine(ye, res.handle, weights=res.weights)
            torch.cuda.synchronize()
            # Bisect the compiler: dynamo alone, dynamo + AOT autograd, then inductor.
            runs = [("eager y", None)] + [(f"compiled run ({b})", torch.compile(step.run, backend=b))
                                          for b in ("eager", "aot_eager", "inductor")]
            for label, run in runs:
                if run is not None:
                    res, out = run()
                    torch.cuda.synchronize()
                report(label, step, res, out, groups, case)
        # If eager y above failed: is it the gap (the compile's seconds) between dispatch and
        # combine, with no compiler involved? The same eager step, sleeping 5 s in the middle.
        case = Case(step.spec, ROUTINGS[1], seed + 200, True, "tensor")
        groups = step.load(case)
        res = step.comm.dispatch(step.x, step.ids, step.w, None, step.n)
        time.sleep(5)
        y, _ = expert_part(res, step.rank, L)
        out = step.comm.combine(y, res.handle, weights=res.weights)
        torch.cuda.synchronize()
        report("eager with a 5 s gap", step, res, out, groups, case)
        step.comm.close()


if __name__ == "__main__":  # inductor's compile workers re-import this module
    launch.spawn(worker, 1, 422002274, dist_backend="nccl", timeout=300)
