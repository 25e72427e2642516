"""``--plot``: throughput and latency against batch size or concurrency, one PNG."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot_series(path: str | Path, x_label: str, series: dict[str, list[tuple[float, dict[str, Any]]]],
                throughput_key: str, latency_key: str, latency_label: str, title: str) -> Path:
    """``series``: name -> [(x, result dict)]; left panel ``throughput_key``, right panel
    ``latency_key`` (a number, or a Summary dict whose ``median_ms`` is drawn)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, points in series.items():
        xs = [p[0] for p in points]
        ax1.plot(xs, [p[1][throughput_key] for p in points], marker="o", label=name)
        lat = [p[1][latency_key] for p in points]
        lat = [v["median_ms"] if isinstance(v, dict) else v for v in lat]
        ax2.plot(xs, lat, marker="o", label=name)
    for ax, ylabel in ((ax1, throughput_key.replace("_", " ") + " (tok/s)"), (ax2, latency_label)):
        ax.set_xlabel(x_label)
        ax.set_ylabel(ylabel)
        ax.set_xscale("log", base=2)
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
