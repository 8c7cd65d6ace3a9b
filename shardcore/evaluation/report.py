"""Text tables for evaluation results (plain, also valid Markdown), and the statistics of a task set.

:func:`summarize` computes a set's statistics once (:class:`SetSummary`: mean, std, n, % over random,
each algorithm paired task by task with the best baseline, with a 95% bootstrap interval of the mean
difference, and which cell is bold); :func:`paper_table`, the experiment runner's files and its plots
render it. :func:`noise_verdict` asks whether any two algorithms differ beyond an oracle's noise."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from enum import Enum
from typing import Sequence

from shardcore.evaluation.compare import TaskResult


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
    return format_table(["alg", "feasible", "max device mem GiB", "lookup-load max/mean", "planning ms"], rows)


class Outcome(str, Enum):
    """What became of one (task, algorithm): a plan, no plan under the cap, or an error of the method.
    A caller that tells failures apart stores ``Outcome.FAILED.value`` in ``TaskResult.extra["outcome"]``."""

    OK = "ok"
    INFEASIBLE = "infeasible"
    FAILED = "failed"


def outcome_of(r: TaskResult) -> Outcome:
    if r.feasible:
        return Outcome.OK
    return Outcome(r.extra.get("outcome", Outcome.INFEASIBLE.value))


def default_baselines() -> frozenset[str]:
    """The heuristic planners (the paper's baselines and the declared ones the reports count among them,
    TorchRec's)."""
    from shardcore.registry import baseline_planners
    from shardcore.baselines import BASELINES

    return frozenset(BASELINES) | frozenset(baseline_planners())


def bootstrap_interval(d: Sequence[float], seed: int = 0, resamples: int = 2000) -> tuple[float, float] | None:
    """95% bootstrap interval of the mean of ``d`` (percentile method); None for fewer than two values."""
    import numpy as np

    d = np.asarray(d, dtype=float)
    if d.size < 2:
        return None
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, d.size, size=(resamples, d.size))].mean(axis=1)
    lo, hi = np.quantile(means, [0.025, 0.975])
    return float(lo), float(hi)


@dataclass
class AlgSummary:
    """One algorithm on one task set; costs are those of the tasks every measured algorithm planned."""

    alg: str
    costs_ms: list[float]               # per compared task, in task order
    mean_ms: float | None
    std_ms: float | None
    pct_over_random: float | None       # the paper's "% over random" on the compared tasks
    vs: str | None = None               # the best baseline it is paired with
    diff_ms: float | None = None        # mean over tasks of (its cost - vs's cost); < 0: faster
    diff_lo_ms: float | None = None     # 95% bootstrap interval of that mean
    diff_hi_ms: float | None = None
    feasible: int = 0
    infeasible: int = 0
    failed: int = 0
    tasks: int = 0
    mean_planning_ms: float = 0.0
    mean_imbalance: float | None = None  # max / mean device cost, over the compared tasks
    bold: bool = False

    @property
    def n(self) -> int:
        return len(self.costs_ms)

    def to_json(self) -> dict:
        out = {k: v for k, v in asdict(self).items() if k != "costs_ms"}
        out["tasks_compared"] = self.n
        return out


