import json

import numpy as np
import pytest
import torch

from shardcore.dataset import load_dataset, load_table_configs
from shardcore.errors import ShardError
from shardcore.plan import Plan
from shardcore.tables import TableConfig
from shardcore.topology import Topology
from shardcore.data.features import FEATURE_NAMES, NUM_FEATURES, FeatureScaler, raw_features
from shardcore.tasks import Task, load_tasks, parse_task_line

from helpers import make_dataset


def test_table_memory_and_features():
    t = TableConfig(3, row=1 << 20, dim=16, pooling_factor=2.5, bins=tuple(range(17)))
    assert t.size == 16 << 20
    assert t.memory_gb("fp16") == pytest.approx(2 * 16 / 1024)
    assert t.memory_gb("fp32") == pytest.approx(4 * 16 / 1024)
    with pytest.raises(ShardError):
        t.memory_gb("int3")
    x = raw_features([t])
    assert x.shape == (1, NUM_FEATURES) == (1, 21)
    assert list(x[0, :4]) == [16, 1 << 20, 2.5, 16 << 20]
    assert list(x[0, 4:]) == list(range(17))
    assert FEATURE_NAMES[4] == "bin_0" and FEATURE_NAMES[-1] == "bin_16"
    assert TableConfig.from_json(t.to_json()) == t


def test_bag_length_cv_is_an_optional_22nd_feature(tmp_path):
    """A table's bag-length CV travels in table_configs.json, is checked on entry, leaves equality and
    the dataset's digest alone, and is the scaler's 22nd feature only where asked for."""
    from shardcore.oracles.setting import dataset_digest
    from shardcore.dataset import save_table_configs

    t = TableConfig(0, 1000, 16, 3.0, length_cv=0.8)
    assert t.to_json()["length_cv"] == 0.8 and TableConfig.from_json(t.to_json()).length_cv == 0.8
    assert "length_cv" not in TableConfig(0, 1000, 16, 3.0).to_json() and t == TableConfig(0, 1000, 16, 3.0)
    assert t.with_dim(8).length_cv == 0.8
    from shardcore.plan import column_wise, data_parallel, row_wise
    assert all(p.length_cv == 0.8 for _, p in column_wise([(0, 8), (1, 8)]).pieces(t, 2))   # pieces keep it
    assert all(p.length_cv == 0.8 for _, p in data_parallel(2).pieces(t, 2))
    assert all(p.length_cv is None for _, p in row_wise([0, 1]).pieces(t, 2))   # a row block's spread is its own
    with pytest.raises(ShardError, match="length_cv -0.5 is negative"):
        TableConfig.from_json({**t.to_json(), "length_cv": -0.5})
    with pytest.raises(ShardError, match="non-numeric length_cv"):
        TableConfig.from_json({**t.to_json(), "length_cv": "x"})
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    save_table_configs(a / "table_configs.json", [t], 4)
    save_table_configs(b / "table_configs.json", [TableConfig(0, 1000, 16, 3.0)], 4)
    assert dataset_digest(a) == dataset_digest(b)
    train = [TableConfig(i, 10 ** (i % 5 + 2), 16, float(i + 1), length_cv=0.2 * (i % 5)) for i in range(20)]
    plain, with_cv = FeatureScaler.fit(train), FeatureScaler.fit(train, length_cv=True)
    assert plain.num_features == 21 and plain.transform(train).shape == (20, 21)
    z = with_cv.transform(train)
    assert with_cv.num_features == 22 and z.shape == (20, 22)
    np.testing.assert_allclose(z[:, :21], plain.transform(train), atol=1e-6)   # the 21 unchanged
    np.testing.assert_allclose([z[:, 21].mean(), z[:, 21].std()], [0, 1], atol=1e-5)
    unknown = TableConfig(99, 100, 16, 1.0)                  # no CV: the training tables' median
    assert with_cv.cv_default == pytest.approx(0.4)
    assert with_cv.transform([unknown])[0, 21] == pytest.approx(
        with_cv.transform([TableConfig(99, 100, 16, 1.0, length_cv=0.4)])[0, 21])
    again = FeatureScaler.from_state(json.loads(json.dumps(with_cv.to_state())))
    np.testing.assert_array_equal(again.transform(train), z)
    assert FeatureScaler.from_state(plain.to_state()).cv_default is None      # older states: 21 features
    # tables without a CV give no CV feature (an input never learnt would take any later CV at random)
    blind = FeatureScaler.fit([TableConfig(i, 100 + i, 16, 1.0 + i) for i in range(5)], length_cv=True)
    assert blind.cv_default is None and blind.num_features == 21
    with pytest.raises(ShardError, match="other features"):
        FeatureScaler.from_state({**with_cv.to_state(), "cv_default": None})


