"""NeuroShard end to end on tiny data with the real evaluator (CPU, gloo): collect -> train -> search -> measure."""

import numpy as np
import pandas as pd
import pytest
import torch

import collect_comm_cost_data
import collect_compute_cost_data
import eval_simulator
import train_comm_cost_model
import train_compute_cost_model
import train_neuroshard
from neuroshard.collect import collect_comm, collect_compute, load_comm_data, load_compute_data
from shardcore.errors import ShardError
from shardcore.oracles.cache import CachedOracle
from shardcore.oracles.measured.driver import PlanEvaluator
from shardcore.tasks import Task, save_tasks
from shardcore.types import Topology

from helpers import make_dataset
from helpers import build_planner, planning_ctx

torch.set_num_threads(1)


def test_collect_train_search_measure(tmp_path, capsys):
    ds = tmp_path / "ds"
    tables = make_dataset(ds, num_tables=24, batch_size=64, dims=(8, 16, 32))
    compute_dir, comm_dir, models = tmp_path / "compute", tmp_path / "comm_2", tmp_path / "models"
    with CachedOracle(PlanEvaluator(ds, ndevices=2, bench_iters=2, warmup_iters=1, comm_iters=3, timeout_s=60),
                      tmp_path / "c.sqlite") as ev:
        s = collect_compute(ev, compute_dir, 24, max_tables=5, max_mem_gb=1.0, max_dim=32, pool="all",
                            progress=False)
        assert s.total == 24 and s.added == 24
        s = collect_compute(ev, compute_dir, 28, max_tables=5, max_mem_gb=1.0, max_dim=32, pool="all",
                            progress=False)   # resumes: only the missing samples
        assert (s.total, s.added) == (28, 4)
        s = collect_comm(ev, comm_dir, 12, t_range=(2, 10), sleep_range=(0.0, 3.0), max_dim=32, progress=False)
        assert s.total == 12
        df = pd.read_csv(compute_dir / "compute_costs.csv")
        assert len(df) == 28 and (df.fw_ms > 0).all() and (df.bw_ms > 0).all()
        assert set(df.columns) >= {"table_ids", "dims", "rows", "pooling_factors", "bins", "fw_ms", "bw_ms"}
        shards, costs, setting = load_compute_data(compute_dir)
        assert setting["batch_size"] == 64 and len(shards) == 28 and costs.shape == (28, 2)
        assert all(t.dim in (4, 8, 16, 32) and t.row == tables[t.index].row for s in shards for t in s)
        dims, delays, fw, bw, _ = load_comm_data(comm_dir)
        assert len(dims) == 12 and all(len(d) == 2 for d in dims) and all((f > 0).all() for f in fw)

        train_compute_cost_model.main(["--data_dir", str(compute_dir), "--epochs", "40", "--out_path",
                                       str(models / "compute.pt"), "--quiet"])
        train_comm_cost_model.main(["--data_dir", str(comm_dir), "--epochs", "40", "--fw_out_path",
                                    str(models / "fw_comm.pt"), "--bw_out_path", str(models / "bw_comm.pt"), "--quiet"])
        out = capsys.readouterr().out
        assert "held-out test MAPE" in out and out.count("held-out test MAPE") == 3
        kw = {k: str(models / f"{k.replace('_model', '')}.pt") for k in ("compute_model", "fw_comm_model",
                                                                        "bw_comm_model")}
        sharder = build_planner("neuroshard", planning_ctx(batch_size=64), **kw)

        # a task whose largest table fits no device whole: NeuroShard must split it column-wise
        big = max(tables, key=lambda t: t.row).with_dim(32)
        task_tables = [t for t in tables if t.index != big.index][:9] + [big]
        cap = max(0.6 * big.memory_gb(), max(t.memory_gb() for t in task_tables[:-1]),
                  sum(t.memory_gb() for t in task_tables) / 2 * 1.1)
        assert big.memory_gb() > cap
        plan = sharder.shard(task_tables, Topology(2, cap))
        assert plan.feasible and plan.splits is not None and plan.splits[-1] >= 2
        measured = ev.evaluate(plan.device_pieces)   # split tables measured as split
        assert measured.cost_ms > 0 and len(measured.device_costs_ms) == 2
        simulated = sharder.simulator.plan_cost(plan)
        assert np.isfinite(simulated) and simulated > 0

    save_tasks(tmp_path / "tasks.txt", [Task(tuple(range(0, 10)), tuple([8] * 10)), Task(tuple(range(10, 20)))])
    eval_simulator.main(["--alg", "neuroshard,lookup_greedy,random", "--task-path", str(tmp_path / "tasks.txt"),
                         "--data-dir", str(ds), "--ndevices", "2", "--max_mem", "1", "--max-length", "2",
                         "--compute-model", kw["compute_model"], "--fw-comm-model", kw["fw_comm_model"],
                         "--bw-comm-model", kw["bw_comm_model"], "--quiet", "--out", str(tmp_path / "sim.jsonl")])
    out = capsys.readouterr().out
    assert "simulated" in out and "% over random" in out
    assert len((tmp_path / "sim.jsonl").read_text().splitlines()) == 6


