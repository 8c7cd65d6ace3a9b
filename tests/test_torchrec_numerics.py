"""Every sharding type a plan file can hold computes under TorchRec's DistributedModelParallel what the
unsharded collection computes: the pooled embeddings of a batch, and the weights after one SGD step.
One launch of 4 gloo CPU ranks (2 hosts of 2, so table-row-wise and grid have hosts) runs
examples/apply_plan.py's check on a plan with table-, column- (even and uneven), row- (even and uneven
blocks), table-row-, table-column-wise, grid and data-parallel tables. Skipped without TorchRec, as
tests/test_torchrec.py."""

import json

import pytest

from helpers import require_torchrec  # noqa: E402

require_torchrec()

from shardcore.errors import ShardError  # noqa: E402
from shardcore.interop import plan_export as pe  # noqa: E402
from shardcore.plan import Plan, column_wise, data_parallel, grid, row_wise, table_wise  # noqa: E402
from helpers import BIG_CAP
from shardcore.topology import Topology

# name, rows, dim, pooling factor, sharding on 4 ranks in hosts of 2
EVERY_TYPE = [("tw", 40, 16, 2.0, table_wise(1)),
              ("cw_even", 30, 16, 2.0, column_wise([(0, 8), (3, 8)])),
              ("cw_uneven", 25, 32, 3.0, column_wise([(2, 24), (0, 8)])),
              ("rw", 50, 8, 2.0, row_wise([0, 1, 2, 3])),             # blocks 13, 13, 13, 11
              ("trw", 22, 8, 2.0, row_wise([2, 3])),                  # host 1: TorchRec's table_row_wise
              ("twcw", 20, 16, 2.0, column_wise([(0, 8), (1, 8)])),   # written as table_column_wise, host 0
              ("grid", 33, 16, 2.0, grid([([0, 1], 8), ([2, 3], 8)])),
              ("dp", 12, 8, 2.0, data_parallel(4))]
TORCHREC_TYPES = ["table_wise", "column_wise", "column_wise", "row_wise", "table_row_wise",
                  "table_column_wise", "grid_shard", "data_parallel"]


def write_every_type(tmp_path, precision="fp32"):
    """The tables file and a plan file holding every sharding type (``table_column_wise`` as a user writes
    it: plan.py writes column-wise blocks as ``column_wise``)."""
    from shardcore.tables import TableConfig

    tables = [TableConfig(i, rows, dim, pf) for i, (_n, rows, dim, pf, _s) in enumerate(EVERY_TYPE)]
    names = [n for n, *_ in EVERY_TYPE]
    csv = tmp_path / "tables.csv"
    csv.write_text("name,rows,dim,pooling_factor\n" + "".join(f"{n},{r},{d},{pf}\n" for n, r, d, pf, _s in EVERY_TYPE))
    plan = Plan(tables, [s for *_x, s in EVERY_TYPE], Topology(4, BIG_CAP, precision))
    obj = pe.torchrec_plan_json(plan, names, local_world_size=2)
    for t in obj["tables"]:
        if t["name"] == "twcw":
            t["sharding_type"] = "table_column_wise"
    path = tmp_path / "plan.torchrec.json"
    path.write_text(json.dumps(obj))
    return csv, path


def test_every_sharding_type_gives_the_unsharded_outputs_and_sgd_step_under_dmp(tmp_path):
    import examples.apply_plan as ex

    csv, path = write_every_type(tmp_path)
    assert [t["sharding_type"] for t in json.loads(path.read_text())["tables"]] == TORCHREC_TYPES
    results = ex.run(str(csv), str(path), local_batch=6)
    assert sorted(results) == [0, 1, 2, 3]
    for rank, res in results.items():
        assert "error" not in res, f"rank {rank}:\n{res.get('error')}"
    assert results[0]["types"] == dict(zip([n for n, *_ in EVERY_TYPE], TORCHREC_TYPES))
    tol = ex.TOLERANCE["fp32"]
    for rank, res in results.items():
        assert res["fw_err"] <= tol, (rank, res)                     # pooled embeddings: the unsharded ones
        assert res["step_err"] <= tol, (rank, res)                   # weights after one SGD step: likewise
        assert res["step_size"] > 100 * tol                          # ... while the step itself moved them
        assert res["touched"] > 0 and res["moved"] == res["touched"]   # every touched row was updated
    # every weight of every table is held by some rank (replicas on all): the ranks' shards tile the tables
    held = sum(res["local_weights"] for res in results.values())
    assert held == sum(r * d * (4 if s.type == "data_parallel" else 1) for _n, r, d, _pf, s in EVERY_TYPE)
    ok, lines = ex.verdict(results, "fp32")
    assert ok and lines[-1].startswith("numerics: the sharded forward and one SGD step equal the unsharded")
    assert len(lines) == 5 and all("touched rows updated" in line for line in lines[:4])


def test_the_check_reports_a_mismatch():
    """verdict() fails a rank whose step differs from the unsharded step, or whose touched rows did not move."""
    import examples.apply_plan as ex

    good = {"local_weights": 10, "fw_err": 0.0, "step_err": 0.0, "step_size": 0.1, "touched": 3, "moved": 3}
    assert ex.verdict({0: good}, "fp32")[0]
    for bad in ({"step_err": 1e-3}, {"fw_err": 1e-3}, {"moved": 2}):
        ok, lines = ex.verdict({0: good, 1: {**good, **bad}}, "fp32")
        assert not ok and "MISMATCH" in lines[1] and "does NOT compute" in lines[-1]


def test_an_empty_row_block_is_refused_on_cpu_ranks(tmp_path):
    """A row-wise table with fewer rows than ranks has an empty block, which FBGEMM's CPU kernels do not run
    (an error on its rank, or an intermittent one in the backward): refused in one line before DMP."""
    from shardcore.tables import TableConfig

    tables = [TableConfig(0, 3, 8, 1.0), TableConfig(1, 40, 8, 1.0)]
    obj = pe.torchrec_plan_json(Plan(tables, [row_wise([0, 1, 2, 3]), table_wise(0)], Topology(4, BIG_CAP, "fp32")),
                                ["short", "t"])
    assert [s["sizes"][0] for s in obj["tables"][0]["shards"]] == [1, 1, 1, 0]
    path = tmp_path / "plan.torchrec.json"
    path.write_text(json.dumps(obj))
    with pytest.raises(ShardError, match="'short': its row_wise block on rank 3 is empty") as exc:
        pe.load_torchrec_plan(path, device_type="cpu")
    assert "\n" not in str(exc.value)
    assert pe.load_torchrec_plan(path, device_type="cuda").plan[""]["short"].sharding_type == "row_wise"


def test_apply_plan_refuses_a_bad_plan_before_any_rank_starts(tmp_path, monkeypatch):
    import examples.apply_plan as ex

    csv, path = write_every_type(tmp_path)
    monkeypatch.setattr(ex, "spawn_ranks", lambda *a, **k: pytest.fail("a rank was started"))
    with pytest.raises(ShardError, match="the plan is for 4 ranks, not the 2 given"):
        ex.run(str(csv), str(path), world=2)
    obj = json.loads(path.read_text())
    obj["tables"][3]["shards"][1]["offsets"] = [12, 0]        # overlaps block 0
    path.write_text(json.dumps(obj))
    with pytest.raises(ShardError, match="overlap"):
        ex.run(str(csv), str(path))
