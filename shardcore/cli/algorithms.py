"""Resolve an ``--alg`` name to a sharder: a baseline name, or a trained model's checkpoint.

A checkpoint (``*.pt``) names the method that wrote it in its ``"method"`` entry; the method's
package (one of those :mod:`shardcore.registry` lists) provides ``load_sharder(path, **kw)`` in its
``sharder`` module. shardcore imports that module by name only when such a checkpoint is asked
for, so the core never depends on a method package. A declared planner (``PLANNER_PLUGINS``) may state
its settings as a config (``CONFIG`` in its module); the scripts then get its flags from
:func:`add_plugin_args` and pass them on with :func:`plugin_kwargs`.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

from shardcore import registry
from shardcore.baselines import BASELINES, Sharder, make_baseline
from shardcore.config import Config, add_config_args, given_args
from shardcore.errors import ShardError
from shardcore.io import load_checkpoint

CORE_PLUGINS = registry.CORE_PLUGINS   # the core's optional planners (TorchRec's), by module


def plugins() -> dict[str, str]:
    """The planners declared beside the learned methods (:func:`shardcore.registry.planner_plugins`)."""
    return registry.planner_plugins()


def _plugin_configs() -> dict[str, Any]:
    """``{name: CONFIG}`` of the declared planners whose module states its settings as a
    :class:`~shardcore.config.Config` instance named ``CONFIG`` (a planner that is not installed has none)."""
    out = {}
    # a planner's main entry point (module only) before its second ones (module:function) that share its flags
    for name, target in sorted(plugins().items(), key=lambda kv: ":" in kv[1]):
        try:
            mod = importlib.import_module(target.partition(":")[0])
        except ModuleNotFoundError:
            continue
        cfg = getattr(mod, "CONFIG", None)
        if isinstance(cfg, Config) and not any(c is cfg for c in out.values()):
            out[name] = cfg    # a second entry point of one planner (shardkit-tw) shares its flags
    return out


def add_plugin_args(parser, measuring: bool = True, groups: dict | None = None) -> None:
    """One argument group per declared planner with a ``CONFIG`` (``groups[name]`` when the script
    made one already): a ``--<name>-<field>`` flag per :func:`~shardcore.config.param` field (fields of
    group ``measuring`` only where ``measuring``: a script that measures plans)."""
    for name, cfg in _plugin_configs().items():
        group = (groups or {}).get(name) or parser.add_argument_group(f"{name} (--alg {name})")
        add_config_args(group, cfg, prefix=f"{name}-", skip_groups=() if measuring else ("measuring",))


def plugin_kwargs(args) -> dict[str, Any]:
    """The declared planners' flags given on the command line, as :func:`resolve` keyword arguments
    (``<name>_<field>``); flags not given are left out (the planner's defaults apply)."""
    out = {}
    for name, cfg in _plugin_configs().items():
        for field, value in given_args(type(cfg), args, prefix=f"{name}-").items():
            out[f"{name}_{field}"] = value
    return out


def checkpoint_method(path: Path) -> str:
    """The method that wrote a checkpoint; only the known method names are accepted (the name is
    used to import the method's package, so a checkpoint never chooses what gets imported)."""
    method = load_checkpoint(path).get("method")
    if not isinstance(method, str):
        raise ShardError(f"{path}: not a shardcore checkpoint (no 'method' entry)")
    known = registry.method_names()
    if method not in known:
        shown = method if len(method) <= 40 else method[:37] + "..."
        raise ShardError(f"{path}: unknown method {shown!r} in checkpoint (known: {', '.join(known)})")
    return method


def _method_module(method: str):
    known = registry.method_names()
    if method not in known:
        raise ShardError(f"unknown method {method!r} (known: {', '.join(known)})")
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
    if name.endswith(".pt") or path.is_file() or os.sep in name:   # a path: a checkpoint, or nothing
        if not path.is_file():
            raise ShardError(f"checkpoint {'is a directory' if path.is_dir() else 'not found'}: {path}")
        return _method_module(checkpoint_method(path)).load_sharder(path, **kwargs)
    if name in CORE_PLUGINS:
        module, _, func = CORE_PLUGINS[name].partition(":")
        return getattr(importlib.import_module(module), func or "load_sharder")(None, **kwargs)
    if name in registry.method_names():
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


def attach_oracle(sharders, oracle) -> None:
    """Hand ``oracle`` to every planner (:meth:`Sharder.attach_oracle`; shardkit's refinement and
    calibration) before its workers start: each checks there what it needs (a cost model, cost data),
    so a missing one stops the command before anything is measured. On such an error the oracle is
    closed (it was never entered)."""
    try:
        for sharder in sharders:
            sharder.attach_oracle(oracle)
    except BaseException:
        oracle.__exit__(None, None, None)
        raise
