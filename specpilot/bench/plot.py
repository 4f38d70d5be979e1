"""A bar chart of tokens/s per system and batch size (median, min–max whiskers), Agg backend."""
from __future__ import annotations

from typing import List


def plot_tokens_per_s(rows: List[dict], title: str, path: str, ylabel: str = "tokens/s") -> None:
    """Grouped bars: one group per batch size, one bar per system; measured rows only."""
    import matplotlib

    matplotlib.use("Agg")  # files only, never a display
    import matplotlib.pyplot as plt

    measured = [r for r in rows if r["status"] == "measured"]
    batches = sorted({r["batch_size"] for r in measured})
    systems = list(dict.fromkeys(r["system"] for r in measured))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(batches) * max(1, len(systems)) / 2), 4.5))
    width = 0.8 / max(1, len(systems))
    for i, system in enumerate(systems):
        xs, ys, lo, hi = [], [], [], []
        for j, b in enumerate(batches):
            row = next((r for r in measured if r["system"] == system and r["batch_size"] == b), None)
            if row is None:
                continue
            t = row["tokens_per_s"]
            xs.append(j + (i - (len(systems) - 1) / 2) * width)
            ys.append(t["median"])
            lo.append(t["median"] - t["min"])
            hi.append(t["max"] - t["median"])
        ax.bar(xs, ys, width, yerr=[lo, hi], capsize=2, label=system)
    ax.set_xticks(range(len(batches)))
    ax.set_xticklabels([str(b) for b in batches])
    ax.set_xlabel("batch size")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    if systems:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120, format="png")
    plt.close(fig)
