"""Two runs never write one output folder at once: a trainer's or a collection's folder is locked while the
run writes it (shardcore.processes.output_lock); the second run is refused in one line naming the first."""

from __future__ import annotations

import os

import pytest

from shardcore.errors import ShardError
from shardcore.processes import LOCK_NAME, output_lock

from helpers import one_line_error, run_script, small_base


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return small_base(tmp_path_factory, "locks")


def test_a_locked_folder_refuses_a_second_writer(tmp_path):
    folder = tmp_path / "run"
    with output_lock(folder, "--out-dir"):
        assert (folder / LOCK_NAME).read_text().strip() == str(os.getpid())
        with pytest.raises(ShardError, match=rf"--out-dir \S+run: another run \(process {os.getpid()}\) is writing"):
            with output_lock(folder, "--out-dir"):
                pass
        (folder / "model.pt").write_text("x")
    assert sorted(os.listdir(folder)) == ["model.pt"]      # the lock file goes with the run
    with output_lock(tmp_path / "empty", "--out-dir"):
        pass
    assert not (tmp_path / "empty").exists()                # a folder the run made and left empty goes too


def test_a_lock_file_left_by_a_killed_run_is_taken_again(tmp_path):
    """A run killed outright leaves its lock file; the kernel dropped its lock, so the next run takes it."""
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / LOCK_NAME).write_text("999999\n")
    with output_lock(folder, "--out-dir"):
        assert (folder / LOCK_NAME).read_text().strip() == str(os.getpid())
    assert not (folder / LOCK_NAME).exists()


@pytest.mark.parametrize("rel, flag, argv", [
    ("train_autoshard.py", "--savedir/--xpid", ["--savedir", "{out}", "--xpid", "x", "--total-steps", 10]),
    ("train_dreamshard.py", "--out-dir", ["--out-dir", "{out}/x", "--num-iterations", 1]),
    ("train_neuroshard.py", "--out-dir", ["--out-dir", "{out}/x", "--skip-collection"]),
    ("collect_compute_cost_data.py", "--out_dir", ["--out_dir", "{out}/x", "--data_size", 2]),
    ("collect_comm_cost_data.py", "--out_dir", ["--out_dir", "{out}/x", "--data_size", 2]),
])
def test_trainers_and_collections_refuse_a_folder_another_run_writes(rel, flag, argv, base, tmp_path, capsys):
    common = {"train_autoshard.py": ["--data-dir", base / "ds", "--task-path", base / "tasks.txt"],
              "train_dreamshard.py": ["--data-dir", base / "ds", "--task-path", base / "tasks.txt"]}.get(
        rel, ["--dataset-dir", base / "ds"])
    argv = [str(a).replace("{out}", str(tmp_path)) for a in argv]
    with output_lock(tmp_path / "x", "held by this test"):
        code, out, err = run_script(rel, [*common, "--gpu-devices", "0,1", "--oracle", "emulated:h200", *argv], capsys)
    one_line_error(code, err, rf"{flag} \S+x: another run \(process {os.getpid()}\) is writing this folder")
    assert not (tmp_path / "x").exists()
