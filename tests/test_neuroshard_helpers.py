"""Shared by the NeuroShard tests: synthetic cost functions and tiny trained models (CPU, seconds).

(Named test_* so that it sits with the other NeuroShard test files; its one test checks the
synthetic cost itself.)
"""

from __future__ import annotations

import numpy as np
import pytest

from shardcore.plan import Plan
from shardcore.tables import TableConfig

from neuroshard.config import ModelConfig
from neuroshard.fitting import fit_comm_model, fit_compute_model
from neuroshard.simulator import Simulator
from helpers import BIG_CAP
from shardcore.topology import Topology

DIMS = (4, 8, 16, 32, 64)


def synthetic_tables(n=60, seed=0):
    rng = np.random.default_rng(seed)
    return [TableConfig(i, int(10 ** rng.uniform(2, 6)), 16, float(rng.choice([0.5, 1, 3, 10, 40]) * rng.uniform(0.5, 1.5)),
                        tuple(rng.dirichlet(np.ones(17)))) for i in range(n)]


def shard_cost(shard):
    """Known compute cost: proportional to the lookups x dim of the shard, plus a fixed overhead."""
    c = sum(t.dim * t.pooling_factor for t in shard) / 100.0 + 0.05
    return 0.3 * c, 0.7 * c


def comm_cost(dims, delays):
    """Known all-to-all times: backward from the dim sums; forward adds the wait for the latest starter."""
    dims = np.asarray(dims, dtype=float)
    delays = np.asarray(delays, dtype=float)
    bw = 1.0 + dims / 200.0 + dims.sum() / 800.0
    return bw + (delays.max() - delays), bw


def compute_data(n=300, seed=0, tables=None, max_tables=8):
    rng = np.random.default_rng(seed)
    tables = tables or synthetic_tables()
    shards, costs = [], []
    for _ in range(n):
        k = int(rng.integers(1, max_tables + 1))
        ids = rng.choice(len(tables), size=k, replace=False)
        s = [tables[int(i)].with_dim(int(rng.choice(DIMS))) for i in ids]
        shards.append(s)
        costs.append(shard_cost(s))
    return shards, np.array(costs)


def comm_data(n=150, ndevices=4, seed=0):
    rng = np.random.default_rng(seed)
    dims, delays, fw, bw = [], [], [], []
    for _ in range(n):
        d = rng.integers(0, 2000, ndevices).astype(float)
        dl = rng.uniform(0, 50, ndevices)
        f, b = comm_cost(d, dl)
        dims.append(d)
        delays.append(dl)
        fw.append(f)
        bw.append(b)
    return dims, delays, fw, bw


def small_cfg(epochs=60, **kw):
    base = dict(hidden=64, embed=32, head_hidden=64, epochs=epochs, batch_size=32, lr=3e-3, lr_decay=0.98)
    base.update(kw)
    return ModelConfig(**base)


def train_simulator(compute_samples=300, comm_samples=150, epochs=60, seed=0):
    shards, costs = compute_data(compute_samples, seed)
    compute, _ = fit_compute_model(shards, costs, small_cfg(epochs, seed=seed))
    dims, delays, fw, bw = comm_data(comm_samples, seed=seed)
    ccfg = small_cfg(epochs, hidden=32, embed=16, head_hidden=32, batch_size=16, seed=seed)
    fw_model, _ = fit_comm_model("fw_comm", dims, fw, delays, ccfg)
    bw_model, _ = fit_comm_model("bw_comm", dims, bw, delays, ccfg)
    return Simulator(compute, fw_model, bw_model)


def test_synthetic_cost_is_what_the_tests_claim():
    t = synthetic_tables(3)
    fw, bw = shard_cost(t)
    assert fw + bw == pytest.approx(sum(x.dim * x.pooling_factor for x in t) / 100 + 0.05)
    f, b = comm_cost([100, 300], [0.0, 5.0])
    assert f[0] == pytest.approx(b[0] + 5.0) and f[1] == pytest.approx(b[1])


def test_simulator_is_a_cost_oracle():
    from shardcore.types import CostOracle

    sim = train_simulator(compute_samples=40, comm_samples=20, epochs=2)
    tables = synthetic_tables(6)
    shards = [tables[:2], tables[2:5], [], tables[5:]]
    assert isinstance(sim, CostOracle)
    with sim as oracle:
        r = oracle.evaluate(shards)
    assert [list(c) for c in r.device_costs_ms] == sim.device_costs(shards).tolist() and not r.from_cache
    assert r.cost_ms == sim.plan_cost(Plan.table_wise(tables, (0, 0, 1, 1, 1, 3), Topology(4, BIG_CAP)))
    assert r.parts["compute"].startswith("modelled") and r.parts["comm"].startswith("modelled")
    assert r.hardware.startswith("simulated by NeuroShard's cost models")


def test_compute_rows_keep_the_bag_length_cv_and_the_model_reads_it(tmp_path):
    """A compute sample's row carries each table's CV (empty where unknown) through the CSV; a row of an
    older collection, without the column, gives tables without one; a compute model fitted with the CV
    feature has 22 inputs per table, one without it 21."""
    import pandas as pd

    from neuroshard.collect import row_tables, shard_row

    shard = [TableConfig(3, 1000, 16, 2.0, length_cv=0.75), TableConfig(5, 500, 8, 1.0)]
    row = shard_row(0, shard, 1.0, 2.0)
    pd.DataFrame([row, shard_row(1, shard[:1], 1.0, 2.0)]).to_csv(tmp_path / "c.csv", index=False)
    back = pd.read_csv(tmp_path / "c.csv").to_dict("records")
    assert [t.length_cv for t in row_tables(back[0])] == [0.75, None]
    assert [t.length_cv for t in row_tables(back[1])] == [0.75]
    old = {k: v for k, v in row.items() if k != "length_cvs"}
    assert [t.length_cv for t in row_tables(old)] == [None, None]
    rng = np.random.default_rng(0)
    shards = [[TableConfig(i, int(rng.integers(100, 10 ** 5)), 16, float(rng.uniform(1, 20)),
                           length_cv=float(rng.uniform(0.2, 1.5))) for i in range(k % 4 + 1)] for k in range(40)]
    costs = np.array([[sum(t.pooling_factor for t in s) * 0.1, sum(t.pooling_factor for t in s) * 0.2] for s in shards])
    for cv in (True, False):
        cfg = ModelConfig(hidden=8, embed=4, head_hidden=8, epochs=2, length_cv_feature=cv)
        model, _ = fit_compute_model(shards, costs, cfg)
        assert model.scaler.num_features == 21 + cv and model.features(shards[0]).shape == (1, 21 + cv)
        assert model.predict_shards(shards[:3]).shape == (3, 2)
    # asked for, but the data holds no CV: the model has the 21 features and says so in its config
    blind = [[TableConfig(t.index, t.row, t.dim, t.pooling_factor) for t in s] for s in shards]
    model, _ = fit_compute_model(blind, costs, ModelConfig(hidden=8, embed=4, head_hidden=8, epochs=2))
    assert model.scaler.num_features == 21 and not model.cfg.length_cv_feature
