"""The registry of planners: every ``--alg`` name -> how its :class:`~shardcore.types.Sharder` is built,
its settings and whether it plans with a trained model.

One table (:func:`planners`), made from the core's baselines, the planners the top level declares
(``shardkit_methods.PLANNERS``: TorchRec's, ours) and the learned methods (``shardkit_methods.METHOD_PACKAGES``,
each package's ``method.METHOD``); the core names none of them. Every planner is built the same way
(:func:`build`): ``factory(ctx, config, checkpoint, planners)`` with the one
:class:`~shardcore.planning.PlanningContext` of the run (topology, batch, landscape, seed), its own
:class:`~shardcore.config.Config` (its flags, bound by :func:`add_planner_args` and
:func:`planner_configs`; another planner's flags never reach it), the checkpoint an ``--alg`` path names
(a trained model: the checkpoint's ``method`` entry picks the method; the name is checked against the
registry before anything of a package is imported) and ``planners(name)``, which builds another planner in
the same context (a planner that starts from another's plan).
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from shardcore import registry
from shardcore.baselines import BASELINES, make_baseline
from shardcore.config import Config
from shardcore.errors import ShardError
from shardcore.io import load_checkpoint
from shardcore.planning import PlanningContext
from shardcore.types import Sharder

Factory = Callable[..., Sharder]   # factory(ctx, config, checkpoint, planners) -> Sharder


@dataclass(frozen=True)
class PlannerEntry:
    """One ``--alg`` name of the registry."""

    name: str
    factory: str | Factory               # "module:function" (imported when the planner is built) or the function
    config: str | None = None            # "module:Class" of its settings, or the name of the planner it shares them with
    trained: bool = False                # plans with a trained model (a checkpoint path names it too)
    baseline: bool = False               # a heuristic the reports compare the learned methods against

    @property
    def settings_of(self) -> str:
        """The planner whose settings (and flags) this one uses: itself, or the one its config names."""
        return self.config if self.config and ":" not in self.config else self.name


def _baseline_factory(name: str) -> Factory:
    def make(ctx: PlanningContext, config: Config | None, checkpoint: Path | None, planners=None) -> Sharder:
        return make_baseline(name, seed=ctx.seed)
    return make


def planners() -> dict[str, PlannerEntry]:
    """Every planner this installation lists, by ``--alg`` name: the baselines, the declared planners, the
    learned methods (listed whether or not their package is importable; building one that is not says so)."""
    out = {n: PlannerEntry(n, _baseline_factory(n), baseline=True) for n in BASELINES}
    for name, spec in registry.declared_planners().items():
        out[name] = PlannerEntry(name, spec.factory, spec.config, baseline=spec.baseline)
    for name in registry.method_names():
        config = None
        try:
            config = registry.get(name).planner_config
        except ShardError:   # not importable here: building it says why
            pass
        out[name] = PlannerEntry(name, f"{name}.sharder:make_sharder", config, trained=True)
    return out


def _import(target: str, what: str) -> Any:
    module, _, attr = target.partition(":")
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        raise ShardError(f"--alg {what}: its package is not available in this installation ({exc.msg})") from None
    return getattr(mod, attr)


def config_class(name: str, table: Mapping[str, PlannerEntry] | None = None) -> type[Config] | None:
    """The settings class of planner ``name`` (through the planner it shares them with), None if it has none
    or its package is not importable."""
    table = planners() if table is None else table
    owner = table[table[name].settings_of]
    if not owner.config:
        return None
    try:
        return _import(owner.config, owner.name)
    except (ShardError, ImportError):
        return None


def _settings_owners(table: Mapping[str, PlannerEntry]) -> dict[str, type[Config]]:
    out = {}
    for name, e in table.items():
        if e.settings_of == name and e.config:
            cls = config_class(name, table)
            if cls is not None:
                out[name] = cls
    return out


def add_planner_args(parser, measuring: bool = True, groups: dict | None = None) -> None:
    """One argument group per planner with settings (``groups[name]`` where the script made one already):
    the flags of its config (:meth:`~shardcore.config.Config.add_args`; fields of group ``measuring`` only
    where ``measuring``: a script that measures plans)."""
    for name, cls in _settings_owners(planners()).items():
        group = (groups or {}).get(name) or parser.add_argument_group(f"{name} (--alg {name})")
        cls.add_args(group, skip_groups=() if measuring else ("measuring",))


def planner_configs(args) -> dict[str, Config]:
    """Each planner's settings from its own flags (:func:`add_planner_args`), by the name that owns them."""
    return {name: cls.from_args(args) for name, cls in _settings_owners(planners()).items()}


def configs_from_dicts(values: Mapping[str, Mapping]) -> dict[str, Config]:
    """Settings stored as plain values (``{name: config.to_dict()}``, an experiment's config) as configs."""
    owners = _settings_owners(planners())
    return {name: owners[name].from_dict(dict(v)) for name, v in values.items() if name in owners}


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


def lookup(name: str) -> tuple[PlannerEntry, Path | None]:
    """The registry's entry for an ``--alg`` value and the checkpoint it names (None: a planner's name)."""
    table = planners()
    path = Path(name)
    if name.endswith(".pt") or path.is_file() or os.sep in name:   # a path: a checkpoint, or nothing
        if not path.is_file():
            raise ShardError(f"checkpoint {'is a directory' if path.is_dir() else 'not found'}: {path}")
        return table[checkpoint_method(path)], path
    if name not in table:
        raise ShardError(f"unknown algorithm {name!r}: choose from {', '.join(table)}, "
                         "or give a trained model's checkpoint (.pt)")
    return table[name], None


def build(name: str, ctx: PlanningContext, configs: Mapping[str, Config] | None = None) -> Sharder:
    """The planner ``name`` (an ``--alg`` value: a name or a checkpoint) for ``ctx``, with its own settings
    from ``configs`` (:func:`planner_configs`; a planner not there gets its config's defaults)."""
    entry, checkpoint = lookup(name)
    configs = dict(configs or {})
    config = configs.get(entry.settings_of)
    if config is None and entry.config:
        cls = config_class(entry.name)
        config = cls() if cls is not None else None
    factory = _import(entry.factory, entry.name) if isinstance(entry.factory, str) else entry.factory
    return factory(ctx, config, checkpoint, lambda other: build(other, ctx, configs))


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
