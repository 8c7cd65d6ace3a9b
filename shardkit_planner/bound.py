"""A lower bound on the best plan's cost under an emulated card's cost model, proven by a MILP solver.

The emulated oracle prices a plan as its slowest device: the fused kernel of the device's model-parallel
pieces (the card's compute model, :mod:`shardcore.oracles.emulated.emulator`), the kernel of its
replicas, and the exchange (:class:`shardcore.oracles.commmodel.CommModel`). :func:`lower_bound` writes a
mixed-integer program whose optimum is at most the cost of every plan of the space below, so the
solver's proven bound (its optimum, or the best bound it has proven when stopped early) is a lower bound
on the optimum, and every planner's distance to it is at least its distance to the optimum.

**The plan space** (one host; a grid needs hosts): every table whole on any device, column-wise in any
number of blocks of any widths that are multiples of 4 (at most one block per device), row-wise over any
``k`` of the devices (equal row blocks), or replicated on every device.

**Exact parts.** The exchange is linear in the widths each device holds (pooled outputs, input ids,
the replicas' all-reduce) and its per-device maximum of bytes sent and received is an epigraph, so it
enters exactly. Per device and per parameter set of the compute model, the kernel's terms that are sums
over its tables enter exactly (each piece's own share, computed by the model's own feature function on
the piece alone); the kernel's constant, its table count's square and ``n log n`` (tangents at the
integers: exact there), its ``max(1, lookups / 10^k)`` launch terms and its total lookups' ``T log T``
(epigraphs of convex functions of the device's lookups) are exact too.

**Relaxed parts** (each replaced by something no larger, so the bound stays a bound): the terms that
couple a kernel's tables -- the widest table's dim, the sort over the kernel's rows and the hats of its
whole footprint -- take each piece's own value (a kernel's widest dim, rows and footprint are at least
each piece's own; the footprint hats their minimum from there up); a column block's share is the lower
convex hull of its share at every width; a row-wise block is priced and counted in memory as the table's
smallest block. These are looser for kernels of many heavy tables (long histories), where the coupled
terms weigh most.
A piece beyond the card's measured range is priced as the model prices it (its in-range twin plus its
physical extra, :mod:`shardcore.oracles.emulated.domain`).

The solver is HiGHS (``highspy``), single-threaded, with a node limit and a time cap: the bound is proven
whatever stops it; ``status`` says whether the program was solved to optimality.
"""

from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from shardcore.errors import ShardError
from shardcore.oracles.commmodel import ID_ELEMENT_SIZE, OUTPUT_ELEMENT_SIZE, CommModel
from shardcore.oracles.emulated.model import (GpuComputeModel, _distinct_rows, _hat, feature_names, known_cv,
                                              physical_features, replica_features, shard_features)
from shardcore.plan import Plan, batch_slices, column_wise, data_parallel, row_blocks, row_wise, table_wise
from shardcore.tables import DIM_MULTIPLE, TableConfig, bytes_per_element
from shardcore.topology import MEMORY_TOLERANCE_GB, Topology

SPACE = ("one host: tables whole, column-wise in blocks of any widths (multiples of 4, one block per device), "
         "row-wise over any k devices, or replicated")
# what the objective's tie-break weighs: the total of the device costs, so the solver's plan is balanced too
TIE = 1e-4


@dataclass
class BoundResult:
    lower_ms: float                 # proven: no plan of the space costs less under the model
    status: str                     # "optimal" or why the solver stopped ("time limit", "node limit")
    plan: Plan | None               # the solver's best plan (its cost under the full model is an upper bound)
    seconds: float
    nodes: int
    space: str = SPACE
    details: dict = field(default_factory=dict)


def _quiet_highs():
    """A HiGHS instance, its start-up banner (printed by its C++ side on the first instance) kept off stdout."""
    import highspy

    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            h = highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)
    return h


