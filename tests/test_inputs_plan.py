"""plan.py's inputs: a tables file (CSV or JSON) and its flags. Bad bytes, numbers beyond bounds, ambiguity (a
column or a batch line twice, statistics of another batch), device counts and memory no plan can meet: one
line before any planner runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest


from helpers import NON_UTF8, ROOT, attack_base, check_one_line_case, one_line_error, run_script, write


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return attack_base(tmp_path_factory, "test_inputs_plan")


CASES = [
    ("1-plan-csv", "plan.py", lambda b, t: ["--tables", write(t, "t.csv", b"name,rows,dim,pooling_factor\n" + NON_UTF8)],
     r"t.csv: not UTF-8"),
    ("1-plan-json", "plan.py", lambda b, t: ["--tables", write(t, "t.json", NON_UTF8)], r"t.json: not UTF-8"),
    ("2-max-memory-nan", "plan.py", lambda b, t: ["--tables", "x.csv", "--max-memory", "nan"], r"finite"),
    ("12-dim-plan", "plan.py", lambda b, t: ["--tables", write(t, "t.csv", "name,rows,dim,pooling_factor\na,10,6,1\n")],
     r"dim 6 is not a multiple of 4"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line(case, base, tmp_path, capsys):
    check_one_line_case(case, base, tmp_path, capsys)


def test_flag_error_from_the_command_line_is_one_line():
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, os.path.join(ROOT, "plan.py"), "--tables", "t.csv", "--ndevices", "0"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr == "error: plan.py: argument --ndevices: expected a positive integer, got '0' (see --help)\n"


def test_csv_with_bom_and_crlf_is_read(tmp_path, capsys):
    p = tmp_path / "t.csv"
    p.write_bytes("\ufeffname,rows,dim,pooling_factor\r\na,1000,8,1\r\nb,10,4,2\r\n".encode())
    code, out, err = run_script("plan.py", ["--tables", p, "--ndevices", 2, "--out", tmp_path / "p.json"], capsys)
    assert code == 0, err
    assert [t["name"] for t in json.loads((tmp_path / "p.json").read_text())["tables"]] == ["a", "b"]


@pytest.mark.parametrize("row, pattern", [
    ("a,1000000000000000000000000000000,8,1", r"row=\d{31},.*\) \(at most 2\*\*40 rows"),     # beyond C's integers
    ("a,100,8,1e300", r"pooling_factor=1e\+300\) \(at most 2\*\*40 rows and pooling factor 100000"),   # costs beyond any plan
])
def test_table_numbers_bounded(row, pattern, tmp_path, capsys):
    csv = tmp_path / "t.csv"
    csv.write_text(f"name,rows,dim,pooling_factor\n{row}\nb,10,8,1\n")
    code, _, err = run_script("plan.py", ["--tables", csv, "--ndevices", 2, "--max-memory", 5, "--alg",
                                          "lookup_greedy,shardkit", "--oracle", "emulated:h200", "--batch-size", 64],
                              capsys)
    one_line_error(code, err, r"t\.csv:2 \(table 'a'\): .*" + pattern)


# -- ambiguity is refused, never resolved without a word ----------------------------------------------------------
@pytest.mark.parametrize("name, text, pattern", [
    ("two_names.csv", "name,rows,dim,pooling_factor,name\na,10,8,1,b\n", r"names column 'name' twice"),
    ("row_and_rows.csv", "name,row,dim,pooling_factor,rows\na,10,8,1,20\n", r"names column 'rows' twice \('row' and 'rows'\)"),
    ("two_bins.csv", "name,rows,dim,pooling_factor,bin_0,bin_0\na,10,8,1,0.5,0.7\n", r"names column 'bin_0' twice"),
    ("two_batches.csv", "# batch_size: 65536\n# batch_size: 4096\nname,rows,dim,pooling_factor\na,10,8,1\n",
     r"two_batches\.csv:2: a second batch_size line \(the first: .*:1: batch_size\)"),
    ("key_twice.json", '{"tables": [{"name": "a", "row": 10, "row": 20, "dim": 8, "pooling_factor": 1}]}',
     r"key_twice\.json: key 'row' appears twice in one object"),
    ("row_and_rows.json", '{"tables": [{"name": "a", "row": 10, "rows": 20, "dim": 8, "pooling_factor": 1}]}',
     r"tables\[0\]: gives both 'row' and 'rows'"),
    ("batch_twice.json", '{"tables": [{"row": 10, "dim": 8, "pooling_factor": 1}], "batch_size": 8, "batch_size": 9}',
     r"key 'batch_size' appears twice"),
])
def test_ambiguous_tables_files_are_refused(name, text, pattern, tmp_path, capsys):
    path = write(tmp_path, name, text)
    code, _, err = run_script("plan.py", ["--tables", path, "--ndevices", 2], capsys)
    one_line_error(code, err, pattern)


def test_statistics_of_another_batch_are_refused(tmp_path, capsys):
    """Reuse statistics hold for the batch the file says they were taken at: --batch-size 4096 over
    histograms of batch 65536 is refused; without statistics (or at the file's batch) the flag is used."""
    bins = ",".join(["0.5", "0.5"] + ["0"] * 15)
    head = "# batch_size: 65536\nname,rows,dim,pooling_factor," + ",".join(f"bin_{k}" for k in range(17)) + "\n"
    path = write(tmp_path, "t.csv", head + f"a,100000,8,4,{bins}\nb,5000,16,2,{bins}\n")
    argv = ["--tables", path, "--ndevices", 2, "--oracle", "emulated:h200", "--alg", "lookup_greedy"]
    code, _, err = run_script("plan.py", [*argv, "--batch-size", 4096], capsys)
    one_line_error(code, err, r"--batch-size 4096: \S+t\.csv states its reuse statistics .* taken at batch 65536")
    code, out, err = run_script("plan.py", [*argv, "--batch-size", 65536], capsys)
    assert code == 0 and "batch 65536" in out, err


# -- device counts and memory no plan can meet: said before any planner runs ----------------------------------------
def test_device_counts_are_bounded_and_more_plan_devices_than_ids_are_summarised(tmp_path, capsys):
    path = write(tmp_path, "t.csv", "name,rows,dim,pooling_factor\na,1000,8,1\nb,100,4,2\nc,10,4,3\n")
    code, _, err = run_script("plan.py", ["--tables", path, "--ndevices", 100000], capsys)
    one_line_error(code, err, r"--ndevices: expected at most 4096 devices, got '100000'")
    code, _, err = run_script("plan.py", ["--tables", path, "--gpu-devices", ",".join(map(str, range(5000)))], capsys)
    one_line_error(code, err, r"--gpu-devices lists 5000 devices: at most 4096")
    # --gpu-devices 0,1 --ndevices 4 (documented: four plan devices measured in turns on two): the summary
    # names the plan's devices 0..3, the plan file no physical ids
    out_file = tmp_path / "p.json"
    code, out, err = run_script("plan.py", ["--tables", path, "--gpu-devices", "0,1", "--ndevices", 4,
                                            "--out", out_file], capsys)
    assert code == 0, err
    from test_plan_cli import first_table

    rows = [line.split("|")[1].strip() for line in first_table(out)[1:]]   # the header first
    assert rows == ["0", "1", "2", "3"]
    assert "device_ids" not in json.loads(out_file.read_text())


def test_tables_larger_than_all_devices_together_are_refused_before_planning(tmp_path, capsys, monkeypatch):
    """Three 0.36 GB tables on two devices of 0.5 GB: no plan of any planner holds them; refused before any
    planner or oracle starts (shardkit searched its whole budget to find that)."""
    from shardkit_planner import sharder

    def never(*a, **k):
        raise AssertionError("a planner ran")

    monkeypatch.setattr(sharder.ShardkitSharder, "shard", never)
    path = write(tmp_path, "big.csv", "name,rows,dim,pooling_factor\na,3000000,64,1\nb,3000000,64,1\nc,3000000,64,1\n")
    code, _, err = run_script("plan.py", ["--tables", path, "--ndevices", 2, "--max-memory", 0.5, "--alg",
                                          "shardkit,torchrec", "--batch-size", 4096, "--oracle", "emulated:h200"], capsys)
    one_line_error(code, err, r"infeasible: the 3 tables need 1\.07\d* GB together \(fp16\), more than 2 devices "
                              r"of 0\.5 GB hold")


def test_sigterm_leaves_no_temporary_folder(tmp_path):
    """SIGTERM while plan.py prices: the temporary folder holding the tables' configs goes with the run."""
    rows = "".join(f"t{i},{1000 * (i + 1)},{(4, 8, 16, 64)[i % 4]},{1 + i % 5}\n" for i in range(200))
    path = write(tmp_path, "t.csv", "name,rows,dim,pooling_factor\n" + rows)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, str(ROOT / "plan.py"), "--tables", str(path), "--ndevices", "8",
                             "--oracle", "emulated:h200", "--batch-size", "4096", "--alg", "shardkit",
                             "--shardkit-time", "60"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 60
    while not list(tmp.glob("plan-*")) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    assert list(tmp.glob("plan-*")), "the temporary folder never appeared"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143 and err.strip().splitlines()[-1] == "error: stopped by SIGTERM", err[-2000:]
    assert list(tmp.iterdir()) == []
