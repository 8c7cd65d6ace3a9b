"""plan.py (users' own tables) and the plan export formats. Runs without TorchRec installed."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from shardcore.baselines import BASELINES
from shardcore.errors import ShardError
from shardcore.plan import Plan
from shardcore.tables import TableConfig
from shardcore.interop import plan_export as pe
from shardcore.topology import Topology

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_spec = importlib.util.spec_from_file_location("plan_script", os.path.join(ROOT, "plan.py"))
plan_script = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(plan_script)

# 8 hand-written tables: 0.18 + 0.18 + 0.0 + 0.003 + 0.03 + 0.18 + 0.0 + 0.0 GB in fp16.
CSV_8 = """name,rows,dim,pooling_factor
user_id,1500000,64,1
item_id,1500000,64,1
category,1000,16,3
brand,50000,32,1
query_tokens,500000,32,12.5
history_items,1500000,64,40
country,250,8,1
device_type,10,4,0
"""


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def first_table(text: str) -> list[str]:
    """The rows (header first) of the first table plan.py prints (the memory account's table follows it)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| "))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return [line for line in lines[start:end] if line.startswith("| ")]


def run_plan(*argv):
    return plan_script.main([str(a) for a in argv])


def test_csv_gives_feasible_plan_and_files(tmp_path, capsys):
    csv_path = write(tmp_path, "tables.csv", CSV_8)
    out = tmp_path / "out" / "plan.json"
    assert run_plan("--tables", csv_path, "--ndevices", 4, "--max-memory", 0.25, "--out", out, "--torchrec") == 0
    text = capsys.readouterr().out
    assert "lookup load" in text and "feasible" in text
    assert len(first_table(text)) == 1 + 4  # header + a row per device

    plain = json.loads(out.read_text())
    assert plain["ndevices"] == 4 and plain["max_memory_gb"] == 0.25 and plain["feasible"] is True
    assert [t["name"] for t in plain["tables"]] == [line.split(",")[0] for line in CSV_8.splitlines()[1:]]
    assert all(0 <= t["device"] < 4 for t in plain["tables"])
    mem = [0.0] * 4
    for t in plain["tables"]:
        assert set(t) >= {"name", "index", "rows", "dim", "pooling_factor", "device"}
        mem[t["device"]] += t["rows"] * t["dim"] * 2 / 2 ** 30
    assert max(mem) <= 0.25
    assert plain["memory_gb"] == pytest.approx(mem, abs=1e-5)

    trec = json.loads((tmp_path / "out" / "plan.torchrec.json").read_text())
    assert trec["format"] == pe.TORCHREC_FORMAT and trec["world_size"] == 4
    assert {t["name"]: t["ranks"] for t in trec["tables"]} == {t["name"]: [t["device"]] for t in plain["tables"]}
    assert all(t["sharding_type"] == "table_wise" for t in trec["tables"])


@pytest.mark.parametrize("alg", BASELINES)
def test_every_baseline_plans_the_csv(tmp_path, alg):
    out = tmp_path / "plan.json"
    run_plan("--tables", write(tmp_path, "t.csv", CSV_8), "--ndevices", 3, "--max-memory", 0.25,
             "--alg", alg, "--out", out)
    plain = json.loads(out.read_text())
    assert plain["feasible"] and max(plain["memory_gb"]) <= 0.25 and plain["alg"] == alg


def test_gpu_devices_are_reported_by_id(tmp_path, capsys):
    out = tmp_path / "plan.json"
    run_plan("--tables", write(tmp_path, "t.csv", CSV_8), "--gpu-devices", "2,5", "--max-memory", 1, "--out", out)
    plain = json.loads(out.read_text())
    assert plain["device_ids"] == [2, 5] and {t["device"] for t in plain["tables"]} <= {0, 1}
    rows = first_table(capsys.readouterr().out)[1:]
    assert [r.split("|")[1].strip() for r in rows] == ["2", "5"]


def test_table_configs_json_and_bins(tmp_path):
    tables = [TableConfig(i, 1000 * (i + 1), 16, float(i), bins=(0.5, 0.5) + (0.0,) * 15) for i in range(5)]
    path = write(tmp_path, "table_configs.json", json.dumps({"tables": [t.to_json() for t in tables]}))
    out = tmp_path / "plan.json"
    run_plan("--tables", path, "--ndevices", 2, "--max-memory", 1, "--out", out)
    plain = json.loads(out.read_text())
    assert [t["name"] for t in plain["tables"]] == [f"table_{i}" for i in range(5)]
    loaded, names = plan_script.read_tables(path)
    assert loaded == tables

    csv_bins = "name,rows,dim,pooling_factor,bin_0,bin_16\na,10,4,1,0.25,0.75\n"
    (t,), _ = plan_script.read_tables(write(tmp_path, "b.csv", csv_bins))
    assert t.bins[0] == 0.25 and t.bins[16] == 0.75 and sum(t.bins) == 1.0


@pytest.mark.parametrize("text,pattern", [
    ("name,rows,dim,pooling_factor\nhuge,200000000,64,1\n", r"'huge'.*larger than the 5 GiB per-device memory cap"),
    ("name,rows,pooling_factor\na,10,1\n", r"missing column\(s\) dim"),
    ("name,rows,dim,pooling_factor\na,10,4,1\nb,ten,4,1\n", r":3 \(table 'b'\): non-numeric rows 'ten'"),
    ("name,rows,dim,pooling_factor\na,10,4,lots\n", r"non-numeric pooling_factor 'lots'"),
    ("", r"empty file"),
    ("\n  \n", r"empty file"),
    ("name,rows,dim,pooling_factor\n", r"no tables"),
    ("name,rows,dim,pooling_factor\na,10,4,1\nb,10,4,1\na,20,4,1\n", r":4: duplicate table name 'a' \(first at .*:2\)"),
    ("name,rows,dim,pooling_factor\na,0,4,1\n", r":2 \(table 'a'\): row and dim must be positive"),
    ("name,rows,dim,pooling_factor\na,10,4,-1\n", r"pooling_factor >= 0 \(got .*pooling_factor=-1.0\)"),
    ("name,rows,dim,pooling_factor\na,10.5,4,1\n", r"rows must be a whole number"),
    ("name,rows,dim,pooling_factor\na,10,4,1,7\n", r"5 values for 4 columns"),
    ("name,rows,dim,pooling_factor,bin_0\na,10,4,1,-0.5\n", r"\(table 'a'\): reuse bin bin_0 = -0.5 is negative"),
    ("name,rows,dim,pooling_factor\na,,4,1\n", r"\(table 'a'\): empty rows"),
])
def test_one_line_errors(tmp_path, text, pattern):
    path = write(tmp_path, "t.csv", text)
    with pytest.raises(ShardError, match=pattern) as info:
        run_plan("--tables", path, "--ndevices", 2, "--max-memory", 5)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("obj,pattern", [
    ({"tables": []}, "no tables"),
    ({"tables": [{"name": "x", "row": 10, "dim": 4}]}, r"missing field\(s\) pooling_factor"),
    ({"tables": [{"name": "x", "row": "many", "dim": 4, "pooling_factor": 1}]}, "non-numeric row 'many'"),
    ({"tables": [{"name": "x", "row": 10, "dim": 4, "pooling_factor": 1},
                 {"name": "x", "row": 10, "dim": 4, "pooling_factor": 1}]}, "duplicate table name 'x'"),
    ({"rows": 3}, 'expected an object with a "tables" list'),
])
def test_json_errors(tmp_path, obj, pattern):
    path = write(tmp_path, "t.json", json.dumps(obj))
    with pytest.raises(ShardError, match=pattern):
        run_plan("--tables", path)


def test_other_argument_errors(tmp_path):
    csv_path = write(tmp_path, "t.csv", CSV_8)
    with pytest.raises(ShardError, match="--torchrec .* --out"):
        run_plan("--tables", csv_path, "--torchrec")
    with pytest.raises(ShardError, match="not found"):
        run_plan("--tables", tmp_path / "nope.csv")
    with pytest.raises(ShardError, match="unknown algorithm"):
        run_plan("--tables", csv_path, "--alg", "best_guess")
    with pytest.raises(ShardError, match="infeasible"):  # every table fits alone, not all together
        run_plan("--tables", csv_path, "--ndevices", 1, "--max-memory", 0.2)


def test_error_exit_code_and_single_line(tmp_path):
    path = write(tmp_path, "t.csv", "name,rows,dim\na,10,4\n")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "plan.py"), "--tables", path],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert "missing column(s) pooling_factor" in proc.stderr


