"""PNG plots of a compile run (matplotlib, Agg backend: files only, never a display)."""
from __future__ import annotations

from typing import List

from specpilot.cost.report import CATEGORIES, CATEGORY_TITLES


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_tokens_per_round(records: List[dict], path: str) -> None:
    """Measured tokens/s of each round's Program (median, min-max whiskers) against the stock
    Program and AR."""
    plt = _pyplot()
    rounds = [r["round"] for r in records]
    med = [r["timing"]["median_tokens_per_s"] for r in records]
    lo = [m - min(r["timing"]["tokens_per_s"]) for m, r in zip(med, records)]
    hi = [max(r["timing"]["tokens_per_s"]) - m for m, r in zip(med, records)]
    fig, ax = plt.subplots(figsize=(8.5, 4.0))
    ax.errorbar(rounds, med, yerr=[lo, hi], marker="o", capsize=3, label="compiled Program")
    stock = records[0]["timing"]["median_tokens_per_s"]
    ax.axhline(stock, color="tab:gray", linestyle="--", label="stock Program")
    compounded, level = [], stock
    for r in records:
        level *= 1.0 + (r.get("gain") or 0.0)
        compounded.append(level)
    ax.plot(rounds, compounded, marker="s", linestyle="-.", color="tab:green",
            label="stock x compounded paired gains")
    ar = (records[0].get("ar_timing") or {}).get("median_tokens_per_s")
    if ar:
        ax.axhline(ar, color="tab:red", linestyle=":", label=records[0].get("ar_label", "AR"))
    _finish_round_plot(plt, fig, ax, rounds, "tokens/s (measured)", "Tokens/s per round", path)


def plot_cost_breakdown(records: List[dict], path: str) -> None:
    """Stacked predicted µs per token by category for each round's Program, with its ceiling."""
    plt = _pyplot()
    rounds = [r["round"] for r in records]
    reports = [r.get("chosen_cost_report") or r["cost_report"] for r in records]
    fig, ax = plt.subplots(figsize=(8.5, 4.0))
    bottom = [0.0] * len(records)
    for c in CATEGORIES:
        values = [rep["breakdown_per_token_s"].get(c, 0.0) * 1e6 for rep in reports]
        ax.bar(rounds, values, bottom=bottom, label=CATEGORY_TITLES[c])
        bottom = [b + v for b, v in zip(bottom, values)]
    ceiling = [1e6 / rep["ceiling_tokens_per_s"] for rep in reports]
    ax.plot(rounds, ceiling, "k_", markersize=20, label="ceiling")
    _finish_round_plot(plt, fig, ax, rounds, "predicted µs per token",
                       "Cost breakdown per round (calibrated roofline)", path)


def _finish_round_plot(plt, fig, ax, rounds, ylabel: str, title: str, path: str) -> None:
    """Axes, legend outside the plot, and the PNG written: what every per-round plot shares."""
    ax.set_xticks(rounds)
    ax.set_xlabel("round")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)
