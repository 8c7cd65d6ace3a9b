"""Who may import and name whom, read from the sources: the core stays method-free, the method
packages stay apart, and the method registry lists what the runner needs."""

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


@pytest.mark.parametrize("path", sorted((ROOT / "shardcore").glob("*.py")), ids=lambda p: p.name)
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
    with pytest.raises(ShardError, match="unknown algorithm 'neuroshard'"):
        algorithms.resolve("neuroshard")
    monkeypatch.setenv(registry.METHODS_ENV, "dreamshard,no_such_method_pkg")
    with pytest.raises(ShardError, match="not available in this installation"):
        registry.get("no_such_method_pkg")
    assert list(registry.available()) == ["dreamshard"]
    monkeypatch.delenv(registry.METHODS_ENV)
    assert registry.precision_origin("fp16") == "as AutoShard's and DreamShard's original code"
    assert registry.train_hint(None) == ("train one with python train_autoshard.py, train_dreamshard.py or "
                                         "train_neuroshard.py")


def test_the_planner_plugins_are_declared_at_the_top_level_and_resolve():
    from shardcore import registry
    from shardcore.cli import algorithms

    assert registry.planner_plugins() == {"shardkit": "shardkit_planner.sharder",
                                          "torchrec-emu": "shardkit_torchrec.sharder"}
    assert type(algorithms.resolve("shardkit", oracle="emulated:h200")).__module__ == "shardkit_planner.sharder"
