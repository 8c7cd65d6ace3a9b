"""PNG figures of the experiment runner and of plan.py (matplotlib, Agg backend: no display needed).

Every figure is written atomically (a temporary file renamed onto the target).
"""

from __future__ import annotations

import math
import os
from typing import Callable, Sequence

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402

from shardcore.costs import COST_PARTS  # noqa: E402
from shardcore.io import atomic_path  # noqa: E402
from shardcore.evaluation.report import SetSummary  # noqa: E402

PART_COLORS = ("#4C72B0", "#DD8452", "#55A868", "#C44E52")


def _colors(labels: Sequence[str]) -> dict[str, tuple]:
    cmap = plt.get_cmap("tab10")
    return {lab: cmap(i % 10) for i, lab in enumerate(labels)}


def _save(fig, path: str | os.PathLike) -> None:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)


def _empty(path, title: str, message: str) -> None:
    fig, ax = plt.subplots(figsize=(6, 2.5))
    ax.axis("off")
    ax.set_title(title, fontsize=10)
    ax.text(0.5, 0.5, message, ha="center", va="center")
    _save(fig, path)


def plot_costs(summaries: Sequence[SetSummary], path: str | os.PathLike, title: str = "Plan cost per algorithm",
               label: Callable[[str], str] = str) -> None:
    """One panel per task set (:class:`~shardcore.evaluation.report.SetSummary`): per algorithm the mean plan
    cost (bar), its std (error bar) and every compared task's cost (dots); the summary's bold cell
    (the best, where told apart from the best baseline) is outlined. ``label`` names an algorithm."""
    sets = [(s.task_set, {label(a): a_s for a, a_s in s.algs.items()}) for s in summaries]
    if not sets or not any(a_s.costs_ms for _, algs in sets for a_s in algs.values()):
        _empty(path, title, "no measured plan")
        return
    labels = list(dict.fromkeys(lab for _, algs in sets for lab in algs))
    colors = _colors(labels)
    ncols = min(3, len(sets))
    nrows = math.ceil(len(sets) / ncols)
    width = max(4.0, 0.55 * len(labels) + 1.5)
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, 3.6 * nrows), squeeze=False)
    for ax, (name, algs) in zip(axes.flat, sets):
        for i, lab in enumerate(labels):
            a_s = algs.get(lab)
            if a_s is None or a_s.mean_ms is None:
                ax.text(i, 0, "n/a", ha="center", va="bottom", fontsize=7, rotation=90)
                continue
            ax.bar(i, a_s.mean_ms, yerr=a_s.std_ms, color=colors[lab], alpha=0.85, capsize=3,
                   edgecolor="black" if a_s.bold else "none", linewidth=1.8 if a_s.bold else 0)
            ax.scatter([i] * a_s.n, a_s.costs_ms, s=8, color="black", zorder=3)
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, rotation=40, ha="right", fontsize=8)
        ax.set_title(name, fontsize=10)
        ax.set_ylabel("plan cost (ms)")
        ax.grid(axis="y", alpha=0.3)
    for ax in list(axes.flat)[len(sets):]:
        ax.axis("off")
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    _save(fig, path)


