"""tools/cpu_truth.py: the measured CPU oracle's reported costs against an independent timing of the same
shards, judged under every speed rule from the same samples, written as a result folder."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_the_truth_check_judges_every_speed_rule_on_the_same_samples(tmp_path):
    out = tmp_path / "truth"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "cpu_truth.py"), "--out-dir", str(out), "--dataset-tables", "12",
         "--batch-size", "128", "--tasks", "1", "--task-tables", "6", "--ndevices", "2", "--rounds", "2",
         "--iters", "3", "--warmup", "1", "--comm-iters", "3"],
        capture_output=True, text=True, cwd=ROOT, timeout=280)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads((out / "truth.json").read_text())
    s, devs = got["summary"], got["devices"]
    from shardcore.oracles.measured.driver import SPEED_RULES

    assert set(s["rules"]) == set(SPEED_RULES)
    for d in devs:   # every device measured once per round under every rule, all positive
        assert set(d["rules_ms"]) == set(SPEED_RULES) and all(len(v) == 2 and min(v) > 0 for v in d["rules_ms"].values())
        # the reported cost is the first rule's, round by round
        assert d["rounds_ms"] == pytest.approx(d["rules_ms"][SPEED_RULES[0]])
    # no correction: the reported ratio is the oracle's wall-clock ms over the independent wall-clock ms
    none = [statistics_median(d["rules_ms"]["none"]) / d["independent_ms"] for d in devs]
    assert s["rules"]["none"]["ratio"][0] == round(min(none), 3) and s["rules"]["none"]["ratio"][2] == round(max(none), 3)
    assert s["within_band"] == sum(0.75 <= d["reported_ms"] / d["independent_ms"] <= 1.33 for d in devs)
    # the result folder: its manifest names the records, the views are the tables printed
    man = json.loads((out / "manifest.json").read_text())
    assert man["format"] == "shardkit-result/1" and man["landscape"] == "measured CPU"
    assert {v["path"].rsplit("/", 1)[-1] for v in man["views"].values()} == {"classes.csv", "checks.csv", "rules.csv"}
    rows = list(csv.reader((out / "rules.csv").open()))
    assert len(rows) == 1 + len(SPEED_RULES) and "same samples under each speed rule" in proc.stdout


def statistics_median(xs):
    import statistics

    return statistics.median(xs)
