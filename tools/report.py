#!/usr/bin/env python3
"""Regenerate every results table of the README and docs/ from the result folders' records.

  make results                         # = python tools/report.py
  python tools/report.py --check       # exit 2 where a page's table differs from what results/ gives
  python tools/report.py --print honest_margins/margins    # one view, printed

A result folder ``results/<name>/`` holds its records and a ``manifest.json`` (format in
results/README.md): the exact command, the commit, the hardware in words, its landscape ("measured on a
real NVIDIA H200", "emulated H200", "measured CPU"), what each record is, and its **views**: the tables
made from the records. A page shows a view between two marker comments,

  <!-- results:honest_margins/margins -->  ...  <!-- /results:honest_margins/margins -->

and ``<!-- results:headline -->`` is the front page's one table: one row per manifest that names a
``headline`` view, the current figure of each landscape. Everything between the markers is generated:
edit the manifest or the records, never the table. A new result folder is one more manifest, not a
change here: the view kinds are

- ``margins``: per task set, the compared planner (``alg``, default shardkit) against the best other
  planner of the records: their mean plan costs over the tasks all planned, the margin (1 - ours /
  theirs), its 95% paired bootstrap interval over tasks (tools/shardkit_compare.py's), the tasks it was
  faster on; on emulated records also under the stressed judge;
- ``planners``: per task set every planner's mean plan cost (``algs`` to choose and order them), each
  also against the planners of ``versus``;
- ``stated``: margins whose records are not in the repository, stated in the manifest with where
  they were quoted from (a view of ``margins``' shape whose interval is in the unit the run gave);
- ``csv``: a CSV file of the folder rendered as it is (``columns`` to choose them);
- ``zoo``: tools/zoo.py's records (``records``, ``bounds``): ``table`` ``cases`` (per case every planner over
  the proven bound) or ``summary`` (per planner); as a headline, shardkit against the best other planner
  over the cases and its distance to the optimum where the solver closed the program.

A set's records (``records``, relative to the repository root) are eval.py --out files (JSONL, may be
gzipped), a tools/gpu_check.py summary (``.json``; ``set`` names the task set, ``repeat`` another run
that measured some plans again: tools/shardkit_compare.py --repeat) or make experiments'
``measurements.csv`` (``set`` names the task set).
"""

from __future__ import annotations

import csv
import json
import os
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from shardcore import io  # noqa: E402
from shardcore.cli.common import make_parser, run_main  # noqa: E402
from shardcore.errors import ShardError  # noqa: E402

FORMAT = "shardkit-result/1"
KINDS = ("margins", "planners", "stated", "csv", "zoo")
LANDSCAPES = ("measured on a real NVIDIA H200", "emulated H200", "measured CPU")
# the pages whose marked tables the report regenerates (relative to the repository root)
PAGES = ("README.md", "docs/*.md", "results/README.md")
MARKER = re.compile(r"<!-- results:(?P<name>[\w./-]+) -->\n(?P<body>.*?)<!-- /results:(?P=name) -->", re.S)
MINUS = "\u2212"
# how a planner is named in a table (a checkpoint path by its method); others as they are recorded
LABELS = {"shardkit-tw": "shardkit (TW)", "torchrec": "TorchRec", "torchrec-tw": "TorchRec (TW)",
          "torchrec-emu": "TorchRec (emulator-priced)", "neuroshard": "NeuroShard", "dreamshard": "DreamShard",
          "autoshard": "AutoShard", "lookup_greedy (planned elsewhere)": "lookup_greedy (planned on the GPU)"}


def head_commit() -> str:
    """The checkout's commit (short), the ``commit`` of a manifest a tool writes; "unknown" outside git."""
    import subprocess

    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def label(alg: str, labels: dict | None = None) -> str:
    """How ``alg`` is named in a table: the view's ``labels``, :data:`LABELS`, a checkpoint by its method."""
    if labels and alg in labels:
        return labels[alg]
    if alg in LABELS:
        return LABELS[alg]
    if "/" in alg:
        for part in reversed(Path(alg).parts):
            if part in LABELS:
                return LABELS[part]
    return alg


