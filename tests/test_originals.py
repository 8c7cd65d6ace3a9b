"""Users of the original AutoShard, DreamShard and NeuroShard repositories: their command lines are
accepted with the original meaning or refused with one line naming our equivalent, and their files
(processed data directories, NeuroShard task files and cost data) are read. Every original-format
file here is written by the test itself, in the layout the original scripts wrote."""

import argparse
import json
import os
from collections import OrderedDict

import numpy as np
import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import eval as eval_script  # noqa: E402
import eval_simulator  # noqa: E402
import run_autoshard  # noqa: E402
import train_autoshard  # noqa: E402
import train_comm_cost_model  # noqa: E402
import train_compute_cost_model  # noqa: E402
import train_dreamshard  # noqa: E402
import train_neuroshard  # noqa: E402
from neuroshard.cli import apply_original_training_args  # noqa: E402
from neuroshard.collect import load_comm_data, load_compute_data  # noqa: E402
from neuroshard.checkpoints import load_model  # noqa: E402
from shardcore.cli import algorithms  # noqa: E402
from shardcore.data import dlrm  # noqa: E402
from shardcore.oracles.measured.benchmark import shard_lookups  # noqa: E402
from shardcore.oracles.setting import dataset_digest  # noqa: E402
from shardcore.cli.common import run_main  # noqa: E402
from shardcore.dataset import load_dataset  # noqa: E402
from shardcore.errors import ShardError  # noqa: E402
from shardcore.data.taskgen import generate_transfer_tasks  # noqa: E402
from shardcore.tasks import load_tasks  # noqa: E402
from tools import gen_dlrm_data, gen_tasks  # noqa: E402
from shardcore.interop.plan_export import default_names  # noqa: E402

from autoshard.sharder import AutoShardModel  # noqa: E402


def _combination_supported() -> bool:
    """``--ndevices N --gpu-devices IDS`` together (N devices measured on those GPUs) comes with the
    concurrent change to shardcore.cli.common.add_device_args; before it, argparse refuses the pair."""
    p = argparse.ArgumentParser(exit_on_error=False)
    from shardcore.cli.common import add_device_args
    add_device_args(p)
    try:
        p.parse_args(["--ndevices", "8", "--gpu-devices", "0,1"])
        return True
    except (argparse.ArgumentError, SystemExit):
        return False


