"""The results tables of the README and docs/ are generated from results/<name>/ (tools/report.py): the
pages hold what the records give, every manifest is valid and tracked, and a new result folder is one
more manifest."""

import json
import os
import shutil
import subprocess

import pytest

from helpers import load_tool

from shardcore.errors import ShardError

report = load_tool("report")
ROOT = report.ROOT


@pytest.fixture(scope="module")
def shipped():
    return report.manifests(ROOT / "results", ROOT)


def test_every_page_holds_the_tables_its_results_generate(shipped):
    """README's one results table (and every marked table of docs/) is what tools/report.py makes of
    results/ now: a changed record, manifest or judge shows here until `make results` is run."""
    readme = (ROOT / "README.md").read_text()
    assert "<!-- results:headline -->" in readme
    cache: dict = {}
    for page in report.pages(ROOT):
        text = page.read_text()
        assert report.regenerate(text, shipped, ROOT, cache, report.page_prefix(page, ROOT)) == text, \
            f"{page.relative_to(ROOT)}: run make results"
    # the front page has one row per landscape, each naming its hardware and its records
    head = cache["headline"].splitlines()[2:]
    assert len(head) == len(report.LANDSCAPES)
    for row, landscape in zip(head, report.LANDSCAPES):
        assert f"**{landscape}**" in row and "](results/" in row


def test_every_result_manifest_is_valid_and_tracked(shipped):
    assert {"h200_measured", "honest_margins", "cpu_experiments"} <= set(shipped)
    assert sorted({m["landscape"] for m in shipped.values() if m.get("headline")}) == sorted(report.LANDSCAPES)
    for name, m in shipped.items():
        assert m["records"] or m["missing"], name
        assert all((ROOT / r["path"]).is_file() for r in m["records"]), name
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    for name in shipped:   # a manifest git ignores would be a result nobody can read
        done = subprocess.run(["git", "check-ignore", "-q", f"results/{name}/manifest.json"], cwd=ROOT)
        assert done.returncode == 1, f"results/{name}/ is git-ignored: add !/results/{name}/ to .gitignore"


def test_the_margins_view_is_shardkit_compares_figure(shipped):
    """The report's margin and tools/shardkit_compare.py's printed one are the same computation."""
    sc = load_tool("shardkit_compare")
    m = shipped["h200_measured"]
    got = report.view_margins(m, "margins", ROOT)
    spec = m["views"]["margins"]["sets"][0]
    text = sc.summarize(str(ROOT / spec["records"]), "shardkit", None, repeat=str(ROOT / spec["repeat"]))
    first = text.split("\n\n")[0]
    assert f"shardkit: {got[0]['margin_pct']:.1f}% below the best anchor ({got[0]['best']})" in first
    lo, hi = got[0]["interval"]
    assert f"interval of the margin (tasks resampled): {lo:.1f}% .. {hi:.1f}%" in first
    assert got[0]["best_ms"] > got[0]["alg_ms"] > 0 and got[0]["faster_on"].endswith(f"/{got[0]['tasks']}")


def test_a_stated_margin_is_the_runs_difference_over_the_runner_up():
    m = report.stated_margin({"label": "S", "tasks": 5, "alg_ms": 30.0, "best": "x", "diff_ms": -10.0,
                              "interval_ms": [-12.0, -8.0]}, "here")
    assert m["best_ms"] == 40.0 and m["margin_pct"] == pytest.approx(25.0) and m["unit"] == "ms"
    assert "−10.00 ms, −12.00..−8.00 ms" in report.margin_cell(m)
    with pytest.raises(ShardError, match="here: a stated set needs"):
        report.stated_margin({"label": "S"}, "here")


def _folder(root, name, manifest):
    d = root / "results" / name
    d.mkdir(parents=True)
    (d / "manifest.json").write_text(json.dumps(manifest))
    return d


BASE = {"format": "shardkit-result/1", "title": "t", "landscape": "measured CPU", "hardware": "a 2-core CPU",
        "command": "python x.py", "commit": "abc1234"}


