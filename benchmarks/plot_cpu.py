"""The PNG for benchmarks/RESULTS.md: decode throughput and prefill latency per engine and
batch size, and serving output throughput."""

from __future__ import annotations

from pathlib import Path


def plot(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from run_cpu import best

    rows, serving = summary["rows"], summary["serving"]
    sizes = summary["args"]["batch_size"]
    engines = [e for e in rows if rows[e]]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    width = 0.8 / max(len(engines), 1)
    for k, eng in enumerate(engines):
        bests = [best(rows[eng], bs) for bs in sizes]
        xs = [i + k * width for i in range(len(sizes))]
        axes[0].bar(xs, [b["decode_throughput"] if b else 0 for b in bests], width, label=eng)
        axes[1].bar(xs, [b["prefill_latency_s"] * 1000 if b else 0 for b in bests], width, label=eng)
    for ax, title in ((axes[0], "decode tok/s (higher is better)"),
                      (axes[1], "prefill / TTFT ms (lower is better)")):
        ax.set_xticks([i + width * (len(engines) - 1) / 2 for i in range(len(sizes))],
                      [f"batch {b}" for b in sizes])
        ax.set_title(title)
        ax.legend()
    names = [n for n, s in serving.items() if s]
    axes[2].bar(range(len(names)), [serving[n]["output_throughput"] for n in names], color=["C0", "C1"])
    axes[2].set_xticks(range(len(names)), [n.replace(" (", "\n(") for n in names], fontsize=8)
    axes[2].set_title("serving output tok/s")
    fig.suptitle("SmolLM2-135M on 2 shared CPU cores")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
