"""The experiment runner end to end on tiny data (2 logical CPU devices), the planning benchmark,
the training orchestration (with stand-in training scripts) and one-line errors."""

import dataclasses
import json
import os
import subprocess
import sys
import textwrap

import matplotlib.image as mpimg
import pandas as pd
import pytest

from experiments import config, training
from shardcore import registry
from shardcore.errors import ShardError
from shardcore.tasks import load_tasks
from shardcore.types import Topology

from helpers import load_tool, make_dataset

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"




@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A 40-table dataset and an (untrained) DreamShard checkpoint: the learned path, without training."""
    from dreamshard.config import DreamShardConfig
    from dreamshard.sharder import DreamShardModel
    from shardcore.data.features import FeatureScaler

    root = tmp_path_factory.mktemp("exp")
    tables = make_dataset(root / "ds", num_tables=40, batch_size=64)
    ckpt = root / "ds_model.pt"
    DreamShardModel.new(DreamShardConfig(), FeatureScaler.fit(tables)).save(ckpt)
    return root, tables, ckpt


def _check_png(path):
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    img = mpimg.imread(path)
    assert img.ndim == 3 and img.shape[0] > 50 and img.shape[1] > 50


def test_pipeline_end_to_end(tiny, capsys):
    root, tables, ckpt = tiny
    out, models = root / "results", root / "models"
    load_tool("run_experiments").main([
        "--scale", "tiny", "--data-dir", str(root / "ds"), "--out-dir", str(out), "--models-dir", str(models),
        "--algs", "random,size_greedy,lookup_greedy,dreamshard,neuroshard,autoshard",
        "--dreamshard-model", str(ckpt), "--skip-train", "--cache-path", str(root / "c.sqlite"), "--quiet"])
    printed = capsys.readouterr().out
    assert "DLRM-6 (2)" in printed and "wrote" in printed

    for name in ("measurements.csv", "results.md", "costs.png", "breakdown.png", "summary.json"):
        assert (out / name).is_file(), name
    # every measurement: 2 sets x 2 tasks x 4 algorithms, all measured, 2 devices x 4 parts each
    df = pd.read_csv(out / "measurements.csv")
    assert len(df) == 16
    assert set(df.alg) == {"random", "size_greedy", "lookup_greedy", "dreamshard"}
    assert set(df.task_set) == {"DLRM-6 (2)", "DLRM-10 (2)"}
    assert (df.status == "ok").all() and (df.cost_ms > 0).all() and (df.planning_ms >= 0).all()
    for cell, total in zip(df.device_costs_ms, df.cost_ms):
        costs = json.loads(cell)
        assert len(costs) == 2 and all(len(c) == 4 for c in costs)
        assert max(sum(c) for c in costs) == pytest.approx(total, abs=1e-2)
    assert (df[df.alg == "dreamshard"].checkpoint == str(ckpt)).all()
    # the paper-layout table: header, one row per set, best in bold, % over random
    md = (out / "results.md").read_text()
    cost_section = md.split("## Plan cost")[1].split("\n## ")[0]
    table = [l for l in cost_section.splitlines() if l.startswith("| ")]
    assert table[0].split("|")[1].strip() == "Task" and len(table) == 3
    assert [c.strip() for c in table[0].split("|")[2:6]] == ["Random", "Size-based", "Lookup-based", "DreamShard"]
    rows = {l.split("|")[1].strip(): l for l in table}
    for name in ("DLRM-6 (2)", "DLRM-10 (2)"):
        assert name in rows and "%)" in rows[name] and "±" in rows[name]
    # skipped methods are noted, not fatal
    assert "## Skipped" in md and "autoshard" in md and "neuroshard" in md
    summary = json.loads((out / "summary.json").read_text())
    # bold follows the paired intervals of summary.json, the same statistics the table shows
    header = [c.strip() for c in table[0].split("|")[1:-1]]
    for st in summary["task_sets"]:
        cells = dict(zip(header, [c.strip() for c in rows[st["task_set"]].split("|")[1:-1]]))
        algs = st["algorithms"]
        assert st["best_baseline"] in ("random", "size_greedy", "lookup_greedy") and st["tasks_compared"] == [0, 1]
        ds = algs["dreamshard"]
        assert ds["vs"] == st["best_baseline"] and ds["diff_lo_ms"] <= ds["diff_ms"] <= ds["diff_hi_ms"]
        costs = df[(df.task_set == st["task_set"])].pivot(index="task", columns="alg", values="cost_ms")
        assert ds["diff_ms"] == pytest.approx((costs.dreamshard - costs[st["best_baseline"]]).mean(), abs=1e-3)
        bold = [h for h, c in cells.items() if c.startswith("**")]
        if st["bold"] is None:
            assert bold == [] and st["why_not_bold"]
        else:
            assert bold == [config.label(st["bold"])] and algs[st["bold"]]["bold"] is True
            assert algs[st["bold"]]["mean_ms"] == min(a["mean_ms"] for a in algs.values())
        # the best against the runner-up of any kind: the second-lowest mean, its paired difference
        ru = st["runner_up"]
        second = sorted(algs, key=lambda a: algs[a]["mean_ms"])[1]
        assert ru["alg"] == second and ru["diff_ms"] == pytest.approx(
            (costs[st["best"]] - costs[second]).mean(), abs=1e-3)
        assert f"vs {config.label(second)} (" in md
    assert "## Paired with the best baseline" in md and "95% bootstrap interval" in md
    assert "## The best against the runner-up" in md
    assert "## Paired with the best baseline" in printed and "| DLRM-10 (2)" in printed
    assert summary["finished"] is True and summary["scale"] == "tiny"
    assert {"machine", "date", "command", "versions", "timings_s"} <= set(summary)
    assert "torch" in summary["versions"] and summary["timings_s"]["total"] > 0
    assert any(n.startswith("autoshard") for n in summary["notes"])
    assert any(n.startswith("neuroshard") for n in summary["notes"])
    assert [s["task_set"] for s in summary["task_sets"]] == ["DLRM-6 (2)", "DLRM-10 (2)"]
    assert summary["task_sets"][0]["algorithms"]["lookup_greedy"]["pct_over_random"] is not None
    _check_png(out / "costs.png")
    _check_png(out / "breakdown.png")
    # test tasks use only tables of the test pool; the same split for every set
    train = load_tasks(out / "tasks" / "dlrm6_2dev" / "train.txt")
    for slug in ("dlrm6_2dev", "dlrm10_2dev"):
        test = load_tasks(out / "tasks" / slug / "test.txt")
        assert len(test) == 2
        assert not {i for t in test for i in t.table_ids} & {i for t in train for i in t.table_ids}


def test_pipeline_on_the_emulated_h200(tiny, capsys):
    """The same pipeline judged by the emulated-H200 oracle: no workers, results labelled as emulated."""
    root, tables, ckpt = tiny
    out = root / "results_emulated"
    load_tool("run_experiments").main([
        "--scale", "tiny", "--data-dir", str(root / "ds"), "--out-dir", str(out), "--models-dir", str(root / "m2"),
        "--algs", "random,lookup_greedy,dreamshard,shardkit-tw", "--dreamshard-model", str(ckpt), "--skip-train",
        "--oracle", "emulated:h200", "--quiet"])
    df = pd.read_csv(out / "measurements.csv")
    assert len(df) == 16 and (df.status == "ok").all() and (df.cost_ms > 0).all()
    md = (out / "results.md").read_text()
    assert "costs from the emulated:h200 oracle" in md and "GiB per device), measured on this machine" not in md
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["oracle"] == "emulated:h200"
    # the learned method's margin below lookup-greedy and its gap above the table-wise search, per set
    assert "## Learned methods against greedy and the table-wise optimum" in md
    gaps = {(g["task_set"], g["alg"]): g for g in summary["learned_gaps"]}
    assert set(gaps) == {(s, a) for s in ("DLRM-6 (2)", "DLRM-10 (2)") for a in ("dreamshard", "shardkit-tw")}
    for st in summary["task_sets"]:
        means = {a: s["mean_ms"] for a, s in st["algorithms"].items()}
        g = gaps[(st["task_set"], "dreamshard")]
        assert g["below_greedy_pct"] == pytest.approx(100 * (1 - means["dreamshard"] / means["lookup_greedy"]), abs=0.01)
        assert g["above_tw_optimum_pct"] == pytest.approx(100 * (means["dreamshard"] / means["shardkit-tw"] - 1), abs=0.01)
        assert gaps[(st["task_set"], "shardkit-tw")]["above_tw_optimum_pct"] == 0
    tw = df[df.alg == "shardkit-tw"]    # table-wise only: every table whole on one device
    assert all(sh["type"] == "table_wise" and len(sh["devices"]) == 1
               for cell in tw.shardings for sh in json.loads(cell))


def test_bench_planning_tiny(tiny, capsys):
    root, tables, ckpt = tiny
    out = root / "bench"
    load_tool("bench_planning").main([
        "--data-dir", str(root / "ds"), "--out-dir", str(out), "--algs", "random,lookup_greedy,dreamshard",
        "--dreamshard-model", str(ckpt), "--tables", "5,10,100", "--tables-ndevices", "2",
        "--devices", "2,4", "--devices-tables", "12", "--repeats", "2", "--models-dir", str(root / "none")])
    for name in ("planning_tables.csv", "planning_devices.csv", "planning.md", "planning.png"):
        assert (out / name).is_file(), name
    tab = pd.read_csv(out / "planning_tables.csv")
    assert sorted(set(tab.num_tables)) == [5, 10, 40]          # 100 > the dataset's 40 tables: all of them
    assert set(tab.alg) == {"random", "lookup_greedy", "dreamshard"} and len(tab) == 9
    assert (tab.status == "ok").all() and (tab.planning_ms > 0).all() and (tab.peak_mem_mb >= 0).all()
    dev = pd.read_csv(out / "planning_devices.csv")
    assert sorted(set(dev.ndevices)) == [2, 4] and (dev.num_tables == 12).all() and (dev.status == "ok").all()
    md = (out / "planning.md").read_text()
    assert "| algorithm" in md and "Peak memory" in md and "DreamShard" in md
    _check_png(out / "planning.png")
    # the time limit: once a size is over it, the larger sizes of that sweep are skipped
    load_tool("bench_planning").main([
        "--data-dir", str(root / "ds"), "--out-dir", str(root / "bench2"), "--algs", "lookup_greedy",
        "--tables", "5,10", "--devices", "2,4", "--devices-tables", "8", "--time-limit", "1e-9"])
    tab = pd.read_csv(root / "bench2" / "planning_tables.csv")
    assert list(tab.status) == ["ok", "skipped"] and "limit" in tab.error[1]
    assert list(pd.read_csv(root / "bench2" / "planning_devices.csv").status) == ["ok", "skipped"]


FAKE_TRAIN = textwrap.dedent("""
    import os, sys, time
    args = sys.argv[1:]
    out = args[args.index("--out-dir") + 1]
    n = [int(args[i + 1]) for i, a in enumerate(args) if a == "--num-iterations"][-1]   # the last one wins
    mode = os.environ["FAKE_MODE"]
    print("fake training", " ".join(args), flush=True)
    if mode == "fail":
        print("error: the fake trainer fails", file=sys.stderr)
        sys.exit(3)
    for i in range(n):
        open(os.path.join(out, f"{i}.pt"), "w").write("x")
        if mode == "hang":
            time.sleep(60)
