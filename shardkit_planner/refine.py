"""Measured refinement: the oracle chooses among the model's best plans, and its answers correct the
model for the task at hand.

A fitted cost model is off by 10-20% per shard on a CPU (:mod:`shardkit_planner.costmodel`), which is
as large as the differences between good plans. Measuring the model's few best candidates and keeping
the fastest (top-k) helps only when the right plan is among them. Here every measurement also teaches
the model about this task's tables, and the search runs again under the corrected model:

Round ``r`` (up to ``k`` rounds):

1. **measure** the unmeasured candidate the corrected model ranks best, on the oracle (through its
   cache);
2. **correct** the model with the answer (:class:`CalibratedModel`): a measured shard's compute is
   known from then on (fw + bw as measured); every other shard's modelled compute gets an additive
   correction, the sum over its pieces of ``a_t x`` the piece's standalone modelled cost, with one
   ``a_t`` per table fitted (ridge least squares) to the measured shards' residuals (measured -
   modelled), so a table the model underrates is learnt from every shard that held it, and a table
   never measured keeps the model's figure; the exchange is scaled by the geometric mean of the
   measured / modelled ratios of the devices measured so far;
3. **search** (:func:`~shardkit_planner.search.local_search`) under the corrected model from the
   fastest measured plan; its result joins the candidates.

The fastest measured plan is kept. Its measurement is the smallest of several noisy ones, so it is
biased low: the sharder says so (``measures_candidates``) and the comparison measures the kept plan
again, afresh (:func:`shardcore.evaluation.compare.evaluate`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Callable, Sequence

import numpy as np

from shardcore.plan import Plan, piece_key
from shardcore.tables import TableConfig
from shardcore.types import DeviceCost

from .costmodel import CostModel
from .search import SearchStats, State, WorkBudget, local_search



def shard_key(pieces: Sequence[TableConfig]) -> tuple:
    return tuple(sorted(piece_key(p) for p in pieces))


def plan_key(plan: Plan) -> tuple:
    return tuple((s.type, s.devices, s.dims) for s in plan.shardings)


@dataclass
class CalibratedModel(CostModel):
    """A :class:`CostModel` corrected by measurements of this task's shards (see the module notes)."""

    ridge: float = 0.1                                 # shrinkage of the per-table corrections
    known: dict = field(default_factory=dict)          # shard key -> measured fw + bw compute (ms)
    corrections: dict = field(default_factory=dict)    # table index -> a (share of its standalone cost)
    comm_log_ratios: list = field(default_factory=list)
    _observed: list = field(default_factory=list, repr=False)   # [(pieces, residual ms)]
    _alone: dict = field(default_factory=dict, repr=False)

    @classmethod
    def around(cls, base: CostModel, **kw) -> "CalibratedModel":
        kw.update({f.name: getattr(base, f.name) for f in fields(CostModel) if f.init and not f.name.startswith("_")})
        return cls(**kw)

    # -- corrections -----------------------------------------------------------------------------
    def _base_compute(self, shards) -> np.ndarray:
        return CostModel.shard_compute(self, shards)

    def standalone(self, pieces: Sequence[TableConfig]) -> list[float]:
        """The base model's compute of each piece alone (ms), remembered."""
        todo = [p for p in pieces if piece_key(p) not in self._alone]
        if todo:
            uniq = {piece_key(p): p for p in todo}
            for k, v in zip(uniq, self._base_compute([[p] for p in uniq.values()])):
                self._alone[k] = max(float(v), 1e-9)
        return [self._alone[piece_key(p)] for p in pieces]

    def correction(self, pieces: Sequence[TableConfig]) -> float:
        """The additive correction of a shard (ms): its pieces' standalone costs times their tables'
        corrections."""
        if not self.corrections:
            return 0.0
        return float(sum(w * self.corrections.get(int(p.index), 0.0) for w, p in zip(self.standalone(pieces), pieces)))

    @property
    def comm_scale(self) -> float:
        return math.exp(float(np.mean(self.comm_log_ratios))) if self.comm_log_ratios else 1.0

    def shard_compute(self, shards) -> np.ndarray:
        shards = [list(s) for s in shards]
        out = np.array(self._base_compute(shards), dtype=float)
        if not self.known and not self.corrections:
            return out
        for i, s in enumerate(shards):
            if s:
                out[i] = self.known.get(shard_key(s), out[i] + self.correction(s))
        return np.maximum(out, 0.0)

    def comm_costs(self, dim_sums, extra=None, ids=None) -> np.ndarray:
        return CostModel.comm_costs(self, dim_sums, extra, ids) * self.comm_scale

    def _refit(self) -> None:
        """Per-table corrections ``a`` minimising sum over measured shards of (sum_p w_p a_t(p) -
        residual)^2 + ridge * mean(w^2) * sum_t a_t^2 (``w_p``: a piece's standalone modelled cost)."""
        index = sorted({int(p.index) for pieces, _ in self._observed for p in pieces})
        col = {t: j for j, t in enumerate(index)}
        A = np.zeros((len(self._observed), len(index)))
        y = np.zeros(len(self._observed))
        for i, (pieces, res) in enumerate(self._observed):
            for w, p in zip(self.standalone(pieces), pieces):
                A[i, col[int(p.index)]] += w
            y[i] = res
        lam = self.ridge * float(np.mean(A[A > 0] ** 2)) if (A > 0).any() else 0.0
        lhs = np.vstack([A, math.sqrt(lam) * np.eye(len(index))])
        rhs = np.concatenate([y, np.zeros(len(index))])
        a = np.linalg.lstsq(lhs, rhs, rcond=None)[0]
        self.corrections = {t: float(a[j]) for t, j in col.items()}

    def observe(self, shards: Sequence[Sequence[TableConfig]], device_costs_ms: Sequence[Sequence[float]]) -> None:
        """Learn from one measured plan: ``shards[d]`` and its four measured cost parts."""
        shards = [list(s) for s in shards]
        base = self._base_compute(shards)
        n = len(shards)
        base_comm = CostModel.comm_costs(self, [sum(self.pooled_dim(p) for p in s) for s in shards],
                                         [sum(self.extra_bytes(p, n) for p in s) for s in shards],
                                         [sum(self.id_width(p) for p in s) for s in shards])
        for s, b, bc, c in zip(shards, base, base_comm, device_costs_ms):
            if not s:
                continue
            comp, comm = DeviceCost(*c).compute_ms, DeviceCost(*c).comm_ms
            k = shard_key(s)
            if comp > 0 and k not in self.known:
                self.known[k] = comp
                self._observed.append((s, comp - float(b)))
            if comm > 0 and bc > 0:
                self.comm_log_ratios.append(math.log(comm / bc))
        if self._observed:
            self._refit()