def refused(capsys, main, argv, match):
    """``main(argv)`` run as a script: exit status 2 and exactly one stderr line ``error: ...``."""
    with pytest.raises(SystemExit) as exc:
        run_main(main, argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    assert match in lines[0], lines[0]
    return lines[0]


def parse(module, argv):
    return module.build_parser().parse_args(argv)


# ------------------------------------------------------------------------------------------------
# Command lines
# ------------------------------------------------------------------------------------------------

def test_autoshard_gen_dlrm_data_flags(tmp_path):
    a = parse(gen_dlrm_data, ["--dim-range", "16,32", "--T-range", "80,81", "--num-train", "1", "--num-test", "1",
                              "--test-as-train", "--transfer", "--transfer-ratio", "0.5"])
    assert a.dims == [16, 32] and a.T_range == [80, 80] and (a.num_train, a.num_test) == (1, 1)
    assert a.test_as_train and a.transfer and a.transfer_ratio == 0.5
    # the task flags write AutoShard's train.txt / test.txt beside the dataset, with its meaning
    out = tmp_path / "ds"
    with pytest.raises(SystemExit) as exc:
        run_main(gen_dlrm_data.main, ["--num-tables", "12", "--batch-size", "32", "--out-dir", str(out), "--quiet",
                                      "--dim-range", "16,32", "--T-range", "5,6", "--num-train", "3",
                                      "--num-test", "2", "--transfer", "--transfer-ratio", "0.5"])
    assert exc.value.code == 0
    assert {t.dim for t in load_dataset(out, with_lookups=False).tables} <= {16, 32}
    train, test = load_tasks(out / "train.txt"), load_tasks(out / "test.txt")
    assert len(train) == 3 and len(test) == 2 and all(len(t) == 5 for t in train + test)
    assert all(i < 6 for t in train for i in t.table_ids)                # the first half only
    assert all(i in {0, 1, 2, 6, 7, 8} for t in test for i in t.table_ids)  # half old, half unseen


def test_autoshard_task_semantics():
    train, test = generate_transfer_tasks(20, 4, 4, num_train=1, num_test=1, test_as_train=True, seed=3)
    assert train == test and len(train[0]) == 4
    train, test = generate_transfer_tasks(20, 4, 4, num_train=5, num_test=5, transfer=True, transfer_ratio=1.0)
    assert all(i < 10 for t in train for i in t.table_ids) and all(i >= 10 for t in test for i in t.table_ids)
    with pytest.raises(ShardError, match="--test-as-train"):
        generate_transfer_tasks(20, 4, 4, num_train=2, num_test=1, test_as_train=True)


def test_gen_dlrm_data_without_data_reads_the_original_default_or_refuses(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    refused(capsys, gen_dlrm_data.main, ["--out-dir", "ds"], "--synthetic")
    raw = dlrm.generate_synthetic_raw(6, 16, seed=1, progress=False)
    (tmp_path / "dlrm_datasets" / "embedding_bag").mkdir(parents=True)
    dlrm.save_raw(raw, tmp_path / "dlrm_datasets" / "embedding_bag" / "fbgemm_t856_bs65536.pt")
    with pytest.raises(SystemExit) as exc:
        run_main(gen_dlrm_data.main, ["--out-dir", "ds", "--quiet"])
    assert exc.value.code == 0
    assert "reading the original default" in capsys.readouterr().out
    assert load_dataset(tmp_path / "ds").num_tables == 6


def test_run_autoshard_flags(capsys):
    a = parse(train_autoshard, ["--num-learner-threads", "1", "--num-cost-updates", "20", "--num-min-buf-size", "5",
                                "--reward-clipping", "abs_one", "--batch-size", "8", "--unroll-length", "100"])
    assert (a.learner_threads, a.cost_updates, a.cost_min_buffer, a.reward_clipping) == (1, 20, 5, "abs_one")
    assert (a.batch_size, a.unroll_length) == (8, 100)
    assert parse(train_autoshard, ["--num-threads", "1"]).learner_threads == 1
    for argv, match in ((["--checkpoint-history"], "--checkpoint-interval"),
                        (["--checkpoint-history-every", "2400"], "--checkpoint-interval"),
                        (["--disable-checkpoint"], "--checkpoint-interval"),
                        (["--num-threads", "4"], "SHARDKIT_NUM_THREADS"),
                        (["--num-learner-threads", "2"], "SHARDKIT_NUM_THREADS"),
                        (["--disable-bins"], "21"), (["--disable-dims"], "21")):
        refused(capsys, run_autoshard.main, argv, match)
    # AutoShard's devices: --gpu-devices alone named the actors' GPUs (plans had --ndevices, default 8)
    refused(capsys, run_autoshard.main, ["--gpu-devices", "0,1,2,3", "--max-memory", "5"], "--ndevices")
    argv = run_autoshard.autoshard_argv([])
    a = parse(train_autoshard, argv)
    assert a.ndevices == 8 and a.max_memory == 7.0
    a = parse(train_autoshard, run_autoshard.autoshard_argv(["--ndevices", "4", "--max-memory", "5"]))
    assert a.ndevices == 4 and a.max_memory == 5.0


def test_autoshard_ndevices_with_gpu_devices():
    """AutoShard passes both: N devices measured on the listed GPUs (depends on the concurrent change
    to shardcore.cli.common.add_device_args that allows the pair)."""
    if not _combination_supported():
        pytest.xfail("needs --ndevices together with --gpu-devices (concurrent shardcore.cli.common.add_device_args change)")
    from shardcore.cli.common import device_ids, num_devices
    for module, argv in ((train_autoshard, run_autoshard.autoshard_argv(["--ndevices", "8", "--gpu-devices", "0,1,2,3"])),
                         (eval_script, ["--alg", "autoshard", "--ndevices", "8", "--gpu-devices", "0,1,2,3",
                                        "--checkpointpath", "m.pt"])):
        a = parse(module, argv)
        assert a.ndevices == 8 and a.gpu_devices == [0, 1, 2, 3]
        assert num_devices(a) == 8 and device_ids(a) == [0, 1, 2, 3]   # 8 plan devices measured on 4


def test_eval_original_flags():
    a = parse(eval_script, ["--checkpointpath", "logs/autoshard/model.tar", "--alg", "autoshard"])
    assert a.checkpoint == "logs/autoshard/model.tar"
    a = parse(eval_script, ["--compute_model", "c.pt", "--fw_comm_model", "f.pt", "--bw_comm_model", "b.pt",
                            "--task_path", "t.txt", "--data_dir", "d", "--gpu_devices", "0,1"])
    assert (a.compute_model, a.fw_comm_model, a.bw_comm_model, a.task_path, a.data_dir, a.gpu_devices) == \
        ("c.pt", "f.pt", "b.pt", "t.txt", "d", [0, 1])


def test_memory_semantics():
    # eval.py: --max-memory is AutoShard's/DreamShard's (fp16); NeuroShard's --max_mem counts fp32
    assert parse(eval_script, ["--max-memory", "5"]).weights_precision == "fp16"
    a = parse(eval_script, ["--max_mem", "4"])
    assert (a.max_memory, a.weights_precision) == (4.0, "fp32")
    assert parse(eval_script, ["--max_mem", "4", "--weights-precision", "fp16"]).weights_precision == "fp16"
    assert parse(eval_script, ["--weights-precision", "fp16", "--max_mem", "4"]).weights_precision == "fp16"
    # NeuroShard's scripts count fp32 by default, whatever the spelling, and say so in --help
    for module in (eval_simulator, train_neuroshard):
        for flag in ("--max_mem", "--max-memory"):
            assert parse(module, [flag, "1"]).weights_precision == "fp32"
        assert "default fp32, as NeuroShard's original code" in " ".join(module.build_parser().format_help().split())
    assert parse(train_dreamshard, ["--max-memory", "5"]).weights_precision == "fp16"
    assert "default fp16, as AutoShard's and DreamShard's" in " ".join(train_dreamshard.build_parser().format_help().split())


def test_dreamshard_batch_size_is_the_cost_networks():
    a = parse(train_dreamshard, ["--task-path", "t.txt", "--gpu-devices", "0,1,2,3", "--batch-size", "64",
                                 "--entropy-weight", "0.001", "--max-memory", "5", "--out-dir", "m"])
    assert a.cost_batch_size == 64 and a.bench_batch_size is None
    assert parse(train_dreamshard, ["--bench-batch-size", "512"]).bench_batch_size == 512


def test_gen_tasks_original_ranges_and_neuroshard_file(tmp_path, capsys):
    assert parse(gen_tasks, ["--T-range", "80,81"]).T_range == [80, 80]
    assert parse(gen_tasks, ["--T-range", "50"]).T_range == [50, 50]
    assert parse(gen_tasks, ["--T_range", "10,60"]).T_range == [10, 59]
    with pytest.raises(SystemExit):
        parse(gen_tasks, ["--T-range", "5,5"])
    from helpers import make_dataset
    tables = make_dataset(tmp_path / "ds", num_tables=40)
    gen_tasks.main(["--data-dir", str(tmp_path / "ds"), "--T-range", "3,4", "--num-train", "4", "--num-test", "4",
                    "--out-dir", str(tmp_path / "ds_tasks")])
    assert all(len(t) == 3 for t in load_tasks(tmp_path / "ds_tasks" / "test.txt"))
    # NeuroShard's gen_tasks: --data_size tasks in data.txt, total memory in fp32 under --max_mem
    gen_tasks.main(["--data_dir", str(tmp_path / "ds"), "--data_size", "30", "--T_range", "8,12", "--max_dim", "32",
                    "--max_mem", "0.05", "--out_dir", str(tmp_path / "ns"), "--seed", "1"])
    tasks = load_tasks(tmp_path / "ns" / "data.txt", num_tables=40)
    assert len(tasks) == 30 and all(8 <= len(t) <= 11 for t in tasks)
    for t in tasks:
        assert set(t.dims) <= {32, 16, 8, 4}
        assert sum(tb.row * tb.dim * 4 for tb in t.tables(tables)) / 2 ** 30 <= 0.05
    assert any(len(set(t.table_ids)) < len(t) for t in tasks)   # ids drawn with replacement, as NeuroShard
    with pytest.raises(ShardError, match="--max_mem"):
        gen_tasks.main(["--data_dir", str(tmp_path / "ds"), "--data_size", "3", "--max-mem", "1"])


def test_neuroshard_training_flags(capsys):
    for module in (train_compute_cost_model, train_comm_cost_model):
        a = parse(module, ["--data_dir", "d", "--train_ratio", "0.7", "--valid_ratio", "0.2", "--batch_size", "128",
                           "--num_samples", "100", "--lr", "0.001", "--epochs", "3", "--eval_every", "1"])
        apply_original_training_args(a, None)
        assert (a.train_batch_size, a.num_samples, a.val_fraction) == (128, 100, 0.2)
        assert a.test_fraction == pytest.approx(0.1)
        refused(capsys, module.main, ["--eval_every", "5"], "--eval_every 1")
        refused(capsys, module.main, ["--train_ratio", "0.9", "--valid_ratio", "0.1"], "test share")
    a = parse(train_compute_cost_model, ["--out_path", "m.pt"])
    assert a.out_path == "m.pt" and a.train_batch_size == 64


# ------------------------------------------------------------------------------------------------
# Files
# ------------------------------------------------------------------------------------------------

def _original_dataset(path, layout: str, num_tables=6, batch=8, seed=0):
    """A processed dataset directory as the original gen_dlrm_data.py scripts wrote it."""
    rng = np.random.default_rng(seed)
    offsets, indices, configs = [], [], []
    for i in range(num_tables):
        lengths = rng.integers(0, 4, size=batch)
        off = torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)])).long()
        idx = torch.from_numpy(rng.integers(0, 150, size=int(off[-1]))).long()
        offsets.append(off)
        indices.append(idx)
        row = max(100, int(idx.max()) + 1 if idx.numel() else 1)
        bins = {f"bin_{k}": (1.0 if k == 0 else 0.0) for k in range(17)}
        if layout == "neuroshard":
            configs.append({"row": row, "pooling_factor": float(lengths.mean()), **bins})
        else:
            configs.append({"index": i, "row": row, "dim": 16 if i % 2 else 32,
                            "pooling_factor": int(lengths.mean()), **bins})
    path.mkdir(parents=True)
    keys = ("offsets", "indices") if layout == "neuroshard" else ("lS_offsets", "lS_indices")
    torch.save({keys[0]: offsets, keys[1]: indices}, path / "data.pt")
    (path / "table_configs.json").write_text(json.dumps(configs if layout == "neuroshard" else {"tables": configs}))
    return offsets, indices, configs


