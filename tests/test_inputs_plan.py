"""plan.py's inputs: a tables file (CSV or JSON) and its flags. Bad bytes, numbers beyond bounds, ambiguity (a
column or a batch line twice, statistics of another batch), device counts and memory no plan can meet: one
line before any planner runs."""

from __future__ import annotations

import json
import os

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
