"""Records compared or continued only where they were priced alike: shardkit_compare.py's files, the trainers'
--resume, NeuroShard's collected samples (oracle, batch, precision, exchange model, emulator fit); a mix is
one line naming the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardcore.errors import ShardError

from helpers import ROOT, fake_trainer, make_dataset, one_line_error, run_script, script, small_base


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return small_base(tmp_path_factory, "test_same_pricing")


GPU = Path(ROOT) / "data" / "gpu_measurements"
EMU_DS = GPU / "dlrm_b65536"
T50 = GPU / "tasks" / "dlrm_tasks_50_test.txt"


def emu(*extra):
    return ["--oracle", "emulated:h200", "--data-dir", EMU_DS, "--task-path", T50, "--gpu-devices", "0,1,2,3",
            "--max-memory", 5, "--quiet", "--max-tasks", 2, *extra]


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    """An eval.py --out file of two tasks on the emulated H200 (lookup_greedy, size_greedy)."""
    from shardcore.cli import common as cli

    out = tmp_path_factory.mktemp("records") / "emu.jsonl"
    with pytest.raises(SystemExit) as exc:
        cli.run_main(script("eval.py").main, [str(a) for a in emu("--alg", "lookup_greedy,size_greedy", "--out", out)])
    assert exc.value.code == 0 and out.is_file()
    return out


def test_concatenated_runs_refused(records, tmp_path, capsys):
    cat = tmp_path / "cat.jsonl"
    cat.write_text(records.read_text() * 2)
    code, _, err = run_script("tools/shardkit_compare.py", [cat, "--alg", "lookup_greedy"], capsys)
    one_line_error(code, err, r"lookup_greedy on task 0 appears twice")
    lines = [json.loads(x) for x in records.read_text().splitlines()]
    lines[-1]["hardware"] = "another oracle"
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text("".join(json.dumps(r) + "\n" for r in lines))
    code, _, err = run_script("tools/shardkit_compare.py", [mixed, "--alg", "lookup_greedy"], capsys)
    one_line_error(code, err, r"records priced with different oracles")


def test_resume_refuses_other_settings(tmp_path):
    trainer = fake_trainer(tmp_path, lambda shards: None, "r")
    extra = {"provenance": dict(trainer._provenance()), "ndevices": 2, "max_memory_gb": 5.0}
    trainer._check_resume(extra)     # the same settings: fine
    trainer_ctx = type("Ctx", (), {"hardware": "cpu", "dataset": "abcd", "batch_size": 16, "optimizer": "exact_sgd"})
    trainer.oracle.context = trainer_ctx     # a measured oracle's cache setting
    extra["provenance"] = dict(trainer._provenance())
    for key, value in [("hardware", "another GPU"), ("dataset", "0123abcd"), ("batch_size", 999), ("ndevices", 8),
                       ("max_memory_gb", 1.0), ("pf_augment", 0.25),      # tables made heavier (--pf-augment)
                       ("exchange", "analytic: 25 us + bytes / 50 GB/s")]:
        bad = {**extra, "provenance": {**extra["provenance"], key: value}}
        if key in ("ndevices", "max_memory_gb"):
            bad = {**extra, key: value, "provenance": {k: v for k, v in extra["provenance"].items() if k != key}}
        with pytest.raises(ShardError, match="--resume: the checkpoint was trained with"):
            trainer._check_resume(bad)


DS_TINY = ["--max-memory", 5, "--bench-steps", 2, "--bench-training-steps", 2, "--rl-num-batches", 1,
           "--rl-batch-size", 2]


@pytest.fixture
def no_workers(monkeypatch):
    """Any measuring worker started fails the test."""
    from shardcore.oracles.measured import driver as evaluator
    from shardkit_planner import sharder

    def start(self):
        raise AssertionError("a measuring worker was started")

    monkeypatch.setattr(evaluator.PlanEvaluator, "start", start)
    monkeypatch.setattr(sharder, "DEFAULT_CPU_MODEL", Path("/nonexistent/cpu_cost_model.json"))


def test_dreamshard_resume_refuses_other_settings(base, tmp_path, capsys, no_workers):
    out = tmp_path / "ds_out"
    common = ["--task-path", base / "tasks.txt", "--out-dir", out, *DS_TINY]
    first = [*common, "--data-dir", base / "ds", "--gpu-devices", "0,1", "--oracle", "emulated:h200",
             "--num-iterations", 1]
    code, _, err = run_script("train_dreamshard.py", first, capsys)
    assert code == 0, err[-2000:]
    saved = (out / "0.pt").read_bytes()
    other = tmp_path / "other"
    make_dataset(other, num_tables=12, batch_size=8, seed=7)
    again = [*common, "--resume", "--num-iterations", 2]
    for change, pattern in [
            (["--data-dir", base / "ds", "--gpu-devices", "0,1,2", "--oracle", "emulated:h200"], r"device count 2"),
            (["--data-dir", base / "ds", "--gpu-devices", "0,1", "--oracle", "emulated:h200",
              "--bench-batch-size", 4], r"batch size 8, this run has 4"),
            (["--data-dir", other, "--gpu-devices", "0,1", "--oracle", "emulated:h200"], r"dataset"),
            (["--data-dir", base / "ds", "--gpu-devices", "0,1", "--oracle", "emulated:h200", "--comm-latency", 500],
             r"exchange model 'analytic: 25 us \+ bytes / 200 GB/s', this run has 'analytic: 500 us"),
            (["--data-dir", base / "ds", "--gpu-devices", "0,1", "--oracle", "emulated:h200", "--emulator-fit", "full"],
             r"emulator fit 'heldout', this run has 'full'"),
            (["--data-dir", base / "ds", "--gpu-devices", "0,1", "--oracle", "measured",     # no worker starts
              "--cache-path", tmp_path / "c.sqlite"], r"oracle \(hardware\) 'emulated"),
            # a hyper-parameter given with another value than the checkpoint's (never kept silently)
            (["--data-dir", base / "ds", "--gpu-devices", "0,1", "--oracle", "emulated:h200", "--rl-lr", "0.01"],
             r"--rl-lr 0\.0005, this run gives 0\.01: a resumed training keeps its hyper-parameters")]:
        code, out_text, err = run_script("train_dreamshard.py", [*again, *change], capsys)
        one_line_error(code, err, r"^error: --resume: the checkpoint was trained with " + pattern)
        assert (out / "0.pt").read_bytes() == saved and not (out / "1.pt").exists()
    code, _, err = run_script("train_dreamshard.py", [*again, "--data-dir", base / "ds", "--gpu-devices", "0,1",
                                                       "--oracle", "emulated:h200", "--rl-lr", "0.0005"], capsys)
    assert code == 0, err[-2000:]          # the same setting resumes
    assert (out / "1.pt").is_file()


# -- records of one file compare only where they were priced alike ---------------------------------------------
def _run_eval(out, *extra):
    from shardcore.cli import common as cli

    with pytest.raises(SystemExit) as exc:
        cli.run_main(script("eval.py").main, [str(a) for a in emu("--alg", "random", "--out", out, *extra)])
    assert exc.value.code == 0
    return out


@pytest.mark.parametrize("extra, field", [(["--comm-bandwidth", 20], "exchange models"),
                                          (["--emulator-fit", "full"], "emulator fits"),
                                          ("fp32", "weights precisions")])
def test_compare_refuses_records_priced_another_way(extra, field, records, tmp_path, capsys):
    """Records of another exchange model (shardkit priced at 200 GB/s, an anchor at 20 made a 2.8% margin
    read 61%), emulator fit or precision than the others in one file: refused, naming the field; the same
    holds for records written before they carried their pricing (read from their hardware and parts)."""
    if extra == "fp32":   # the emulated card knows fp16 only: another precision's records, as a measured run writes
        other = tmp_path / "other.jsonl"
        other.write_text("".join(json.dumps({**r, "alg": "random", "pricing": {**r["pricing"], "precision": "fp32"}})
                                 + "\n" for x in records.read_text().splitlines() for r in [json.loads(x)]
                                 if r["alg"] == "lookup_greedy"))
    else:
        other = _run_eval(tmp_path / "other.jsonl", *extra)
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(records.read_text() + other.read_text())
    code, _, err = run_script("tools/shardkit_compare.py", [mixed, "--alg", "lookup_greedy"], capsys)
    one_line_error(code, err, rf"records priced with different {field} \(lookup_greedy task 0: .*; random task 0: ")
    if field != "weights precisions":   # precision: an older record never said it
        old = tmp_path / "old.jsonl"
        old.write_text("".join(json.dumps({k: v for k, v in json.loads(x).items() if k != "pricing"}) + "\n"
                               for x in mixed.read_text().splitlines()))
        code, _, err = run_script("tools/shardkit_compare.py", [old, "--alg", "lookup_greedy"], capsys)
        one_line_error(code, err, rf"records priced with different {field}")


def test_records_priced_alike_compare(records, tmp_path, capsys):
    again = _run_eval(tmp_path / "again.jsonl")
    both = tmp_path / "both.jsonl"
    both.write_text(records.read_text() + again.read_text())
    code, out, err = run_script("tools/shardkit_compare.py", [both, "--alg", "random"], capsys)
    assert code == 0, err
    assert "random:" in out and ("below the best anchor" in out or "ABOVE the best anchor" in out)


def test_compare_needs_an_anchor_it_has(records, capsys):
    """--anchors naming only --alg left no anchor (a traceback); naming an algorithm the file lacks
    compared against fewer anchors than asked, without a word."""
    for anchors, pattern in (("lookup_greedy", r"no anchor to compare lookup_greedy with"),
                             ("size_greedy,torchrec", r"--anchors torchrec: no records of it")):
        code, _, err = run_script("tools/shardkit_compare.py", [records, "--alg", "lookup_greedy", "--anchors",
                                                                anchors], capsys)
        one_line_error(code, err, pattern)


def test_cost_accuracy_refuses_records_priced_another_way(records, tmp_path, capsys):
    """tools/shardkit_cost_accuracy.py judges every record with one model: records of two exchange models
    (or batches) are refused rather than judged with the first one's."""
    other = _run_eval(tmp_path / "other.jsonl", "--comm-bandwidth", 20)
    code, _, err = run_script("tools/shardkit_cost_accuracy.py", [
        "--records", f"{records},{other}", "--task-path", T50, "--data-dir", EMU_DS, "--oracle", "emulated:h200"],
        capsys)
    one_line_error(code, err, r"--records: records priced with different exchange models")