def test_alg_torchrec_without_torchrec_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torchrec", None)  # import torchrec -> ImportError, installed or not
    with pytest.raises(ShardError) as info:
        run_plan("--tables", write(tmp_path, "t.csv", CSV_8), "--alg", "torchrec")
    msg = str(info.value)
    assert "pip install -e .[torchrec]" in msg and "pip install --no-deps torchrec==1.8.0" in msg
    assert "\n" not in msg


def test_export_plans_writes_both_forms_per_task(tmp_path):
    tables_a = [TableConfig(i, 100 * (i + 1), 8, 1.0) for i in range(4)]
    tables_b = [TableConfig(i, 50, 4, 2.0) for i in (7, 9)]
    two = Topology(2, 1.0)
    records = [pe.PlanRecord(0, "lookup_greedy", Plan.table_wise(tables_a, (0, 1, 1, 0), two)),
               (3, "models/dreamshard/9.pt", Plan.table_wise(tables_b, (1, 0), two), ["x", "y"]),
               (4, "torchrec", None)]  # no plan found: listed, no files
    paths = pe.export_plans(tmp_path / "exp", records, max_memory_gb=1.0)
    assert all(p.is_file() for p in paths) and len(paths) == 5
    index = json.loads((tmp_path / "exp" / "index.json").read_text())
    assert [(e["task"], e["alg"]) for e in index["plans"]] == [
        (0, "lookup_greedy"), (3, "models/dreamshard/9.pt"), (4, "torchrec")]
    assert index["plans"][2]["plan"] is None and not (tmp_path / "exp" / "torchrec").exists()
    plain = json.loads((tmp_path / "exp" / index["plans"][1]["plan"]).read_text())
    assert index["plans"][1]["plan"] == "models_dreamshard_9.pt/task_0003.json"
    assert [(t["name"], t["index"], t["device"]) for t in plain["tables"]] == [("x", 7, 1), ("y", 9, 0)]
    assert plain["task"] == 3 and plain["ndevices"] == 2
    trec = json.loads((tmp_path / "exp" / index["plans"][0]["torchrec"]).read_text())
    assert [(t["name"], t["ranks"], t["shards"][0]["sizes"]) for t in trec["tables"]] == [
        ("table_0", [0], [100, 8]), ("table_1", [1], [200, 8]), ("table_2", [1], [300, 8]), ("table_3", [0], [400, 8])]

    with pytest.raises(ShardError, match="duplicate table name"):
        pe.plan_json(Plan.table_wise(tables_a, (0, 0, 0, 0), Topology(1, 1.0)), names=["a", "b", "a", "c"])
    one = Plan.table_wise(tables_b, (0, 0), Topology(1, 1.0))
    with pytest.raises(ShardError, match="share the export directory"):
        pe.export_plans(tmp_path / "clash", [(0, "a/b", one), (0, "a_b", one)], 1.0)