def test_script_flags_accept_original_and_dashed_spellings():
    a = collect_compute_cost_data.build_parser().parse_args(
        ["--gpu_devices", "0,1", "--max_tables", "7", "--max_mem", "2", "--max_dim", "64", "--dataset_dir", "d",
         "--out_dir", "o", "--data_size", "9"])
    b = collect_compute_cost_data.build_parser().parse_args(
        ["--gpu-devices", "0,1", "--max-tables", "7", "--max-memory", "2", "--max-dim", "64", "--dataset-dir", "d",
         "--out-dir", "o", "--data-size", "9"])
    assert vars(a) == vars(b) and a.gpu_devices == [0, 1] and a.max_memory == 2.0
    c = collect_comm_cost_data.build_parser().parse_args(["--T_range", "5,9", "--sleep_range", "1,20"])
    d = collect_comm_cost_data.build_parser().parse_args(["--T-range", "5,9", "--sleep-range", "1,20"])
    assert vars(c) == vars(d) and c.T_range == [5, 8] and c.sleep_range == [1.0, 20.0]   # MAX exclusive, as the original
    e = train_comm_cost_model.build_parser().parse_args(["--fw_out_path", "a", "--bw-out-path", "b", "--epochs", "3"])
    assert (e.fw_out_path, e.bw_out_path, e.epochs) == ("a", "b", 3)
    f = train_neuroshard.build_parser().parse_args(["--comm-epochs", "4", "--epochs", "5", "--max_mem", "1"])
    assert (f.comm_epochs, f.epochs, f.max_memory) == (4, 5, 1.0)
    with pytest.raises(ShardError, match="no cost data"):
        train_compute_cost_model.main(["--data_dir", "/nonexistent/dir", "--quiet"])


def test_grouped_collection_draws_each_call_from_one_table_subset(tmp_path):
    """``group_tables``: every oracle call measures ``group_shards`` shards whose tables all come from
    one random subset of that many pool tables (one held-out refit of the emulated card per call)."""
    from neuroshard.collect import table_pool
    from shardcore.oracles.emulated.oracle import EmulatedOracle

    calls = []

    class Recording(EmulatedOracle):
        def measure_devices(self, shards, no_cache=None, **kw):
            calls.append([list(s) for s in shards])
            return super().measure_devices(shards, no_cache, **kw)

    ev = Recording("data/gpu_measurements/dlrm_b65536", 1)
    out = tmp_path / "compute"
    s = collect_compute(ev, out, 50, max_tables=6, max_mem_gb=5.0, max_dim=64, pool="train", progress=False,
                        group_tables=20, group_shards=20)
    assert (s.total, s.added) == (50, 50)
    assert [len(c) for c in calls] == [20, 20, 10]
    pool = set(table_pool(len(ev.dataset.tables), "train"))
    subsets = [{t.index for sh in c for t in sh} for c in calls]
    assert all(len(u) <= 20 and u <= pool for u in subsets)
    assert len(subsets[0] | subsets[1]) > 20          # a fresh subset per call
    shards, costs, _ = load_compute_data(out)
    assert len(shards) == 50 and (costs > 0).all()
    with pytest.raises(ShardError):
        collect_compute(ev, tmp_path / "bad", 5, pool="train", progress=False, group_tables=-1)


