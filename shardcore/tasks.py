"""Sharding tasks and task files.

A task file is text, one task per line: ``3,17,250`` (DreamShard style: table ids into the
dataset) or ``3,17,250 64,16,128`` (NeuroShard style: ids, then one dim per table). Blank lines
and lines starting with ``#`` are skipped. The number of devices and the memory cap are not part
of the file: they come from the command line (``--gpu-devices``/``--ndevices``, ``--max-memory``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from shardcore import io
from shardcore.errors import ShardError
from shardcore.tables import TableConfig, dim_problem


@dataclass(frozen=True)
class Task:
    table_ids: tuple[int, ...]
    dims: tuple[int, ...] | None = None  # NeuroShard style: a dim per table overriding the dataset's

    def __post_init__(self):
        if self.dims is not None and len(self.dims) != len(self.table_ids):
            raise ShardError(f"task has {len(self.table_ids)} table ids but {len(self.dims)} dims")

    def __len__(self) -> int:
        return len(self.table_ids)

    def tables(self, dataset_tables: Sequence[TableConfig]) -> list[TableConfig]:
        """The task's tables (with the task's dims, if it has them), in task order."""
        n = len(dataset_tables)
        out = []
        for k, i in enumerate(self.table_ids):
            if not 0 <= i < n:
                raise ShardError(f"table id {i} out of range: the dataset has {n} tables (ids 0..{n - 1})")
            t = dataset_tables[i]
            out.append(t.with_dim(self.dims[k]) if self.dims is not None else t)
        return out

    def to_line(self) -> str:
        ids = ",".join(str(i) for i in self.table_ids)
        return ids if self.dims is None else ids + " " + ",".join(str(d) for d in self.dims)


def _int_list(text: str, what: str, where: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise ShardError(f"{where}: malformed task line: {what} must be comma-separated integers, got {text!r}") from None
    return values


def parse_task_line(line: str, where: str = "task") -> Task:
    parts = line.split()
    if len(parts) not in (1, 2):
        raise ShardError(f"{where}: malformed task line {line.strip()!r}: expected 'ids' or 'ids dims'")
    ids = _int_list(parts[0], "table ids", where)
    if any(i < 0 for i in ids):
        raise ShardError(f"{where}: negative table id in {parts[0]!r}")
    if len(set(ids)) != len(ids):
        raise ShardError(f"{where}: a table id appears twice in {parts[0]!r}")
    dims = None
    if len(parts) == 2:
        dims = _int_list(parts[1], "dims", where)
        if len(dims) != len(ids):
            raise ShardError(f"{where}: {len(ids)} table ids but {len(dims)} dims")
        if any(d <= 0 for d in dims):
            raise ShardError(f"{where}: dims must be positive, got {parts[1]!r}")
        problems = [dim_problem(d) for d in dims if dim_problem(d)]
        if problems:
            raise ShardError(f"{where}: {problems[0]}")
    return Task(ids, dims)


def parse_task_line_repeats(line: str, where: str = "task") -> Task:
    """Like :func:`parse_task_line`, and also NeuroShard's task lines whose ids repeat a table
    (its ``tools/gen_tasks.py`` draws ids with replacement): in an ``ids dims`` line a table id
    that appears twice is two tables, each with its own dim. DreamShard-style lines (ids only)
    must still name each table once."""
    parts = line.split()
    if len(parts) != 2:
        return parse_task_line(line, where)
    ids = _int_list(parts[0], "table ids", where)
    if len(set(ids)) == len(ids):
        return parse_task_line(line, where)
    # repeated ids: validate the other fields the same way, then keep every occurrence
    parse_task_line(",".join(str(k) for k in range(len(ids))) + " " + parts[1], where)
    if any(i < 0 for i in ids):
        raise ShardError(f"{where}: negative table id in {parts[0]!r}")
    return Task(ids, _int_list(parts[1], "dims", where))


def load_tasks(path: str | os.PathLike, num_tables: int | None = None) -> list[Task]:
    """Read a task file; with ``num_tables`` every table id is checked against the dataset."""
    path = Path(path)
    if not path.is_file():
        raise ShardError(f"task file not found: {path} (generate one with tools/gen_tasks.py)")
    tasks = []
    for lineno, line in enumerate(io.read_text(path, "task file").splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        where = f"{path}:{lineno}"
        task = parse_task_line_repeats(line, where)
        if num_tables is not None:
            bad = [i for i in task.table_ids if i >= num_tables]
            if bad:
                raise ShardError(f"{where}: table id {bad[0]} out of range: the dataset has {num_tables} tables")
        tasks.append(task)
    if not tasks:
        raise ShardError(f"{path}: no tasks in file")
    return tasks


def save_tasks(path: str | os.PathLike, tasks: Sequence[Task]) -> None:
    io.write_text(path, "".join(t.to_line() + "\n" for t in tasks))