@pytest.mark.parametrize("layout", ["autoshard", "neuroshard"])
def test_original_dataset_directories_are_read(tmp_path, layout):
    offsets, indices, configs = _original_dataset(tmp_path / "ds", layout)
    ds = load_dataset(tmp_path / "ds")
    assert ds.num_tables == 6 and ds.batch_size == 8
    for i in range(6):
        idx, off = ds.lookups(i)
        assert torch.equal(idx, indices[i]) and torch.equal(off, offsets[i])
        t = ds.tables[i]
        assert t.index == i and t.row == configs[i]["row"] and t.bins[0] == 1.0
        assert t.dim == (configs[i]["dim"] if layout == "autoshard" else 16)
    # the oracle's input and the cache's dataset identity work on it
    idx, off = shard_lookups(ds, [ds.tables[1], ds.tables[1].with_dim(8)])
    assert off.numel() == 2 * 8 + 1 and idx.numel() == 2 * indices[1].numel()
    assert len(dataset_digest(tmp_path / "ds")) == 16


def test_bad_original_files_fail_in_one_line(tmp_path):
    _original_dataset(tmp_path / "ds", "neuroshard")
    torch.save({"offsets": [torch.tensor([0, 2])], "indices": [torch.tensor([1])]}, tmp_path / "ds" / "data.pt")
    with pytest.raises(ShardError, match="offsets must start at 0 and end"):
        load_dataset(tmp_path / "ds")
    torch.save({"something": 1}, tmp_path / "ds" / "data.pt")
    with pytest.raises(ShardError, match="lS_offsets/lS_indices or offsets/indices"):
        load_dataset(tmp_path / "ds")
    (tmp_path / "ds" / "table_configs.json").write_text(json.dumps([{"row": 100}]))
    with pytest.raises(ShardError, match="missing field"):
        load_dataset(tmp_path / "ds", with_lookups=False)


