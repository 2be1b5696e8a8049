"""PNG of a `moe-backend bench` run: latency against tokens per rank, per backend.

One row of panels per preset (dispatch, combine), log-log, with the floor set by the
GPU-to-GPU copy rate (the bytes that must cross, over that rate) and, when measured, the
latency floor of a two-launch exchange (moe_backend/latency_floor.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot_latency(reports: list[dict[str, Any]], path: str | Path) -> str | None:
    """Write the PNG; returns why not when matplotlib is missing (the `plot` extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install -e '.[plot]')"
    fig = latency_figure(reports)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return None


def latency_figure(reports: list[dict[str, Any]]) -> Any:
    """The figure of `plot_latency` (matplotlib must be importable)."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullLocator

    fig, axes = plt.subplots(len(reports), 2, figsize=(12, 4.2 * len(reports)), squeeze=False)
    for (ax_d, ax_c), report in zip(axes, reports):
        backends = sorted({r["backend"] for r in report["rows"]})
        for op, ax in (("dispatch", ax_d), ("combine", ax_c)):
            for i, backend in enumerate(backends):  # one colour per backend in every panel
                rows = sorted((r for r in report["rows"] if r["backend"] == backend and op in r["phases"]),
                              key=lambda r: r["num_tokens"])
                if rows:
                    ax.plot([r["num_tokens"] for r in rows], [r["phases"][op]["median"] for r in rows],
                            marker="o", color=f"C{i}", label=backend)
            rate = report.get("copy_rate_gbps")
            moved = sorted({(r["num_tokens"], r["bytes_across_max_rank"][op]) for r in report["rows"]
                            if "bytes_across_max_rank" in r})
            if rate and moved:
                ax.plot([n for n, _ in moved], [b / (rate * 1e3) for _, b in moved], "k--",
                        label=f"copy-rate floor ({rate:.0f} GB/s)")
            floor = (report.get("latency_floor_us") or {}).get("2_launches")
            if floor:  # a split op's fewest launches: no op of a few tokens gets below it
                ax.axhline(floor["median"], color="grey", linestyle=":",
                           label=f"latency floor, 2 launches ({floor['median']:.1f} us)")
            ax.set_xscale("log", base=2)
            # Ticks at the measured token counts, as plain numbers (the log axis's own labels
            # repeated powers of 2 between them).
            counts = sorted({r["num_tokens"] for r in report["rows"]})
            ax.xaxis.set_minor_locator(NullLocator())
            ax.set_xticks(counts, [str(n) for n in counts])
            ax.set_yscale("log")
            ax.set_xlabel("tokens per rank")
            ax.set_ylabel(f"{op} median (us, slowest rank)")
            ax.set_title(f"{report['preset']}: {op}")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
