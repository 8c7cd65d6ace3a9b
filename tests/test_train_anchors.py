"""tools/train_anchors.py: one-line errors for bad input, the manifest of a tiny real run, and a failed
run that leaves the output as it was (seconds: NeuroShard only, a few samples and epochs)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from shardcore.errors import ShardError
from tests.helpers import load_tool

ROOT = Path(__file__).resolve().parent.parent
TINY = ["--stages", "neuroshard", "--ns-compute-samples", "12", "--ns-comm-samples", "6", "--ns-max-tables", "4",
        "--ns-epochs", "30", "--ns-comm-epochs", "30"]


@pytest.fixture(scope="module")
def tool():
    return load_tool("train_anchors")


def _dirs(tmp_path):
    return ["--out-dir", str(tmp_path / "anchors" / "h200"), "--work-dir", str(tmp_path / "work")]


@pytest.mark.parametrize("argv, message", [
    (["--stages", "dreamshard,foo"], "--stages: unknown method foo"),
    (["--data-dir", "no/such/dir"], "no table_configs.json"),
    (["--oracle", "emulated:tpu"], "unknown oracle"),
    (["--expected-test", "no/such/file.txt"], "--expected-test no/such/file.txt: no such file"),
    (["--ns-comm-devices", "4,1"], "--ns-comm-devices: device counts of an all-to-all, each at least 2"),
])
def test_bad_input_is_one_line_and_writes_nothing(tool, tmp_path, argv, message):
    with pytest.raises(ShardError, match=message) as err:
        tool.main(_dirs(tmp_path) + argv)
    assert "\n" not in str(err.value)
    assert not (tmp_path / "anchors").exists() and not (tmp_path / "work").exists()


def test_bad_numbers_are_refused_by_the_parser(tool, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        tool.main(_dirs(tmp_path) + ["--ndevices", "0"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "--ndevices" in err and "\n" not in err


def test_tasks_that_are_not_the_shipped_split_stop_the_run(tool, tmp_path):
    other = tmp_path / "other_test.txt"
    other.write_text("1 2 3\n")
    with pytest.raises(ShardError, match="differs from") as err:
        tool.main(_dirs(tmp_path) + TINY + ["--expected-test", str(other)])
    assert "\n" not in str(err.value)
    assert not (tmp_path / "anchors").exists()


def test_manifest_of_a_tiny_run_and_a_failed_rerun_keeps_it(tool, tmp_path, monkeypatch):
    out = tmp_path / "anchors" / "h200"
    assert tool.main(_dirs(tmp_path) + TINY + ["--seed", "3"]) == 0
    man = json.loads((out / "MANIFEST.json").read_text())
    assert set(man["checkpoints"]) == {"neuroshard/compute.pt", "neuroshard/fw_comm.pt", "neuroshard/bw_comm.pt"}
    train = (out / "train_tasks.txt").read_bytes()
    assert len(train.decode().splitlines()) == 50
    for key, rec in man["checkpoints"].items():
        path = out / key
        torch.load(path, map_location="cpu", weights_only=True)
        assert rec["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest() and rec["bytes"] == path.stat().st_size
        assert rec["seed"] == 3 and rec["oracle"] == "emulated:h200" and rec["emulator_fit"] == "heldout"
        assert rec["batch_size"] == 65536 and rec["ndevices"] == 4 and rec["max_memory_gb"] == 5.0
        assert rec["training_tasks"]["sha256"] == hashlib.sha256(train).hexdigest()
        # compute: collect + train; communication: one collection per device count (4 and 8) + train on both
        assert len(rec["commands"]) == (2 if key.endswith("compute.pt") else 3)
        assert all(c.startswith("python ") and "--seed 3" in c for c in rec["commands"])
        assert "--oracle emulated:h200 --emulator-fit heldout" in rec["commands"][0]
        assert rec["wall_s"] > 0 and rec["date"] and rec["machine"]["cpu"]
    comm = man["checkpoints"]["neuroshard/fw_comm.pt"]["commands"]
    assert "--gpu-devices 0,1,2,3 " in comm[0] and "--gpu-devices 0,1,2,3,4,5,6,7 " in comm[1]
    assert "comm_4," in comm[2] and "comm_8" in comm[2]
    assert "--pool all" in man["checkpoints"]["neuroshard/compute.pt"]["commands"][0]
    from neuroshard.checkpoints import load_model

    assert load_model(out / "neuroshard" / "fw_comm.pt", "fw_comm").device_counts == (4, 8)
    assert man["command"].startswith("python tools/train_anchors.py")
    assert not list(out.parent.glob(".*"))          # no staging folder left behind
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}

    # a stage that fails: one line, the output untouched
    real = tool.Runner.execute

    def failing(cmd, log):
        if "collect_compute_cost_data.py" in cmd:
            log.write_text("boom: the oracle went away\n")
            return 1
        return real(cmd, log)

    monkeypatch.setattr(tool.Runner, "execute", staticmethod(failing))
    with pytest.raises(ShardError, match="stage neuroshard_compute_data failed .*boom") as err:
        tool.main(_dirs(tmp_path) + TINY)
    assert "\n" not in str(err.value)
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert not list(out.parent.glob(".*"))


def test_failure_while_assembling_leaves_no_staging(tool, tmp_path, monkeypatch):
    out = tmp_path / "anchors" / "h200"
    out.mkdir(parents=True)
    (out / "keep.txt").write_text("old")

    def broken(staging, *a, **k):
        (staging / "half.pt").write_bytes(b"x")
        raise ShardError("disk full")

    monkeypatch.setattr(tool, "write_manifest", broken)
    monkeypatch.setattr(tool, "stage_neuroshard", lambda args, run, work: {})
    with pytest.raises(ShardError, match="disk full"):
        tool.main(_dirs(tmp_path) + TINY)
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]
    assert not list(out.parent.glob(".*"))


def test_autoshard_trains_on_tasks_of_every_table(tool, tmp_path):
    """AutoShard's anchor draws its training tasks from every table (its original's protocol), recorded in the
    manifest and copied beside the checkpoint; a tiny real run (100 steps)."""
    from shardcore.tasks import load_tasks

    out = tmp_path / "anchors" / "h200"
    assert tool.main(_dirs(tmp_path) + ["--stages", "autoshard", "--as-steps", "100", "--as-actors", "2"]) == 0
    rec = json.loads((out / "MANIFEST.json").read_text())["checkpoints"]["autoshard/model.pt"]
    own = out / "autoshard" / "train_tasks.txt"
    assert rec["training_tasks"]["file"] == "autoshard/train_tasks.txt"
    assert rec["training_tasks"]["sha256"] == hashlib.sha256(own.read_bytes()).hexdigest()
    assert "--all-tables" in rec["training_tasks"]["generated_by"]
    assert f"--task-path {tmp_path / 'work' / 'tasks_autoshard' / 'train.txt'}" in rec["commands"][0]
    tasks = load_tasks(own, num_tables=856)
    test = load_tasks(ROOT / "data/gpu_measurements/tasks/dlrm_tasks_50_test.txt", num_tables=856)
    assert len(tasks) == 50 and all(len(t) == 50 for t in tasks)
    assert {i for t in tasks for i in t.table_ids} & {i for t in test for i in t.table_ids}
    torch.load(out / "autoshard" / "model.pt", map_location="cpu", weights_only=True)
    best = json.loads((out / "MANIFEST.json").read_text())["checkpoints"]["autoshard/best.pt"]   # what is evaluated
    assert "check at step" in best["selected"] and best["training_tasks"] == rec["training_tasks"]
    torch.load(out / "autoshard" / "best.pt", map_location="cpu", weights_only=True)