@dataclass
class SetSummary:
    """The statistics of one task set, computed once; every table, file and plot renders them.

    The best cell is bold only where a paired comparison says so: each algorithm is paired task by
    task with the best baseline (the lowest mean among the baselines), with a 95% bootstrap interval
    of the mean difference. A best algorithm that is not a baseline is bold when its interval lies
    below zero; a best baseline, when every non-baseline's interval lies above zero; in a row of
    baselines only (or of non-baselines only), when the runner-up's interval against the best lies
    above zero. Fewer than two compared tasks: no interval, nothing bold."""

    task_set: str
    algs: dict[str, AlgSummary]
    tasks_compared: list[int]
    baseline: str = "random"
    best_baseline: str | None = None
    best: str | None = None
    bold: str | None = None
    why_not_bold: str = ""
    # the best mean paired with the second best of any column, baselines or not: (runner-up, mean
    # difference best - runner-up in ms, its 95% interval or None); None with fewer than two columns
    runner_up: tuple[str, float, tuple[float, float] | None] | None = None

    def runner_up_text(self, label=str) -> str:
        """'-2.95 [-6.96, +0.06] vs X (not told apart)': the best against the next best column, whatever
        kind (``label`` names it)."""
        if self.runner_up is None:
            return "-"
        name, diff, ci = self.runner_up
        name = label(name)
        if ci is None:
            return f"{diff:+.2f} vs {name} (no interval)"
        told = "told apart" if ci[1] < 0 else "not told apart"
        return f"{diff:+.2f} [{ci[0]:+.2f}, {ci[1]:+.2f}] vs {name} ({told})"

    def cell(self, alg: str, bold: bool = True) -> str:
        """'mean±std (+x%)' as in the DreamShard paper's table, ``**`` where bold."""
        s = self.algs[alg]
        if s.mean_ms is None:
            return Outcome.FAILED.value if s.failed else Outcome.INFEASIBLE.value
        gain = "" if s.pct_over_random is None else f" ({s.pct_over_random:+.1f}%)"
        text = f"{s.mean_ms:.1f}±{s.std_ms:.1f}{gain}"
        return f"**{text}**" if s.bold and bold else text

    def diff_text(self, alg: str) -> str:
        """'+1.2 [-0.4, +2.0] vs X' (ms, mean paired difference and its 95% interval) or '-'."""
        s = self.algs[alg]
        if s.diff_ms is None:
            return "-"
        ci = "" if s.diff_lo_ms is None else f" [{s.diff_lo_ms:+.2f}, {s.diff_hi_ms:+.2f}]"
        return f"{s.diff_ms:+.2f}{ci} vs {s.vs}"

    def to_json(self) -> dict:
        return {"task_set": self.task_set, "tasks_compared": list(self.tasks_compared),
                "best_baseline": self.best_baseline, "best": self.best, "bold": self.bold,
                "why_not_bold": self.why_not_bold,
                "runner_up": None if self.runner_up is None else {
                    "alg": self.runner_up[0], "diff_ms": self.runner_up[1],
                    "ci_ms": None if self.runner_up[2] is None else list(self.runner_up[2])},
                "algorithms": {a: s.to_json() for a, s in self.algs.items()}}


def summarize(results: Sequence[TaskResult], task_set: str = "", baseline: str = "random",
              baselines: frozenset[str] | None = None, seed: int = 0, resamples: int = 2000) -> SetSummary:
    """The :class:`SetSummary` of one task set's results (algorithms in the order they appear)."""
    baselines = default_baselines() if baselines is None else baselines
    groups = _by_alg(results)
    cost = {a: {r.task: r.cost_ms for r in rs if r.cost_ms is not None} for a, rs in groups.items()}
    cost = {a: c for a, c in cost.items() if c}
    common = sorted(set.intersection(*(set(c) for c in cost.values()))) if cost else []
    base_mean = statistics.fmean(cost[baseline][t] for t in common) if baseline in cost and common else None
    algs: dict[str, AlgSummary] = {}
    for alg, rs in groups.items():
        costs = [cost[alg][t] for t in common] if alg in cost else []
        mean, std = _mean_std(costs) if costs else (None, None)
        gain = improvement_over(base_mean, mean) if base_mean is not None and mean and alg != baseline else None
        outcomes = [outcome_of(r) for r in rs]
        imb = [r.imbalance for r in rs if r.task in common and r.imbalance is not None]
        algs[alg] = AlgSummary(alg, costs, mean, std, gain, feasible=outcomes.count(Outcome.OK),
                               infeasible=outcomes.count(Outcome.INFEASIBLE), failed=outcomes.count(Outcome.FAILED),
                               tasks=len(rs), mean_planning_ms=1e3 * statistics.fmean(r.planning_seconds for r in rs),
                               mean_imbalance=statistics.fmean(imb) if imb else None)
    out = SetSummary(task_set, algs, common, baseline)
    means = {a: s.mean_ms for a, s in algs.items() if s.mean_ms is not None}
    if not means:
        out.why_not_bold = "nothing measured"
        return out
    out.best = min(means, key=means.get)
    base_means = {a: m for a, m in means.items() if a in baselines}
    out.best_baseline = min(base_means, key=base_means.get) if base_means else None

    def paired(a: str, b: str) -> tuple[float, tuple[float, float] | None]:
        d = [cost[a][t] - cost[b][t] for t in common]
        return statistics.fmean(d), bootstrap_interval(d, seed, resamples)

    if out.best_baseline is not None:
        for alg, s in algs.items():
            if alg != out.best_baseline and s.mean_ms is not None:
                s.vs = out.best_baseline
                s.diff_ms, ci = paired(alg, out.best_baseline)
                s.diff_lo_ms, s.diff_hi_ms = ci if ci is not None else (None, None)
    if len(means) >= 2:
        second = sorted(means, key=means.get)[1]
        out.runner_up = (second, *paired(out.best, second))   # no interval with one common task
    others = [a for a in means if a not in baselines]
    if len(common) < 2:
        out.why_not_bold = f"{len(common)} task(s) compared: no interval"
        return out
    if len(means) < 2:
        out.why_not_bold = "one algorithm measured"
        return out
    if out.best_baseline is None or not others or len(others) == len(means):
        runner_up = sorted(means, key=means.get)[1]   # one kind only: the best against the runner-up
        ci = paired(runner_up, out.best)[1]
        significant = ci[0] > 0
    elif out.best == out.best_baseline:
        significant = all(algs[a].diff_lo_ms > 0 for a in others)
    else:
        significant = algs[out.best].diff_hi_ms < 0
    if significant:
        out.bold = out.best
        algs[out.best].bold = True
    else:
        out.why_not_bold = "the best mean is within the 95% interval of the paired difference"
    return out


