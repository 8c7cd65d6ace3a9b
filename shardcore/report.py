"""Text tables for evaluation results (plain, also valid Markdown)."""

from __future__ import annotations

import statistics
from typing import Sequence

from .evaluation import TaskResult


def format_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(c) for c in header]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[j]) for r in cells) for j in range(len(header))]
    def line(r):
        return "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(cells[0]), sep] + [line(r) for r in cells[1:]])


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    if not values:
        return float("nan"), float("nan")
    return statistics.fmean(values), (statistics.pstdev(values) if len(values) > 1 else 0.0)


def _by_alg(results: Sequence[TaskResult]) -> dict[str, list[TaskResult]]:
    out: dict[str, list[TaskResult]] = {}
    for r in results:
        out.setdefault(r.alg, []).append(r)
    return out


def improvement_over(base_ms: float, cost_ms: float) -> float:
    """The DreamShard paper's "% over random": base / cost - 1, in percent (positive = faster)."""
    return (base_ms / cost_ms - 1.0) * 100.0


def plan_only_summary(results: Sequence[TaskResult]) -> str:
    rows = []
    for alg, rs in _by_alg(results).items():
        ok = [r for r in rs if r.feasible]
        max_mem = [max(r.memory_gb) for r in ok]
        imb = []
        for r in ok:
            load = r.extra.get("lookup_load") or []
            mean = sum(load) / len(load) if load else 0.0
            imb.append(max(load) / mean if mean > 0 else 1.0)
        rows.append([alg, f"{len(ok)}/{len(rs)}",
                     f"{statistics.fmean(max_mem):.3f}" if ok else "-",
                     f"{statistics.fmean(imb):.3f}" if ok else "-",
                     f"{1e3 * statistics.fmean(r.planning_seconds for r in rs):.2f}"])
    return format_table(["alg", "feasible", "max device mem GB", "lookup-load max/mean", "planning ms"], rows)


def measured_summary(results: Sequence[TaskResult], baseline: str = "random") -> str:
    """Per algorithm: mean ± std (across tasks) of the measured plan cost, % over ``baseline`` on the
    tasks that both planned feasibly, mean imbalance, infeasible count, planning time."""
    groups = _by_alg(results)
    base = {r.task: r.cost_ms for r in groups.get(baseline, []) if r.cost_ms is not None}
    rows = []
    for alg, rs in groups.items():
        costs = [r.cost_ms for r in rs if r.cost_ms is not None]
        mean, std = _mean_std(costs)
        both = [(base[r.task], r.cost_ms) for r in rs if r.cost_ms is not None and r.task in base]
        if both and alg != baseline:
            gain = f"{improvement_over(statistics.fmean(b for b, _ in both), statistics.fmean(c for _, c in both)):+.1f}%"
        else:
            gain = "-"
        imb = [r.imbalance for r in rs if r.imbalance is not None]
        rows.append([alg, f"{mean:.2f} ± {std:.2f}" if costs else "-", gain,
                     f"{statistics.fmean(imb):.3f}" if imb else "-",
                     sum(not r.feasible for r in rs),
                     f"{1e3 * statistics.fmean(r.planning_seconds for r in rs):.2f}"])
    return format_table(["alg", "cost ms (mean ± std over tasks)", f"% over {baseline}",
                         "imbalance max/mean", "infeasible", "planning ms"], rows)


def paper_table(results: Sequence[TaskResult], task_set: str, baseline: str = "random") -> str:
    """One row in the DreamShard results-table layout: each cell 'mean±std (+x%)', best in bold.

    Only tasks that every algorithm planned feasibly count, so all cells average the same tasks."""
    groups = _by_alg(results)
    common = set.intersection(*({r.task for r in rs if r.cost_ms is not None} for rs in groups.values()))
    groups = {alg: [r for r in rs if r.task in common] for alg, rs in groups.items()}
    base = [r.cost_ms for r in groups.get(baseline, []) if r.cost_ms is not None]
    base_mean = statistics.fmean(base) if base else None
    means = {}
    cells = {}
    for alg, rs in groups.items():
        costs = [r.cost_ms for r in rs if r.cost_ms is not None]
        if not costs:
            cells[alg] = "infeasible"
            continue
        mean, std = _mean_std(costs)
        means[alg] = mean
        gain = "" if base_mean is None or alg == baseline else f" ({improvement_over(base_mean, mean):+.1f}%)"
        cells[alg] = f"{mean:.1f}±{std:.1f}{gain}"
    if means:
        best = min(means, key=means.get)
        cells[best] = f"**{cells[best]}**"
    return format_table(["Task"] + list(groups), [[task_set] + [cells[a] for a in groups]])
