"""`moe-backend train-bench`: one model, one seed, every dispatcher.

`--schedule interleaved` (default) builds one model per dispatcher up front and steps them in
turn (step 1 of each, then step 2 of each, ...), so host drift, which dominates small
host-bound configs on a shared machine, lands on all of them alike; `sequential` runs each
dispatcher's whole run in turn, one model alive at a time (less memory).

Writes `table.txt`, `bench.json` and `bench.png` (step time per dispatcher; loss curves
overlaid) into the output folder. Every dispatcher trains the same model on the same data
from the same initial weights, so their loss curves may differ only by rounding: each is
compared step by step with the first dispatcher's and must agree within `--loss-rtol`
(relative); a disagreement is reported and makes the command exit with status 3.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import statistics
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ..train_config import TrainConfig
from . import dispatchers, report
from .cli import load_with_overrides, require_output_dir, run_distributed

# Preferred order: ours first, then Megatron's; the first that ran is the loss baseline.
ORDER = ("nvshmem", "reference", "alltoall", "allgather", "flex")


def candidates(requested: list[str] | None, on_gpu: bool) -> tuple[list[str], dict[str, str]]:
    """Dispatchers to run, and the skipped ones with the reason."""
    avail = dispatchers.available(on_gpu)
    names = [n for n in ORDER if requested is None or n in requested]
    skipped = {n: avail[n] for n in names if avail.get(n)}
    return [n for n in names if n not in skipped], skipped


def _bench_body(cfg: TrainConfig, names: list[str], skipped: dict[str, str], out: str, rtol: float,
                schedule: str) -> None:
    from .cli import quiet_megatron_warnings

    quiet_megatron_warnings()
    run = _interleaved if schedule == "interleaved" else _sequential
    runs = run(cfg, names, out)
    if dist.get_rank() == 0:
        finish(cfg, runs, skipped, Path(out), rtol, schedule)


def _with_dispatcher(cfg: TrainConfig, name: str) -> TrainConfig:
    one = copy.deepcopy(cfg)
    one.dispatcher = name
    return one


def _failure(err: Exception) -> dict[str, Any]:
    return {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}


def _sequential(cfg: TrainConfig, names: list[str], out: str) -> dict[str, Any]:
    """Each dispatcher's whole run in turn (one model alive at a time)."""
    from .loop import train_rank

    rank0 = dist.get_rank() == 0
    runs: dict[str, Any] = {}
    for name in names:
        if rank0:
            report.say(f"--- dispatcher {name} ---")
        try:
            result = train_rank(_with_dispatcher(cfg, name), str(Path(out) / name), progress=True)
            if rank0 and result is not None:
                runs[name] = result
                report.say(report.summary_line(result))
        except Exception as err:  # one broken dispatcher must not hide the others' results
            if rank0:
                report.say(f"dispatcher {name} failed: {err}")
            runs[name] = _failure(err)
        dist.barrier()
    return runs


def _interleaved(cfg: TrainConfig, names: list[str], out: str) -> dict[str, Any]:
    """Every dispatcher's model built up front, then one step of each in turn, step after step:
    a host whose speed drifts during the run slows every dispatcher alike."""
    from .loop import RankTrainer, model_parallel, prepare_rank

    rank0 = dist.get_rank() == 0
    device = prepare_rank(cfg)
    runs: dict[str, Any] = {}
    with model_parallel(cfg):
        trainers: dict[str, RankTrainer] = {}
        for name in names:
            try:
                trainers[name] = RankTrainer(_with_dispatcher(cfg, name), device, show=False)
            except Exception as err:  # one broken dispatcher must not hide the others' results
                if rank0:
                    report.say(f"dispatcher {name} failed to build: {err}")
                runs[name] = _failure(err)
        for step in range(cfg.train.steps):
            times = []
            for name, trainer in list(trainers.items()):
                try:
                    rec = trainer.step(step)
                    times.append(f"{name} {rec['time_s'] * 1e3:.1f} ms (loss {rec['loss']:.4f})")
                except Exception as err:
                    if rank0:
                        report.say(f"dispatcher {name} failed at step {step + 1}: {err}")
                    runs[name] = _failure(err)
                    del trainers[name]
            if rank0:
                report.say(f"step {step + 1}/{cfg.train.steps}: " + ", ".join(times))
        for name, trainer in trainers.items():
            result = trainer.finish(str(Path(out) / name))
            if result is not None:
                runs[name] = result
                report.say(report.summary_line(result))
    return {n: runs[n] for n in names if n in runs}  # the preferred order: the loss baseline first