# ------------------------------------------------------------------------------------------------
# plan.py as the front door: several planners priced side by side on an oracle
# ------------------------------------------------------------------------------------------------

def test_side_by_side_on_the_emulated_h200_writes_the_cheapest(tmp_path, capsys):
    path = write(tmp_path, "t.csv", "# batch_size: 65536\n" + CSV_8)
    out = tmp_path / "plan.json"
    assert run_plan("--tables", path, "--ndevices", 4, "--max-memory", 1, "--alg", "size_lookup_greedy,random,shardkit",
                    "--oracle", "emulated:h200", "--shardkit-time", 0.2, "--out", out) == 0
    text = capsys.readouterr().out
    assert "emulated NVIDIA H200" in text and "batch 65536" in text
    warn = [line for line in text.splitlines() if line.startswith("warning:")]
    assert len(warn) == 1 and "8 of 8" not in warn[0] and "no reuse statistics" in warn[0]   # device_type: pf 0
    rows = [line for line in first_table(text) if "ms" not in line.split("|")[2]]
    costs = {r.split("|")[1].strip().rstrip(" *"): float(r.split("|")[2]) for r in rows}
    assert set(costs) == {"size_lookup_greedy", "random", "shardkit"} and all(c > 0 for c in costs.values())
    plain = json.loads(out.read_text())
    cheapest = min(costs, key=costs.get)
    assert plain["alg"] == cheapest and plain["cost_ms"] == pytest.approx(costs[cheapest], abs=1e-3)
    assert plain["batch_size"] == 65536 and "H200" in plain["priced_on"]
    assert [t["name"] for t in plain["tables"]][:2] == ["user_id", "item_id"]

    # --pick writes the named one; --batch-size overrides the file's
    assert run_plan("--tables", path, "--ndevices", 4, "--max-memory", 1, "--alg", "size_lookup_greedy,random",
                    "--oracle", "emulated:h200", "--batch-size", 4096, "--pick", "random", "--out", out) == 0
    assert "batch 4096" in capsys.readouterr().out
    assert json.loads(out.read_text())["alg"] == "random"