""")


def test_training_orchestration(tmp_path, monkeypatch):
    """Train / reuse / fail / time-out paths of the learned methods, with a stand-in training script
    in the method's registry entry (no global of the runner is patched)."""
    (tmp_path / "train_dreamshard.py").write_text(FAKE_TRAIN)
    spec = dataclasses.replace(registry.get("dreamshard"), train_script=tmp_path / "train_dreamshard.py")
    ts = config.TaskSetDef(6, 2)
    cfg = config.ExperimentConfig(data_dir=str(tmp_path), out_dir=str(tmp_path / "out"),
                                  models_dir=str(tmp_path / "models"), scale="tiny",
                                  train_args={"dreamshard": "--num-iterations 3"}).resolved()
    paths = {ts: tmp_path / "train.txt"}

    monkeypatch.setenv("FAKE_MODE", "ok")
    notes = []
    models = training.prepare_learned(cfg, spec, paths, notes, echo=False)
    assert notes == [] and models[2].source == "trained" and models[2].checkpoint.endswith("dreamshard_2dev/2.pt")
    log = (tmp_path / "out" / "logs" / "train_dreamshard_2dev.log").read_text()
    assert "--task-path" in log and "--gpu-devices 0,1" in log and "fake training" in log
    # a finished checkpoint is reused
    models = training.prepare_learned(cfg, spec, paths, notes, echo=False)
    assert models[2].source == "existing"
    # ... unless its method finds it stale for the run's device counts: trained again (--skip-train: kept)
    seen = []
    stale = dataclasses.replace(spec, stale=lambda ck, counts: seen.append((ck.name, counts)) or "knows 1 device only")
    skip = dataclasses.replace(cfg, skip_train=True)
    models = training.prepare_learned(skip, stale, paths, notes, echo=False)
    assert models[2].source == "existing" and "(--skip-train kept it)" in notes[-1]
    notes = []
    models = training.prepare_learned(cfg, stale, paths, notes, echo=False)
    assert models[2].source == "trained" and notes == ["dreamshard: trained again: the checkpoint of an earlier run "
                                                       "knows 1 device only"]
    assert seen[0] == ("2.pt", (2,))
    notes = []
    models = training.prepare_learned(dataclasses.replace(cfg, retrain=True), stale, paths, notes, echo=False)
    assert models[2].source == "trained" and notes == [] and len(seen) == 2   # --retrain: not asked

    monkeypatch.setenv("FAKE_MODE", "fail")
    notes = []
    retrain = dataclasses.replace(cfg, retrain=True)
    assert training.prepare_learned(retrain, spec, paths, notes, echo=False) == {}
    assert len(notes) == 1 and "exit status 3" in notes[0] and "fake trainer fails" in notes[0]

    monkeypatch.setenv("FAKE_MODE", "hang")
    notes = []
    hang = dataclasses.replace(retrain, train_timeout_s=3.0)
    models = training.prepare_learned(hang, spec, paths, notes, echo=False)
    assert models[2].source == "partial" and models[2].checkpoint.endswith("0.pt") and notes == []

    # --skip-train without a checkpoint: a note, no model
    notes = []
    skip = dataclasses.replace(cfg, models_dir=str(tmp_path / "empty"), skip_train=True)
    assert training.prepare_learned(skip, spec, paths, notes, echo=False) == {}
    assert "--skip-train" in notes[0]


