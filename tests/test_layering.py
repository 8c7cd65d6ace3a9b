"""Who may import and name whom, read from the sources: the core stays method-free and small, each
folder of shardcore/ is one layer with its rule, the method packages stay apart, no module imports
itself back through others (every import counts: at the top, inside functions, under
``TYPE_CHECKING``), and the method registry lists what the runner needs."""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
METHODS = ("autoshard", "dreamshard", "neuroshard")
PLANNERS = ("shardkit_planner",)          # our own planner: a method package too, declared as a plugin
PACKAGES = METHODS + PLANNERS
INTEROP = ("shardkit_torchrec",)           # TorchRec's interfaces backed by shardkit: may import the core and our planner


def _docstring_lines(tree: ast.AST) -> set[int]:
    """Lines of every docstring (module, class, function)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = getattr(node, "body", [])
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                out.update(range(body[0].lineno, body[0].end_lineno + 1))
    return out


def _imported_packages(tree: ast.AST) -> set[str]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
    return out


def method_mentions(source: str, cite_papers: bool = False) -> list[tuple[int, str]]:
    """(line, token) of every code token (names, strings outside docstrings, f-string parts) that
    names a method; comments and docstrings may describe conventions by paper name. With
    ``cite_papers``, strings may cite a paper by its capitalised name ("the DreamShard paper's
    layout"); names and lower-case package names still count."""
    tree = ast.parse(source)
    docs = _docstring_lines(tree)
    kinds = {tokenize.NAME, tokenize.STRING}
    kinds |= {getattr(tokenize, k) for k in ("FSTRING_MIDDLE", "TSTRING_MIDDLE") if hasattr(tokenize, k)}
    hits = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in kinds:
            continue
        if tok.type != tokenize.NAME and tok.start[0] in docs:
            continue
        text = tok.string if cite_papers and tok.type != tokenize.NAME else tok.string.lower()
        if any(m in text for m in METHODS):
            hits.append((tok.start[0], tok.string))
    return hits


def test_the_checker_sees_names_strings_and_fstrings_but_not_docstrings_or_comments():
    src = ('"""DreamShard-style docs are fine."""\n'
           "# NeuroShard in a comment is fine\n"
           "import autoshard.sharder\n"
           "def f():\n    '''AutoShard docs'''\n    return f\"{1}neuroshard\"\n"
           "X = 'DreamShard'\n")
    found = [t for _, t in method_mentions(src)]
    assert "autoshard" in found and "'DreamShard'" in found and any("neuroshard" in t for t in found)
    assert not any("style docs" in t or "AutoShard docs" in t for t in found)
    cited = [t for _, t in method_mentions(src, cite_papers=True)]
    assert "autoshard" in cited and "'DreamShard'" not in cited and any("neuroshard" in t for t in cited)


def test_the_registry_lists_the_method_packages():
    import shardkit_methods
    from shardcore import registry

    assert tuple(shardkit_methods.METHOD_PACKAGES) == METHODS
    specs = registry.available()
    assert tuple(specs) == METHODS
    for name, spec in specs.items():
        assert spec.name == name and spec.train_script.is_file(), name
        assert spec.default_precision in ("fp16", "fp32") and spec.label.lower() == name
        assert set(spec.scale_flags) >= {"full", "small", "tiny"}


@pytest.mark.parametrize("path", sorted((ROOT / "shardcore").rglob("*.py")),
                         ids=lambda p: str(p.relative_to(ROOT / "shardcore")))
def test_the_core_neither_imports_nor_names_a_method(path):
    source = path.read_text()
    assert not _imported_packages(ast.parse(source)) & set(PACKAGES + INTEROP), path.name
    assert method_mentions(source) == [], f"{path.name} names a method in code: {method_mentions(source)[:3]}"
    assert not any(p in source for p in INTEROP), f"{path.name} names the TorchRec interop package"


@pytest.mark.parametrize("method", PACKAGES)
def test_no_method_package_imports_another(method):
    others = (set(PACKAGES) - {method}) | set(INTEROP)
    for path in sorted((ROOT / method).rglob("*.py")):
        bad = _imported_packages(ast.parse(path.read_text())) & others
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


@pytest.mark.parametrize("path", sorted((ROOT / "shardkit_torchrec").rglob("*.py")), ids=lambda p: p.name)
def test_the_torchrec_interop_imports_only_the_core_and_our_planner(path):
    """shardkit_torchrec may use shardcore and shardkit_planner, never a learned method package, and names none."""
    source = path.read_text()
    assert not _imported_packages(ast.parse(source)) & set(METHODS), path.name
    assert method_mentions(source) == [], f"{path.name} names a method in code: {method_mentions(source)[:3]}"


@pytest.mark.parametrize("path", sorted((ROOT / "experiments").glob("*.py")), ids=lambda p: p.name)
def test_the_experiment_runner_names_no_method(path):
    """The runner reads the methods from the registry; its texts may cite the papers' tables."""
    source = path.read_text()
    assert not _imported_packages(ast.parse(source)) & set(PACKAGES + INTEROP), path.name
    hits = method_mentions(source, cite_papers=True)
    assert hits == [], f"{path.name} names a method in code: {hits[:3]}"


def test_the_method_list_can_be_replaced_from_the_environment(monkeypatch):
    """SHARDKIT_METHODS replaces the top-level list: an unlisted method is unknown to the core."""
    from shardcore import registry
    from shardcore.cli import algorithms
    from shardcore.errors import ShardError

    monkeypatch.setenv(registry.METHODS_ENV, "dreamshard")
    assert registry.method_names() == ("dreamshard",) and list(registry.available()) == ["dreamshard"]
    assert registry.train_hint(None) == "train one with python train_dreamshard.py"
    assert registry.precision_origin("fp32") == "" and registry.spelling_owner("--max_mem") == "the original code's"
    assert "neuroshard" not in algorithms.planners() and algorithms.planners()["dreamshard"].trained
    with pytest.raises(ShardError, match="unknown algorithm 'neuroshard'"):
        algorithms.lookup("neuroshard")
    monkeypatch.setenv(registry.METHODS_ENV, "dreamshard,no_such_method_pkg")
    with pytest.raises(ShardError, match="not available in this installation"):
        registry.get("no_such_method_pkg")
    assert list(registry.available()) == ["dreamshard"]
    monkeypatch.delenv(registry.METHODS_ENV)
    assert registry.precision_origin("fp16") == "as AutoShard's and DreamShard's original code"
    assert registry.train_hint(None) == ("train one with python train_autoshard.py, train_dreamshard.py or "
                                         "train_neuroshard.py")


def test_one_registry_holds_every_planner_with_its_factory_settings_and_kind():
    """Baselines, the declared planners and the learned methods in one table; each planner's flags bind to
    its own settings only, and a planner sharing another's settings (shardkit-tw) reads them."""
    import dataclasses

    from shardcore import registry
    from shardcore.baselines import BASELINES
    from shardcore.cli import algorithms
    from shardcore.cli.common import make_parser
    from shardcore.planning import Landscape, PlanningContext
    from shardcore.topology import Topology

    table = algorithms.planners()
    assert set(table) == set(BASELINES) | set(registry.declared_planners()) | set(METHODS)
    assert {n for n, e in table.items() if e.trained} == set(METHODS)
    assert set(registry.declared_planners()) == {"shardkit", "shardkit-tw", "torchrec", "torchrec-tw", "torchrec-emu"}
    assert {n: e.settings_of for n, e in table.items() if e.settings_of != n} == {
        "shardkit-tw": "shardkit", "torchrec-tw": "torchrec", "torchrec-emu": "torchrec"}
    p = make_parser()
    algorithms.add_planner_args(p, measuring=False)
    args = p.parse_args(["--shardkit-time", "0.5", "--torchrec-memory", "weights", "--k", "2"])
    configs = algorithms.planner_configs(args)
    assert configs["shardkit"].time == 0.5 and configs["torchrec"].memory == "weights"
    assert configs["neuroshard"].search == {"k": 2} and configs["autoshard"].checkpoint is None
    assert not any(hasattr(c, "memory") for n, c in configs.items() if n != "torchrec")   # nobody else's flags
    ctx = PlanningContext(Topology(4, 5.0), 4096, Landscape("emulated:h200"))
    sk = algorithms.build("shardkit", ctx, configs)
    assert type(sk).__module__ == "shardkit_planner.sharder" and sk.time_budget_s == 0.5
    # the second entry point: the same planner, table-wise only, under its own name, sharing shardkit's flags
    tw = algorithms.build("shardkit-tw", ctx, configs)
    assert tw.name == "shardkit-tw" and tw.types == ("table_wise",) and tw.time_budget_s == 0.5
    assert algorithms.build("random", dataclasses.replace(ctx, seed=3)).seed == 3


# -- the module graph: every import of every module, read from the sources ------------------------
SKIP_DIRS = {".venv", ".git", "data", "models", "results", "build"}   # top-level folders without code of ours
# the core: everything shardcore/ holds but the oracles' wing, the data wing and the command-line wiring
CORE_WINGS = ("oracles", "data", "cli")
CORE_MAX_LINES = 4400


def _module_files() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the repository (packages by their __init__)."""
    out = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT)
        if rel.parts[0] in SKIP_DIRS or any(p.startswith(".") for p in rel.parts):
            continue
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts:
            out[".".join(parts)] = path
    return out


def module_imports(name: str, source: str, known: set[str], is_package: bool = False) -> set[str]:
    """The repository modules ``name`` imports: every ``import`` and ``from ... import`` in the file
    (top level, inside functions, under ``TYPE_CHECKING``), relative ones resolved; ``from pkg import
    mod`` counts as ``pkg.mod`` where that is a module, and an import of something inside a module
    as that module."""
    package = name if is_package else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".") if package else []
                base = base[:len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for a in node.names:
                found.add(f"{module}.{a.name}" if f"{module}.{a.name}" in known else module)
    out = set()
    for mod in found:
        while mod and mod not in known:
            mod = mod.rpartition(".")[0]
        if mod and mod != name:
            out.add(mod)
    return out


def import_graph() -> dict[str, set[str]]:
    files = _module_files()
    known = set(files)
    return {name: module_imports(name, path.read_text(), known, path.name == "__init__.py")
            for name, path in files.items()}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, cycles = {}, {}, set(), [], []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, edges = work[-1]
            for w in edges:
                if w not in graph:
                    continue
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        cycles.append(sorted(comp))
    return cycles


def test_the_cycle_check_sees_lazy_and_type_checking_imports():
    known = {"pkg", "pkg.a", "pkg.b", "pkg.c", "pkg.sub", "pkg.sub.d"}
    a = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import X\n"
    b = "def f():\n    from . import c\n"
    c = "import pkg.a.thing\n"
    d = "from ..a import Y\nfrom pkg.sub import nothing_here\n"
    assert module_imports("pkg.a", a, known) == {"pkg.b"}
    assert module_imports("pkg.b", b, known) == {"pkg.c"}
    assert module_imports("pkg.c", c, known) == {"pkg.a"}
    assert module_imports("pkg.sub.d", d, known) == {"pkg.a", "pkg.sub"}
    graph = {"pkg.a": {"pkg.b"}, "pkg.b": {"pkg.c"}, "pkg.c": {"pkg.a"}, "pkg.sub.d": {"pkg.a"}}
    assert import_cycles(graph) == [["pkg.a", "pkg.b", "pkg.c"]]
    assert import_cycles({"x": {"y"}, "y": set()}) == []


def test_no_module_imports_itself_back():
    """No circle anywhere in the repository: a module never reaches itself through its imports."""
    cycles = import_cycles(import_graph())
    assert cycles == [], "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def _layer(module: str) -> str:
    """``core`` for a module directly in shardcore/, else its folder (``shardcore.oracles.measured``,
    ``shardcore.evaluation``...), or its top-level package."""
    parts = module.split(".")
    if parts[0] != "shardcore":
        return parts[0]
    if ROOT.joinpath(*parts).is_dir():   # a package: its own folder
        return module
    if len(parts) == 2:
        return "core"
    return ".".join(parts[:-1])


ORACLE_CONTRACT = ("shardcore.oracles.factory", "shardcore.oracles.setting", "shardcore.oracles.cache",
                   "shardcore.oracles.commmodel")   # what a method may use of the oracles' wing
# folder -> the layers it may import (besides itself); a prefix allows the folder and its subfolders
LAYER_RULES = {
    "core": ("core",),
    "shardcore.data": ("core",),
    "shardcore.processes": ("core",),
    "shardcore.oracles": ("core", "shardcore.data", "shardcore.oracles"),
    "shardcore.oracles.emulated": ("core", "shardcore.data", *ORACLE_CONTRACT),
    "shardcore.oracles.measured": ("core", "shardcore.data", "shardcore.processes", *ORACLE_CONTRACT),
    "shardcore.evaluation": ("core", "shardcore.data", *ORACLE_CONTRACT),
    "shardcore.interop": ("core", *ORACLE_CONTRACT),
    "shardcore.cli": ("core", "shardcore.data", "shardcore.processes", "shardcore.oracles", "shardcore.evaluation"),
}
# the method packages: the core, data, how processes start and end, the oracle contract and the
# command-line helpers, never an oracle's internals (emulated/, measured/), the evaluation or the
# interop; our planner may start from another planner (cli.algorithms) and fits its cost model with the
# emulator's feature family.
METHOD_RULE = ("core", "shardcore.data", "shardcore.processes", *ORACLE_CONTRACT, "shardcore.cli.common")
# our planner's cost model is the emulated card's compute model, refitted on the card's measurements, or a
# calibrated card's (its file read by the card module)
PLANNER_RULE = METHOD_RULE + ("shardcore.oracles.emulated.model", "shardcore.oracles.emulated.measurements",
                              "shardcore.oracles.emulated.card")
for _m in METHODS:
    LAYER_RULES[_m] = METHOD_RULE
LAYER_RULES["shardkit_planner"] = PLANNER_RULE
# TorchRec's planning interfaces backed by shardkit: a start that is another planner is built by name
LAYER_RULES["shardkit_torchrec"] = PLANNER_RULE + ("shardcore.interop", "shardcore.cli.algorithms")


def _allowed(target: str, rule: tuple[str, ...]) -> bool:
    if _layer(target) == "core":
        return "core" in rule
    return any(target == r or target.startswith(r + ".") for r in rule if r != "core")


def test_each_folder_imports_only_the_layers_below_it():
    """core <- data <- oracles (emulated/ and measured/ apart, both through the contract) <-
    evaluation <- cli; methods use the core and the oracle contract, never an oracle's internals."""
    bad = []
    for module, targets in sorted(import_graph().items()):
        layer = _layer(module)
        rule = LAYER_RULES.get(layer)
        if rule is None:
            continue
        for target in sorted(targets):
            if not target.startswith("shardcore.") or _layer(target) == layer:
                continue
            if not _allowed(target, rule):
                bad.append(f"{module} ({layer}) imports {target}")
    assert bad == [], "\n".join(bad)


def test_the_emulated_and_measured_oracles_stay_apart():
    graph = import_graph()
    for module, targets in graph.items():
        if module.startswith("shardcore.oracles.emulated"):
            assert not any(t.startswith("shardcore.oracles.measured") for t in targets), module
        if module.startswith("shardcore.oracles.measured"):
            assert not any(t.startswith("shardcore.oracles.emulated") for t in targets), module


def core_lines() -> dict[str, int]:
    """Lines of every module of the core package outside its wings (:data:`CORE_WINGS`), by path."""
    out = {}
    for p in sorted((ROOT / "shardcore").rglob("*.py")):
        rel = p.relative_to(ROOT / "shardcore")
        if rel.parts[0] not in CORE_WINGS:
            out[str(rel)] = len(p.read_text().splitlines())
    return out


def test_the_core_counts_every_module_outside_the_oracles_data_and_cli_wings():
    """The count is honest: a new module anywhere in shardcore/ (a subfolder included) counts unless it is an
    oracle's, data's or the command line's."""
    lines = core_lines()
    assert {"plan.py", "types.py", "evaluation/report.py", "interop/plan_export.py", "processes/__init__.py"} <= set(lines)
    assert not any(k.split("/")[0] in CORE_WINGS for k in lines)


def test_the_core_layer_is_small():
    """What every planner and consumer needs stays within CORE_MAX_LINES."""
    lines = core_lines()
    assert sum(lines.values()) <= CORE_MAX_LINES, f"the core has {sum(lines.values())} lines: {lines}"