class _Program:
    """A MILP in row form: variables with bounds and integrality, rows ``lo <= a x <= hi``, a linear objective."""

    def __init__(self):
        self.lb, self.ub, self.integer, self.cost = [], [], [], []
        self.rows: list[tuple[float, float, dict]] = []

    def var(self, lb=0.0, ub=math.inf, integer=False, cost=0.0) -> int:
        self.lb.append(lb)
        self.ub.append(ub)
        self.integer.append(integer)
        self.cost.append(cost)
        return len(self.lb) - 1

    def binary(self) -> int:
        return self.var(0.0, 1.0, True)

    def row(self, coefs: dict, lo=-math.inf, hi=math.inf) -> None:
        self.rows.append((lo, hi, {k: v for k, v in coefs.items() if v != 0.0}))

    def solve(self, time_limit: float, node_limit: int):
        import highspy

        h = _quiet_highs()
        h.setOptionValue("output_flag", False)
        h.setOptionValue("threads", 1)
        h.setOptionValue("random_seed", 0)
        h.setOptionValue("time_limit", float(time_limit))
        h.setOptionValue("mip_max_nodes", int(node_limit))
        h.setOptionValue("mip_rel_gap", 1e-6)
        inf = highspy.kHighsInf
        n = len(self.lb)
        h.addVars(n, np.array([max(v, -inf) for v in self.lb]), np.array([min(v, inf) for v in self.ub]))
        h.changeColsCost(n, np.arange(n, dtype=np.int32), np.asarray(self.cost, dtype=float))
        ints = np.array([i for i, b in enumerate(self.integer) if b], dtype=np.int32)
        if len(ints):
            h.changeColsIntegrality(len(ints), ints, np.full(len(ints), highspy.HighsVarType.kInteger))
        starts, idx, val, lo, hi = [], [], [], [], []
        for rlo, rhi, coefs in self.rows:
            starts.append(len(idx))
            idx.extend(coefs)
            val.extend(coefs.values())
            lo.append(max(rlo, -inf))
            hi.append(min(rhi, inf))
        h.addRows(len(self.rows), np.asarray(lo, float), np.asarray(hi, float), len(idx),
                  np.asarray(starts, np.int32), np.asarray(idx, np.int32), np.asarray(val, float))
        h.run()
        return h


def _feature_index(spec) -> dict:
    return {name: i for i, name in enumerate(feature_names(spec))}