def test_a_new_result_folder_is_one_more_manifest(tmp_path):
    """A folder with a CSV of figures and a stated headline: its table and its front-page row come from the
    manifest alone, and the report rewrites only what lies between the markers."""
    d = _folder(tmp_path, "zoo", {
        **BASE, "records": [{"path": "results/zoo/zoo.csv", "what": "planners on public models"}],
        "views": {"table": {"kind": "csv", "path": "results/zoo/zoo.csv", "columns": ["model", "shardkit ms"]},
                  "head": {"kind": "stated", "sets": [{"label": "M (8)", "tasks": 1, "alg_ms": 2.0, "best": "torchrec",
                                                        "diff_ms": -0.5, "interval_ms": [-0.6, -0.4]}]}},
        "headline": {"view": "head", "order": 1}})
    (d / "zoo.csv").write_text("model,lower bound ms,shardkit ms\nmlperf,1.5,2.0\ndcnv2,2.5,3.1\n")
    (tmp_path / "docs").mkdir()
    page = tmp_path / "docs" / "zoo.md"
    page.write_text("# Zoo\n\nbefore\n<!-- results:zoo/table -->\nstale\n<!-- /results:zoo/table -->\nafter\n")
    ms = report.manifests(tmp_path / "results", tmp_path)
    new = report.regenerate(page.read_text(), ms, tmp_path, prefix=report.page_prefix(page, tmp_path))
    assert new.startswith("# Zoo\n\nbefore\n<!-- results:zoo/table -->\n| model | shardkit ms |")
    assert "| dcnv2 | 3.1 |" in new and "stale" not in new and new.endswith("<!-- /results:zoo/table -->\nafter\n")
    assert "[results/zoo/](../results/zoo/) (commit abc1234)" in new
    head = report.render_headline(ms, tmp_path)
    assert "| **measured CPU** | a 2-core CPU | M (8); 1 tasks each | M (8): 20.0% below TorchRec" in head


@pytest.mark.parametrize("change, message", [
    ({"format": "other"}, "not a result manifest"),
    ({"command": None}, "no 'command'"),
    ({"landscape": "somewhere"}, "landscape 'somewhere' is none of"),
    ({"records": []}, "no records, and no 'missing'"),
    ({"records": [{"path": "results/bad/none.jsonl", "what": "x"}]}, "record results/bad/none.jsonl not found"),
    ({"views": {"v": {"kind": "pie"}}}, "view 'v': 'kind' must be one of"),
    ({"headline": {"view": "nope"}}, "'headline' names a view of this manifest"),
])
def test_a_bad_manifest_is_refused_in_one_line(tmp_path, change, message):
    (tmp_path / "r.csv").write_text("a\n1\n")
    manifest = {**BASE, "records": [{"path": "r.csv", "what": "x"}], "views": {}, **change}
    manifest = {k: v for k, v in manifest.items() if v is not None}
    _folder(tmp_path, "bad", manifest)
    with pytest.raises(ShardError) as exc:
        report.manifests(tmp_path / "results", tmp_path)
    assert message in str(exc.value) and "\n" not in str(exc.value)
    assert str(exc.value).startswith(os.path.join("results", "bad", "manifest.json"))


def test_a_marker_naming_no_view_is_refused(shipped):
    with pytest.raises(ShardError, match="no view 'honest_margins/none'"):
        report.regenerate("<!-- results:honest_margins/none -->\n<!-- /results:honest_margins/none -->", shipped, ROOT)


def test_a_complete_honest_margins_run_becomes_the_current_one(tmp_path, monkeypatch):
    """tools/honest_margins.py names its new run as the folder's current one: the records and views point
    at it, the run it replaces joins the history, and the command, commit and date are the new run's."""
    hm = load_tool("honest_margins")
    monkeypatch.setattr(hm, "ROOT", tmp_path)
    folder = tmp_path / "results" / "honest_margins"
    for run in ("old", "new"):
        (folder / run).mkdir(parents=True)
        (folder / run / "emu_dlrm50.jsonl.gz").write_bytes(b"")
    manifest = {**BASE, "landscape": "emulated H200", "current": "results/honest_margins/old",
                "records": [{"path": "results/honest_margins/old/emu_dlrm50.jsonl.gz", "what": "x"}],
                "history": [{"folder": "results/honest_margins/older", "note": "y"}],
                "views": {"m": {"kind": "margins", "sets": [{"label": "S",
                                                            "records": "results/honest_margins/old/emu_dlrm50.jsonl.gz"}]}}}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    hm.make_current(folder / "manifest.json", folder / "new", ["--out-dir", "results/honest_margins/new"])
    got = report.read_manifest(folder, tmp_path)
    assert got["current"] == "results/honest_margins/new"
    assert got["records"][0]["path"] == got["views"]["m"]["sets"][0]["records"] == "results/honest_margins/new/emu_dlrm50.jsonl.gz"
    assert [h["folder"] for h in got["history"]] == ["results/honest_margins/old", "results/honest_margins/older"]
    assert got["command"] == "python tools/honest_margins.py --out-dir results/honest_margins/new"
    assert got["commit"] and got["date"].endswith("UTC")