def test_whole_tables_and_heavier_tables_in_the_collection(tmp_path):
    """``whole_share``: that share of the random shards keeps every table at its own dim (as table-wise
    plans place them); ``pf_augment``: that share of the tables looked up 2x or 4x as often, reuse bins
    shifted alike, priced by an emulated oracle and refused on a measured one."""
    import types

    from neuroshard.collect import heavier, random_shard
    from shardcore.oracles.emulated.oracle import EmulatedOracle

    ev = EmulatedOracle("data/gpu_measurements/dlrm_b65536", 1)
    tables = ev.dataset.tables
    pool = list(range(len(tables)))
    # the original's sample stream is untouched at 0
    a = random_shard(np.random.default_rng(3), tables, pool, 8, 5.0, [128, 64, 32, 16, 8, 4])
    b = random_shard(np.random.default_rng(3), tables, pool, 8, 5.0, [128, 64, 32, 16, 8, 4], whole_share=0.0,
                     pf_augment=0.0)
    assert a == b
    for seed in range(5):
        s = random_shard(np.random.default_rng(seed), tables, pool, 8, 5.0, [128, 64, 32, 16, 8, 4], whole_share=1.0)
        assert s and all(t.dim == tables[t.index].dim for t in s)
    t = tables[154]
    h = heavier(t, 2)
    assert h.pooling_factor == 4 * t.pooling_factor and (h.index, h.row, h.dim) == (t.index, t.row, t.dim)
    assert h.bins[:2] == (0.0, 0.0) and h.bins[2:-1] == t.bins[:-3]
    assert sum(h.bins) == pytest.approx(sum(t.bins))          # the same rows
    (heavy,), (plain,) = ev.measure_devices([[h]]), ev.measure_devices([[t]])
    assert heavy.fw_ms + heavy.bw_ms > plain.fw_ms + plain.bw_ms
    out = tmp_path / "compute"
    collect_compute(ev, out, 30, max_tables=6, max_mem_gb=5.0, max_dim=16, pool="train", progress=False,
                    whole_share=0.5, pf_augment=1.0)
    shards, costs, _ = load_compute_data(out)
    ratios = {round(t.pooling_factor / tables[t.index].pooling_factor, 6) for s in shards for t in s
              if tables[t.index].pooling_factor > 0}
    assert ratios <= {2.0, 4.0} and ratios and (costs > 0).all()
    # the defaults follow the oracle: an emulated one draws whole-table shards and heavier tables
    from neuroshard import config

    assert config.COMPUTE_DEFAULTS[True]["pf_augment"] > 0 and config.COMPUTE_DEFAULTS[False] == {
        "compute_samples": 2000, "whole_share": 0.0, "pf_augment": 0.0}     # measured: the original's recipe
    collect_compute(ev, tmp_path / "d", 40, max_tables=6, max_mem_gb=5.0, max_dim=128, pool="train", progress=False)
    shards, _, _ = load_compute_data(tmp_path / "d")
    assert any(t.pooling_factor > tables[t.index].pooling_factor for s in shards for t in s)
    assert any(all(t.dim == tables[t.index].dim for t in s) and len(s) > 2 for s in shards)
    measured = types.SimpleNamespace(dataset=ev.dataset, precision="fp16", hardware="CPU (AMD EPYC), 1 device")
    with pytest.raises(ShardError, match="--pf-augment needs an emulated oracle"):
        collect_compute(measured, tmp_path / "m", 5, pool="train", progress=False, pf_augment=0.5)
    assert not (tmp_path / "m").exists()
    with pytest.raises(ShardError, match="--whole-share must be in"):
        collect_compute(ev, tmp_path / "w", 5, pool="train", progress=False, whole_share=1.5)