def piece_terms(compute: GpuComputeModel, pieces: Sequence[TableConfig], batch: int, precision: str,
                cv_of: Callable | None = None) -> dict:
    """Per piece (each priced as a kernel of its own) the additive shares of the kernel cost that
    :func:`lower_bound` sums over a device (see the module notes): ``add[s]`` ``[pieces, 2]`` (forward,
    backward) of parameter set ``s``, ``lookups[s]`` (the launch terms' lookups), and ``extra``
    ``[pieces, 2]`` (the physical extra beyond the measured range); plus the kernel-level weights of each
    set: ``const``, ``tables_sq``, ``tables_log``, ``lookups_log`` (the kernel's ``T log2 T / 30``), ``floor``
    ``{10^k: [fw, bw]}``."""
    if compute.spec.get("family") == "cpu":
        raise ShardError("the lower bound prices an emulated GPU's model; a CPU model has other coupled terms")
    spec = compute.spec
    names = _feature_index(spec)
    bpw = compute.bytes_per_weight(precision)
    cv_of = cv_of or (lambda t: known_cv(compute._known, t, math.nan))
    shards = [[p] for p in pieces]
    ta, shard_of = compute._arrays(shards, [[cv_of(p)] for p in pieces])
    dom = compute.domain
    extra = np.zeros((len(pieces), 2))
    if dom is not None and len(pieces):
        inside = dom.clip(ta)
        diff = (physical_features(ta.row, ta.pf, ta.dim, _distinct_rows(ta, float(batch) * ta.pf), shard_of,
                                  len(pieces), batch, bpw)
                - physical_features(inside.row, inside.pf, inside.dim, _distinct_rows(inside, float(batch) * inside.pf),
                                    shard_of, len(pieces), batch, bpw))
        out = dom.outside(ta.row, ta.pf, ta.dim)
        extra = np.where(out[:, None], np.maximum(diff, 0.0) @ compute.measured.physical_weights(compute.card).T, 0.0)
        ta = inside
    kernel_cols = [names["const"], names.get("tables_sq"), names.get("tables_x_log2"), names.get("shard_lookups_x_log2")]
    floor_cols = [(name, i) for name, i in names.items() if name.startswith("floor_lookups1e")]
    sfp_cols = [i for name, i in names.items() if name.startswith("lookups_shard_fp1e")]
    out = {"add": [], "lookups": [], "const": [], "tables_sq": [], "tables_log": [], "lookups_log": [], "floor": [],
           "extra": extra}
    for i, b in enumerate(compute.batches):
        at = compute.set_batch(i, batch)
        X = shard_features(ta, shard_of, len(pieces), at, spec, bpw)
        W = np.stack(compute.weights[b])            # [2, F]
        add = X.copy()
        for c in kernel_cols:
            if c is not None:
                add[:, c] = 0.0
        for _, c in floor_cols:
            add[:, c] = 0.0
        add[:, sfp_cols] = 0.0
        share = add @ W.T                            # [pieces, 2]
        if sfp_cols:   # the kernel's footprint hats: their minimum from the piece's own footprint up
            knots = np.asarray(spec["shard_footprint_knots"], dtype=float)
            L = X[:, names["lookups"]]
            rb = np.ceil(ta.dim * float(bpw) / 32.0) * 32.0
            own = np.log10(np.maximum(_distinct_rows(ta, float(at) * ta.pf) * rb, 1.0))
            for j in range(2):
                w = W[j, sfp_cols]
                at_own = _hat(own, knots) @ w
                above = np.array([min([at_own[p]] + [w[k] for k in range(len(knots)) if knots[k] >= own[p]])
                                  for p in range(len(pieces))])
                share[:, j] += L * above
        out["add"].append(share)
        out["lookups"].append(X[:, names["lookups"]])
        out["const"].append(W[:, names["const"]])
        out["tables_sq"].append(W[:, names["tables_sq"]] if "tables_sq" in names else np.zeros(2))
        out["tables_log"].append(W[:, names["tables_x_log2"]] if "tables_x_log2" in names else np.zeros(2))
        out["lookups_log"].append(W[:, names["shard_lookups_x_log2"]] if "shard_lookups_x_log2" in names
                                  else np.zeros(2))
        out["floor"].append({10.0 ** float(name[len("floor_lookups1e"):]): W[:, c] for name, c in floor_cols})
    return out


def _lower_hull(xs: np.ndarray, ys: np.ndarray) -> list[tuple[float, float]]:
    """``(intercept, slope)`` of the edges of the lower convex hull of the points (one line for one
    point): each line lies below every point, so the largest of them at ``x`` is a bound from below."""
    pts = sorted(zip(xs.tolist(), ys.tolist()))
    hull: list = []
    for p in pts:
        while len(hull) >= 2 and (hull[-1][0] - hull[-2][0]) * (p[1] - hull[-2][1]) \
                - (hull[-1][1] - hull[-2][1]) * (p[0] - hull[-2][0]) <= 0:
            hull.pop()
        hull.append(p)
    if len(hull) == 1:
        return [(hull[0][1], 0.0)]
    out = []
    for (x0, y0), (x1, y1) in zip(hull, hull[1:]):
        slope = (y1 - y0) / (x1 - x0)
        out.append((y0 - slope * x0, slope))
    return out


@dataclass
class _Table:
    """One table's shares of a device's cost, per option (see :func:`lower_bound`)."""

    pos: int
    integral: bool
    cw_lines: list          # per set s, phase j: [(intercept, slope)] of a column block's compute in its width
    cw_lookups: list        # per set s: a block's lookups (each block looks up every id)
    rw: dict                # k -> {"add": [s][j], "lookups": [s], "mem", "ids"}
    whole: dict             # the fluid (fractional) coefficients of the whole table
    dp_ok: bool


