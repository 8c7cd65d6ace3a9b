"""A user's own tables (``plan.py --tables``): a CSV or a ``table_configs.json``, and the batch it states.

CSV: columns ``name, rows, dim, pooling_factor`` (``row`` is accepted for ``rows``), optionally
``bin_0 .. bin_16`` (the access-reuse histogram) and ``length_cv`` (the CV of a sample's lookup count,
which the emulated GPU prices); a comment line ``# batch_size: B`` states the batch
the statistics were taken at. JSON: ``{"tables": [{"row", "dim", "pooling_factor", ...}], "batch_size": B}``
(or a bare list); an entry may carry a ``name`` (default ``table_<index>``) and use ``rows`` for ``row``,
and a missing ``index`` is its position. Both go through :meth:`shardcore.tables.TableConfig.from_json`,
the one validation of a table; every bad cell is a one-line :class:`~shardcore.errors.ShardError` that
names the file, line (or entry) and table.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path

from shardcore.errors import ShardError
from shardcore.io import parse_json, read_text
from shardcore.tables import BIN_NAMES, TableConfig, _number

REQUIRED_COLUMNS = ("name", "rows", "dim", "pooling_factor")
WHAT = "CSV or JSON tables file"


def _check_duplicates(names, wheres) -> None:
    seen = {}
    for n, w in zip(names, wheres):
        if n in seen:
            raise ShardError(f"{w}: duplicate table name {n!r} (first at {seen[n]})")
        seen[n] = w


def _cell(text, what: str, where: str, integer: bool = False):
    s = "" if text is None else str(text).strip()
    if s == "":
        raise ShardError(f"{where}: empty {what}")
    return _number(s, what, where, integer=integer)


def read_tables_csv(path: Path) -> tuple[list[TableConfig], list[str]]:
    """``name, rows, dim, pooling_factor[, bin_0 .. bin_16][, length_cv]`` -> (tables, names)."""
    text = read_text(path, WHAT)
    if not text.strip():
        raise ShardError(f"{path}: empty file (expected a header: {', '.join(REQUIRED_COLUMNS)})")
    reader = csv.DictReader([line for line in text.splitlines() if not line.lstrip().startswith("#")])
    header = [h.strip() for h in (reader.fieldnames or [])]
    reader.fieldnames = header
    cols: dict = {}
    for h in header:   # two columns of one meaning (name twice, row and rows): which one counts would be a guess
        key = {"row": "rows"}.get(h, h)
        if key in cols and h:
            raise ShardError(f"{path}: the header names column {key!r} twice ({cols[key]!r} and {h!r}); keep one")
        cols[key] = h
    missing = [c for c in REQUIRED_COLUMNS if c not in cols]
    if missing:
        raise ShardError(f"{path}: missing column(s) {', '.join(missing)} (header: {', '.join(header)}; "
                         f"required: {', '.join(REQUIRED_COLUMNS)})")
    tables, names, wheres = [], [], []
    for lineno, row in enumerate(reader, start=2):
        if all((v is None or str(v).strip() == "") for v in row.values()):
            continue
        where = f"{path}:{lineno}"
        if None in row:  # more cells than header columns
            raise ShardError(f"{where}: {len(header) + len(row[None])} values for {len(header)} columns")
        name = (row[cols["name"]] or "").strip()
        if not name:
            raise ShardError(f"{where}: empty table name")
        named = f"{where} (table {name!r})"
        entry = {"index": len(tables), "row": _cell(row[cols["rows"]], "rows", named, integer=True),
                 "dim": _cell(row[cols["dim"]], "dim", named, integer=True),
                 "pooling_factor": _cell(row[cols["pooling_factor"]], "pooling_factor", named)}
        for b in BIN_NAMES + ("length_cv",):
            if b in cols and str(row[cols[b]] or "").strip():
                entry[b] = _cell(row[cols[b]], b, named)
        tables.append(TableConfig.from_json(entry, where=named))
        names.append(name)
        wheres.append(where)
    if not tables:
        raise ShardError(f"{path}: no tables (only a header)")
    _check_duplicates(names, wheres)
    return tables, names


def read_tables_json(path: Path) -> tuple[list[TableConfig], list[str]]:
    """A table_configs.json (or a bare list of tables) -> (tables, names)."""
    text = read_text(path, WHAT)
    if not text.strip():
        raise ShardError(f"{path}: empty file (expected {{\"tables\": [...]}})")
    obj = parse_json(text, path)
    entries = obj.get("tables") if isinstance(obj, dict) else obj
    if not isinstance(entries, list):
        raise ShardError(f'{path}: expected an object with a "tables" list')
    if not entries:
        raise ShardError(f"{path}: no tables")
    tables, names, wheres = [], [], []
    for k, entry in enumerate(entries):
        where = f"{path}: tables[{k}]"
        if not isinstance(entry, dict):
            raise ShardError(f"{where}: expected an object, got {type(entry).__name__}")
        entry = dict(entry)
        if "row" in entry and "rows" in entry:
            raise ShardError(f"{where}: gives both 'row' and 'rows'; keep one")
        if "row" not in entry and "rows" in entry:
            entry["row"] = entry["rows"]
        entry.setdefault("index", k)
        table = TableConfig.from_json(entry, where=where)
        tables.append(table)
        names.append(str(entry.get("name", f"table_{table.index}")))
        wheres.append(where)
    _check_duplicates(names, wheres)
    return tables, names


def read_tables(path: str | os.PathLike) -> tuple[list[TableConfig], list[str]]:
    """The tables of a CSV or JSON tables file and their names."""
    path = Path(path)
    if not path.is_file():
        raise ShardError(f"tables file {'is a directory' if path.is_dir() else 'not found'}: {path}")
    return read_tables_json(path) if path.suffix.lower() == ".json" else read_tables_csv(path)


def read_batch_size(path: str | os.PathLike) -> int | None:
    """The batch the tables' statistics were taken at, as the tables file states it: a JSON's top-level
    ``batch_size``, or a CSV line ``# batch_size: B``; None when the file does not say."""
    path = Path(path)
    text = read_text(path, WHAT)
    if path.suffix.lower() == ".json":
        obj = parse_json(text, path)
        value = obj.get("batch_size") if isinstance(obj, dict) else None
        if value is None:
            return None
        where = f"{path}: batch_size"
    else:
        value = None
        for lineno, line in enumerate(text.splitlines(), start=1):
            body = line.strip().lstrip("#").strip() if line.lstrip().startswith("#") else ""
            key, sep, rest = body.replace("=", ":").partition(":")
            if sep and key.strip().lower() in ("batch_size", "batch size", "batch"):
                if value is not None:   # two statements: which batch the statistics hold for would be a guess
                    raise ShardError(f"{path}:{lineno}: a second batch_size line (the first: {where}); keep one")
                value, where = rest.strip(), f"{path}:{lineno}: batch_size"
        if value is None:
            return None
    batch = _cell(value, "batch_size", where, integer=True)
    if batch < 1:
        raise ShardError(f"{where} must be a positive integer, got {value!r}")
    return batch