def test_training_commands_come_from_the_registry(tmp_path):
    """Each method's training command: its script, the shared arguments in its own spelling, then the
    scale's flags and the user's; the benchmark batch renamed where the script's --batch-size differs."""
    cfg = config.ExperimentConfig(data_dir=str(tmp_path), out_dir=str(tmp_path / "out"), scale="tiny",
                                  batch_size=64, models_dir=str(tmp_path / "m"),
                                  train_args={"autoshard": "--seed=5"}).resolved()
    ts = config.TaskSetDef(6, 2)
    d = tmp_path / "ck"
    d.mkdir()
    cmds = {}
    for name, spec in registry.available().items():
        folder = training.method_dir(cfg.models_dir, name, 2)
        cmds[name] = training.train_command(cfg, spec, ts, tmp_path / "train.txt", folder)
        assert cmds[name][1] == str(spec.train_script) and cmds[name][1].endswith(f"train_{name}.py")
        tail = list(spec.scale_flags["tiny"])
        assert cmds[name][-len(tail) - (name == "autoshard"):][:len(tail)] == tail
    assert "--bench-batch-size" in cmds["dreamshard"] and "--batch-size" not in cmds["dreamshard"]
    assert "--bench-batch-size" in cmds["autoshard"] and cmds["autoshard"][-1] == "--seed=5"
    assert cmds["autoshard"][cmds["autoshard"].index("--xpid") + 1] == "autoshard_2dev"
    assert "--batch-size" in cmds["neuroshard"] and "--task-path" not in cmds["neuroshard"]
    # NeuroShard's one model serves every set: its all-to-alls are collected on each device count planned for
    ns = cmds["neuroshard"]
    counts = sorted({t.ndevices for t in cfg.task_sets} | {2})
    assert ns[ns.index("--comm-devices") + 1] == ",".join(map(str, counts))
    assert ns[ns.index("--comm-data-dir") + 1].split(",") == [str(training.method_dir(cfg.models_dir, "neuroshard", 2)
                                                                  / f"comm_{n}") for n in counts]
    small = config.ExperimentConfig(data_dir=str(tmp_path), scale="small").resolved()
    cmd = training.train_command(small, registry.get("neuroshard"), small.train_sets[0], tmp_path / "t.txt", d)
    assert cmd[cmd.index("--comm-devices") + 1] == "4,8"      # DLRM-50 (4) trains it; DLRM-40/80 plan on 8
    # the checkpoint each leaves: a numbered one (the newest), or a fixed name
    for f in ("1.pt", "10.pt", "2.pt", "model.pt"):
        (d / f).write_text("x")
    assert registry.get("dreamshard").find_checkpoint(d).name == "10.pt"
    assert registry.get("autoshard").find_checkpoint(d).name == "model.pt"
    assert registry.get("neuroshard").find_checkpoint(d) is None
    # the one evaluated: DreamShard's and AutoShard's best.pt where their training wrote one, else the same
    assert training.model_checkpoint(registry.get("dreamshard"), d).name == "10.pt"
    assert training.model_checkpoint(registry.get("autoshard"), d).name == "model.pt"
    (d / "best.pt").write_text("x")
    assert training.model_checkpoint(registry.get("dreamshard"), d).name == "best.pt"
    assert registry.get("dreamshard").find_checkpoint(d).name == "10.pt"      # still says how far it trained
    assert training.model_checkpoint(registry.get("autoshard"), d).name == "best.pt"
    assert registry.get("autoshard").find_checkpoint(d).name == "model.pt"


