"""The new user's path of docs/planning-your-tables.md, end to end: a CSV of 12 tables (24 to 20M rows) ->
plan.py comparing planners side by side on the emulated H200 -> the TorchRec plan -> DistributedModelParallel
on 4 gloo ranks checking a forward and an SGD step against the unsharded collection (examples/apply_plan.py,
whose snippet the page shows).
The largest tables keep their rows and get small dims, so the ranks' shards stay small. Skipped without
TorchRec, as tests/test_torchrec.py."""

import json
import os
import re
import subprocess
import sys


from helpers import require_torchrec  # noqa: E402

require_torchrec()

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "planning-your-tables.md")

# the page's 12 tables with the rows kept and the dims of the big ones cut (the page's CSV has 128 ...)
CSV_12 = """# batch_size: 65536
name,rows,dim,pooling_factor
user_id,20000000,4,1
item_id,8000000,4,1
history_items,8000000,8,40
query_tokens,2000000,16,12
category,5000,32,3
brand,300000,16,1
city,40000,32,1
country,250,16,1
hour,24,8,1
device_type,10,8,1
ad_campaign,1500000,16,2
seller,600000,16,1
"""


def script(*argv, timeout=300):
    return subprocess.run([sys.executable, *map(str, argv)], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout)


def test_csv_to_side_by_side_to_torchrec_plan_to_dmp_on_four_gloo_ranks(tmp_path):
    tables = tmp_path / "my_tables.csv"
    tables.write_text(CSV_12)
    plan = tmp_path / "plan.json"
    proc = script("plan.py", "--tables", tables, "--ndevices", 4, "--max-memory", 0.2,
                  "--alg", "size_lookup_greedy,torchrec,shardkit", "--oracle", "emulated:h200",
                  "--out", plan, "--torchrec")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert "emulated NVIDIA H200" in out and "batch 65536" in out
    assert sum(line.startswith("warning:") for line in out.splitlines()) == 1   # no reuse bins: said once
    costs = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.split("|")[1:-1]]
        if len(cells) == 8 and re.fullmatch(r"[0-9.]+", cells[1]):
            costs[cells[0].rstrip(" *")] = float(cells[1])
    assert set(costs) == {"size_lookup_greedy", "torchrec", "shardkit"}
    plain = json.loads(plan.read_text())
    assert plain["alg"] == min(costs, key=costs.get) and plain["batch_size"] == 65536
    trec = json.loads((tmp_path / "plan.torchrec.json").read_text())
    names = [line.split(",")[0] for line in CSV_12.splitlines()[2:]]
    assert [t["name"] for t in trec["tables"]] == names and trec["world_size"] == 4

    proc = script("examples/apply_plan.py", "--tables", tables, "--plan", tmp_path / "plan.torchrec.json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [line for line in proc.stdout.splitlines() if line.startswith("rank ")]
    assert len(ranks) == 4 and all("pooled embeddings vs the unsharded" in r and "touched rows updated" in r
                                   and "MISMATCH" not in r for r in ranks)
    assert "numerics: the sharded forward and one SGD step equal the unsharded collection's on every rank" in proc.stdout
    held = sum(int(re.search(r": ([0-9,]+) weights held", r).group(1).replace(",", "")) for r in ranks)
    sizes = [(int(r), int(d)) for _n, r, d, _pf in (line.split(",") for line in CSV_12.splitlines()[2:])]
    replicated = sum(t["rows"] * t["dim"] for t in trec["tables"] if t["sharding_type"] == "data_parallel")
    assert held == sum(r * d for r, d in sizes) + 3 * replicated   # every table's rows once, a replica on each rank

    # the plan must fit the collection: a renamed or reshaped table stops in one line, before any rank starts
    for old, new, match in (("seller,", "merchant,", "'merchant' is not in the plan"),
                            ("hour,24,8", "hour,24,16", "table 'hour': the plan has 24 x 8, the module 24 x 16")):
        other = tmp_path / "other.csv"
        other.write_text(CSV_12.replace(old, new))
        proc = script("examples/apply_plan.py", "--tables", other, "--plan", tmp_path / "plan.torchrec.json")
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:"), proc.stderr[-2000:]
        assert match in lines[0], lines[0]


def test_the_page_shows_the_tested_snippet_and_commands():
    text = open(DOC).read()
    source = open(os.path.join(ROOT, "examples", "apply_plan.py")).read()
    snippet = source.split("# --8<-- [apply]\n")[1]
    lines = [line[4:] for line in snippet.splitlines() if line.strip() and not line.strip().startswith("# --8<--")]
    page = "\n".join(line for line in text.splitlines() if line.strip())
    assert "\n".join(lines) in page    # the page's snippet is the example's, line for line
    for command in ("python plan.py --tables my_tables.csv", "--oracle emulated:h200", "--torchrec",
                    "python examples/apply_plan.py --tables my_tables.csv --plan plan.torchrec.json"):
        assert command in text, command
