"""What the core and the experiment runner know of the planners they do not hold: the learned methods
and the other planners the top level declares.

The core never names a method. The list of method packages comes from the top level
(``shardkit_methods.METHOD_PACKAGES``), or from the ``SHARDKIT_METHODS`` environment variable
(comma-separated package names) where it is set; each package declares itself in its ``method``
module as ``METHOD = MethodSpec(...)``: its name and label, how it is trained (script, arguments,
flags per experiment scale), where its checkpoint is, its planner's settings (a config class) and the
precision of its original code. A method module imports nothing heavy, so reading the registry costs no
torch import of a method. The planners that are not trained by a script (``shardkit_methods.PLANNERS``:
TorchRec's, ours) are :class:`PlannerSpec` s. :mod:`shardcore.cli.algorithms` makes one table of every
``--alg`` name from these and the core's baselines.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

from shardcore.errors import ShardError

METHODS_ENV = "SHARDKIT_METHODS"
TOP_LEVEL_LIST = "shardkit_methods"    # module with METHOD_PACKAGES and PLANNERS, at the repository's top level


@dataclass(frozen=True)
class PlannerSpec:
    """A planner the top level declares beside the learned methods (``shardkit_methods.PLANNERS``)."""

    factory: str                  # "module:function", called as function(ctx, config, checkpoint, planners)
    config: str | None = None     # "module:Class" of its settings, or the --alg name whose settings it shares
    baseline: bool = False        # a heuristic the reports compare the learned methods against (TorchRec's)


@dataclass(frozen=True)
class TrainContext:
    """What a training run is asked to do; a method turns it into its script's arguments."""

    task_path: Path                  # the training tasks
    data_dir: str                    # absolute dataset directory
    ndevices: int
    max_memory: float                # GB per device
    precision: str
    seed: int
    folder: Path                     # where the checkpoint must end up
    oracle_flags: tuple[str, ...] = ()   # the hardware oracle's flags as eval.py spells them
    device_counts: tuple[int, ...] = ()  # every device count the model will plan for (default: ndevices)

    @property
    def plan_device_counts(self) -> tuple[int, ...]:
        """The device counts the model will plan for, ``ndevices`` among them, ascending."""
        return tuple(sorted({self.ndevices, *self.device_counts}))

    @property
    def gpu_devices(self) -> str:
        return ",".join(str(d) for d in range(self.ndevices))

    def oracle_flags_renaming_batch(self, batch_flag: str) -> list[str]:
        """The oracle flags with ``--batch-size`` renamed, for a script where it means something else."""
        return [batch_flag if f == "--batch-size" else f for f in self.oracle_flags]


@dataclass(frozen=True)
class MethodSpec:
    """One learned method as its package declares it."""

    name: str                        # package name = ``--alg`` name = a checkpoint's "method" entry
    label: str                       # as the papers write it
    train_script: Path               # absolute path of its training script
    train_hint: str                  # the command that trains one ("python train_x.py (or ...)")
    default_precision: str           # weight precision of the original code
    train_args: Callable[[TrainContext], list[str]]   # the script's arguments for a training run
    checkpoint: str | None = None    # file the script leaves in its folder; None: the newest numbered N.pt
    selected: str | None = None      # a file the script also leaves there, to evaluate where present (best.pt)
    final_checkpoint: Callable[[Sequence[str]], int] | None = None   # numbered: the last index, given the flags
    scale_flags: Mapping[str, tuple[str, ...]] = field(default_factory=dict)   # experiment scale -> flags
    needs_train_tasks: bool = True   # False: it trains on data it draws itself (no task file needed)
    # True: its training tasks are drawn from every table of the dataset (the test tasks' included), as its
    # original draws them, not from the training pool of the train/test split
    every_table_tasks: bool = False
    flag_spellings: tuple[str, ...] = ()   # flags of the original code the shared CLI also accepts
    planner_config: str | None = None      # "module:Class" of the --alg planner's settings (its flags), if any
    model_help: str = ""             # appended to the runner's --<name>-model help
    task_seed_note: str = ""         # a note when the runner's task seed differs from 0 and it trained
    seen_note: str = ""              # a note whenever it trained: what of the test tasks its training saw
    # why a finished checkpoint does not fit a run that plans for these device counts (it is trained
    # again), or None: e.g. cost models fitted on exchanges of fewer device counts than the run plans for
    stale: Callable[[Path, Sequence[int]], str | None] | None = None

    def find_checkpoint(self, folder: str | os.PathLike) -> Path | None:
        """The checkpoint the training script leaves in ``folder``, or None."""
        folder = Path(folder)
        if self.checkpoint is None:
            ckpts = numbered_checkpoints(folder)
            return ckpts[-1][1] if ckpts else None
        p = folder / self.checkpoint
        return p if p.is_file() else None

    def is_final(self, checkpoint: Path, flags: Sequence[str]) -> bool:
        """Whether ``checkpoint`` is the last one a training with ``flags`` writes."""
        if self.checkpoint is not None or self.final_checkpoint is None:
            return True
        return int(checkpoint.stem) >= self.final_checkpoint(flags)


