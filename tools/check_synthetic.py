#!/usr/bin/env python
"""Check (and re-fit) the calibration of the synthetic DLRM data against the published statistics.

    python tools/check_synthetic.py --batch-size 65536            # generate and measure (~8 GB RAM)
    python tools/check_synthetic.py --expected --seeds 0,1,2,3    # closed-form expectation, seconds
    python tools/check_synthetic.py --fit --seeds 0,1,2,3,4,5     # re-fit the shape parameters

Measuring generates the raw data exactly as tools/gen_dlrm_data.py does and computes the reuse
counts table by table (it keeps no int32 copies). The expected histograms treat each row's count as
Poisson(lam) with lam = lookups x the row's probability; rows are grouped into log-spaced rank buckets
and their lam onto a fine log grid, so a population of 856 tables takes well under a second. The fit
minimises, with Adam, the deviation of the expected histograms (both: by lookups and by distinct
rows) from the published ones over the exponent / head parameters of shardcore.data.dlrm.SYNTHETIC_PARAMS.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from typing import Sequence

import numpy as np
import torch


from shardcore.data import dlrm
from shardcore.argtypes import int_list, positive_int, seed_int
from shardcore.cli.common import run_main
from shardcore.oracles.factory import batch_size_int
from shardcore.tables import NUM_BINS
from shardcore.cli.common import ArgumentParser as OneLineParser

PUB_L = np.array(dlrm.PUBLISHED_REUSE_BY_LOOKUPS)
PUB_R = np.array(dlrm.PUBLISHED_REUSE_BY_ROWS)

# ---------------------------------------------------------------------------------------------
# Expected histograms
# ---------------------------------------------------------------------------------------------
GRID = np.exp(np.linspace(math.log(1e-9), math.log(1e9), 6001))   # expected counts lam
LOG_G0 = math.log(GRID[0])
DLOG = math.log(GRID[1]) - LOG_G0


def _poisson_bin_matrices() -> tuple[np.ndarray, np.ndarray]:
    """``rows[k, j]``: P(Poisson(GRID[j]) in bin k); ``looks[k, j]``: E[C; C in bin k]."""
    lam = torch.tensor(GRID, dtype=torch.float64)

    def cdf(m: int) -> torch.Tensor:  # P(C <= m) = Q(m + 1, lam)
        if m < 0:
            return torch.zeros_like(lam)
        return torch.special.gammaincc(torch.full_like(lam, m + 1.0), lam)

    rows, looks = [], []
    prev_r, prev_l = cdf(0), torch.zeros_like(lam)
    for k in range(NUM_BINS - 1):
        hi = 1 << k
        cur_r, cur_l = cdf(hi), cdf(hi - 1)      # E[C; C <= m] = lam P(C <= m - 1)
        rows.append(cur_r - prev_r)
        looks.append(lam * (cur_l - prev_l))
        prev_r, prev_l = cur_r, cur_l
    rows.append(1 - prev_r)
    looks.append(lam * (1 - prev_l))
    return torch.stack(rows).numpy(), torch.stack(looks).numpy()


M_ROWS, M_LOOKS = _poisson_bin_matrices()


def rank_buckets(row: int, exact: int = 300, ratio: float = 1.02) -> tuple[np.ndarray, np.ndarray]:
    """1-based rank buckets ``[lo, hi]`` covering 1..row: single ranks first, then log-spaced."""
    if row <= exact:
        k = np.arange(1, row + 1, dtype=np.float64)
        return k, k
    n = int(math.ceil(math.log(row / exact) / math.log(ratio)))
    edges = np.unique(np.floor(exact * ratio ** np.arange(n + 1)).astype(np.int64))
    edges = np.append(edges[edges < row], row)
    single = np.arange(1, exact + 1, dtype=np.float64)
    return (np.concatenate([single, edges[:-1] + 1.0]), np.concatenate([single, edges[1:] * 1.0]))


def _power_law_mass(lo_rank, hi_rank, row, s, q, xp=np):
    """P(lo_rank <= rank <= hi_rank) under density ~ x ** -s on [1 + q, row + 1 + q)."""
    a = 1.0 - s
    a = xp.where(xp.abs(a) < 1e-7, xp.full_like(a, 1e-7), a) if xp is torch else (1e-7 if abs(a) < 1e-7 else a)
    A, Bk = lo_rank + q, hi_rank + 1.0 + q
    lo, hi = 1.0 + q, row + 1.0 + q
    return xp.exp(a * xp.log(A / lo)) * xp.expm1(a * xp.log(Bk / A)) / xp.expm1(a * xp.log(hi / lo))


def _grid_weights(lam: np.ndarray, count: np.ndarray) -> np.ndarray:
    lam = np.clip(lam, GRID[0], GRID[-1])
    j = np.clip(np.rint((np.log(lam) - LOG_G0) / DLOG).astype(np.int64), 0, len(GRID) - 1)
    return np.bincount(j, weights=count, minlength=len(GRID))


def expected_histograms(specs: Sequence[dlrm.SyntheticTable], batch_size: int) -> tuple[np.ndarray, np.ndarray, float]:
    """Expected aggregate ``(by_lookups, by_rows, distinct_rows)`` of a synthetic population."""
    w = np.zeros(len(GRID))
    for t in specs:
        n = t.pooling_factor * batch_size
        if n <= 0:
            continue
        lo, hi = rank_buckets(t.row)
        p = _power_law_mass(lo, hi, t.row, t.exponent, t.head_offset)
        cnt = hi - lo + 1
        lam = n * (t.head * p / cnt + (1.0 - t.head) / t.row)
        w += _grid_weights(lam, cnt)
    rows, looks = M_ROWS @ w, M_LOOKS @ w
    return looks / looks.sum(), rows / rows.sum(), float(rows.sum())


# ---------------------------------------------------------------------------------------------
# Fit (torch, differentiable in the exponent / head parameters)
# ---------------------------------------------------------------------------------------------
FIT_KEYS = ("exp_knots", "exp_per_log_pool", "exp_spread", "head_knots", "head_per_log_pool",
            "head_spread", "head_offset")


class _Population:
    def __init__(self, num_tables: int, seed: int, params: dict, batch_size: int):
        self.draws = dlrm._spec_draws(num_tables, seed, params)
        self.pool = dlrm._pooling(self.draws, params)
        self.rows = self.draws["rows"]
        lo, hi, tid = [], [], []
        for t, r in enumerate(self.rows):
            a, b = rank_buckets(int(r), exact=100, ratio=1.05)
            lo.append(a), hi.append(b), tid.append(np.full(len(a), t))
        self.lo, self.hi = torch.tensor(np.concatenate(lo)), torch.tensor(np.concatenate(hi))
        self.tid = torch.tensor(np.concatenate(tid))
        self.cnt = self.hi - self.lo + 1
        self.n = torch.tensor(self.pool * batch_size)
        self.d = torch.tensor(self.draws["decades"])
        self.log_pool = torch.tensor(np.log(np.maximum(self.pool, 1e-3)) - 2.0)
        self.u_exp = torch.tensor(self.draws["u_exp"])
        self.u_head = torch.tensor(self.draws["u_head"])
        self.knots = params["knots"]

    def _interp(self, values: torch.Tensor) -> torch.Tensor:
        k = torch.tensor(self.knots, dtype=torch.float64)
        d = self.d.clamp(k[0], k[-1])
        i = (torch.searchsorted(k, d, right=True) - 1).clamp(0, len(k) - 2)
        f = (d - k[i]) / (k[i + 1] - k[i])
        return values[i] * (1 - f) + values[i + 1] * f

    def histograms(self, P: dict) -> tuple[torch.Tensor, torch.Tensor]:
        s = (self._interp(P["exp_knots"]) + P["exp_per_log_pool"] * self.log_pool
             + P["exp_spread"] * (2 * self.u_exp - 1)).clamp(0.0, 3.0)
        h = torch.sigmoid(self._interp(P["head_knots"]) + P["head_per_log_pool"] * self.log_pool
                          + P["head_spread"] * (2 * self.u_head - 1))
        rows = torch.tensor(self.rows, dtype=torch.float64)[self.tid]
        p = _power_law_mass(self.lo, self.hi, rows, s[self.tid], P["head_offset"], xp=torch)
        lam = self.n[self.tid] * (h[self.tid] * p / self.cnt + (1 - h[self.tid]) / rows)
        keep = (self.n[self.tid] > 0).to(torch.float64)
        pos = (torch.log(lam.clamp(GRID[0] * 1.0001, GRID[-1] * 0.999)) - LOG_G0) / DLOG
        j = torch.floor(pos.detach()).long()
        f = pos - j
        c = self.cnt * keep
        w = torch.zeros(len(GRID), dtype=torch.float64).scatter_add(0, j, c * (1 - f)).scatter_add(0, j + 1, c * f)
        r, l = torch.tensor(M_ROWS) @ w, torch.tensor(M_LOOKS) @ w
        return l / l.sum(), r / r.sum()


def fit(seeds: Sequence[int], iters: int, num_tables: int, batch_size: int, lr: float = 0.01) -> dict:
    torch.set_num_threads(1)  # many small ops: OpenMP threads only add overhead
    base = dict(dlrm.SYNTHETIC_PARAMS)
    pops = [_Population(num_tables, s, base, batch_size) for s in seeds]
    P = {k: torch.tensor(base[k], dtype=torch.float64, requires_grad=True) for k in FIT_KEYS}
    opt = torch.optim.Adam(list(P.values()), lr=lr)
    pl, pr = torch.tensor(PUB_L), torch.tensor(PUB_R)
    for it in range(iters):
        loss = torch.zeros((), dtype=torch.float64)
        for pop in pops:
            l, r = pop.histograms(P)
            dl, dr = l - pl, r - pr   # an 8-norm stands in for the max deviation
            loss = loss + 20 * (dl.abs() ** 8).sum() ** 0.25 + (dl ** 2).sum() + (dr ** 2).sum() \
                + 3 * (dr.abs() ** 8).sum() ** 0.25
        ek, hk = P["exp_knots"], P["head_knots"]   # mild smoothness and size penalties
        loss = loss + 2e-4 * ((ek[2:] - 2 * ek[1:-1] + ek[:-2]) ** 2).sum() \
            + 2e-5 * ((hk[2:] - 2 * hk[1:-1] + hk[:-2]) ** 2).sum() \
            + 1e-4 * (P["head_per_log_pool"] ** 2 + P["exp_per_log_pool"] ** 2)
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.no_grad():
            for k in ("head_offset", "exp_spread", "head_spread"):
                P[k].clamp_(min=0.0)
        if it % 100 == 0 or it == iters - 1:
            print(f"iteration {it}: loss {loss.item():.5f}", flush=True)
    return {k: [round(x, 3) for x in v.tolist()] if v.dim() else round(v.item(), 3) for k, v in P.items()}


# ---------------------------------------------------------------------------------------------
# Measurement
# ---------------------------------------------------------------------------------------------
def measure(num_tables: int, batch_size: int, seed: int, progress: bool) -> dict:
    t0 = time.time()
    raw = dlrm.generate_synthetic_raw(num_tables, batch_size, seed=seed, progress=progress)
    t1 = time.time()
    indices, offsets = raw.indices.numpy(), raw.offsets.numpy()
    T, B = raw.num_tables, raw.batch_size
    rpb = np.zeros((T, NUM_BINS), dtype=np.int64)
    lpb = np.zeros((T, NUM_BINS), dtype=np.int64)
    rows, pools = np.ones(T, dtype=np.int64), np.zeros(T)
    for t in range(T):
        idx = indices[offsets[t * B]: offsets[(t + 1) * B]]
        if idx.size:
            rows[t] = int(idx.max()) + 1
        pools[t] = idx.size / B
        rpb[t], lpb[t] = dlrm.reuse_counts(idx, int(rows[t]))
    by_lookups, by_rows = dlrm.aggregate_reuse(rpb, lpb)
    return {"by_lookups": by_lookups, "by_rows": by_rows, "rows": rows, "pooling": pools,
            "lookups": raw.num_lookups, "generate_s": t1 - t0, "measure_s": time.time() - t1}


def _table(by_lookups, by_rows) -> str:
    lines = [f"{'bin':>14} {'by lookups':>10} {'published':>9} {'diff':>7}   {'by rows':>8} {'published':>9} {'diff':>7}"]
    for k, label in enumerate(dlrm.BIN_LABELS):
        lines.append(f"{label:>14} {by_lookups[k]:10.3f} {PUB_L[k]:9.3f} {by_lookups[k] - PUB_L[k]:+7.3f}   "
                     f"{by_rows[k]:8.3f} {PUB_R[k]:9.3f} {by_rows[k] - PUB_R[k]:+7.3f}")
    lines.append(f"max |diff|: by lookups {np.abs(by_lookups - PUB_L).max():.4f}, "
                 f"by distinct rows {np.abs(by_rows - PUB_R).max():.4f}")
    return "\n".join(lines)


def _spread(pools: np.ndarray, rows: np.ndarray, empty: np.ndarray) -> str:
    q = np.percentile(pools, [50, 90, 99])
    r = rows[~empty]
    return (f"pooling factor: min {pools.min():.2f}  median {q[0]:.2f}  mean {pools.mean():.2f}  p90 {q[1]:.2f}  "
            f"p99 {q[2]:.2f}  max {pools.max():.2f}  empty tables {int(empty.sum())}  > 100: {int((pools > 100).sum())}\n"
            f"hash size (non-empty tables): min {r.min():,}  median {int(np.median(r)):,}  max {r.max():,}  "
            f"span {math.log10(r.max() / r.min()):.1f} orders of magnitude")


def main(argv: Sequence[str] | None = None) -> int:
    p = OneLineParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--num-tables", type=positive_int, default=dlrm.PUBLISHED_NUM_TABLES,
                   help="tables of the generated data (the published file's count)")
    p.add_argument("--batch-size", type=batch_size_int, default=dlrm.PUBLISHED_BATCH_SIZE,
                   help="samples per table of the generated data (the published file's batch)")
    p.add_argument("--seed", type=seed_int, default=0, help="seed of the measured data")
    p.add_argument("--expected", action="store_true", help="closed-form expected histograms only (for --seeds)")
    p.add_argument("--fit", action="store_true", help="re-fit the exponent / head parameters (for --seeds)")
    p.add_argument("--seeds", type=int_list, default=[0], help="populations for --expected / --fit")
    p.add_argument("--iters", type=positive_int, default=800, help="--fit: Adam iterations")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    args = p.parse_args(argv)
    if args.fit:
        params = fit(args.seeds, args.iters, args.num_tables, args.batch_size)
        print(json.dumps(params))
        for s in args.seeds:
            l, r, _ = expected_histograms(dlrm.synthetic_table_specs(args.num_tables, s, params), args.batch_size)
            print(f"seed {s}: expected max |diff| by lookups {np.abs(l - PUB_L).max():.4f}, "
                  f"by rows {np.abs(r - PUB_R).max():.4f}")
        return 0
    if args.expected:
        for s in args.seeds:
            specs = dlrm.synthetic_table_specs(args.num_tables, s)
            l, r, distinct = expected_histograms(specs, args.batch_size)
            print(f"seed {s}: expected at {args.num_tables} tables x batch {args.batch_size} "
                  f"({distinct / 1e6:.1f} M distinct rows)")
            print(_table(l, r))
        return 0
    m = measure(args.num_tables, args.batch_size, args.seed, not args.quiet)
    print(f"measured: {args.num_tables} tables x batch {args.batch_size}, seed {args.seed}: "
          f"{m['lookups']:,} lookups (generated in {m['generate_s']:.1f} s, counted in {m['measure_s']:.1f} s)")
    print(_table(m["by_lookups"], m["by_rows"]))
    print(_spread(m["pooling"], m["rows"], m["pooling"] == 0))
    return 0


if __name__ == "__main__":
    run_main(main)
