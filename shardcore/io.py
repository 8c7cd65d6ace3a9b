"""Atomic output helpers: write to a temporary file beside the target, then rename.

A crash or Ctrl-C in the middle of a write never leaves a half-written file
under the final name.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import IO, Any, Iterator

import torch


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path in the target's directory; rename it onto ``path`` on success."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    os.chmod(tmp_path, 0o666 & ~_umask())  # mkstemp makes 0600; outputs get the usual permissions
    try:
        yield tmp_path
        os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w") -> Iterator[IO[Any]]:
    """Open a temporary file for writing; it replaces ``path`` when the block ends without error."""
    with atomic_path(path) as tmp:
        with open(tmp, mode) as fh:
            yield fh


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_open(path, "w") as fh:
        fh.write(text)


def write_json(path: str | os.PathLike, obj: Any, indent: int | None = 2) -> None:
    write_text(path, json.dumps(obj, indent=indent) + "\n")


def torch_save(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save`` through a temporary file. Store only tensors, numbers, strings, lists and dicts
    so that the file loads with ``torch.load(..., weights_only=True)``."""
    with atomic_path(path) as tmp:
        torch.save(obj, tmp)


TRAIN_COMMANDS = {"autoshard": "python train_autoshard.py (or run_autoshard.py)",
                  "dreamshard": "python train_dreamshard.py",
                  "neuroshard": "python train_neuroshard.py (or train_compute_cost_model.py and "
                                "train_comm_cost_model.py)"}


def train_hint(method: str | None) -> str:
    """``train one with python train_<method>.py``: the way forward from a checkpoint that cannot be used."""
    if method in TRAIN_COMMANDS:
        return f"train one with {TRAIN_COMMANDS[method]}"
    return "train one with python train_autoshard.py, train_dreamshard.py or train_neuroshard.py"


def load_checkpoint(path: str | os.PathLike, method: str | None = None, version: int | None = None,
                    label: str | None = None) -> dict:
    """A checkpoint dict read with ``weights_only=True`` (never unpickles code). A missing or unreadable
    file, another method's checkpoint (``method``) or another format version (``version``) raise
    :class:`~shardcore.errors.ShardError` with one line; ``label`` names the kind ("an AutoShard").
    A checkpoint of the original repositories' code (a bare ``state_dict``, AutoShard's ``model.tar``,
    or a pickle that needs code to load) is named as such, with the command that trains one here:
    their networks differ from these, so their weights cannot be loaded."""
    from .errors import ShardError

    if not os.path.isfile(path):
        raise ShardError(f"checkpoint not found: {path}")
    original = ("if it comes from the original AutoShard/DreamShard/NeuroShard code, it cannot be loaded here "
                f"(their networks differ): {train_hint(method)}")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        raise ShardError(f"{path}: cannot read checkpoint ({type(exc).__name__}: {first}); {original}") from None
    if not isinstance(obj, dict) or "method" not in obj:
        raise ShardError(f"{path}: not {label or 'a shardkit'} checkpoint (no 'method' entry); {original}")
    if method is not None and obj.get("method") != method:
        raise ShardError(f"{path}: not {label or 'a shardkit'} checkpoint (it is a {obj.get('method')} one); "
                         f"{train_hint(method)}")
    if version is not None and obj.get("version") != version:
        raise ShardError(f"{path}: checkpoint version {obj.get('version')} is not {version}")
    return obj
