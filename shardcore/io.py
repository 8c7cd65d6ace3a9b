"""Outputs and inputs: the one rule every output obeys (:func:`check_outputs`), atomic writes (a temporary
file beside the target, then renamed: never a half-written file under the final name), strict reads
(text, JSON, torch files with ``weights_only=True``) and checkpoints."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import warnings
from pathlib import Path
from typing import IO, Any, Iterator

from shardcore.errors import ShardError


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path in the target's directory; rename it onto ``path`` on success."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path, mask = Path(tmp), os.umask(0)
    os.umask(mask)
    os.chmod(tmp_path, 0o666 & ~mask)  # mkstemp makes 0600; outputs get the usual permissions
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
    import torch
    with atomic_path(path) as tmp:
        torch.save(obj, tmp)


def save_checkpoint(obj: Any, path: str | os.PathLike) -> None:
    """A model checkpoint through :func:`torch_save`, refused (one line, nothing written) when a weight
    or a statistic in it is NaN or infinite: a diverged network never replaces a good file."""
    check_finite(obj, f"{path}: not saved", "training diverged; lower the learning rate")
    torch_save(obj, path)


def read_maybe_gzipped(path: str | os.PathLike) -> bytes:
    """A file's bytes, decompressed when it is gzip (``eval.py --out`` records shipped as ``.jsonl.gz``).
    Raises ``OSError`` (a bad gzip stream included) as ``open`` does."""
    import gzip
    import zlib

    with open(path, "rb") as fh:
        data = fh.read()
    if data[:2] != b"\x1f\x8b":
        return data
    try:
        return gzip.decompress(data)
    except (EOFError, zlib.error) as exc:
        raise gzip.BadGzipFile(f"a truncated or corrupt gzip stream ({exc})") from None


def read_text(path: str | os.PathLike, what: str = "file") -> str:
    """A text file's contents as UTF-8 (a leading byte-order mark is dropped). An unreadable file or
    one that is not UTF-8 text raises :class:`~shardcore.errors.ShardError` with one line."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except IsADirectoryError:
        raise ShardError(f"{path}: is a directory, expected a {what}") from None
    except OSError as exc:
        raise ShardError(f"{path}: cannot read {what} ({exc.strerror or exc})") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ShardError(f"{path}: not UTF-8 text (byte 0x{data[exc.start]:02x} at line {line}); "
                         f"expected a {what}") from None