def test_config_errors():
    assert config.parse_task_sets("20:4, 50:4,40:8")[2] == config.TaskSetDef(40, 8)
    for bad in ("20x4", "0:4", "", "20:4,20:4"):
        with pytest.raises(ShardError):
            config.parse_task_sets(bad)
    with pytest.raises(ShardError, match="unknown algorithm"):
        config.ExperimentConfig(algs=("random", "bogus")).resolved()
    with pytest.raises(ShardError, match="checkpoint not found"):
        config.ExperimentConfig(model_paths={"dreamshard": "/nonexistent/9.pt"}).resolved()
    # the small scale's shape (documented in results/README.md)
    small = config.SCALES["small"]
    assert [t.name for t in small.task_sets] == ["DLRM-20 (4)", "DLRM-50 (4)", "DLRM-40 (8)", "DLRM-80 (8)"]
    assert small.num_test == 5 and small.train_sets == (config.TaskSetDef(50, 4),)
    assert config.all_algs()[-5:] == ("autoshard", "dreamshard", "neuroshard", "shardkit-tw", "shardkit")   # ours last
    assert config.label("shardkit") == "shardkit" and config.label("torchrec-tw") == "TorchRec (TW)"
    assert config.label("neuroshard") == "NeuroShard" and config.label("size_greedy") == "Size-based"
    # a noisy measured oracle repeats every plan, an emulated one answers once; the judge is held out
    assert config.ExperimentConfig().resolved().repeats == config.MEASURED_REPEATS == 3
    emu = config.ExperimentConfig(oracle="emulated:h200").resolved()
    assert emu.repeats == 1 and emu.emulator_fit == "heldout"
    assert config.ExperimentConfig(oracle="emulated:h200", repeats=2).resolved().repeats == 2
    with pytest.raises(ShardError, match="emulator-fit"):
        config.ExperimentConfig(emulator_fit="bogus").resolved()
    with pytest.raises(ShardError, match="repeats"):
        config.ExperimentConfig(repeats=0).resolved()


