"""The emulated card knows what it was measured on: its domain, the price of a table beyond it (continuous
at the edge, growing with the rows a table touches), fp32 priced by the bytes it moves, and the notes every
pricing output prints for such tables."""

from __future__ import annotations

import math

import numpy as np
import pytest

from shardcore.oracles.emulated.domain import FEW_LOOKUPS, domain_note
from shardcore.oracles.emulated.emulator import card_domain, load_gpu_model, measured_landscapes
from shardcore.tables import TableConfig

B = 65536


@pytest.fixture(scope="module")
def model():
    return load_gpu_model("h200")


@pytest.fixture(scope="module")
def dom():
    return card_domain("h200")


def test_the_domain_is_the_measured_tables_ranges(dom):
    tables = [t for land in measured_landscapes("h200") for s in land.meas["shards"] for t in s["configs"]]
    assert dom.max_rows == max(t.row for t in tables)
    assert dom.max_pooling == max(t.pooling_factor for t in tables)
    assert (dom.min_dim, dom.max_dim) == (min(t.dim for t in tables), max(t.dim for t in tables))
    assert dom.few_lookup_max_rows == max(t.row for t in tables if t.pooling_factor <= FEW_LOOKUPS)
    assert dom.few_lookup_max_rows < dom.max_rows   # the one-hot tables of public models were never measured
    # every measured table is inside; one of the MLPerf DLRM's 40M-row tables is not, and says by how far
    assert not any(dom.problems(t) for t in tables)
    why = dom.problems(TableConfig(0, 40_000_000, 128, 1.0))
    assert len(why) == 1 and f"{40e6 / dom.max_rows:.1f}x the largest measured" in why[0]
    assert dom.problems(TableConfig(0, 10, 256, 1.0)) == [f"dim 256 outside the measured {dom.min_dim}..{dom.max_dim}"]
    assert "fp32" in dom.problems(TableConfig(0, 10, 16, 1.0), "fp32")[0]


def test_beyond_the_range_the_price_is_continuous_and_grows_with_the_rows_touched(model, dom):
    def cost(rows, pf):
        return sum(model.predict([TableConfig(0, int(rows), 128, pf)], B))

    # at the edge of each range a table just outside costs what the edge costs (no jump)
    for pf, edge in ((1.0, dom.few_lookup_max_rows), (80.0, dom.max_rows)):
        assert cost(edge * 1.01, pf) == pytest.approx(cost(edge, pf), rel=0.02)
    # a one-hot table touches at most a batch of rows: 40M rows cost what 1M do
    assert cost(40e6, 1.0) == pytest.approx(cost(dom.few_lookup_max_rows, 1.0), rel=1e-9)
    # a table whose lookups touch more distinct rows than any measured one costs more, in proportion
    grows = [cost(40e6, pf) for pf in (300.0, 400.0, 600.0)]
    assert grows[0] < grows[1] < grows[2]
    assert grows[2] - grows[1] == pytest.approx(2 * (grows[1] - grows[0]), rel=0.05)   # linear in the bytes
    # inside the range nothing changed: the shipped fit as it is
    inside = [TableConfig(0, 1000, 64, 3.0), TableConfig(1, 500_000, 16, 20.0)]
    dom_off = type(model)(model.params)
    dom_off.__class__ = type("NoDomain", (type(model),), {"domain": property(lambda self: None)})
    assert np.array_equal(model.predict_many([inside], B), dom_off.predict_many([inside], B))


def test_fp32_is_priced_by_the_bytes_it_moves(model):
    from shardcore.oracles.emulated.emulator import feature_names, shard_features, table_arrays

    t = TableConfig(0, 2_000_000, 64, 10.0)
    assert sum(model.predict([t], B)) < sum(model.predict([t], B, precision="fp32"))
    ta, of = table_arrays([[t]], [[0.5]])
    x16, x32 = (shard_features(ta, of, 1, B, model.spec, bpw)[0] for bpw in (2, 4))
    names = feature_names(model.spec)
    for name in ("lookup_sectors", "dram_sectors", "distinct_sectors"):   # the weights' bytes: twice as many
        assert x32[names.index(name)] == pytest.approx(2 * x16[names.index(name)])
    assert x32[names.index("batch_x_dim")] == x16[names.index("batch_x_dim")]   # outputs are fp32 either way


def test_the_note_names_the_out_of_range_tables_and_the_precision(dom):
    tables = [TableConfig(0, 100, 16, 1.0), TableConfig(1, 40_000_000, 128, 1.0)]
    assert domain_note(dom, tables[:1], ["small"], "fp16") is None
    note = domain_note(dom, tables, ["small", "big"], "fp32")
    assert note.count("\n") == 0 and "big:" in note and "small" not in note
    assert "fp32 weights: compute derived from fp16 measurements by bytes moved" in note
    assert math.isfinite(sum(load_gpu_model("h200").predict([tables[1]], B, precision="fp32")))
