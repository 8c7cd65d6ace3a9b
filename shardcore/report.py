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


def paper_table(results: Sequence[TaskResult], task_set: str, baseline: str = "random", bold: bool = True) -> str:
    """One row in the DreamShard results-table layout: each cell 'mean±std (+x%)', best in bold
    (``bold=False``: no cell marked, when the plans cannot be told apart, see :func:`noise_verdict`).

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
    if means and bold:
        best = min(means, key=means.get)
        cells[best] = f"**{cells[best]}**"
    return format_table(["Task"] + list(groups), [[task_set] + [cells[a] for a in groups]])


def _paired_distinct(a: Sequence[float], b: Sequence[float], noise: float, seed: int = 0,
                     resamples: int = 2000) -> bool:
    """Whether costs ``a`` and ``b`` (paired by task) differ: the mean relative difference exceeds
    ``noise`` (a fraction) and, with two or more tasks, its 95% bootstrap interval excludes zero."""
    import numpy as np

    d = np.array([(x - y) / y for x, y in zip(a, b) if y > 0])
    if d.size == 0 or abs(float(d.mean())) <= noise:
        return False
    if d.size == 1:
        return True
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, d.size, size=(resamples, d.size))].mean(axis=1)
    lo, hi = np.quantile(means, [0.025, 0.975])
    return bool(lo > 0 or hi < 0)


def noise_verdict(results: Sequence[TaskResult], noise_pct: float | None) -> str | None:
    """One line when no two algorithms' plans can be told apart, else None.

    Two algorithms differ when, over the tasks both planned, the mean relative difference of their
    costs exceeds the oracle's measurement noise (``noise_pct``: the relative spread of a shard's
    timed samples; None or 0 for a noise-free oracle) and its 95% bootstrap interval excludes 0."""
    groups = {alg: {r.task: r.cost_ms for r in rs if r.cost_ms is not None} for alg, rs in _by_alg(results).items()}
    groups = {alg: costs for alg, costs in groups.items() if costs}
    if len(groups) < 2:
        return None
    noise = (noise_pct or 0.0) / 100.0
    algs = list(groups)
    for i, a in enumerate(algs):
        for b in algs[i + 1:]:
            common = sorted(set(groups[a]) & set(groups[b]))
            if _paired_distinct([groups[a][t] for t in common], [groups[b][t] for t in common], noise):
                return None
    means = {alg: statistics.fmean(c.values()) for alg, c in groups.items()}
    lo, hi = min(means.values()), max(means.values())
    noise_txt = f"the oracle's measured noise ({noise_pct:.1f}% spread of a shard's timed samples)" \
        if noise_pct else "the task-to-task spread"
    return (f"no ranking: the {len(groups)} algorithms' plans cannot be told apart (mean costs "
            f"{lo:.3f}..{hi:.3f} ms, {100 * (hi / lo - 1):.1f}% apart, within {noise_txt}); on a GPU, "
            "measure at the dataset's full batch (tools/gen_dlrm_data.py --batch-size 65536)")


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation (average ranks for ties); nan for fewer than two points or a
    constant input."""
    import numpy as np

    if len(x) != len(y) or len(x) < 2:
        return float("nan")

    def ranks(v):
        v = np.asarray(v, dtype=float)
        order = np.argsort(v, kind="mergesort")
        r = np.empty(len(v))
        r[order] = np.arange(len(v), dtype=float)
        for val in np.unique(v):  # ties get their average rank
            m = v == val
            if m.sum() > 1:
                r[m] = r[m].mean()
        return r

    rx, ry = ranks(x), ranks(y)
    if rx.std() == 0 or ry.std() == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])
