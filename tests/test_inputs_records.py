"""Records and cost data read by the tools (eval.py --out records, shard lines, cost CSVs): malformed rows, costs
that overflow, and predictions never read as measurements."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardcore.errors import ShardError

from helpers import ROOT, compute_csv, good_rows, one_line_error, run_script, script, small_base


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return small_base(tmp_path_factory, "test_inputs_records")


@pytest.mark.parametrize("bad, pattern", [
    ("9,1;2,8;4,100;50,2.0;1.0,nan,2.0\n", r"c.csv:11: fw_ms must be a finite number >= 0"),
    ("9,1;2,8;4,100;50,2.0;1.0,-1,2.0\n", r"c.csv:11: fw_ms must be a finite number >= 0"),
    ("9,1;2,8;4,100;50\n", r"c.csv:11: "),                 # a row cut short
    ("9,1;x,8;4,100;50,2.0;1.0,1,2.0\n", r"c.csv:11: unreadable cost row"),
    ("9,1;2,8;4,100;50,2.0;inf,1,2.0\n", r"c.csv:11: .*pooling factors finite"),
])
def test_cost_csv_rows(bad, pattern, tmp_path, capsys):
    p = compute_csv(tmp_path / "c.csv", good_rows(9) + [bad])
    code, _, err = run_script("train_compute_cost_model.py",
                              ["--data_dir", p, "--out_path", tmp_path / "m.pt", "--epochs", 1, "--quiet"], capsys)
    one_line_error(code, err, pattern)
    assert not (tmp_path / "m.pt").exists()


@pytest.mark.parametrize("record, pattern", [
    ({"task": 0, "cost_ms": 1.0}, r"r.jsonl:1: not an eval.py --out record \(no 'alg'\)"),
    ({"alg": "a", "task": -1}, r"'task' must be a whole number"),
    ({"alg": "a", "task": 0, "cost_ms": float("nan"), "device_costs_ms": [[1, 1, 1, 1]]}, r"'cost_ms' must be finite"),
    ({"alg": "a", "task": 0, "cost_ms": 1.0, "device_costs_ms": [[1, 1, "x", 1]]}, r"'device_costs_ms'"),
])
def test_shardkit_compare_records(record, pattern, tmp_path, capsys):
    p = tmp_path / "r.jsonl"
    p.write_text(json.dumps(record) + "\n")
    code, _, err = run_script("tools/shardkit_compare.py", [p], capsys)
    one_line_error(code, err, pattern.replace("finite", "a finite number"))


def test_compare_costs_that_overflow_the_statistics(tmp_path, capsys):
    p = tmp_path / "big.jsonl"
    p.write_text("".join(json.dumps({"alg": a, "task": t, "cost_ms": 1.7e308,
                                     "device_costs_ms": [[1.7e308, 0, 0, 0], [1.0, 0, 0, 0]]}) + "\n"
                         for a in "ab" for t in range(3)))
    code, _, err = run_script("tools/shardkit_compare.py", [p, "--alg", "a"], capsys)
    one_line_error(code, err, r"big\.jsonl:1: 'cost_ms' must be a finite number in \[0, 1e12\]")


def test_prediction_never_read_as_measurement(tmp_path):
    from shardcore.oracles.emulated.emulator import read_shard_lines
    from shardcore.tables import TableConfig

    tables = [TableConfig(0, 100, 8, 1.0)]
    p = tmp_path / "pred.jsonl"
    p.write_text(json.dumps({"tables": [[0, 8]], "fw_ms": 1.0, "bw_ms": 2.0, "oracle": "emulated:h200",
                             "predicted": True}) + "\n")
    with pytest.raises(ShardError, match=r"pred.jsonl:1: holds predictions"):
        read_shard_lines(p, tables)
    p.write_text('{"tables": [[0, 8]], "fw_ms": Infinity}\n')
    with pytest.raises(ShardError, match=r"fw_ms must be a non-negative number \(and finite\)"):
        read_shard_lines(p, tables)


def test_predictions_fed_back_are_refused(tmp_path, capsys):
    """tools/predict_shard_costs.py marks what it wrote ("predicted", "oracle"); the one reader of shard
    lines (shardcore.oracles.emulated.emulator.read_shard_lines: the emulator's fit, its accuracy tool, this tool) refuses it."""
    from shardcore.dataset import load_table_configs
    from shardcore.oracles.emulated.emulator import MEASUREMENTS_DIR

    configs = Path(MEASUREMENTS_DIR) / "dlrm_b65536" / "table_configs.json"
    if not configs.is_file():
        pytest.skip("no shipped GPU measurements")
    dim = load_table_configs(configs)[0].dim
    src = tmp_path / "shards.jsonl"
    src.write_text(f'{{"tables": [[0, {dim}]], "fw_ms": 1.0, "bw_ms": 2.0}}\n')
    pred = tmp_path / "pred.jsonl"
    code, _, err = run_script("tools/predict_shard_costs.py", ["--shards", src, "--out", pred], capsys)
    assert code == 0, err
    before = pred.read_bytes()
    code, _, err = run_script("tools/predict_shard_costs.py", ["--shards", pred, "--out", tmp_path / "again.jsonl"],
                              capsys)
    one_line_error(code, err, r"pred\.jsonl:1: holds predictions \(by emulated:h200")
    assert pred.read_bytes() == before and not (tmp_path / "again.jsonl").exists()


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


def test_eval_records_carry_provenance(records):
    for line in records.read_text().splitlines():
        stamp = json.loads(line)["produced_by"]
        assert stamp["tool"] == "eval.py" and stamp["predicted"] is False and "emulated" in stamp["oracle"]


def _stamped(src, dst, stamp):
    dst.write_text("".join(json.dumps({**json.loads(x), "produced_by": stamp}) + "\n"
                           for x in src.read_text().splitlines()))
    return dst


@pytest.mark.parametrize("rel, argv", [
    ("tools/shardkit_compare.py", ["{f}", "--alg", "lookup_greedy"]),
    ("tools/shardkit_cost_accuracy.py", ["--records", "{f}", "--task-path", T50, "--data-dir", EMU_DS,
                                         "--oracle", "emulated:h200"]),
])
def test_predicted_records_never_read_as_costs(rel, argv, records, tmp_path, capsys):
    """eval_simulator.py's records (the simulator's predictions) fed to a reader of an oracle's costs."""
    sim = _stamped(records, tmp_path / "sim.jsonl", {"tool": "eval_simulator.py", "predicted": True})
    before = sim.read_bytes()
    code, _, err = run_script(rel, [str(a).replace("{f}", str(sim)) for a in argv], capsys)
    one_line_error(code, err, r"sim\.jsonl:?1?: ?.*holds predictions \(produced by eval_simulator\.py\)")
    assert sim.read_bytes() == before


def test_a_broken_stamp_is_refused(records, tmp_path, capsys):
    bad = _stamped(records, tmp_path / "bad.jsonl", "eval.py")
    code, _, err = run_script("tools/shardkit_compare.py", [bad, "--alg", "lookup_greedy"], capsys)
    one_line_error(code, err, r"bad\.jsonl:1: 'produced_by' must be an object")


def test_predicted_cost_data_refused(tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    compute_csv(data / "compute_costs.csv", good_rows(12))
    (data / "meta.json").write_text(json.dumps({"kind": "compute", "produced_by": {"tool": "a model",
                                                                                   "predicted": True}}))
    code, _, err = run_script("train_compute_cost_model.py", ["--data_dir", data, "--out_path", tmp_path / "m.pt",
                                                             "--epochs", 1, "--quiet"], capsys)
    one_line_error(code, err, r"meta\.json: holds predictions \(produced by a model\)")
    assert not (tmp_path / "m.pt").exists()


def test_a_record_naming_a_key_twice_is_refused(tmp_path, capsys):
    p = tmp_path / "r.jsonl"
    p.write_text('{"alg": "a", "task": 0, "cost_ms": 1.0, "cost_ms": 9.0, "device_costs_ms": [[1, 0, 0, 0]]}\n')
    code, _, err = run_script("tools/shardkit_compare.py", [p], capsys)
    one_line_error(code, err, r"r\.jsonl:1: key 'cost_ms' appears twice in one object")