def test_neuroshard_samples_of_another_exchange_are_never_reused(base, tmp_path, capsys):
    """Communication samples collected at 200 GB/s are not topped up at 20 GB/s (train_neuroshard.py
    --comm-bandwidth 20 reused them), and two folders of different exchanges are not trained on together."""
    from neuroshard.collect import load_comm_data

    common = ["--dataset_dir", base / "ds", "--gpu-devices", "0,1", "--oracle", "emulated:h200", "--max_dim", 16,
              "--T_range", "2,4", "--weights-precision", "fp16"]
    code, _, err = run_script("collect_comm_cost_data.py", [*common, "--out_dir", tmp_path / "c200", "--data_size", 3],
                              capsys)
    assert code == 0, err
    before = (tmp_path / "c200" / "comm_costs.csv").read_bytes()
    code, _, err = run_script("collect_comm_cost_data.py", [*common, "--out_dir", tmp_path / "c200", "--data_size", 6,
                                                            "--comm-bandwidth", 20], capsys)
    one_line_error(code, err, r"comm_costs\.csv was measured in another setting \(exchange 'analytic: 25 us \+ "
                              r"bytes / 200 GB/s', this run 'analytic: 25 us \+ bytes / 20 GB/s'\)")
    assert (tmp_path / "c200" / "comm_costs.csv").read_bytes() == before
    code, _, err = run_script("collect_comm_cost_data.py", [*common, "--out_dir", tmp_path / "c20", "--data_size", 3,
                                                            "--comm-bandwidth", 20], capsys)
    assert code == 0, err
    with pytest.raises(ShardError, match=r"cost data measured in different settings: exchange .*200 GB/s.*20 GB/s"):
        load_comm_data(f"{tmp_path / 'c200'},{tmp_path / 'c20'}")
