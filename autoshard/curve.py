"""The training curve: mean episode return (and measured plan cost) against environment steps, and the
greedy (argmax) policy's cost on training tasks over the lookup greedy's (``policy_eval.csv``), with the
table-wise optimum's when a reference is given (``eval.py --alg lookup_greedy,shardkit --shardkit-types tw
--out REF.jsonl`` on the same training tasks)."""

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


def policy_ratios(policy_eval_csv: str | os.PathLike) -> pd.DataFrame:
    """Per policy check (``step``): the greedy policy's mean cost over the lookup greedy's on the checked
    tasks (``ratio``; NaN when a plan went over the cap) and ``elapsed_s``."""
    df = pd.read_csv(policy_eval_csv)
    greedy = df[df["alg"] == "lookup_greedy"].drop_duplicates("task", keep="last").set_index("task")["cost_ms"]
    pol = df[df["alg"] == "policy"].copy()
    pol["ratio"] = pol["cost_ms"] / pol["task"].map(greedy)
    return pol.groupby("step").agg(ratio=("ratio", lambda r: r.mean() if r.notna().all() else np.nan),
                                   elapsed_s=("elapsed_s", "first")).reset_index()


def reference_ratio(reference_jsonl: str | os.PathLike, tasks, alg: str = "shardkit") -> float | None:
    """Mean over ``tasks`` of ``alg``'s cost over the lookup greedy's in an ``eval.py --out`` file."""
    import json

    from shardcore.oracles.setting import refuse_predictions

    cost: dict = {}
    with open(reference_jsonl) as f:
        for k, line in enumerate(f, 1):
            r = json.loads(line)
            refuse_predictions(r, f"{reference_jsonl}:{k}", "an oracle's costs (eval.py --out)")
            if r.get("cost_ms") is not None:
                cost[(r["alg"], r["task"])] = float(r["cost_ms"])
    ratios = [cost[(alg, k)] / cost[("lookup_greedy", k)] for k in tasks
              if (alg, k) in cost and ("lookup_greedy", k) in cost]
    return float(np.mean(ratios)) if ratios else None


def plot_curve(episodes_csv: str | os.PathLike, out_png: str | os.PathLike, window: int = 50,
               policy_eval_csv: str | os.PathLike | None = None,
               reference_jsonl: str | os.PathLike | None = None) -> Path:
    """Episode returns (dots) and their moving average over ``window`` episodes; below, the measured
    plan cost (ms) of the feasible episodes; with ``policy_eval_csv`` (default: beside ``episodes_csv``
    when there), a third panel: the greedy policy's cost over the lookup greedy's on the checked
    training tasks, with the table-wise optimum's from ``reference_jsonl`` when given. Written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from shardcore.io import atomic_path

    df = pd.read_csv(episodes_csv)
    if policy_eval_csv is None and (Path(episodes_csv).parent / "policy_eval.csv").is_file():
        policy_eval_csv = Path(episodes_csv).parent / "policy_eval.csv"
    checks = policy_ratios(policy_eval_csv) if policy_eval_csv is not None else None
    panels = 3 if checks is not None and len(checks) else 2
    fig, axes = plt.subplots(panels, 1, figsize=(7, 3 * panels), sharex=True)
    ax1, ax2 = axes[0], axes[1]
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
    ax2.set_ylabel("measured plan cost (ms)\n(sampled episodes)")
    ax2.grid(alpha=0.3)
    if panels == 3:
        ax3 = axes[2]
        ax3.plot(checks["step"], checks["ratio"], "o-", color="tab:green", label="greedy (argmax) policy")
        ax3.axhline(1.0, color="black", lw=1, label="lookup greedy")
        if reference_jsonl is not None:
            tasks = sorted(pd.read_csv(policy_eval_csv)["task"].unique())
            tw = reference_ratio(reference_jsonl, tasks)
            if tw is not None:
                ax3.axhline(tw, color="tab:purple", ls="--", lw=1, label="table-wise optimum (search)")
        ax3.set_ylabel("cost / lookup greedy\n(training tasks checked)")
        ax3.legend(loc="upper right")
        ax3.grid(alpha=0.3)
    axes[-1].set_xlabel("environment steps")
    fig.suptitle("AutoShard training")
    fig.tight_layout()
    out_png = Path(out_png)
    with atomic_path(out_png) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
    return out_png


def main(argv=None) -> int:
    """``python -m autoshard.curve RUN_DIR [--reference REF.jsonl]``: redraw RUN_DIR/train_curve.png."""
    import argparse

    p = argparse.ArgumentParser(description="Redraw <RUN_DIR>/train_curve.png from its episodes.csv and "
                                            "policy_eval.csv.")
    p.add_argument("run_dir", help="a training's <savedir>/<xpid> folder")
    p.add_argument("--reference", default=None, metavar="REF.jsonl",
                   help="eval.py --out file with lookup_greedy and shardkit (--shardkit-types tw) plans of the "
                        "same training tasks: draws the table-wise optimum's cost over the lookup greedy's")
    p.add_argument("--window", type=int, default=50, help="episodes in the moving average (default %(default)s)")
    args = p.parse_args(argv)
    run = Path(args.run_dir)
    print(plot_curve(run / "episodes.csv", run / "train_curve.png", args.window, reference_jsonl=args.reference))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