def test_scaler_is_fitted_once_and_reapplied():
    train = [TableConfig(i, 10 ** (i % 6 + 1), 4 * (i % 4 + 1), float(i)) for i in range(30)]
    scaler = FeatureScaler.fit(train)
    z = scaler.transform(train)
    assert z.dtype == np.float32
    np.testing.assert_allclose(z[:, :4].mean(axis=0), 0, atol=1e-5)
    np.testing.assert_allclose(z[:, :4].std(axis=0), 1, atol=1e-4)
    # Re-applied to other tables, statistics do not change: no refit on the task being sharded.
    other = [TableConfig(0, 5, 128, 100.0)]
    again = FeatureScaler.from_state(json.loads(json.dumps(scaler.to_state())))
    np.testing.assert_array_equal(again.transform(other), scaler.transform(other))
    assert again.transform(other)[0, 0] > 3  # dim 128 is far above the training mean


def test_dataset_round_trip(tmp_path):
    tables = make_dataset(tmp_path / "ds", num_tables=5, batch_size=16)
    ds = load_dataset(tmp_path / "ds")
    assert ds.tables == tables and ds.batch_size == 16
    idx, off = ds.lookups(2)
    assert idx.dtype == off.dtype == torch.int64 and off.numel() == 17 and off[-1] == idx.numel()
    assert not load_dataset(tmp_path / "ds", with_lookups=False).has_lookups


@pytest.mark.parametrize("content, message", [
    ("{not json", "malformed JSON"),
    ('{"tables": 3}', '"tables" list'),
    ('{"tables": [{"index": 0, "row": 10}]}', "missing field"),
    ('{"tables": [{"index": 0, "row": "ten", "dim": 4, "pooling_factor": 1}]}', "non-numeric"),
    ('{"tables": [{"index": 1, "row": 10, "dim": 4, "pooling_factor": 1}]}', "indices must be"),
    ('{"tables": [{"index": 0, "row": 0, "dim": 4, "pooling_factor": 1}]}', "must be positive"),
])
def test_table_config_errors(tmp_path, content, message):
    p = tmp_path / "table_configs.json"
    p.write_text(content)
    with pytest.raises(ShardError, match=message) as exc:
        load_table_configs(p)
    assert "\n" not in str(exc.value)


def test_missing_files(tmp_path):
    with pytest.raises(ShardError, match="dataset directory not found"):
        load_dataset(tmp_path / "nope")
    (tmp_path / "d").mkdir()
    with pytest.raises(ShardError, match="table configs not found"):
        load_dataset(tmp_path / "d")
    make_dataset(tmp_path / "e", num_tables=3)
    (tmp_path / "e" / "data.pt").unlink()
    with pytest.raises(ShardError, match="lookup data not found"):
        load_dataset(tmp_path / "e")
    with pytest.raises(ShardError, match="task file not found"):
        load_tasks(tmp_path / "tasks.txt")


def test_task_lines():
    assert parse_task_line("3,17,250") == Task((3, 17, 250))
    assert parse_task_line("3,17,250 64,16,128\n") == Task((3, 17, 250), (64, 16, 128))
    for bad, msg in [("3,x,5", "malformed"), ("1,2 4", "2 table ids but 1 dims"), ("1 2 3", "malformed"),
                     ("1,1", "twice"), ("-1,2", "negative"), ("1,2 4,0", "positive")]:
        with pytest.raises(ShardError, match=msg):
            parse_task_line(bad)