def num(v: float, digits: int = 4) -> str:
    """``v`` to ``digits`` significant digits, a true minus sign."""
    s = f"{v:#.{digits}g}".rstrip(".") if abs(v) >= 1 else f"{v:.{digits - 1}f}"
    return s.replace("-", MINUS)


def pct(v: float) -> str:
    return f"{v:.1f}".replace("-", MINUS)


def signed_pct(v: float) -> str:
    return ("+" if v >= 0 else "") + pct(v)


def md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


# -- manifests ----------------------------------------------------------------------------------------
def read_manifest(folder: Path, root: Path = ROOT) -> dict:
    """``folder/manifest.json``, checked: one-line errors name the file and what is wrong."""
    path = folder / "manifest.json"
    where = str(path.relative_to(root)) if path.is_relative_to(root) else str(path)
    try:
        obj = json.loads(path.read_text())
    except OSError as exc:
        raise ShardError(f"{where}: cannot read ({exc.strerror})") from None
    except json.JSONDecodeError as exc:
        raise ShardError(f"{where}: malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise ShardError(f"{where}: not a result manifest (needs \"format\": \"{FORMAT}\")")
    for key in ("title", "landscape", "hardware", "command", "commit", "records", "views"):
        if key not in obj:
            raise ShardError(f"{where}: no {key!r} (results/README.md lists what a manifest holds)")
    if obj["landscape"] not in LANDSCAPES:
        raise ShardError(f"{where}: landscape {obj['landscape']!r} is none of {', '.join(map(repr, LANDSCAPES))}")
    if not obj["records"] and not obj.get("missing"):
        raise ShardError(f"{where}: no records, and no 'missing' saying why")
    for rec in obj["records"]:
        if not isinstance(rec, dict) or "path" not in rec or "what" not in rec:
            raise ShardError(f"{where}: each record is {{\"path\": ..., \"what\": ...}}, got {rec!r}")
        if not (root / rec["path"]).is_file():
            raise ShardError(f"{where}: record {rec['path']} not found")
    if not isinstance(obj["views"], dict):
        raise ShardError(f"{where}: 'views' maps a view's name to its description")
    for name, view in obj["views"].items():
        if not isinstance(view, dict) or view.get("kind") not in KINDS:
            raise ShardError(f"{where}: view {name!r}: 'kind' must be one of {', '.join(KINDS)}")
    head = obj.get("headline")
    if head is not None and (not isinstance(head, dict) or head.get("view") not in obj["views"]):
        raise ShardError(f"{where}: 'headline' names a view of this manifest: {{\"view\": NAME, \"order\": N}}")
    obj["name"] = folder.name
    obj["where"] = where
    return obj


def manifests(results: Path, root: Path = ROOT) -> dict[str, dict]:
    """Every ``results/<name>/manifest.json``, by folder name."""
    return {d.name: read_manifest(d, root) for d in sorted(results.iterdir())
            if d.is_dir() and (d / "manifest.json").is_file()}


# -- records ------------------------------------------------------------------------------------------
def set_records(spec: dict, where: str, root: Path = ROOT) -> list[dict]:
    """The eval-like records (``task``, ``alg``, ``cost_ms``, ``device_costs_ms``...) of one task set."""
    from tools import shardkit_compare as sc

    if "records" not in spec:
        raise ShardError(f"{where}: a set needs 'records' (a path relative to the repository root)")
    path = root / spec["records"]
    if not path.is_file():
        raise ShardError(f"{where}: records {spec['records']} not found")
    if path.suffix == ".json":   # a tools/gpu_check.py summary: the set by its name
        chosen = [recs for lab, recs, _ in sc.gpu_check_sets(str(path)) if sc.gpu_set_name(lab) == spec.get("set")]
        if not chosen:
            raise ShardError(f"{where}: {spec['records']} has no task set {spec.get('set')!r}")
        recs = chosen[0]
        if spec.get("repeat"):
            again = [r for lab, r, _ in sc.gpu_check_sets(str(root / spec["repeat"]))
                     if sc.gpu_set_name(lab) == spec.get("set")]
            if again:
                recs = sc.apply_repeat(spec["set"], recs, spec["repeat"], again[0])[0]
        return recs
    if path.suffix == ".csv":    # make experiments' measurements.csv: the set's measured plans
        out = []
        with open(path, newline="") as fh:
            for row in csv.DictReader(fh):
                if row.get("task_set") == spec.get("set") and row.get("status") == "ok" and row.get("cost_ms"):
                    out.append({"task": int(row["task"]), "alg": row.get("label") or row["alg"],
                                "cost_ms": float(row["cost_ms"]), "device_costs_ms": json.loads(row["device_costs_ms"]),
                                "hardware": row.get("hardware")})
        if not out:
            raise ShardError(f"{where}: {spec['records']} has no measured plan of task set {spec.get('set')!r}")
        return out
    from shardcore.evaluation.compare import check_record

    try:
        lines = io.read_maybe_gzipped(path).decode("utf-8").splitlines()
        return [check_record(json.loads(x), f"{spec['records']}:{k}") for k, x in enumerate(lines, 1) if x.strip()]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ShardError(f"{spec['records']}: not a readable eval.py --out file ({io.first_line(exc, 200)})") from None


def margin(spec: dict, view: dict, where: str, root: Path = ROOT) -> dict:
    """One task set's margin of the compared planner below the best other one (tools/shardkit_compare.py's
    figures, as numbers): ``label, tasks, alg, alg_ms, best, best_ms, margin_pct, interval, unit,
    faster_on`` and ``stressed`` (None, or ``best, margin_pct, interval`` under the stressed judge)."""
    from tools import shardkit_compare as sc

    alg = view.get("alg", "shardkit")
    recs = set_records(spec, where, root)
    by, algs, tasks = sc.compared(spec["records"], recs, alg, view.get("anchors"))
    order = sorted(tasks)
    mean = {a: statistics.fmean(by[a][t]["cost_ms"] for t in order) for a in algs}
    best = min((a for a in algs if a != alg), key=lambda a: mean[a])
    ours, theirs = [by[alg][t]["cost_ms"] for t in order], [by[best][t]["cost_ms"] for t in order]
    out = {"label": spec.get("label") or spec.get("set") or spec["records"], "tasks": len(order), "alg": alg,
           "alg_ms": mean[alg], "best": best, "best_ms": mean[best], "margin_pct": 100.0 * (1 - mean[alg] / mean[best]),
           "interval": sc.margin_interval(ours, theirs), "unit": "%",
           "faster_on": f"{sum(a < b for a, b in zip(ours, theirs))}/{len(order)}", "stressed": None}
    hardware = str(recs[0].get("hardware") or "")
    if view.get("stressed", True) and "emulated" in hardware:
        data_dir = str(root / view.get("data_dir", "data/gpu_measurements/dlrm_b65536"))
        stressed, _ = sc.stressed_judge(by, algs, order, hardware, data_dir)
        if stressed is not None:
            smean = {a: statistics.fmean(stressed[a][t] for t in order) for a in algs}
            sbest = min((a for a in algs if a != alg), key=lambda a: smean[a])
            out["stressed"] = {"best": sbest, "margin_pct": 100.0 * (1 - smean[alg] / smean[sbest]),
                               "interval": sc.margin_interval([stressed[alg][t] for t in order],
                                                              [stressed[sbest][t] for t in order])}
    return out


def stated_margin(spec: dict, where: str) -> dict:
    """A stated set (``label, tasks, alg_ms, best, diff_ms, interval_ms``) in :func:`margin`'s shape: the
    best other planner's mean is ``alg_ms - diff_ms``; the interval stays in ms."""
    try:
        alg_ms, diff = float(spec["alg_ms"]), float(spec["diff_ms"])
        lo, hi = (float(v) for v in spec["interval_ms"])
        return {"label": spec["label"], "tasks": int(spec["tasks"]), "alg": spec.get("alg", "shardkit"),
                "alg_ms": alg_ms, "best": spec["best"], "best_ms": alg_ms - diff,
                "margin_pct": -100.0 * diff / (alg_ms - diff), "interval": (lo, hi), "unit": "ms",
                "diff_ms": diff, "faster_on": spec.get("faster_on", ""), "stressed": None}
    except (KeyError, TypeError, ValueError) as exc:
        raise ShardError(f"{where}: a stated set needs label, tasks, alg_ms, best, diff_ms and interval_ms "
                         f"[lo, hi] ({type(exc).__name__}: {exc})") from None


def view_margins(m: dict, name: str, root: Path = ROOT) -> list[dict]:
    view = m["views"][name]
    where = f"{m['where']}: view {name!r}"
    if view["kind"] == "margins":
        return [margin(s, view, where, root) for s in view.get("sets", [])]
    if view["kind"] == "stated":
        return [stated_margin(s, where) for s in view.get("sets", [])]
    raise ShardError(f"{where}: a {view['kind']} view gives no margins (the headline needs margins or stated)")


# -- rendering ----------------------------------------------------------------------------------------
def interval_text(m: dict) -> str:
    lo, hi = m["interval"]
    if m["unit"] == "%":   # the margin's interval, in points
        return f"{pct(lo)}..{pct(hi)}" + (": a tie" if lo <= 0 <= hi else "")
    ms = lambda v: f"{v:.2f}".replace("-", MINUS)   # noqa: E731
    return f"{ms(m['diff_ms'])} ms, {ms(lo)}..{ms(hi)} ms" + (": a tie" if lo <= 0 <= hi else "")


def margin_cell(m: dict, labels: dict | None = None) -> str:
    word = "below" if m["margin_pct"] >= 0 else "above"
    text = f"{abs(m['margin_pct']):.1f}% {word} {label(m['best'], labels)} ({interval_text(m)})"
    if m["stressed"]:
        s = m["stressed"]
        text += f", stressed {pct(s['margin_pct'])}% ({pct(s['interval'][0])}..{pct(s['interval'][1])})"
    return text


def render_margins(ms: list[dict], view: dict) -> str:
    labels = view.get("labels")
    stressed = any(m["stressed"] for m in ms)
    header = ["task set", "tasks", f"{label(ms[0]['alg'], labels) if ms else 'shardkit'} ms", "best other planner, ms",
              "margin below it (95% paired interval)"] + (["under the stressed judge"] if stressed else []) + \
             ["faster on"]
    rows = []
    for m in ms:
        s = m["stressed"]
        row = [m["label"], str(m["tasks"]), num(m["alg_ms"]), f"{label(m['best'], labels)} {num(m['best_ms'])}",
               f"{pct(m['margin_pct'])}% ({interval_text(m)})"]
        if stressed:
            row.append(f"{pct(s['margin_pct'])}% ({pct(s['interval'][0])}..{pct(s['interval'][1])}) vs "
                       f"{label(s['best'], labels)}" if s else "-")
        rows.append(row + [m["faster_on"] or "-"])
    return md_table(header, rows)


def render_planners(m: dict, name: str, root: Path = ROOT) -> str:
    """Rows: planners; columns: task sets; a cell the mean plan cost over the tasks all listed planners
    planned, with its difference to each of ``versus``."""
    from tools import shardkit_compare as sc

    view = m["views"][name]
    where = f"{m['where']}: view {name!r}"
    labels, versus = view.get("labels"), list(view.get("versus", []))
    cols, means = [], []
    for spec in view.get("sets", []):
        recs = set_records(spec, where, root)
        present = {r["alg"] for r in recs}
        algs = [a for a in (view.get("algs") or sorted(present)) if a in present]
        missing = [a for a in view.get("algs") or [] if a not in present]
        if missing:
            raise ShardError(f"{where}: {spec['records']} has no records of {', '.join(missing)}")
        by, algs, tasks = sc.compared(spec["records"], recs, algs[0], algs[1:])
        means.append({a: statistics.fmean(by[a][t]["cost_ms"] for t in tasks) for a in algs})
        cols.append(f"{spec.get('label') or spec.get('set')} ({len(tasks)} tasks)")
    order = view.get("algs") or sorted(means[0], key=means[0].get)
    rows = []
    for a in order:
        cells = [label(a, labels)]
        for mean in means:
            if a not in mean:
                cells.append("-")
                continue
            rel = [f"{signed_pct(100 * (mean[a] / mean[v] - 1))}% vs {label(v, labels)}"
                   for v in versus if v != a and v in mean]
            low = mean[a] == min(mean.values())
            val = f"**{num(mean[a])}**" if low else num(mean[a])
            cells.append(val + (f" ({'; '.join(rel)})" if rel else ""))
        rows.append(cells)
    return md_table(["mean plan cost, ms"] + cols, rows)


def render_csv(m: dict, name: str, root: Path = ROOT) -> str:
    view = m["views"][name]
    path = root / view.get("path", "")
    if not view.get("path") or not path.is_file():
        raise ShardError(f"{m['where']}: view {name!r}: csv {view.get('path')!r} not found")
    with open(path, newline="") as fh:
        rows = list(csv.reader(fh))
    if not rows:
        raise ShardError(f"{m['where']}: view {name!r}: {view['path']} is empty")
    header, body = rows[0], rows[1:]
    cols = view.get("columns") or header
    missing = [c for c in cols if c not in header]
    if missing:
        raise ShardError(f"{m['where']}: view {name!r}: {view['path']} has no column {missing[0]!r}")
    idx = [header.index(c) for c in cols]
    return md_table(cols, [[r[i] if i < len(r) else "" for i in idx] for r in body])


def source_line(m: dict) -> str:
    """What every generated table ends with: where its figures come from."""
    setup = f" ({m['setup']})" if m.get("setup") else ""
    return (f"<sub>{m['landscape']}: {m['hardware']}{setup}; records and command: "
            f"[results/{m['name']}/](results/{m['name']}/) (commit {m['commit']})</sub>")


def render_view(ms: dict[str, dict], name: str, root: Path = ROOT) -> str:
    if name == "headline":
        return render_headline(ms, root)
    folder, _, view = name.partition("/")
    if folder not in ms or view not in ms[folder]["views"]:
        raise ShardError(f"no view {name!r}: a marker names results/<folder>/manifest.json's view as FOLDER/VIEW")
    m = ms[folder]
    kind = m["views"][view]["kind"]
    if kind in ("margins", "stated"):
        body = render_margins(view_margins(m, view, root), m["views"][view])
    elif kind == "planners":
        body = render_planners(m, view, root)
    elif kind == "zoo":
        body = render_zoo(m, view, root)
    else:
        body = render_csv(m, view, root)
    return body + "\n\n" + source_line(m)


def zoo_records(m: dict, name: str, root: Path = ROOT) -> tuple[list[dict], list[dict]]:
    from tools import zoo

    view = m["views"][name]
    out = []
    for key in ("records", "bounds"):
        path = root / str(view.get(key, ""))
        if not view.get(key) or not path.is_file():
            raise ShardError(f"{m['where']}: view {name!r}: {key} {view.get(key)!r} not found")
        out.append(zoo.read_jsonl(path))
    return out[0], out[1]


def render_zoo(m: dict, name: str, root: Path = ROOT) -> str:
    from tools import zoo

    records, bounds = zoo_records(m, name, root)
    algs = list(dict.fromkeys(r["alg"] for r in records))
    table = m["views"][name].get("table", "summary")
    if table not in ("cases", "summary"):
        raise ShardError(f"{m['where']}: view {name!r}: table is 'cases' or 'summary', got {table!r}")
    return zoo.render_cases(records, bounds, algs) if table == "cases" else zoo.render_summary(records, bounds, algs)


def headline_row(m: dict, root: Path = ROOT) -> tuple[str, str]:
    """(task sets, cell) of one manifest's headline view."""
    view = m["headline"]["view"]
    if m["views"][view]["kind"] == "zoo":
        from tools import zoo

        cell = zoo.headline(*zoo_records(m, view, root))
        sets = m["headline"].get("sets", "public models")
    else:
        got = view_margins(m, view, root)
        labels = m["views"][view].get("labels")
        tasks = [g["tasks"] for g in got]
        sets = ", ".join(g["label"] for g in got) + "; " + (f"{tasks[0]} tasks each" if len(set(tasks)) == 1 else
                                                            ", ".join(map(str, tasks)) + " tasks")
        cell = "; ".join(f"{g['label']}: {margin_cell(g, labels)}" for g in got)
    if m["headline"].get("note"):
        cell += f" — *{m['headline']['note']}*"
    return sets, cell


def render_headline(ms: dict[str, dict], root: Path = ROOT) -> str:
    """The front page's table: one row per landscape, the manifests with a ``headline`` of that landscape
    (ordered by ``order`` then folder name) joined in it: their hardware, task sets and the compared
    planner's margin on each."""
    heads = sorted((m for m in ms.values() if m.get("headline")), key=lambda m: (m["headline"].get("order", 99), m["name"]))
    rows = []
    for landscape in LANDSCAPES:
        these = [m for m in heads if m["landscape"] == landscape]
        if not these:
            continue
        parts = [headline_row(m, root) for m in these]
        hardware = " / ".join(dict.fromkeys(m["hardware"] for m in these))
        rows.append([f"**{landscape}**", hardware, " + ".join(sets for sets, _ in parts),
                     "<br>".join(cell for _, cell in parts),
                     ", ".join(f"[{m['name']}](results/{m['name']}/)" for m in these)])
    return md_table(["landscape", "hardware", "task sets (devices)", "shardkit against the best other planner (95% paired "
                     "interval over tasks)", "records"], rows)


# -- pages --------------------------------------------------------------------------------------------
def pages(root: Path = ROOT) -> list[Path]:
    out = []
    for pattern in PAGES:
        out += sorted(root.glob(pattern))
    return out


def page_prefix(page: Path, root: Path = ROOT) -> str:
    """The relative path from ``page``'s folder to the repository root ('' at the root, '../' in docs/)."""
    rel = Path(os.path.relpath(root, page.parent))
    return "" if str(rel) == "." else rel.as_posix() + "/"


def regenerate(text: str, ms: dict[str, dict], root: Path = ROOT, cache: dict | None = None, prefix: str = "") -> str:
    """``text`` with every marked table regenerated; ``prefix`` leads from the page to the repository root
    (its links to results/ are made relative to the page)."""
    cache = {} if cache is None else cache

    def sub(match):
        name = match.group("name")
        if name not in cache:
            cache[name] = render_view(ms, name, root)
        body = cache[name].replace("](results/", f"]({prefix}results/")
        return f"<!-- results:{name} -->\n{body}\n<!-- /results:{name} -->"

    return MARKER.sub(sub, text)


def build_parser():
    p = make_parser(description=__doc__)
    p.add_argument("--check", action="store_true",
                   help="write nothing: fail (exit 2) where a page's generated table differs from what results/ gives")
    p.add_argument("--print", dest="show", default=None, metavar="VIEW",
                   help="print one view (FOLDER/VIEW, or headline) and write nothing")
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    root = ROOT
    ms = manifests(root / "results", root)
    if args.show:
        print(render_view(ms, args.show, root))
        return 0
    cache: dict = {}
    stale = []
    for page in pages(root):
        text = page.read_text()
        new = regenerate(text, ms, root, cache, page_prefix(page, root))
        if new != text:
            stale.append(str(page.relative_to(root)))
            if not args.check:
                io.write_text(page, new)
    if args.check and stale:
        raise ShardError(f"results tables out of date in {', '.join(stale)}: run make results")
    print(("checked" if args.check else "regenerated") + f" {len(cache)} tables from {len(ms)} result folders"
          + (f"; rewrote {', '.join(stale)}" if stale and not args.check else ""))
    return 0


if __name__ == "__main__":
    run_main(main)