def plot_breakdown(panels: Sequence[tuple[str, Sequence[Sequence[float]], float]], path: str | os.PathLike,
                   parts: Sequence[str] = COST_PARTS,
                   title: str = "Per-device cost breakdown") -> None:
    """Side-by-side panels (e.g. the best and the worst algorithm on one task): per device a stacked
    bar of its cost parts. ``panels``: ``[(name, device_costs_ms [D][parts], plan cost ms)]``."""
    if not panels:
        _empty(path, title, "no measured plan")
        return
    ndev = max(len(p[1]) for p in panels)
    fig, axes = plt.subplots(1, len(panels), figsize=(max(4.0, 0.5 * ndev + 2.5) * len(panels), 3.8),
                             sharey=True, squeeze=False)
    for ax, (name, costs, total) in zip(axes[0], panels):
        bottom = [0.0] * len(costs)
        for j, part in enumerate(parts):
            vals = [float(c[j]) for c in costs]
            ax.bar(range(len(costs)), vals, bottom=bottom, color=PART_COLORS[j % len(PART_COLORS)], label=part)
            bottom = [b + v for b, v in zip(bottom, vals)]
        ax.axhline(total, color="black", linestyle="--", linewidth=0.8)
        ax.set_xticks(range(len(costs)))
        ax.set_xlabel("device")
        ax.set_title(f"{name}: {total:.1f} ms", fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("cost (ms)")
    axes[0][-1].legend(fontsize=8, loc="upper right")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    _save(fig, path)


PART_NAMES = ("forward compute", "forward exchange", "backward exchange", "backward compute")


def plot_plans(plans: Sequence[tuple], path: str | os.PathLike, cap_gb: float,
               title: str = "The compared plans") -> None:
    """plan.py's plans side by side, one column per planner: above, per device a stacked bar of its cost
    parts (:data:`~shardcore.costs.COST_PARTS`, forward compute first), the plan's cost (its slowest
    device) as a dashed line; below, per device its memory, the cap as a red line. Costs share one axis
    and memory another, so the columns compare at a glance. ``plans``: ``[(name, device_costs_ms [D][4]
    or None, memory_gb [D] or None, cost_ms or None, why not placed or None)]``; a plan without costs
    (infeasible, failed) gets a column that says why."""
    if not plans:
        _empty(path, title, "no plan")
        return
    ndev = max((len(p[1]) for p in plans if p[1]), default=1)
    top = max((sum(c) for p in plans if p[1] for c in p[1]), default=1.0) * 1.08
    mem_top = max([cap_gb] + [m for p in plans if p[2] for m in p[2]]) * 1.1
    width = max(3.2, 0.42 * ndev + 1.6)
    fig, axes = plt.subplots(2, len(plans), figsize=(width * len(plans), 6.2), squeeze=False,
                             gridspec_kw={"height_ratios": [3, 1.3]})
    for col, (name, costs, memory, cost_ms, why) in enumerate(plans):
        ax, mx = axes[0][col], axes[1][col]
        if not costs:
            ax.axis("off")
            mx.axis("off")
            ax.set_title(f"{name}: not placed", fontsize=10)
            ax.text(0.5, 0.5, (why or "infeasible")[:80], ha="center", va="center", fontsize=8, wrap=True,
                    transform=ax.transAxes)
            continue
        xs = list(range(len(costs)))
        bottom = [0.0] * len(costs)
        for j, part in enumerate(PART_NAMES):
            vals = [float(c[j]) for c in costs]
            ax.bar(xs, vals, bottom=bottom, color=PART_COLORS[j % len(PART_COLORS)], label=part)
            bottom = [b + v for b, v in zip(bottom, vals)]
        if cost_ms is not None:
            ax.axhline(cost_ms, color="black", linestyle="--", linewidth=0.8)
        ax.set_ylim(0, top)
        ax.set_xticks(xs)
        ax.set_title(f"{name}: {cost_ms:.3f} ms" if cost_ms is not None else name, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
        mx.bar(xs, list(memory or [0.0] * len(costs)), color="#8C8C8C")
        mx.axhline(cap_gb, color="#C44E52", linewidth=1.2, label=f"cap {cap_gb:g} GiB")
        mx.set_ylim(0, mem_top)
        mx.set_xticks(xs)
        mx.set_xlabel("device")
        mx.grid(axis="y", alpha=0.3)
        if col == 0:
            ax.set_ylabel("cost (ms)")
            mx.set_ylabel("memory (GiB)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    for ax in axes[0]:
        if ax.get_legend_handles_labels()[0]:
            handles, labels = ax.get_legend_handles_labels()
            break
    for mx in axes[1]:
        h, lab = mx.get_legend_handles_labels()
        if h:
            handles, labels = handles + h, labels + lab
            break
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8, frameon=False)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    _save(fig, path)


def plot_planning(series: dict[tuple[str, str], list[tuple[int, float, float | None]]], path: str | os.PathLike,
                  tables_title: str = "tables grow", devices_title: str = "devices grow",
                  mem_floor_mb: float = 0.01) -> None:
    """2 x 2 log-log panels: planning time and peak memory against tables and against devices.
    ``series[(sweep, label)] = [(x, planning_ms, peak_mem_mb)]`` with sweep "tables" or "devices".
    Memory below ``mem_floor_mb`` (e.g. 0: nothing measurable) is drawn at the floor."""
    if not series:
        _empty(path, "Planning time and memory", "nothing planned")
        return
    labels = list(dict.fromkeys(lab for _, lab in series))
    colors = _colors(labels)
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    for col, (sweep, xlabel, sub) in enumerate((("tables", "tables", tables_title),
                                                ("devices", "devices", devices_title))):
        for lab in labels:
            pts = sorted(series.get((sweep, lab), []))
            if not pts:
                continue
            xs = [p[0] for p in pts]
            axes[0][col].plot(xs, [max(p[1], 1e-3) for p in pts], marker="o", color=colors[lab], label=lab)
            mem = [(p[0], max(p[2], mem_floor_mb)) for p in pts if p[2] is not None]
            if mem:
                axes[1][col].plot([m[0] for m in mem], [m[1] for m in mem], marker="o", color=colors[lab], label=lab)
        xs_all = sorted({p[0] for (sw, _), pts in series.items() if sw == sweep for p in pts})
        for row, ylabel in ((0, "planning time (ms)"), (1, f"peak memory (MB; < {mem_floor_mb:g} drawn at it)")):
            ax = axes[row][col]
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            if xs_all:
                ax.set_xticks(xs_all)
                ax.set_xticklabels([str(x) for x in xs_all])
                ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            ax.set_title(sub, fontsize=10)
            ax.grid(alpha=0.3, which="both")
    handles, names = [], []
    for ax in axes.flat:
        for h, n in zip(*ax.get_legend_handles_labels()):
            if n not in names:
                handles.append(h)
                names.append(n)
    fig.legend(handles, names, loc="lower center", ncol=min(len(names), 5), fontsize=9, frameon=False)
    fig.suptitle("Planning time and peak memory (log axes)", fontsize=11)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    _save(fig, path)
