"""``plan3d sweep --plot``: throughput against GPUs on log-log axes, with the ideal linear scaling
from the first point, and MFU on an axis of its own below. Needs matplotlib (extra ``plot``).

Ideal linear scaling from the smallest count n0 with a fit: tokens/s(n) = tokens/s(n0) * n / n0,
a straight line of slope 1 on log-log axes; the gap to it is what planner.sweep's scaling
efficiency measures.
"""

from __future__ import annotations

import io

from ..errors import PLOT_EXTRA, UsageError
from ..outputs import is_stdout, write

IDEAL_GID = "ideal"  # matplotlib gid of the ideal-scaling lines (one per batch)


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise UsageError(PLOT_EXTRA) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def scaling_figure(rows: list[dict], title: str):
    """A matplotlib Figure of planner.sweep rows (rows with ``error`` are left out): axes[0]
    tokens/s against GPUs (both log scale, GPUs ticked at the swept counts as numbers; per batch
    the measured line and, dotted, the ideal line with gid IDEAL_GID), axes[1] MFU in % of the
    dense BF16 peak against GPUs (log x, linear 0-100)."""
    plt = _pyplot()
    ok = [r for r in rows if not r.get("error")]
    fig, (ax, ax_mfu) = plt.subplots(2, 1, sharex=True, figsize=(7, 6.5),
                                     gridspec_kw={"height_ratios": [2, 1]})
    for b in dict.fromkeys(r["global_batch_size"] for r in ok):
        series = [r for r in ok if r["global_batch_size"] == b]
        gpus = [r["gpus"] for r in series]
        tps = [r["tokens_per_s"] for r in series]
        (line,) = ax.plot(gpus, tps, "o-", label=f"tokens/s, batch {b}")
        ideal = [tps[0] * n / gpus[0] for n in gpus]
        ax.plot(gpus, ideal, ":", color=line.get_color(), gid=IDEAL_GID,
                label=f"ideal linear scaling from {gpus[0]} GPUs, batch {b}")
        ax_mfu.plot(gpus, [r["mfu"] * 100 for r in series], "s--", color=line.get_color(),
                    label=f"MFU, batch {b}")
    ax.set_xscale("log", base=2)
    _gpu_ticks(ax, sorted({r["gpus"] for r in ok}))
    ax.set_yscale("log")
    _count_ticks(ax.yaxis)
    ax.set_ylabel("tokens/s (log scale)")
    ax.set_title(title)
    ax.legend(loc="upper left", fontsize="small")
    ax.grid(True, which="both", alpha=0.3)
    ax_mfu.set_xlabel("GPUs (log scale)")
    ax_mfu.set_ylabel("MFU (% of BF16 peak)")
    ax_mfu.set_ylim(0, 100)
    ax_mfu.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig


def _gpu_ticks(ax, counts: list[int]) -> None:
    """The GPU axis (log 2) ticked at the swept counts, written as counts ("64", "1,024"), not
    as powers ("2^6"); no minor ticks between them."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator
    if not counts:
        return
    ax.xaxis.set_major_locator(FixedLocator(counts))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: f"{x:,.0f}"))
    ax.xaxis.set_minor_locator(NullLocator())


def _count_ticks(axis) -> None:
    """A log-10 axis of counts ticked at 1, 2 and 5 per decade and written as numbers
    ("200,000", "1,000,000"), not as powers ("10^5")."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda y, _pos: f"{y:,.0f}"))
    axis.set_minor_formatter(NullFormatter())


def save_scaling_plot(rows: list[dict], path, title: str) -> None:
    """``scaling_figure`` written to ``path`` (PNG). UsageError when matplotlib is missing or
    the file cannot be written."""
    plt = _pyplot()
    fig = scaling_figure(rows, title)
    try:
        if is_stdout(path):  # --plot -: the PNG's bytes on stdout
            buffer = io.BytesIO()
            fig.savefig(buffer, dpi=120, format="png")
            write(path, buffer.getvalue(), force=True)
        else:
            fig.savefig(path, dpi=120)
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None
    finally:
        plt.close(fig)
