"""Per-step records, the progress line, and the JSON/CSV logs of a training run."""

from __future__ import annotations

import csv
import dataclasses
import datetime
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from ..train_config import TrainConfig

CSV_FIELDS = ("step", "time_s", "tokens_per_s", "loss", "aux_loss", "lr", "grad_norm", "dispatch_ms",
              "combine_ms", "dispatch_fwd_ms", "dispatch_bwd_ms", "combine_fwd_ms", "combine_bwd_ms")


def say(msg: str) -> None:
    print(f"[moe-backend train {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _commit() -> str:
    try:
        here = Path(__file__).resolve().parent
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True,
                             timeout=5)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


class RunLog:
    def __init__(self, cfg: TrainConfig, dispatcher: str, device: torch.device, world: int, params: int):
        self.cfg = cfg
        self.dispatcher = dispatcher
        self.device = device
        self.world = world
        self.params = params
        self.steps: list[dict[str, Any]] = []
        self.started = time.time()

    def header(self) -> str:
        c, p = self.cfg, self.cfg.parallel
        return (f"{c.name}: dispatcher {self.dispatcher}, {self.world} ranks on {self.device.type} "
                f"(tp {p.tp}, ep {p.ep}, expert_tp {p.expert_tp}, dp {c.dp}), {self.params:,} parameters per rank, "
                f"{c.tokens_per_step():,} tokens/step, {c.train.precision}, {c.train.steps} steps")

    def add(self, step: int, loss: float, aux: float | None, lr: float, norm: float, seconds: float,
            comm: dict[str, float]) -> dict[str, Any]:
        ms = {f"{k}_ms": v * 1e3 for k, v in comm.items()}
        rec = {
            "step": step + 1,
            "time_s": seconds,
            "tokens_per_s": self.cfg.tokens_per_step() / seconds if seconds > 0 else float("nan"),
            "loss": loss,
            "aux_loss": aux,
            "lr": lr,
            "grad_norm": norm,
            "dispatch_ms": ms["dispatch_fwd_ms"] + ms["dispatch_bwd_ms"],
            "combine_ms": ms["combine_fwd_ms"] + ms["combine_bwd_ms"],
            **ms,
        }
        self.steps.append(rec)
        return rec

    def finish(self) -> dict[str, Any]:
        timed = self.steps[self.cfg.train.timing_warmup:] or self.steps
        keys = ("time_s", "tokens_per_s", "dispatch_ms", "combine_ms")
        med = {k: statistics.median(s[k] for s in timed) for k in keys}
        summary = {
            "steps": len(self.steps),
            "timed_steps": len(timed),
            "median_step_ms": med["time_s"] * 1e3,
            "median_tokens_per_s": med["tokens_per_s"],
            "median_dispatch_ms": med["dispatch_ms"],
            "median_combine_ms": med["combine_ms"],
            "first_loss": self.steps[0]["loss"],
            "final_loss": self.steps[-1]["loss"],
            "wall_s": time.time() - self.started,
        }
        return {
            "name": self.cfg.name,
            "dispatcher": self.dispatcher,
            "config": dataclasses.asdict(self.cfg),
            "environment": {
                "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                "host": platform.node(),
                "python": sys.version.split()[0],
                "torch": torch.__version__,
                "device": self.device.type,
                "gpu": torch.cuda.get_device_name(0) if self.device.type == "cuda" else None,
                "world_size": self.world,
                "commit": _commit(),
            },
            "parameters_per_rank": self.params,
            "summary": summary,
            "steps": self.steps,
        }


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def step_line(rec: dict[str, Any], total: int, width: int = 20) -> str:
    done = int(width * rec["step"] / total)
    bar = "#" * done + "." * (width - done)
    return (f"step {rec['step']:>4}/{total} [{bar}] {rec['time_s'] * 1e3:9.1f} ms  "
            f"{rec['tokens_per_s']:10,.0f} tok/s  loss {rec['loss']:.4f}  aux {_fmt(rec['aux_loss'], '.4f')}  "
            f"dispatch {rec['dispatch_ms']:8.2f} ms  combine {rec['combine_ms']:8.2f} ms")


def summary_line(result: dict[str, Any]) -> str:
    s = result["summary"]
    return (f"done {result['name']} ({result['dispatcher']}): loss {s['first_loss']:.4f} -> {s['final_loss']:.4f}, "
            f"median step {s['median_step_ms']:.1f} ms, {s['median_tokens_per_s']:,.0f} tok/s, "
            f"dispatch {s['median_dispatch_ms']:.2f} ms, combine {s['median_combine_ms']:.2f} ms per step")


def write(result: dict[str, Any], out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    js, cs = out_dir / "train_log.json", out_dir / "train_log.csv"
    js.write_text(json.dumps(result, indent=2) + "\n")
    with cs.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        w.writerows(result["steps"])
    return [js, cs]