def numbered_checkpoints(folder: Path) -> list[tuple[int, Path]]:
    """``N.pt`` files of ``folder``, by N."""
    if not folder.is_dir():
        return []
    return sorted((int(p.stem), p) for p in folder.glob("*.pt") if p.stem.isdigit())


def flag_value(flags: Sequence[str], name: str, default: str | None = None) -> str | None:
    """The last value given to ``name`` in ``flags`` (``--x 3`` or ``--x=3``), else ``default``."""
    value = default
    for i, f in enumerate(flags):
        if f == name and i + 1 < len(flags):
            value = flags[i + 1]
        elif f.startswith(name + "="):
            value = f.split("=", 1)[1]
    return value


def method_names() -> tuple[str, ...]:
    """The method packages this installation lists (importable or not), in the papers' order."""
    env = os.environ.get(METHODS_ENV)
    if env is not None:
        return tuple(n.strip() for n in env.split(",") if n.strip())
    try:
        listing = importlib.import_module(TOP_LEVEL_LIST)
    except ModuleNotFoundError:
        return ()
    return tuple(getattr(listing, "METHOD_PACKAGES", ()))


def declared_planners() -> dict[str, PlannerSpec]:
    """``{--alg name: PlannerSpec}`` of the planners the top-level list declares beside the learned
    methods (``PLANNERS``); empty where there is no list. Their modules are imported only when asked for."""
    try:
        listing = importlib.import_module(TOP_LEVEL_LIST)
    except ModuleNotFoundError:
        return {}
    out = {}
    for name, decl in dict(getattr(listing, "PLANNERS", {})).items():
        try:
            out[str(name)] = PlannerSpec(**decl)
        except TypeError:
            raise ShardError(f"{TOP_LEVEL_LIST}.PLANNERS[{name!r}] must give factory='module:function' and "
                             "optionally config and baseline") from None
    return out


def baseline_planners() -> tuple[str, ...]:
    """The declared planners the reports count among the baselines (TorchRec's)."""
    return tuple(n for n, p in declared_planners().items() if p.baseline)


def get(name: str) -> MethodSpec:
    """The spec a listed method package declares; one-line :class:`ShardError` otherwise."""
    names = method_names()
    if name not in names:
        raise ShardError(f"unknown method {name!r} (known: {', '.join(names) or 'none'})")
    try:
        module = importlib.import_module(f"{name}.method")
    except ModuleNotFoundError as exc:
        raise ShardError(f"the {name} method is not available in this installation ({exc.msg})") from None
    spec = getattr(module, "METHOD", None)
    if not isinstance(spec, MethodSpec) or spec.name != name:
        raise ShardError(f"{name}.method does not declare METHOD = MethodSpec(name={name!r}, ...)")
    return spec


def available() -> dict[str, MethodSpec]:
    """The listed methods whose package is importable, by name."""
    out = {}
    for name in method_names():
        try:
            out[name] = get(name)
        except ShardError:
            continue
    return out


def label(name: str) -> str:
    spec = available().get(name)
    return spec.label if spec is not None else name


def _possessives(labels: Sequence[str]) -> str:
    return " and ".join(f"{lab}'s" for lab in labels)


def precision_origin(precision: str) -> str:
    """``as X's and Y's original code``: the methods whose original code counts weights in ``precision``."""
    labels = [s.label for s in available().values() if s.default_precision == precision]
    return f"as {_possessives(labels)} original code" if labels else ""


def spelling_owner(flag: str) -> str:
    """Whose original code spells a flag this way (``X's``), or ``the original code's``."""
    labels = [s.label for s in available().values() if flag in s.flag_spellings]
    return _possessives(labels) if labels else "the original code's"


def train_hint(name: str | None) -> str:
    """``train one with ...``: the way forward from a checkpoint that cannot be used."""
    specs = available()
    if name in specs:
        return f"train one with {specs[name].train_hint}"
    scripts = [s.train_script.name for s in specs.values()]
    if not scripts:
        return "train one with a method's training script"
    listed = scripts[0] if len(scripts) == 1 else ", ".join(scripts[:-1]) + " or " + scripts[-1]
    return f"train one with python {listed}"


def originals_text() -> str:
    """``A/B/C``: the labels of every listed method (the original repositories' code)."""
    return "/".join(s.label for s in available().values()) or "original"