def test_priced_plans_show_where_each_table_went_and_plot_side_by_side(tmp_path, capsys):
    """With an oracle, plan.py prints the kept plan per device (its tables or blocks, memory and the
    oracle's four cost parts, the slowest device's total being the plan's cost) and --plot draws every
    compared plan; --plot needs prices and never replaces an input."""
    path = write(tmp_path, "t.csv", "# batch_size: 65536\n" + CSV_8)
    png = tmp_path / "plans.png"
    assert run_plan("--tables", path, "--ndevices", 4, "--max-memory", 1, "--alg", "lookup_greedy,shardkit",
                    "--oracle", "emulated:h200", "--shardkit-time", 0.2, "--plot", png) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    costs = {r.split("|")[1].strip().rstrip(" *"): float(r.split("|")[2]) for r in first_table(text)[1:]}
    kept = next(line for line in lines if line.startswith("* the plan written: ")).split(": ")[1].split(" ")[0]
    start = next(i for i, line in enumerate(lines) if line.startswith("where each table went in "))
    assert kept in lines[start]
    header, *rows = [line for line in lines[start + 1:start + 3 + 4] if line.startswith("| ")]
    cols = [c.strip() for c in header.split("|")[1:-1]]
    assert cols[:4] == ["device", "tables or blocks", "memory GiB", "of cap"] and cols[-2:] == ["total ms", "names"]
    assert len(rows) == 4
    totals = []
    for row in rows:
        cells = [c.strip() for c in row.split("|")[1:-1]]
        parts = [float(c) for c in cells[4:8]]
        assert sum(parts) == pytest.approx(float(cells[8]), abs=2e-3) and all(p >= 0 for p in parts)
        totals.append(float(cells[8]))
    assert max(totals) == pytest.approx(costs[kept], abs=2e-3)
    listed = " ".join(lines[start:start + 3 + 4 + 1])
    assert all(name in listed for name in ("user_id", "item_id", "history_items", "query_tokens"))
    assert png.read_bytes()[:4] == b"\x89PNG" and f"wrote {png}" in text
    with pytest.raises(ShardError, match="--plot draws the plans' costs: price them with --oracle"):
        run_plan("--tables", path, "--ndevices", 4, "--max-memory", 1, "--plot", tmp_path / "x.png")
    with pytest.raises(ShardError, match="--plot .* is also the input"):
        run_plan("--tables", path, "--ndevices", 4, "--max-memory", 1, "--oracle", "emulated:h200", "--plot", path)
    assert not (tmp_path / "x.png").exists() and open(path).read().startswith("# batch_size")


def test_batch_from_the_json_and_no_silent_guess(tmp_path, capsys):
    tables = [{"name": f"t{k}", "row": 1000 * (k + 1), "dim": 16, "pooling_factor": 2.0} for k in range(6)]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"tables": tables, "batch_size": 8192}))
    assert run_plan("--tables", path, "--ndevices", 2, "--max-memory", 1, "--alg", "lookup_greedy,shardkit",
                    "--oracle", "emulated:h200", "--shardkit-time", 0.1) == 0
    assert "batch 8192" in capsys.readouterr().out
    assert plan_script.read_batch_size(path) == 8192

    bare = write(tmp_path, "bare.csv", CSV_8)
    with pytest.raises(ShardError, match="batch is not known.*--batch-size.*shardkit"):
        run_plan("--tables", bare, "--ndevices", 2, "--max-memory", 1, "--alg", "shardkit", "--oracle", "emulated:h200")
    # without an oracle the planners that need a batch say which they assume
    assert run_plan("--tables", bare, "--ndevices", 2, "--max-memory", 1, "--alg", "shardkit",
                    "--shardkit-time", 0.1) == 0
    assert "batch 4096, assumed" in capsys.readouterr().out
    with pytest.raises(ShardError, match="--pick"):
        run_plan("--tables", bare, "--alg", "random,naive", "--out", tmp_path / "p.json")
    with pytest.raises(ShardError, match="not among --alg"):
        run_plan("--tables", bare, "--alg", "random", "--pick", "naive")
    with pytest.raises(ShardError, match="table_configs.json with its data.pt"):
        run_plan("--tables", bare, "--alg", "random", "--oracle", "measured", "--batch-size", 64)


