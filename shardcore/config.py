"""Hyper-parameters stated once: a method's config dataclass is the only place a hyper-parameter is
written (name, default, help text); its command-line flags are generated from it, and its checkpoint
form is :meth:`Config.to_dict` / :meth:`Config.from_dict`.

A field becomes a flag when it is declared with :func:`param` (plain fields stay internal)::

    @dataclass
    class MyConfig(Config):
        lr: float = param(1e-3, "learning rate (default %(default)s)", type=positive_float)
        hidden: int = 64   # no flag

    add_config_args(parser.add_argument_group("training"), MyConfig())   # --lr
    cfg = config_from_args(MyConfig, args)

``param`` keeps what argparse needs beyond the field: the flag spellings (by default ``--`` and the
field name with dashes; original repositories' underscore spellings are listed as aliases), the
``dest`` when a script's namespace used another name, the argparse ``type``, ``choices``,
``metavar``, ``action`` (``store_true``/``store_false`` for booleans) and a ``cli_default`` when the
flag's default is not the field's (e.g. ``None``: "not given, keep the config's value").
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import MISSING, asdict, dataclass, fields
from typing import Any, Callable, ClassVar, TypeVar

C = TypeVar("C", bound="Config")
_NO_CLI_DEFAULT = object()


def param(default: Any = MISSING, help: str = "", *, flags: tuple[str, ...] | None = None, dest: str | None = None,
          type: Callable[[str], Any] | None = None, choices: tuple | list | None = None, metavar: str | None = None,
          action: str | None = None, cli_default: Any = _NO_CLI_DEFAULT, default_factory: Any = MISSING,
          group: str = "") -> Any:
    """A config field that is also a command-line flag (see the module notes)."""
    if not help:
        raise ValueError("a flag needs its help text")
    meta = {"help": help, "flags": flags, "dest": dest, "type": type, "choices": choices, "metavar": metavar,
            "action": action, "cli_default": cli_default, "group": group}
    if default_factory is not MISSING:
        return dataclasses.field(default_factory=default_factory, metadata={"cli": meta})
    return dataclasses.field(default=default, metadata={"cli": meta})


def flag_fields(cls_or_cfg) -> list[dataclasses.Field]:
    """The fields of a config class that are flags, in declaration order."""
    return [f for f in fields(cls_or_cfg) if "cli" in f.metadata]


def _flags(f: dataclasses.Field, prefix: str, underscore_aliases: bool) -> list[str]:
    names = []
    for n in f.metadata["cli"]["flags"] or (f"--{f.name.replace('_', '-')}",):
        names.append(f"--{(prefix.replace('-', '_') if '_' in n else prefix)}{n[2:]}")
        if underscore_aliases:
            names.append(names[-1][:2] + names[-1][2:].replace("-", "_"))
    return list(dict.fromkeys(names))


def _dest(f: dataclasses.Field, prefix: str) -> str:
    return prefix.replace("-", "_") + (f.metadata["cli"]["dest"] or f.name)


def add_config_args(p: argparse.ArgumentParser | argparse._ArgumentGroup, defaults: "Config", prefix: str = "",
                    groups: dict[str, Any] | None = None, underscore_aliases: bool = False,
                    skip_groups: tuple[str, ...] = ()) -> None:
    """Add one flag per :func:`param` field of ``defaults`` to ``p``, with the values of ``defaults``
    as the flags' defaults (``{default}`` in a help text is replaced by that value).

    ``prefix`` (e.g. ``comm-``) goes before every flag and its ``dest`` (``comm_``) when a script
    configures two objects of one class; ``groups`` maps a field's ``group`` name to an argument group
    (fields of other groups go to ``p``); ``underscore_aliases`` also accepts every dashed flag
    spelled with underscores (``--head_hidden`` beside ``--head-hidden``), as the original scripts did;
    fields whose ``group`` is in ``skip_groups`` get no flag (a script where they do not apply)."""
    for f in flag_fields(defaults):
        meta = f.metadata["cli"]
        if meta["group"] and meta["group"] in skip_groups:
            continue
        kw: dict[str, Any] = {"dest": _dest(f, prefix),
                              "help": meta["help"].replace("{default}", str(getattr(defaults, f.name)))}
        default = getattr(defaults, f.name) if meta["cli_default"] is _NO_CLI_DEFAULT else meta["cli_default"]
        if meta["action"] in ("store_true", "store_false"):
            kw.update(action=meta["action"], default=default)
        else:
            kw.update(default=default, type=meta["type"] or _field_type(f))
            for key in ("choices", "metavar", "action"):
                if meta[key] is not None:
                    kw[key] = meta[key]
        target = (groups or {}).get(meta["group"], p)
        target.add_argument(*_flags(f, prefix, underscore_aliases), **kw)


def _field_type(f: dataclasses.Field) -> Callable[[str], Any]:
    t = f.type if not isinstance(f.type, str) else {"int": int, "float": float, "str": str}.get(f.type)
    if t not in (int, float, str):
        raise TypeError(f"config field {f.name}: give param(type=...) for a flag of type {f.type}")
    if t is float:   # never let nan or inf through a flag that did not say otherwise
        from shardcore.argtypes import finite_float

        return finite_float
    return t


def config_from_args(cls: type[C], args: argparse.Namespace, base: "Config | None" = None, prefix: str = "",
                     **overrides: Any) -> C:
    """``base`` (default: ``cls()``) with every flag field set from ``args``; a flag whose value is
    ``None`` (its ``cli_default``, i.e. not given) keeps the base's value; ``overrides`` win."""
    values = (base or cls()).to_dict()
    for f in flag_fields(cls):
        dest = _dest(f, prefix)
        if hasattr(args, dest) and getattr(args, dest) is not None:
            values[f.name] = getattr(args, dest)
    values.update(overrides)
    return cls(**values)