def test_task_file_errors(tmp_path):
    p = tmp_path / "t.txt"
    p.write_text("0,1,2\n\n# comment\n3,4 8,16\n")
    tasks = load_tasks(p, num_tables=5)
    assert tasks == [Task((0, 1, 2)), Task((3, 4), (8, 16))]
    with pytest.raises(ShardError, match=r"t.txt:4: table id 4 out of range"):
        load_tasks(p, num_tables=4)
    p.write_text("0,1\n0,x\n")
    with pytest.raises(ShardError, match=r"t.txt:2: malformed"):
        load_tasks(p)
    p.write_text("\n")
    with pytest.raises(ShardError, match="no tasks"):
        load_tasks(p)
    tables = [TableConfig(i, 100, 16, 1.0) for i in range(3)]
    assert [t.dim for t in Task((2, 0), (4, 8)).tables(tables)] == [4, 8]
    with pytest.raises(ShardError, match="out of range"):
        Task((3,)).tables(tables)
    with pytest.raises(ShardError, match="dims"):
        Task((0, 1), (4,))


def test_plan_pieces_memory_feasibility():
    tables = [TableConfig(i, 1 << 20, 16, 1.0) for i in range(4)]  # 1/32 GB each in fp16
    topo = Topology(3, 1 / 16)
    plan = Plan.table_wise(tables, (0, 1, 1, 0), topo)
    assert plan.device_positions == [[0, 3], [1, 2], []] and plan.allocation == (0, 1, 1, 0)
    assert Plan.from_device_tables(tables, plan.device_positions, topo) == plan
    assert plan.device_memory_gb() == pytest.approx([1 / 16, 1 / 16, 0])
    assert plan.feasible and not plan.general and plan.splits is None
    assert not Plan(tables, plan.shardings, Topology(3, 1 / 16, "fp32")).feasible   # fp32 weights: twice the bytes
    with pytest.raises(ShardError):
        Plan.table_wise(tables[:2], (0, 3), topo)
    with pytest.raises(ShardError):
        Plan.from_device_tables(tables, [[0, 1], [1], [2, 3]], topo)
    with pytest.raises(ShardError):
        Plan(tables[:3], plan.shardings, topo)


def test_the_compact_form_of_older_records_reads_as_column_blocks():
    tables = [TableConfig(0, 1 << 20, 16, 3.0), TableConfig(1, 100, 8, 1.0)]
    topo = Topology(2, 5.0)
    plan = Plan.from_allocation(tables, (0, 1, 1), topo, splits=(2, 1))
    assert [(t.index, t.dim, t.row, t.pooling_factor) for _, t in plan.pieces] == [
        (0, 8, 1 << 20, 3.0), (0, 8, 1 << 20, 3.0), (1, 8, 100, 1.0)]
    assert plan.sharding_types == ["column_wise", "table_wise"] and plan.splits == (2, 1)
    assert plan.allocation == (0, 1, 1) and not plan.general
    # a column split halves each block's memory and keeps the lookups
    assert plan.device_memory_gb()[0] == pytest.approx(tables[0].memory_gb() / 2)
    assert [len(s) for s in plan.device_pieces] == [1, 2]
    with pytest.raises(ShardError):
        Plan.from_allocation(tables, (0, 1), topo, splits=(2, 1))
    with pytest.raises(ShardError):
        Plan.from_allocation(tables, (0, 1, 1, 0), topo, splits=(3, 1))   # 16 is not divisible by 3


def test_a_device_cost_is_named_in_the_order_of_the_cost_parts():
    from shardcore.costs import COST_PARTS
    from shardcore.types import DeviceCost, OracleInfo, PlanResult

    assert DeviceCost._fields == COST_PARTS
    r = PlanResult([[1.0, 2.0, 3.0, 4.0], [0.5, 0.0, 0.25, 0.5]], hardware="test")
    first, second = r.devices
    assert first == DeviceCost(fw_comp=1.0, fw_comm=2.0, bw_comm=3.0, bw_comp=4.0) == r.device_costs_ms[0]
    assert all(isinstance(c, DeviceCost) for c in r.device_costs_ms) and list(first) == [1.0, 2.0, 3.0, 4.0]
    assert (first.compute_ms, first.comm_ms, first.total_ms) == (5.0, 5.0, 10.0)
    assert [d.total_ms for d in r.devices] == r.device_totals_ms and second.total_ms == 1.25
    info = OracleInfo("cpu", startup_s=1.5)
    assert info.noise_pct is None and info.device_type == "cpu"
    with pytest.raises(AttributeError):   # frozen: what an oracle said of itself is not edited
        info.startup_s = 0.0