def paper_table(results: Sequence[TaskResult] | SetSummary, task_set: str = "", baseline: str = "random",
                bold: bool = True) -> str:
    """One row in the DreamShard results-table layout: each cell 'mean±std (+x%)', the best in bold
    where its :class:`SetSummary` tells it apart from the best baseline (``bold=False``: no cell
    marked, e.g. when the plans cannot be told apart from the oracle's noise, see :func:`noise_verdict`).

    Only tasks that every measured algorithm planned feasibly count, so all cells average the same tasks."""
    summary = results if isinstance(results, SetSummary) else summarize(results, task_set, baseline)
    algs = list(summary.algs)
    return format_table(["Task"] + algs, [[summary.task_set or task_set] + [summary.cell(a, bold) for a in algs]])


def summary_table(summary: SetSummary) -> str:
    """The task set's summary as a table, per algorithm: mean ± std (across the compared tasks) of
    the measured plan cost, % over the summary's baseline, mean imbalance, how many tasks it planned
    no plan for (infeasible or failed), mean planning time. Rendered from :class:`SetSummary`, the
    statistics computed once."""
    rows = []
    for alg, s in summary.algs.items():
        rows.append([alg, f"{s.mean_ms:.2f} ± {s.std_ms:.2f}" if s.mean_ms is not None else "-",
                     f"{s.pct_over_random:+.1f}%" if s.pct_over_random is not None else "-",
                     f"{s.mean_imbalance:.3f}" if s.mean_imbalance is not None else "-",
                     s.infeasible + s.failed, f"{s.mean_planning_ms:.2f}"])
    return format_table(["alg", "cost ms (mean ± std over tasks)", f"% over {summary.baseline}",
                         "imbalance max/mean", "infeasible", "planning ms"], rows)


def measured_summary(results: Sequence[TaskResult], baseline: str = "random") -> str:
    """:func:`summary_table` of the results' :class:`SetSummary`."""
    return summary_table(summarize(results, baseline=baseline))


def _paired_distinct(a: Sequence[float], b: Sequence[float], noise: float, seed: int = 0,
                     resamples: int = 2000) -> bool:
    """Whether costs ``a`` and ``b`` (paired by task) differ: the mean relative difference exceeds
    ``noise`` (a fraction) and, with two or more tasks, its 95% bootstrap interval excludes zero."""
    d = [(x - y) / y for x, y in zip(a, b) if y > 0]
    if not d or abs(statistics.fmean(d)) <= noise:
        return False
    ci = bootstrap_interval(d, seed, resamples)
    return ci is None or ci[0] > 0 or ci[1] < 0


def noise_verdict(results: Sequence[TaskResult] | SetSummary, noise_pct: float | None) -> str | None:
    """One line when no two algorithms' plans can be told apart, else None.

    Two algorithms differ when, over the compared tasks of the results' :class:`SetSummary`, the mean
    relative difference of their costs exceeds the oracle's measurement noise (``noise_pct``: the
    relative spread of a shard's timed samples; None or 0 for a noise-free oracle) and its 95%
    bootstrap interval excludes 0."""
    summary = results if isinstance(results, SetSummary) else summarize(results)
    groups = {alg: s.costs_ms for alg, s in summary.algs.items() if s.costs_ms}
    if len(groups) < 2:
        return None
    noise = (noise_pct or 0.0) / 100.0
    algs = list(groups)
    for i, a in enumerate(algs):
        for b in algs[i + 1:]:
            if _paired_distinct(groups[a], groups[b], noise):
                return None
    means = {alg: statistics.fmean(c) for alg, c in groups.items()}
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