def lower_bound(tables: Sequence[TableConfig], topology: Topology, compute: GpuComputeModel, comm: CommModel,
                batch_size: int, *, cv_of: Callable | None = None, time_limit_s: float = 60.0,
                node_limit: int = 20000, replicate_max_gb: float | None = None,
                integral_tables: int = 32) -> BoundResult:
    """The bound of the module notes for ``tables`` on ``topology`` (``replicate_max_gb``: the largest
    table the space replicates; default any that fits every device). The ``integral_tables`` tables of
    the largest standalone cost are placed as integers; the others are *fluid*: any share of each on any
    device, at a share of the least a whole table costs in any of its forms (a relaxation of every plan:
    it keeps the bound a bound, and the program small on tasks of hundreds of tables)."""
    t0 = time.perf_counter()
    tables = list(tables)
    n, cap, precision = topology.ndevices, topology.max_memory_gb, topology.precision
    if comm.hosts(n) > 1:
        raise ShardError("the lower bound covers one host (its exchange is one level); "
                         f"{n} devices on hosts of {comm.devices_per_host} span {comm.hosts(n)}")
    B = int(batch_size)
    bpe = bytes_per_element(precision) / float(1 << 30)
    slices = batch_slices(B, n)
    nsets = len(compute.batches)
    # -- every piece a table may become, priced alone -------------------------------------------------
    cw, rw = [], []
    for pos, t in enumerate(tables):
        cw.extend((pos, w) for w in range(DIM_MULTIPLE, t.dim + 1, DIM_MULTIPLE))
        rw.extend((pos, k) for k in range(2, n + 1))

    def rw_piece(pos, k):
        t = tables[pos]
        rows = min(row_blocks(t.row, k))
        return TableConfig(t.index, max(rows, 1), t.dim, t.pooling_factor * rows / t.row, t.bins, t.length_cv)

    pieces = [tables[pos].with_dim(w) for pos, w in cw] + [rw_piece(pos, k) for pos, k in rw]
    terms = piece_terms(compute, pieces, B, precision, cv_of)
    share = [terms["add"][s] + terms["extra"] for s in range(nsets)]          # [s][piece, phase]
    alone = np.array([share[-1][cw.index((pos, t.dim))].sum() for pos, t in enumerate(tables)])
    order = sorted(range(len(tables)), key=lambda p: (-alone[p] - 1e3 * tables[p].memory_gb(precision), p))
    integral = set(order[:integral_tables])
    info: list[_Table] = []
    for pos, t in enumerate(tables):
        ws = np.arange(DIM_MULTIPLE, t.dim + 1, DIM_MULTIPLE, dtype=float)
        idx = [cw.index((pos, int(w))) for w in ws]
        lines = [[_lower_hull(ws, share[s][idx, j]) for j in (0, 1)] for s in range(nsets)]
        cw_look = [float(terms["lookups"][s][idx[0]]) for s in range(nsets)]
        rwd = {}
        for k in range(2, n + 1):
            j = len(cw) + rw.index((pos, k))
            rwd[k] = {"add": [share[s][j] for s in range(nsets)], "lookups": [float(terms["lookups"][s][j])
                                                                             for s in range(nsets)],
                      "mem": pieces[j].row * t.dim * bpe, "ids": pieces[j].pooling_factor + 1.0}
        # a whole table's least cost over its forms, per unit share (fluid tables)
        full = share[-1][idx[-1]]
        whole = {"add": [np.minimum.reduce([share[s][idx[-1]]] + [share[s][i] * (t.dim / w) for i, w in zip(idx, ws)]
                                           + [k * rwd[k]["add"][s] for k in rwd]) for s in range(nsets)],
                 "lookups": [min([cw_look[s]] + [k * rwd[k]["lookups"][s] for k in rwd]) for s in range(nsets)],
                 "mem": min([t.memory_gb(precision)] + [k * rwd[k]["mem"] for k in rwd]),
                 "ids": min([t.pooling_factor + 1.0] + [k * rwd[k]["ids"] for k in rwd])}
        del full
        dp_ok = n > 1 and t.memory_gb(precision) <= min(cap, replicate_max_gb if replicate_max_gb is not None
                                                          else cap) + MEMORY_TOLERANCE_GB
        info.append(_Table(pos, pos in integral, lines, cw_look, rwd, whole, dp_ok))
    w_rep = compute.replica_weights if any(ti.dp_ok for ti in info) else None
    if any(ti.dp_ok for ti in info) and w_rep is None:
        raise ShardError("the lower bound needs the card's replica law (too few replica devices measured)")
    # -- the program ----------------------------------------------------------------------------------
    P = _Program()
    Z = P.var(cost=1.0)
    any_mp, any_dp = P.binary(), P.binary()
    ms_per_byte = 1e3 / (comm.bandwidth_gbps * 1e9)
    lat = comm.latency_us * 1e-3
    # per device, the expressions every term adds to: {var: coef}
    dev = [{"mem": {}, "width": {}, "ids": {}, "count": {}, "lookups": [{} for _ in range(nsets)],
            "add": [[{}, {}] for _ in range(nsets)], "on": []} for _ in range(n)]
    blocks = {}    # (pos, d) -> (y, omega, [block cost vars per s, j])
    rws = {}       # (pos, k) -> (selector, [per device binaries])
    fluid = {}     # (pos, d) -> share
    sel_cw, sel_dp = {}, {}

    def add(d, key, var, coef, s=None, j=None):
        tgt = dev[d][key] if s is None else (dev[d][key][s] if j is None else dev[d][key][s][j])
        tgt[var] = tgt.get(var, 0.0) + coef

    for ti in info:
        t = tables[ti.pos]
        choose = {}
        if ti.dp_ok:
            sel_dp[ti.pos] = v = P.binary()
            choose[v] = 1.0
            P.row({any_dp: 1.0, v: -1.0}, lo=0.0)
        if not ti.integral:
            shares = [P.var(0.0, 1.0) for _ in range(n)]
            P.row({**{v: 1.0 for v in shares}, **choose}, lo=1.0, hi=1.0)
            for d, v in enumerate(shares):
                fluid[(ti.pos, d)] = v
                add(d, "mem", v, ti.whole["mem"])
                add(d, "width", v, float(t.dim))
                add(d, "ids", v, ti.whole["ids"])
                add(d, "count", v, 1.0)
                dev[d]["on"].append(v)
                for s in range(nsets):
                    add(d, "lookups", v, ti.whole["lookups"][s], s)
                    for j in (0, 1):
                        add(d, "add", v, float(ti.whole["add"][s][j]), s, j)
                P.row({any_mp: 1.0, v: -1.0}, lo=0.0)
            continue
        sel_cw[ti.pos] = c = P.binary()
        choose[c] = 1.0
        omegas = {}
        for d in range(n):
            y, om = P.binary(), P.var(0.0, float(t.dim))
            P.row({y: 1.0, c: -1.0}, hi=0.0)
            P.row({om: 1.0, y: -float(t.dim)}, hi=0.0)
            P.row({om: 1.0, y: -float(DIM_MULTIPLE)}, lo=0.0)
            omegas[om] = 1.0
            P.row({any_mp: 1.0, y: -1.0}, lo=0.0)
            cvars = []
            for s in range(nsets):
                row = []
                for j in (0, 1):
                    cv = P.var()
                    for a, b in ti.cw_lines[s][j]:
                        P.row({cv: 1.0, y: -a, om: -b}, lo=0.0)
                    add(d, "add", cv, 1.0, s, j)
                    row.append(cv)
                cvars.append(row)
                add(d, "lookups", y, ti.cw_lookups[s], s)
            add(d, "mem", om, t.row * bpe)
            add(d, "width", om, 1.0)
            add(d, "ids", y, t.pooling_factor + 1.0)
            add(d, "count", y, 1.0)
            dev[d]["on"].append(y)
            blocks[(ti.pos, d)] = (y, om, cvars)
        P.row({**omegas, c: -float(t.dim)}, lo=0.0, hi=0.0)
        for k, r in ti.rw.items():
            sel = P.binary()
            choose[sel] = 1.0
            on = [P.binary() for _ in range(n)]
            P.row({**{v: 1.0 for v in on}, sel: -float(k)}, lo=0.0, hi=0.0)
            for d, v in enumerate(on):
                P.row({any_mp: 1.0, v: -1.0}, lo=0.0)
                add(d, "mem", v, r["mem"])
                add(d, "width", v, float(t.dim))
                add(d, "ids", v, r["ids"])
                add(d, "count", v, 1.0)
                dev[d]["on"].append(v)
                for s in range(nsets):
                    add(d, "lookups", v, r["lookups"][s], s)
                    for j in (0, 1):
                        add(d, "add", v, float(r["add"][s][j]), s, j)
            rws[(ti.pos, k)] = (sel, on)
        P.row(choose, lo=1.0, hi=1.0)
    # -- the exchange, shared by every device ---------------------------------------------------------
    W_tot, P_tot = {}, {}
    for d in range(n):
        for v, c in dev[d]["width"].items():
            W_tot[v] = W_tot.get(v, 0.0) + c
        for v, c in dev[d]["ids"].items():
            P_tot[v] = P_tot.get(v, 0.0) + c
    ar = P.var()
    if n > 1:
        ring = {v: 2.0 * (n - 1) / n * tables[pos].row * tables[pos].dim * bytes_per_element(precision) * ms_per_byte
                for pos, v in sel_dp.items()}
        P.row({ar: 1.0, any_dp: -lat, **{v: -c for v, c in ring.items()}}, lo=0.0)
    tang = sorted({a for a in (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768)
                   if a <= max(1, len(tables))})
    costs = []
    for d in range(n):
        D = dev[d]
        P.row({**D["mem"], **{v: tables[pos].memory_gb(precision) for pos, v in sel_dp.items()}}, hi=cap)
        u = P.binary()
        for v in D["on"]:
            P.row({u: 1.0, v: -1.0}, lo=0.0)
        Q, R = P.var(), P.var()
        for a in tang:   # tangents of N^2 / 100 and N log2(N + 1) at the integers a
            P.row({Q: 1.0, **{v: -c * 2.0 * a / 100.0 for v, c in D["count"].items()}}, lo=-a * a / 100.0)
            f, df = a * math.log2(a + 1), math.log2(a + 1) + a / ((a + 1) * math.log(2))
            P.row({R: 1.0, **{v: -c * df for v, c in D["count"].items()}}, lo=f - df * a)
        kern = []
        tlog = [_lookups_log(P, D["lookups"][s]) for s in range(nsets)]
        for phase in (0, 1):
            k_ = P.var()
            for s in range(nsets):
                coef = {k_: 1.0, u: -terms["const"][s][phase], Q: -terms["tables_sq"][s][phase],
                        R: -terms["tables_log"][s][phase], tlog[s]: -terms["lookups_log"][s][phase]}
                for v, c in D["add"][s][phase].items():
                    coef[v] = coef.get(v, 0.0) - c
                for scale, wgt in terms["floor"][s].items():
                    F = P.var()
                    P.row({F: 1.0, u: -1.0}, lo=0.0)
                    P.row({F: 1.0, **{v: -c / scale for v, c in D["lookups"][s].items()}}, lo=0.0)
                    coef[F] = coef.get(F, 0.0) - wgt[phase]
                P.row(coef, lo=0.0)
            kern.append(k_)
        cost = {kern[0]: 1.0, kern[1]: 1.0}
        if sel_dp:   # the replicas' kernel over the device's slice
            for phase in (0, 1):
                cost[any_dp] = cost.get(any_dp, 0.0) + float(w_rep[phase][0])
                for pos, v in sel_dp.items():
                    f = replica_features([[tables[pos]]], slices[d], bytes_per_element(precision))[0]
                    cost[v] = cost.get(v, 0.0) + float(f[1:] @ w_rep[phase][1:])
        if n > 1:   # pooled outputs both ways, the input ids, the replicas' all-reduce
            pool, ids = P.var(), P.var()
            sent = {v: OUTPUT_ELEMENT_SIZE * c * (B - slices[d]) * ms_per_byte for v, c in D["width"].items()}
            recv = {v: OUTPUT_ELEMENT_SIZE * slices[d] * c * ms_per_byte for v, c in W_tot.items()}
            for v, c in D["width"].items():
                recv[v] -= OUTPUT_ELEMENT_SIZE * slices[d] * c * ms_per_byte
            P.row({pool: 1.0, any_mp: -lat, **{v: -c for v, c in sent.items()}}, lo=0.0)
            P.row({pool: 1.0, any_mp: -lat, **{v: -c for v, c in recv.items()}}, lo=0.0)
            isent = {v: ID_ELEMENT_SIZE * slices[d] * c * ms_per_byte for v, c in P_tot.items()}
            for v, c in D["ids"].items():
                isent[v] -= ID_ELEMENT_SIZE * slices[d] * c * ms_per_byte
            irecv = {v: ID_ELEMENT_SIZE * (B - slices[d]) * c * ms_per_byte for v, c in D["ids"].items()}
            P.row({ids: 1.0, any_mp: -lat, **{v: -c for v, c in isent.items()}}, lo=0.0)
            P.row({ids: 1.0, any_mp: -lat, **{v: -c for v, c in irecv.items()}}, lo=0.0)
            cost[pool] = 2.0
            cost[ids] = 1.0
            cost[ar] = 1.0
        C = P.var(cost=TIE / n)
        P.row({C: 1.0, **{v: -c for v, c in cost.items()}}, lo=0.0)
        P.row({Z: 1.0, C: -1.0}, lo=0.0)
        costs.append(C)
    if len(set(slices)) == 1:   # identical devices: some optimum has its device costs in decreasing order
        for a, b in zip(costs, costs[1:]):
            P.row({a: 1.0, b: -1.0}, lo=0.0)
    _average_device(P, Z, dev, terms, nsets, n, B, slices, tang, lat, ms_per_byte, any_mp, any_dp, ar, sel_dp,
                    tables, precision, w_rep, W_tot, P_tot)
    h = P.solve(time_limit_s, node_limit)
    hinfo = h.getInfo()
    status = h.modelStatusToString(h.getModelStatus())
    # the tie-break adds at most TIE x the mean device cost <= TIE x Z to the objective: taken off the bound
    lower = float(hinfo.mip_dual_bound) / (1.0 + TIE)
    plan = None
    if hinfo.primal_solution_status == 2 and not fluid:   # a plan of integers only: the solver's own
        val = np.asarray(h.getSolution().col_value)
        plan = _plan_of(val, tables, topology, blocks, rws, sel_cw, sel_dp)
        if plan is not None and not plan.feasible:   # widths rounded past the cap
            plan = None
    return BoundResult(lower_ms=max(lower, 0.0), status="optimal" if status == "Optimal" else status.lower(),
                       plan=plan, seconds=time.perf_counter() - t0, nodes=int(hinfo.mip_node_count),
                       details={"variables": len(P.lb), "rows": len(P.rows), "gap": float(hinfo.mip_gap),
                                "integral_tables": len(integral), "fluid_tables": len(tables) - len(integral)})