def test_run_experiments_flags_come_from_the_config():
    """tools/run_experiments.py's flags are ExperimentConfig's param fields, each with the config's default
    and a help text; parsed and turned back into the config they reproduce it."""
    from shardcore.config import config_from_args, flag_fields

    tool = load_tool("run_experiments")
    p = tool.build_parser()
    by_flag = {s: a for a in p._actions for s in a.option_strings}
    defaults = config.ExperimentConfig()
    for f in flag_fields(config.ExperimentConfig):
        meta = f.metadata["cli"]
        action = by_flag[(meta["flags"] or ("--" + f.name.replace("_", "-"),))[0]]
        assert action.default == getattr(defaults, f.name) and action.help, f.name
        assert "{" not in action.help, f.name
    assert ",".join(config.all_algs()) in by_flag["--algs"].help
    assert by_flag["--max-memory"].default == defaults.max_memory
    assert by_flag["--weights-precision"].default == defaults.precision
    got = config_from_args(config.ExperimentConfig, p.parse_args([]), command=defaults.command)
    assert got == dataclasses.replace(defaults)
    args = p.parse_args(["--scale", "tiny", "--task-sets", "6:2", "--train-timeout", "30", "--skip-train"])
    cfg = config_from_args(config.ExperimentConfig, args)
    assert (cfg.scale, cfg.task_sets, cfg.train_timeout_s, cfg.skip_train) == \
        ("tiny", (config.TaskSetDef(6, 2),), 30.0, True)