def parse_json(text: str, where) -> Any:
    """JSON text whose objects name each key once (``{"row": 1, "row": 2}`` would keep the last without a
    word); a malformed text or a repeated key is one line naming ``where``."""
    def unique(pairs):
        if len({k for k, _ in pairs}) < len(pairs):
            raise ShardError(f"{where}: key {next(k for k, _ in pairs if sum(j == k for j, _ in pairs) > 1)!r} "
                             "appears twice in one object; keep one")
        return dict(pairs)
    try:
        return json.loads(text, object_pairs_hook=unique)
    except json.JSONDecodeError as exc:
        raise ShardError(f"{where}: malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None


def _same_file(a: Path, b: Path) -> bool:   # links resolved; hard links by inode
    try:
        return a.resolve() == b.resolve() or (a.exists() and b.exists() and os.path.samefile(a, b))
    except OSError:
        return False


def check_outputs(outputs: dict, inputs: dict | None = None, *, dirs=(), replaced=()) -> None:
    """The one rule every command that writes checks before any work (one line each, nothing created):
    each output (``outputs``: flag -> path, None where not given; ``dirs``: the flags naming directories)
    can be written there (its folder, or the nearest one that exists, is a writable directory); none is a
    device, pipe or socket (``/dev/full``); none names or links to an input (``inputs``: flag -> path;
    links and ``..`` resolved, hard links by inode) or another output; no input lies inside a directory
    the command replaces as a whole (``replaced``: output flags)."""
    outs = [(f, Path(p)) for f, p in outputs.items() if p is not None]
    ins = [(f, Path(p)) for f, p in (inputs or {}).items() if p not in (None, "")]
    for i, (flag, path) in enumerate(outs):
        if str(outputs[flag]) == "" or (path.name in ("", ".", "..") and flag not in dirs):
            raise ShardError(f"{flag} {str(outputs[flag])!r}: not a {'directory' if flag in dirs else 'file'} name")
        base = path if path.is_dir() else path.absolute().parent
        while not base.exists() and base != base.parent:
            base = base.parent
        exists, is_dir = path.exists(), path.is_dir()
        problems = ((exists and not (is_dir or path.is_file()), "is a device, pipe or socket, not a regular file: "
                     "never written over"),   # an output is a regular file renamed into place
                    (exists and is_dir and flag not in dirs, "is a directory, expected a file name"),
                    (exists and not is_dir and flag in dirs, "is a file, not a directory"),
                    (not base.is_dir(), f"{base} is a file, not a directory"),
                    (not os.access(base, os.W_OK | os.X_OK, effective_ids=os.access in os.supports_effective_ids),
                     f"directory {base} is not writable"))
        why = next((w for bad, w in problems if bad), None)
        if why:
            raise ShardError(f"{flag} {path}: {why}")
        for other, ipath in ins + outs[i + 1:]:
            if other == flag:   # a file both read and written (a cache): one flag, one role
                continue
            inside = flag in replaced and ipath.resolve().is_relative_to(path.resolve())
            if _same_file(path, ipath) or inside:
                role = "input" if (other, ipath) in ins else "output"
                raise ShardError(f"{flag} {path} {'holds' if inside else 'is also'} the {role} {other} {ipath}: the "
                                 f"output would replace it; choose another {flag}")


def first_line(text: object, limit: int = 300) -> str:
    """The first non-empty line of a message, shortened to ``limit`` characters."""
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    line = lines[0] if lines else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


@contextlib.contextmanager
def checkpoint_contents(path: str | os.PathLike) -> Iterator[None]:
    """Build a model from a checkpoint's entries: a missing entry, a wrong type or a tensor whose shape
    does not fit the architecture becomes one line ``<path>: broken checkpoint (...)``."""
    try:
        yield
    except ShardError as exc:
        if str(path) in str(exc):
            raise
        raise ShardError(f"{path}: broken checkpoint ({exc})") from None
    except KeyError as exc:
        raise ShardError(f"{path}: broken checkpoint (no {exc.args[0]!r} entry)") from None
    except (TypeError, ValueError, RuntimeError, AttributeError, IndexError, OverflowError) as exc:
        what = "weights do not match its config" if "state_dict" in str(exc) else first_line(exc)
        raise ShardError(f"{path}: broken checkpoint ({what})") from None


def safe_torch_load(path: str | os.PathLike, what: str = "file", name: str | None = None, **kwargs) -> Any:
    """``torch.load(path, weights_only=True)``; a file that needs more than plain tensors, numbers,
    strings, lists and dicts is refused as unsafe, other read failures give one line as well."""
    import torch
    import pickle

    kwargs.setdefault("map_location", "cpu")
    label = name or str(path)
    try:
        with warnings.catch_warnings():   # e.g. torch's note on the pickle protocol: not one line
            warnings.simplefilter("ignore")
            return torch.load(path, weights_only=True, **kwargs)
    except pickle.UnpicklingError as exc:
        text = str(exc)
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        detail = next((ln for ln in lines if "Unsupported" in ln or "GLOBAL" in ln), first_line(text))
        if "GLOBAL" in text:   # it names code to import or call: never loaded
            raise ShardError(f"{label}: refused as unsafe: the {what} holds pickled Python objects other than "
                             "tensors and plain data, which shardkit never loads") from None
        raise ShardError(f"{label}: cannot read {what}: not a readable torch file ({first_line(detail, 120)})") from None
    except Exception as exc:  # a truncated or foreign file
        raise ShardError(f"{label}: cannot read {what}: not a readable torch file "
                         f"({type(exc).__name__}: {first_line(exc, 200)})") from None


def load_checkpoint(path: str | os.PathLike, method: str | None = None, version: int | None = None,
                    label: str | None = None) -> dict:
    """A checkpoint dict read with ``weights_only=True`` (never unpickles code). A missing or unreadable
    file, another method's (``method``) or format version's (``version``) is one line; ``label`` names the
    kind ("an AutoShard"). One of the original repositories' code (a bare ``state_dict``, ``model.tar``, a
    pickle needing code) is named so, with the command that trains one here (their networks differ)."""
    from shardcore import registry

    train_hint = registry.train_hint
    if not os.path.isfile(path):
        raise ShardError(f"checkpoint not found: {path}")
    original = (f"if it comes from the original {registry.originals_text()} code, it cannot be loaded here "
                f"(their networks differ): {train_hint(method)}")
    try:
        obj = safe_torch_load(path, "checkpoint")
    except ShardError as exc:   # unreadable, or refused as unsafe: one line, with the way forward
        raise ShardError(f"{exc}; {original}") from None
    if not isinstance(obj, dict) or "method" not in obj:
        raise ShardError(f"{path}: not {label or 'a shardkit'} checkpoint (no 'method' entry); {original}")
    if method is not None and obj.get("method") != method:
        raise ShardError(f"{path}: not {label or 'a shardkit'} checkpoint (it is a {obj.get('method')} one); "
                         f"{train_hint(method)}")
    if version is not None and obj.get("version") != version:
        raise ShardError(f"{path}: checkpoint version {obj.get('version')} is not {version}")
    check_finite(obj, f"{path}: broken checkpoint", f"{train_hint(obj.get('method') or method)}")
    return obj


def nonfinite_entry(obj: Any, where: str = "") -> str | None:
    """The first place in a checkpoint-like tree (dicts, lists, tensors, numbers) that holds a NaN or
    an infinity, as a path like ``model.lstm.weight``; None when every number is finite."""
    import torch
    import math

    if isinstance(obj, torch.Tensor):
        exact = not (obj.is_floating_point() or obj.is_complex())
        return None if exact or bool(torch.isfinite(obj).all()) else (where or "tensor")
    if isinstance(obj, float):
        return None if math.isfinite(obj) else (where or "value")
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, (list, tuple)) else ()
    for k, v in items:
        bad = nonfinite_entry(v, f"{where}.{k}" if where else str(k))
        if bad is not None:
            return bad
    return None


def check_finite(obj: Any, label: str, hint: str = "") -> None:
    """Refuse (one line, ``label: non-finite values in <entry>``) weights, scalers or statistics that
    hold a NaN or an infinity: every checkpoint loader and saver calls it, so a diverged network is
    neither written nor used."""
    bad = nonfinite_entry(obj)
    if bad is not None:
        raise ShardError(f"{label} (non-finite values in {bad})" + (f"; {hint}" if hint else ""))
