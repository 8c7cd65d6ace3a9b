"""The training curve: mean episode return (and measured plan cost) against environment steps."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd


def moving_average(x: np.ndarray, window: int) -> np.ndarray:
    if len(x) == 0:
        return x
    window = max(1, min(window, len(x)))
    c = np.cumsum(np.insert(np.asarray(x, dtype=float), 0, 0.0))
    out = np.empty(len(x))
    for i in range(len(x)):
        lo = max(0, i + 1 - window)
        out[i] = (c[i + 1] - c[lo]) / (i + 1 - lo)
    return out


def plot_curve(episodes_csv: str | os.PathLike, out_png: str | os.PathLike, window: int = 50) -> Path:
    """Episode returns (dots) and their moving average over ``window`` episodes; below, the measured
    plan cost (ms) of the feasible episodes. Written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from shardcore.io import atomic_path

    df = pd.read_csv(episodes_csv)
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    if len(df):
        ax1.plot(df["step"], df["return"], ".", alpha=0.25, color="tab:blue", label="episode")
        ax1.plot(df["step"], moving_average(df["return"].to_numpy(), window), color="tab:blue",
                 label=f"mean of last {window}")
        cost = df.dropna(subset=["cost_ms"])
        ax2.plot(cost["step"], cost["cost_ms"], ".", alpha=0.25, color="tab:red")
        ax2.plot(cost["step"], moving_average(cost["cost_ms"].to_numpy(), window), color="tab:red")
    ax1.set_ylabel("return (balance min/max)")
    ax1.legend(loc="lower right")
    ax1.grid(alpha=0.3)
    ax2.set_ylabel("measured plan cost (ms)")
    ax2.set_xlabel("environment steps")
    ax2.grid(alpha=0.3)
    fig.suptitle("AutoShard training")
    fig.tight_layout()
    out_png = Path(out_png)
    with atomic_path(out_png) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
    return out_png