def test_torchrec_column_is_configured_for_the_judged_hardware():
    """TorchRec's planner gets the judged hardware like the declared planners, and its record keeps the
    configuration it ran with (through the guard)."""
    pytest.importorskip("torchrec")
    from experiments.pipeline import build_sharders, planning_context_of
    from shardcore.tables import TableConfig

    cfg = config.ExperimentConfig(oracle="emulated:h200", comm_bandwidth=123.0, comm_latency=7.0, data_dir=None)
    sharders, _ = build_sharders(["torchrec"], planning_context_of(cfg, 2, 65536), {})
    tables = [TableConfig(i, 1000 * (i + 1), 16, 2.0 + i) for i in range(4)]
    sharders["torchrec"].shard(tables, Topology(2, 1.0))
    cfg = sharders["torchrec"].plan_stats()["torchrec_config"]
    assert cfg["compute_device"] == "cuda" and cfg["intra_host_bw_gbps"] == 123.0 and cfg["batch_per_rank"] == 32768


@pytest.mark.parametrize("script,args", [
    ("run_experiments.py", ["--scale", "tiny", "--data-dir", "/nonexistent/ds"]),
    ("run_experiments.py", ["--scale", "tiny", "--algs", "random,bogus"]),
    ("bench_planning.py", ["--data-dir", "/nonexistent/ds"]),
])
def test_bad_input_gives_one_line_error(tmp_path, script, args):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", script), "--out-dir", str(tmp_path / "o")]
                          + args, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert not (tmp_path / "o" / "results.md").exists()


def test_autoshard_trains_on_tasks_of_every_table_and_an_old_checkpoint_is_stale(tmp_path):
    """AutoShard's training tasks in an experiment are drawn from every table (its original's protocol),
    the other methods' from the train split; an AutoShard checkpoint of the plain observation (no
    observation options in its config) is trained again."""
    import torch

    from experiments import pipeline
    from shardcore.dataset import load_dataset

    make_dataset(tmp_path / "ds", num_tables=40, seed=3)
    cfg = config.ExperimentConfig(data_dir=str(tmp_path / "ds"), out_dir=str(tmp_path / "out"), scale="tiny",
                                  models_dir=str(tmp_path / "m")).resolved()
    tables = load_dataset(tmp_path / "ds", with_lookups=False).tables
    dirs = pipeline.generate_task_files(cfg, tables)
    ts = cfg.train_sets[0]
    every = pipeline.train_paths_for(registry.get("autoshard"), cfg, dirs)[ts]
    assert every.name == "train_every_table.txt"
    assert pipeline.train_paths_for(registry.get("dreamshard"), cfg, dirs)[ts].name == "train.txt"
    n = len(tables)
    drawn = {i for t in load_tasks(every, num_tables=n) for i in t.table_ids}
    split = {i for t in load_tasks(dirs[ts] / "train.txt", num_tables=n) for i in t.table_ids}
    tested = {i for t in load_tasks(dirs[ts] / "test.txt", num_tables=n) for i in t.table_ids}
    assert len(load_tasks(every, num_tables=n)) == cfg.num_train and not split & tested and drawn & tested
    stale = registry.get("autoshard").stale
    ck = tmp_path / "model.pt"
    torch.save({"config": {"seed": 0}}, ck)
    assert "plain observation" in stale(ck, (4,))
    torch.save({"config": {"scaled_device_features": True, "relative_costs": True}}, ck)
    assert stale(ck, (4,)) is None
    ck.write_bytes(b"junk")
    assert stale(ck, (4,)) is None          # unreadable: the loader's error, later