@dataclass
class RefineResult:
    plan: Plan
    name: str
    cost_ms: float
    measured_ms: list
    names: list
    from_cache: int
    model_first_ms: float          # the measured cost of the plain model's first choice


def refine(model: CostModel, oracle, candidates: list[tuple[str, Plan]], k: int, *, budget: Callable[[], WorkBudget],
           types: Sequence[str], stats: SearchStats | None = None,
           search: Callable | None = None) -> RefineResult:
    """Up to ``k`` measurements (see the module notes). ``candidates``: (name, plan), best first by the
    plain model; ``budget()``: a fresh work budget for each round's search; ``search(state, budget,
    types=, stats=)``: the search (default :func:`~shardkit_planner.search.local_search`)."""
    search = search or local_search
    cal = CalibratedModel.around(model)
    pool: dict[tuple, tuple[str, Plan]] = {}
    for name, plan in candidates:
        pool.setdefault(plan_key(plan), (name, plan))
    measured: dict[tuple, tuple[float, str, Plan]] = {}
    order: list[tuple] = []
    from_cache = 0
    for r in range(int(k)):
        todo = [(key, name, plan) for key, (name, plan) in pool.items() if key not in measured]
        if not todo:
            break
        if r == 0:
            key, name, plan = todo[0]          # the plain model's first choice
        else:
            scores = [tuple(State.of(cal, plan).score) for _, _, plan in todo]
            key, name, plan = todo[min(range(len(todo)), key=lambda i: scores[i])]
        pieces = plan.device_pieces
        answer = oracle.evaluate(pieces)
        from_cache += bool(getattr(answer, "from_cache", False))
        measured[key] = (float(answer.cost_ms), name, plan)
        order.append(key)
        cal.observe(pieces, answer.device_costs_ms)
        if r + 1 < k:
            _, best_name, best_plan = min(measured.values(), key=lambda x: x[0])
            st = State.of(cal, best_plan)
            search(st, budget(), types=types, stats=stats)
            new = st.plan()
            pool.setdefault(plan_key(new), (f"{best_name.split('+')[0]}+measured-search", new))
    cost, name, plan = min(measured.values(), key=lambda x: x[0])
    return RefineResult(plan=plan, name=name, cost_ms=cost, measured_ms=[measured[q][0] for q in order],
                        names=[measured[q][1] for q in order], from_cache=from_cache,
                        model_first_ms=measured[order[0]][0])