def test_eval_export_torchrec_uses_the_tables_names(tmp_path, capsys):
    """eval.py --export-torchrec names tables as table_configs.json does (plan.py's JSON carries names)."""
    import eval as eval_script
    from helpers import make_dataset
    from shardcore.tasks import Task, save_tasks

    make_dataset(tmp_path / "ds", num_tables=6, batch_size=8)
    cfg_path = tmp_path / "ds" / "table_configs.json"
    cfg = json.loads(cfg_path.read_text())
    for t in cfg["tables"]:
        if t["index"] != 5:
            t["name"] = f"feature_{t['index']}"
    cfg_path.write_text(json.dumps(cfg))
    save_tasks(tmp_path / "t.txt", [Task((0, 5, 2))])
    eval_script.main(["--alg", "lookup_greedy", "--data-dir", str(tmp_path / "ds"), "--task-path",
                      str(tmp_path / "t.txt"), "--ndevices", "2", "--plan-only", "--quiet",
                      "--export-torchrec", str(tmp_path / "exp")])
    trec = json.loads((tmp_path / "exp" / "lookup_greedy" / "task_0000.torchrec.json").read_text())
    assert [t["name"] for t in trec["tables"]] == ["feature_0", "table_5", "feature_2"]


def test_torchrec_problem_knows_the_hosts():
    """plan.py --torchrec: a table-row-wise or grid table is applicable when its blocks are whole hosts
    of --devices-per-host, never on one host; the summary tags grid pieces."""
    from shardcore.plan import grid, row_wise, table_wise

    tables = [TableConfig(0, 1000, 16, 2.0), TableConfig(1, 500, 8, 1.0)]
    names = ["a", "b"]
    one_host, hosts = Topology(4, 1.0), Topology(4, 1.0, devices_per_host=2)
    twrw = [row_wise([2, 3]), table_wise(0)]
    g = [grid([([2, 3], 8), ([0, 1], 8)]), table_wise(0)]
    assert plan_script.torchrec_problem(names, Plan(tables, twrw, hosts)) is None
    assert plan_script.torchrec_problem(names, Plan(tables, g, hosts)) is None
    assert "table 'a': row-wise over ranks [2, 3]" in plan_script.torchrec_problem(names, Plan(tables, twrw, one_host))
    assert "grid blocks of 2 ranks" in plan_script.torchrec_problem(names, Plan(tables, g, one_host))   # one host of 4
    bad = Plan(tables, [grid([([1, 2], 8), ([0, 3], 8)]), table_wise(0)], hosts)
    assert "grid block on ranks [1, 2]" in plan_script.torchrec_problem(names, bad)
    text, _imb, _worst = plan_script.summary(names, Plan(tables, g, one_host), [0, 1, 2, 3])
    assert "a [grid]" in text


def test_a_csv_may_give_each_table_its_bag_length_cv(tmp_path):
    from shardcore.data.user_tables import read_tables_csv
    from shardcore.errors import ShardError

    path = tmp_path / "t.csv"
    path.write_text("name,rows,dim,pooling_factor,length_cv\nuser,1000000,64,20,1.4\nitem,500000,32,3,\n")
    tables, names = read_tables_csv(path)
    assert names == ["user", "item"] and [t.length_cv for t in tables] == [1.4, None]
    path.write_text("name,rows,dim,pooling_factor,length_cv\nuser,1000000,64,20,-1\n")
    with pytest.raises(ShardError, match="user.*length_cv -1.0 is negative"):
        read_tables_csv(path)