def given_args(cls: type["Config"], args: argparse.Namespace, prefix: str = "") -> dict:
    """``{field: value}`` of the flag fields given on the command line (value not ``None``); a
    ``store_false`` flag counts as given when it is ``False``."""
    out = {}
    for f in flag_fields(cls):
        v = getattr(args, _dest(f, prefix), None)
        if f.metadata["cli"]["action"] == "store_false":
            if v is False:
                out[f.name] = False
        elif f.metadata["cli"]["action"] == "store_true":
            if v:
                out[f.name] = True
        elif v is not None:
            out[f.name] = v
    return out


@dataclass
class Config:
    """Base of every method's config dataclass: the one (de)serialiser of configs, and where a planner's
    settings meet the command line (:meth:`add_args`, :meth:`from_args`: ``--<flag_prefix><field>``)."""

    #: what every flag of this config starts with (``shardkit-``: ``--shardkit-time``); empty for flags
    #: spelled as an original repository spelled them
    flag_prefix: ClassVar[str] = ""

    @classmethod
    def add_args(cls, group, skip_groups: tuple[str, ...] = ()) -> None:
        """This config's flags in ``group`` (fields of a group in ``skip_groups`` get none)."""
        add_config_args(group, cls(), prefix=cls.flag_prefix, skip_groups=skip_groups)

    @classmethod
    def from_args(cls: type[C], args: argparse.Namespace) -> C:
        """The config the flags of :meth:`add_args` give (a flag not given keeps the field's default)."""
        return config_from_args(cls, args, prefix=cls.flag_prefix)

    def to_dict(self) -> dict:
        """Plain values (what a checkpoint stores)."""
        return asdict(self)

    @classmethod
    def from_dict(cls: type[C], obj: dict) -> C:
        """The config a checkpoint stored. Keys this version does not know (a field since removed)
        are ignored, fields it does not hold take their defaults, so older checkpoints load."""
        from shardcore.errors import ShardError

        if not isinstance(obj, dict):
            raise ShardError(f"{cls.__name__}: expected an object, got {type(obj).__name__}")
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in obj.items() if k in names})