def test_the_collection_draws_every_table_by_default_as_the_original(tmp_path):
    """The original pre-trains on random shards of every table of the dataset (its tasks are new
    combinations of those tables), so the default pool is ``all``: the test pool's tables appear;
    ``pool="train"`` keeps to the training pool of gen_tasks.py's split (test tables unseen)."""
    from neuroshard import config
    from neuroshard.collect import table_pool
    from shardcore.oracles.emulated.oracle import EmulatedOracle

    assert config.COLLECTION.pool == "all"
    ev = EmulatedOracle("data/gpu_measurements/dlrm_b65536", 1)
    train = set(table_pool(len(ev.dataset.tables), "train"))
    assert set(table_pool(len(ev.dataset.tables))) == set(range(len(ev.dataset.tables)))
    seen = {}
    for pool in ("all", "train"):
        kw = {} if pool == "all" else {"pool": pool}
        collect_compute(ev, tmp_path / pool, 24, max_tables=8, max_mem_gb=5.0, max_dim=16, progress=False,
                        group_tables=60, group_shards=24, **kw)
        shards, _, _ = load_compute_data(tmp_path / pool)
        seen[pool] = {t.index for s in shards for t in s}
    assert seen["all"] - train and seen["train"] <= train
    assert collect_compute_cost_data.build_parser().parse_args([]).pool == "all"


def test_train_neuroshard_collects_all_to_alls_of_every_device_count(tmp_path, capsys):
    """``--comm-devices 2,3``: one folder of all-to-alls per count, the communication models trained on
    both (a 2-device model would extrapolate on 3 devices); bad lists are one-line errors before any work."""
    from neuroshard.checkpoints import load_model

    out, comm2, comm3 = tmp_path / "m", tmp_path / "comm_2", tmp_path / "comm_3"
    base = ["--gpu-devices", "0,1", "--dataset-dir", "data/gpu_measurements/dlrm_b65536", "--oracle", "emulated:h200",
            "--compute-data-dir", str(tmp_path / "compute"), "--out-dir", str(out), "--compute-samples", "12",
            "--comm-samples", "6", "--max-tables", "4", "--T-range", "2,6", "--epochs", "3", "--comm-epochs", "3",
            "--weights-precision", "fp16", "--max-memory", "5", "--quiet"]
    train_neuroshard.main(base + ["--comm-devices", "2,3", "--comm-data-dir", f"{comm2},{comm3}"])
    text = capsys.readouterr().out
    assert "communication data, 2 devices" in text and "communication data, 3 devices" in text
    assert "12 samples of 2 and 3 devices" in text
    for d, n in ((comm2, 2), (comm3, 3)):
        dims, *_ = load_comm_data(d)
        assert len(dims) == 6 and all(len(x) == n for x in dims)
    assert load_model(out / "fw_comm.pt", "fw_comm").device_counts == (2, 3)
    assert load_model(out / "neuroshard.pt", "bw_comm").device_counts == (2, 3)
    # make experiments trains such a bundle again when its sets plan for a count its models never saw
    from neuroshard.method import stale
    assert stale(out / "neuroshard.pt", (2, 3)) is None
    assert stale(out / "neuroshard.pt", (2, 4)) == "has communication models of 2 and 3-device all-to-alls only, not of 4"
    assert stale(tmp_path / "missing.pt", (2, 4)) is None
    for extra, why in ((["--comm-devices", "1,2"], "at least 2 devices"),
                       (["--comm-devices", "2,2"], "lists a count twice"),
                       (["--comm-devices", "2,3", "--comm-data-dir", str(comm2)], "one per count")):
        with pytest.raises(ShardError, match=why):
            train_neuroshard.main(base + ["--out-dir", str(tmp_path / "never")] + extra)
    assert not (tmp_path / "never").exists()
