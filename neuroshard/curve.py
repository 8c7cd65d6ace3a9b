"""The cost models' learning curves, written beside the checkpoints: per model and epoch the training
loss (mean squared log error) and the validation MAPE (the score that picks the kept epoch)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

import pandas as pd

from shardcore.io import atomic_open, atomic_path


def history_frame(results: Mapping[str, object]) -> pd.DataFrame:
    """``{model name: FitResult}`` -> one row per model and epoch (``model, epoch, train_loss,
    val_mape, best``; ``best`` marks the kept epoch)."""
    rows = []
    for name, res in results.items():
        for epoch, (loss, val) in enumerate(res.history):
            rows.append({"model": name, "epoch": epoch, "train_loss": float(loss), "val_mape": float(val),
                         "best": epoch == res.best_epoch})
    return pd.DataFrame(rows, columns=["model", "epoch", "train_loss", "val_mape", "best"])


def write_curve(results: Mapping[str, object], csv_path: str | os.PathLike, png_path: str | os.PathLike | None = None
                ) -> list[Path]:
    """The learning curves as CSV (and a PNG of validation MAPE against epochs, one line per model,
    when ``png_path`` is given and matplotlib is installed). Written atomically; returns the paths."""
    df = history_frame(results)
    csv_path = Path(csv_path)
    with atomic_open(csv_path) as fh:
        df.to_csv(fh, index=False)
    out = [csv_path]
    if png_path is None or df.empty:
        return out
    try:
        import matplotlib
    except ImportError:
        return out
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, part in df.groupby("model", sort=False):
        ax.plot(part["epoch"], part["val_mape"], label=name)
        best = part[part["best"]]
        ax.plot(best["epoch"], best["val_mape"], "o", color=ax.lines[-1].get_color())
    ax.set_yscale("log")
    ax.set_xlabel("epoch")
    ax.set_ylabel("validation MAPE (%)")
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title("NeuroShard cost models (dot: the kept epoch)")
    fig.tight_layout()
    png_path = Path(png_path)
    with atomic_path(png_path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
    return out + [png_path]
