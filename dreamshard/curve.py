"""DreamShard's learning curve: after every iteration, the mean judged cost of the policy's plans on
training tasks, relative to lookup-based greedy (``learning_curve.csv``, drawn as ``learning_curve.png``)."""

from __future__ import annotations

import os
from pathlib import Path

CURVE_FIELDS = ["iteration", "tasks", "lookup_greedy_ms", "greedy_ms", "decoded_ms", "greedy_vs_lookup_pct",
                "decoded_vs_lookup_pct", "cost_net_mape_pct", "buffer"]


def plot_curve(curve_csv: str | os.PathLike, out_png: str | os.PathLike) -> Path:
    """Greedy and decoded plan cost relative to lookup-greedy (%, lower is better) per iteration; below,
    the cost network's error on those plans (which it never saw). Written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    from shardcore.io import atomic_path

    df = pd.read_csv(curve_csv)
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    ax1.axhline(0.0, color="gray", lw=1, label="lookup greedy")
    ax1.plot(df["iteration"], df["greedy_vs_lookup_pct"], "o-", label="policy, greedy")
    if df["decoded_ms"].notna().any():
        ax1.plot(df["iteration"], df["decoded_vs_lookup_pct"], "s-", label="policy, best of sampled by cost net")
    ax1.set_ylabel("judged cost vs lookup greedy (%)")
    ax1.legend()
    ax1.grid(alpha=0.3)
    ax2.plot(df["iteration"], df["cost_net_mape_pct"], "o-", color="tab:red")
    ax2.set_ylabel("cost net error on greedy plans\n(MAPE %, unseen plans)")
    ax2.set_xlabel("iteration")
    ax2.grid(alpha=0.3)
    n = int(df["tasks"].iloc[-1]) if len(df) else 0
    fig.suptitle(f"DreamShard training: mean over {n} training tasks")
    fig.tight_layout()
    out_png = Path(out_png)
    with atomic_path(out_png) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
    return out_png