def _average_device(P, Z, dev, terms, nsets, n, B, slices, tang, lat, ms_per_byte, any_mp, any_dp, ar, sel_dp,
                    tables, precision, w_rep, W_tot, P_tot) -> None:
    """``Z`` at least the average device that holds a model-parallel piece (the slowest is no cheaper),
    each kernel's constant counted whole: its kernel terms at the devices' means (their launch maxima and
    the count's square are convex: their mean is at least their value at the mean), its sums over pieces
    divided by the devices, its pooled outputs and ids sent at the mean width over its batch slice (every
    piece is on some device, and a device without one sends nothing). The per-device rows alone let a
    relaxation spread a kernel's constant thinly over every device; this row does not."""
    def total(key, s=None, j=None):
        out: dict = {}
        for D in dev:
            tgt = D[key] if s is None else (D[key][s] if j is None else D[key][s][j])
            for v, c in tgt.items():
                out[v] = out.get(v, 0.0) + c / n
        return out

    count = total("count")
    Q, R = P.var(), P.var()
    for a in tang:
        P.row({Q: 1.0, **{v: -c * 2.0 * a / 100.0 for v, c in count.items()}}, lo=-a * a / 100.0)
        f, df = a * math.log2(a + 1), math.log2(a + 1) + a / ((a + 1) * math.log(2))
        P.row({R: 1.0, **{v: -c * df for v, c in count.items()}}, lo=f - df * a)
    cost: dict = {}
    tlog = [_lookups_log(P, total("lookups", s)) for s in range(nsets)]
    for phase in (0, 1):
        k_ = P.var()
        for s in range(nsets):
            coef = {k_: 1.0, any_mp: -terms["const"][s][phase], Q: -terms["tables_sq"][s][phase],
                    R: -terms["tables_log"][s][phase], tlog[s]: -terms["lookups_log"][s][phase]}
            for v, c in total("add", s, phase).items():
                coef[v] = coef.get(v, 0.0) - c
            look = total("lookups", s)
            for scale, wgt in terms["floor"][s].items():
                F = P.var()
                P.row({F: 1.0, any_mp: -1.0}, lo=0.0)
                P.row({F: 1.0, **{v: -c / scale for v, c in look.items()}}, lo=0.0)
                coef[F] = coef.get(F, 0.0) - wgt[phase]
            P.row(coef, lo=0.0)
        cost[k_] = 1.0
    if sel_dp:
        small = min(slices)
        for phase in (0, 1):
            cost[any_dp] = cost.get(any_dp, 0.0) + float(w_rep[phase][0])
            for pos, v in sel_dp.items():
                f = replica_features([[tables[pos]]], small, bytes_per_element(precision))[0]
                cost[v] = cost.get(v, 0.0) + float(f[1:] @ w_rep[phase][1:])
    if n > 1:
        pool, ids = P.var(), P.var()
        out = OUTPUT_ELEMENT_SIZE * (B - max(slices)) / n * ms_per_byte
        P.row({pool: 1.0, any_mp: -lat, **{v: -c * out for v, c in W_tot.items()}}, lo=0.0)
        back = ID_ELEMENT_SIZE * (B - max(slices)) / n * ms_per_byte
        P.row({ids: 1.0, any_mp: -lat, **{v: -c * back for v, c in P_tot.items()}}, lo=0.0)
        cost[pool] = 2.0
        cost[ids] = 1.0
        cost[ar] = 1.0
    P.row({Z: 1.0, **{v: -c for v, c in cost.items()}}, lo=0.0)