def compare_losses(runs: dict[str, Any], rtol: float) -> dict[str, dict[str, Any]]:
    """Max relative difference of each loss curve to the first successful run's."""
    ok = [n for n, r in runs.items() if "error" not in r]
    if not ok:
        return {}
    base = [s["loss"] for s in runs[ok[0]]["steps"]]
    out = {}
    for name in ok:
        curve = [s["loss"] for s in runs[name]["steps"]]
        diff = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(curve, base))
        out[name] = {"baseline": ok[0], "max_rel_diff": diff, "rtol": rtol, "agrees": diff <= rtol}
    return out


def sign_test_p(wins: int, n: int) -> float:
    """Two-sided sign-test p-value: `wins` of `n` untied pairs favour one side."""
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(0, min(wins, n - wins) + 1)) / 2**n
    return min(1.0, 2 * tail)


def paired_steps(runs: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The first successful dispatcher's step time against each other's, step by step over the
    timed steps. Meaningful for the interleaved schedule, where step i of every dispatcher ran
    back to back, so a per-step difference cancels the host's drift."""
    ok = [n for n, r in runs.items() if "error" not in r]
    if len(ok) < 2:
        return {}

    def timed_ms(name: str) -> list[float]:
        r = runs[name]
        return [s["time_s"] * 1e3 for s in r["steps"][-r["summary"]["timed_steps"]:]]

    base = timed_ms(ok[0])
    out = {}
    for name in ok[1:]:
        diff = [a - b for a, b in zip(base, timed_ms(name))]
        faster, slower = sum(d < 0 for d in diff), sum(d > 0 for d in diff)
        out[name] = {"baseline": ok[0], "steps": len(diff), "median_diff_ms": statistics.median(diff),
                     "baseline_faster_steps": faster, "sign_test_p": sign_test_p(faster, faster + slower)}
    return out


def paired_lines(paired: dict[str, dict[str, Any]]) -> list[str]:
    return [f"paired per step: {p['baseline']} - {name} = {p['median_diff_ms']:+.1f} ms (median); "
            f"{p['baseline']} faster in {p['baseline_faster_steps']}/{p['steps']} steps "
            f"(sign test p = {p['sign_test_p']:.3g})" for name, p in paired.items()]


def table(runs: dict[str, Any], agreement: dict[str, Any], skipped: dict[str, str]) -> str:
    head = (f"{'dispatcher':<12}{'step ms':>10}{'tok/s':>12}{'dispatch ms':>13}{'combine ms':>12}"
            f"{'final loss':>12}  loss vs baseline")
    lines = [head, "-" * len(head)]
    for name, r in runs.items():
        if "error" in r:
            lines.append(f"{name:<12}  failed: {r['error'].splitlines()[0][:100]}")
            continue
        s, a = r["summary"], agreement[name]
        verdict = (f"{a['max_rel_diff']:.2e} {'ok' if a['agrees'] else 'DISAGREES'}"
                   f" (rtol {a['rtol']:g}, vs {a['baseline']})")
        lines.append(f"{name:<12}{s['median_step_ms']:>10.1f}{s['median_tokens_per_s']:>12,.0f}"
                     f"{s['median_dispatch_ms']:>13.2f}{s['median_combine_ms']:>12.2f}"
                     f"{s['final_loss']:>12.4f}  {verdict}")
    for name, why in skipped.items():
        lines.append(f"{name:<12}  skipped: {why}")
    lines.append("times: medians over the timed steps of the slowest rank; dispatch/combine: forward + backward")
    return "\n".join(lines)


def plot(runs: dict[str, Any], path: Path, title: str) -> str | None:
    """PNG with step times and loss curves; returns why not when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install -e '.[plot]')"
    ok = {n: r for n, r in runs.items() if "error" not in r}
    fig, (ax_t, ax_l) = plt.subplots(1, 2, figsize=(12, 4.5))
    names = list(ok)
    step_ms = [ok[n]["summary"]["median_step_ms"] for n in names]
    comm_ms = [ok[n]["summary"]["median_dispatch_ms"] + ok[n]["summary"]["median_combine_ms"] for n in names]
    xs = range(len(names))
    ax_t.bar(xs, step_ms, color="tab:blue", label="step")
    ax_t.bar(xs, comm_ms, color="tab:orange", label="dispatch + combine")
    ax_t.set_xticks(list(xs), names)
    ax_t.set_ylabel("median step time (ms)")
    ax_t.set_title("step time per dispatcher")
    ax_t.legend()
    for n in names:
        steps = ok[n]["steps"]
        ax_l.plot([s["step"] for s in steps], [s["loss"] for s in steps], label=n, alpha=0.8)
    ax_l.set_xlabel("step")
    ax_l.set_ylabel("loss")
    ax_l.set_title("loss (curves should overlap)")
    ax_l.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return None


def finish(cfg: TrainConfig, runs: dict[str, Any], skipped: dict[str, str], out: Path, rtol: float,
           schedule: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    agreement = compare_losses(runs, rtol)
    paired = paired_steps(runs) if schedule == "interleaved" else {}
    text = "\n".join([table(runs, agreement, skipped), *paired_lines(paired)])
    (out / "table.txt").write_text(text + "\n")
    report.say("\n" + text)
    no_png = plot(runs, out / "bench.png", f"{cfg.name}: {cfg.parallel.world_size} ranks, ep {cfg.parallel.ep}")
    summary = {
        "config": cfg.name,
        "schedule": schedule,
        "loss_rtol": rtol,
        "agreement": agreement,
        "paired": paired,
        "skipped": skipped,
        "png": None if no_png else "bench.png",
        "png_missing_because": no_png,
        "runs": {n: (r if "error" in r else {k: r[k] for k in ("summary", "steps", "environment", "dispatcher")})
                 for n, r in runs.items()},
    }
    (out / "bench.json").write_text(json.dumps(summary, indent=2) + "\n")
    report.say(f"wrote {out / 'table.txt'}, {out / 'bench.json'}" + ("" if no_png else f", {out / 'bench.png'}"))
    if no_png:
        report.say(f"no PNG: {no_png}")


def cmd_train_bench(args: argparse.Namespace) -> int:
    cfg = load_with_overrides(args)
    require_output_dir(args.out)
    on_gpu = torch.cuda.is_available() and torch.cuda.device_count() >= 1
    names, skipped = candidates(args.dispatchers, on_gpu)
    for name, why in skipped.items():
        report.say(f"skipping {name}: {why}")
    if not names:
        report.say("no dispatcher can run here")
        return 2
    run_distributed(_bench_body, cfg, names, skipped, args.out, args.loss_rtol, args.schedule)
    if os.environ.get("RANK", "0") != "0":
        return 0  # under torchrun only global rank 0 wrote the results
    result = json.loads((Path(args.out) / "bench.json").read_text())
    bad = [n for n, a in result["agreement"].items() if not a["agrees"]]
    failed = [n for n, r in result["runs"].items() if "error" in r]
    if bad or failed:
        report.say(f"loss curves disagree: {bad}; failed: {failed}")
        return 3
    return 0