def test_neuroshard_task_file_with_repeated_ids(tmp_path, capsys):
    _original_dataset(tmp_path / "ds", "neuroshard")
    (tmp_path / "data.txt").write_text("3,3,5 16,32,8\n0,1,2,3 4,4,4,4\n")
    tasks = load_tasks(tmp_path / "data.txt", num_tables=6)
    assert tasks[0].table_ids == (3, 3, 5) and tasks[0].dims == (16, 32, 8)
    tables = tasks[0].tables(load_dataset(tmp_path / "ds", with_lookups=False).tables)
    assert [(t.index, t.dim) for t in tables] == [(3, 16), (3, 32), (5, 8)]   # a table used twice is two tables
    assert default_names(tables) == ["table_3", "table_3_1", "table_5"]
    (tmp_path / "bad.txt").write_text("3,3,5\n")
    with pytest.raises(ShardError, match="appears twice"):   # DreamShard-style lines still name a table once
        load_tasks(tmp_path / "bad.txt")
    (tmp_path / "bad2.txt").write_text("3,3,5 16,32\n")
    with pytest.raises(ShardError, match="3 table ids but 2 dims"):
        load_tasks(tmp_path / "bad2.txt")
    # NeuroShard's eval.py command line on NeuroShard's files, planned without hardware
    eval_script.main(["--alg", "random,lookup_greedy", "--task_path", str(tmp_path / "data.txt"), "--data_dir",
                      str(tmp_path / "ds"), "--gpu_devices", "0,1", "--max_mem", "1", "--plan-only",
                      "--out", str(tmp_path / "r.jsonl")])
    records = [json.loads(x) for x in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert len(records) == 4 and all(r["feasible"] for r in records) and len(records[0]["allocation"]) == 3
    assert "fp32" in capsys.readouterr().out


def test_neuroshard_cost_data_round_trip(tmp_path):
    # compute: NeuroShard's augmented table_configs.json (every table at dims 16, 8, 4) and data.txt
    base = [{"row": 100 * (k + 1), "pooling_factor": 1.5 * k, **{f"bin_{b}": 0.0 for b in range(17)}}
            for k in range(3)]
    aug = [{**t, "dim": d} for d in (16, 8, 4) for t in base]
    comp = tmp_path / "compute"
    comp.mkdir()
    (comp / "table_configs.json").write_text(json.dumps(aug))
    (comp / "data.txt").write_text("0,4,8 3.0\n2 1.5\n7,7 2.25\n")
    shards, costs, setting = load_compute_data(str(comp))
    assert [[(t.index, t.row, t.dim) for t in s] for s in shards] == [
        [(0, 100, 16), (1, 200, 8), (2, 300, 4)], [(2, 300, 16)], [(1, 200, 4), (1, 200, 4)]]
    assert np.allclose(costs.sum(1), [3.0, 1.5, 2.25]) and np.allclose(costs[:, 0], costs[:, 1])
    assert shards[1][0].pooling_factor == 3.0 and setting["precision"] == "fp32"
    # communication: per device dim sums, delays, fw and bw ms
    comm = tmp_path / "comm_4"
    comm.mkdir()
    (comm / "data.txt").write_text("64,32,16,8 0,3,1,2 1.5,1.25,1.0,0.5 2.0,1.5,1.0,0.75\n"
                                   "8,8,8,8 0,0,0,0 0.5,0.5,0.5,0.5 0.25,0.25,0.25,0.25\n")
    dims, delays, fw, bw, _ = load_comm_data(str(comm))
    assert len(dims) == 2 and dims[0].tolist() == [64, 32, 16, 8] and delays[0].tolist() == [0, 3, 1, 2]
    assert fw[0].tolist() == [1.5, 1.25, 1.0, 0.5] and bw[1].tolist() == [0.25] * 4
    (comm / "data.txt").write_text("64,32 0,3 1.5\n")
    with pytest.raises(ShardError, match="dim_sums delays fw_costs bw_costs"):
        load_comm_data(str(comm))
    # the training scripts take these directories and NeuroShard's flags
    train_compute_cost_model.main(["--data_dir", str(comp), "--epochs", "2", "--train_ratio", "0.34",
                                   "--valid_ratio", "0.33", "--batch_size", "2", "--out_path",
                                   str(tmp_path / "compute.pt"), "--quiet"])
    assert load_model(tmp_path / "compute.pt", "compute") is not None


def test_original_checkpoints_are_named_with_the_training_command(tmp_path):
    state = OrderedDict(("layer.weight", torch.zeros(2, 2)) for _ in range(1))
    torch.save(state, tmp_path / "9.pt")                      # DreamShard's models/dreamshard/9.pt: a state_dict
    with pytest.raises(ShardError) as exc:
        algorithms.lookup(str(tmp_path / "9.pt"))
    msg = str(exc.value)
    assert "original" in msg and "train_dreamshard.py" in msg and "\n" not in msg
    torch.save({"model_state_dict": state, "flags": {"ndevices": 8, "xpid": "autoshard"}},
               tmp_path / "model.tar")                        # AutoShard's logs/autoshard/model.tar
    with pytest.raises(ShardError, match=r"original .*train_autoshard\.py") as exc:
        AutoShardModel.load(tmp_path / "model.tar")
    assert "\n" not in str(exc.value)
    torch.save(torch.nn.Linear(2, 2), tmp_path / "compute.pt")   # a pickled module: not loadable weights-only
    with pytest.raises(ShardError, match=r"original .*train_neuroshard\.py") as exc:
        load_model(tmp_path / "compute.pt", "compute")
    assert "\n" not in str(exc.value)


def test_every_flag_of_the_tools_has_help(monkeypatch):
    from tools import bench_oracle, check_synthetic

    actions = []
    real = argparse.ArgumentParser.parse_args

    def record(self, args=None, namespace=None):
        actions.extend(a for a in self._actions if not isinstance(a, argparse._HelpAction))
        raise SystemExit(0)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", record)
    for main in (check_synthetic.main, bench_oracle.parse_args):
        with pytest.raises(SystemExit):
            main([])
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", real)
    assert len(actions) > 15
    assert [a.option_strings for a in actions if not a.help] == []


def test_tasks_beside_the_dataset_and_cost_data_as_data_dir(tmp_path, capsys, monkeypatch):
    """The original layout keeps train.txt/test.txt beside the dataset: without --task-path (and no
    default task file) the scripts find them there, with a note; a cost-data folder given as --data_dir
    (its meaning in the original evaluation script) is refused in one line that says what to give."""
    from helpers import make_dataset
    from shardcore.tasks import Task, save_tasks

    monkeypatch.chdir(tmp_path)          # the default data/dlrm_tasks_50/*.txt do not exist here
    make_dataset(tmp_path / "ds", num_tables=8, batch_size=8)
    save_tasks(tmp_path / "ds" / "test.txt", [Task((0, 1, 2))])
    save_tasks(tmp_path / "ds" / "train.txt", [Task((3, 4))])
    a = parse(eval_script, ["--data-dir", str(tmp_path / "ds")])
    assert a.task_path == str(tmp_path / "ds" / "test.txt")
    assert "beside the dataset" in capsys.readouterr().err
    a = parse(train_autoshard, ["--data-dir", str(tmp_path / "ds")])
    assert a.task_path == str(tmp_path / "ds" / "train.txt")
    capsys.readouterr()
    a = parse(eval_script, ["--data-dir", str(tmp_path / "ds"), "--task-path", "mine.txt"])
    assert a.task_path == "mine.txt"   # a given path is never replaced

    (tmp_path / "cost" / "compute").mkdir(parents=True)
    (tmp_path / "cost" / "compute" / "compute_costs.csv").write_text("sample\n")
    line = refused(capsys, eval_script.main, ["--data_dir", str(tmp_path / "cost"), "--plan-only"], "cost data")
    assert "--compute-model" in line and "table_configs.json" in line
