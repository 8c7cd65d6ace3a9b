"""Resolve an ``--alg`` name to a sharder: a baseline name, or a trained model's checkpoint.

A checkpoint (``*.pt``) names the method that wrote it in its ``"method"`` entry; the method's
package (``autoshard``, ``dreamshard``, ``neuroshard``, ...) provides ``load_sharder(path, **kw)``
in its ``sharder`` module. shardcore imports that module by name only when such a checkpoint is
asked for, so the core never depends on a method package.
"""

from __future__ import annotations

import importlib
from pathlib import Path

# Method packages outside NAMED_METHODS: one "name module[:function]" per line of this file at the
# repository root (blank lines and "#" comments skipped); resolve() imports the module only when the
# name is asked for. The core itself names no such package.
PLUGINS_FILE = Path(__file__).resolve().parent.parent / "method_plugins.txt"

from .baselines import BASELINES, Sharder, make_baseline
from .errors import ShardError
from .io import load_checkpoint

# Plain names (not paths) that a method package answers to, e.g. ``--alg neuroshard``.
NAMED_METHODS = ("autoshard", "dreamshard", "neuroshard")
# Names served by an optional module of the core (imported only when asked for).
# ``module`` or ``module:function`` (default function: load_sharder).
CORE_PLUGINS = {"torchrec": "shardcore.torchrec_planner",
                "torchrec-tw": "shardcore.torchrec_planner:load_sharder_tw"}


def plugins(path: Path | None = None) -> dict[str, str]:
    """``{--alg name: "module[:function]"}`` listed in :data:`PLUGINS_FILE` (empty when it is absent)."""
    path = PLUGINS_FILE if path is None else Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        raise ShardError(f"{path}: unreadable ({exc})") from None
    out = {}
    for k, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2 or not all(p.replace("_", "").replace("-", "").replace(".", "").replace(":", "").isalnum()
                                      for p in parts):
            raise ShardError(f"{path}:{k}: expected 'name module[:function]', got {line!r}")
        out[parts[0]] = parts[1]
    return out


def checkpoint_method(path: Path) -> str:
    """The method that wrote a checkpoint; only the known method names are accepted (the name is
    used to import the method's package, so a checkpoint never chooses what gets imported)."""
    method = load_checkpoint(path).get("method")
    if not isinstance(method, str):
        raise ShardError(f"{path}: not a shardcore checkpoint (no 'method' entry)")
    if method not in NAMED_METHODS:
        shown = method if len(method) <= 40 else method[:37] + "..."
        raise ShardError(f"{path}: unknown method {shown!r} in checkpoint (known: {', '.join(NAMED_METHODS)})")
    return method


def _method_module(method: str):
    if method not in NAMED_METHODS:
        raise ShardError(f"unknown method {method!r} (known: {', '.join(NAMED_METHODS)})")
    try:
        return importlib.import_module(f"{method}.sharder")
    except ModuleNotFoundError as exc:
        raise ShardError(f"--alg {method}: the {method} method is not available in this installation "
                         f"({exc.msg})") from None


def resolve(name: str, seed: int = 0, **kwargs) -> Sharder:
    """``name`` is a baseline (random, naive, *_greedy), a method name, or a checkpoint path."""
    if name in BASELINES:
        return make_baseline(name, seed=seed)
    path = Path(name)
    if name.endswith(".pt") or path.is_file():
        if not path.is_file():
            raise ShardError(f"checkpoint not found: {path}")
        return _method_module(checkpoint_method(path)).load_sharder(path, **kwargs)
    if name in CORE_PLUGINS:
        module, _, func = CORE_PLUGINS[name].partition(":")
        return getattr(importlib.import_module(module), func or "load_sharder")(None, **kwargs)
    if name in NAMED_METHODS:
        return _method_module(name).load_sharder(None, **kwargs)
    extra = plugins()
    if name in extra:
        module, _, func = extra[name].partition(":")
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            raise ShardError(f"--alg {name}: its package is not available in this installation ({exc.msg})") from None
        return getattr(mod, func or "load_sharder")(None, seed=seed, **kwargs)
    raise ShardError(f"unknown algorithm {name!r}: choose from {', '.join(BASELINES)}, "
                     "or give a trained model's checkpoint (.pt)")
