"""tools/zoo.py: one small case end to end -- every planner priced, the solver's bound no higher than any
plan, the records, tables and manifest a result folder needs, and nothing written where the run fails."""

from __future__ import annotations

import json

import pytest

from helpers import load_tool
from shardcore.errors import ShardError


def test_a_small_case_writes_records_a_bound_below_every_plan_and_a_valid_manifest(tmp_path, capsys):
    zoo = load_tool("zoo")
    report = load_tool("report")
    out = tmp_path / "zoo"
    assert zoo.main(["--models", "deeprecsys_dlrm_rmc1", "--devices", "2", "--caps", "tight", "--no-named-cases",
                     "--algs", "shardkit,size_greedy", "--bound-time", "10", "--shardkit-work", "2000",
                     "--out-dir", str(out)]) == 0
    records = zoo.read_jsonl(out / "records.jsonl")
    bounds = zoo.read_jsonl(out / "bounds.jsonl")
    assert {r["alg"] for r in records} == {"shardkit", "size_greedy"} and len(bounds) == 1
    lower = bounds[0]["lower_ms"]
    assert lower > 0 and all(r["cost_ms"] >= lower - 1e-9 for r in records)
    assert (out / "zoo.png").stat().st_size > 0 and "| planner (1 cases)" in (out / "zoo.md").read_text()
    m = report.read_manifest(out, tmp_path)
    assert m["landscape"] == "emulated H200" and "zoo" in report.render_view({"zoo": m}, "zoo/cases", tmp_path)
    # an existing folder is kept unless --force; a model that is not there is refused before any work
    with pytest.raises(ShardError, match="exists"):
        zoo.main(["--models", "deeprecsys_dlrm_rmc1", "--out-dir", str(out)])
    with pytest.raises(ShardError, match="no nosuch.csv"):
        zoo.main(["--models", "nosuch", "--out-dir", str(tmp_path / "other")])
    assert not (tmp_path / "other").exists()
    assert json.loads((out / "manifest.json").read_text())["views"]["summary"]["kind"] == "zoo"