LOOKUP_TANGENTS = [2.0 ** k for k in range(1, 37)]


def _lookups_log(P, lookups: dict) -> int:
    """A variable at least ``T log2 max(T, 2) / 30`` of the kernel's lookups ``T`` (``lookups``: var ->
    coefficient): tangents of that convex function at powers of two (exact between them to within the curve)."""
    Y = P.var()
    for a in LOOKUP_TANGENTS:
        f, df = a * math.log2(a) / 30.0, (math.log2(a) + 1.0 / math.log(2)) / 30.0
        P.row({Y: 1.0, **{v: -c * df for v, c in lookups.items()}}, lo=f - df * a)
    return Y


def _plan_of(val, tables, topology, blocks, rws, sel_cw, sel_dp) -> Plan | None:
    """The solver's plan (widths rounded to multiples of 4 summing to the dim); None where a block's width
    does not round to a valid one."""
    shardings, n = [], topology.ndevices
    for pos, t in enumerate(tables):
        if pos in sel_dp and val[sel_dp[pos]] > 0.5:
            shardings.append(data_parallel(n))
        elif pos in sel_cw and val[sel_cw[pos]] > 0.5:
            parts = [(d, val[blocks[(pos, d)][1]]) for d in range(n) if val[blocks[(pos, d)][0]] > 0.5]
            units = [int(round(w / DIM_MULTIPLE)) for _, w in parts]
            units[int(np.argmax(units))] += t.dim // DIM_MULTIPLE - sum(units)
            if min(units) < 1:
                return None
            got = [(d, u * DIM_MULTIPLE) for (d, _), u in zip(parts, units)]
            shardings.append(table_wise(got[0][0]) if len(got) == 1 else column_wise(got))
        else:
            k, devs = next((k, [d for d, v in enumerate(on) if val[v] > 0.5]) for (p, k), (sel, on) in rws.items()
                           if p == pos and val[sel] > 0.5)
            shardings.append(row_wise(devs))
    return Plan(tables, shardings, topology)
