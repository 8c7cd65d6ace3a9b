"""Plan files: a plan in plain JSON and in the form TorchRec loads, written for one task or many,
and read back into TorchRec's ``ShardingPlan`` (reading needs TorchRec installed, writing does not).

:func:`plan_json` gives the plain form
(``{"tables": [{"name", "index", "rows", "dim", "pooling_factor", "device"}, ...], "ndevices",
"max_memory_gb", "memory_gb": [...]}``), :func:`torchrec_plan_json` a form that
:func:`load_torchrec_plan` / :func:`sharding_plan_from_json` turn back into TorchRec's
``ShardingPlan`` (one ``ParameterSharding`` per table: table-wise, ``fused``, ``ranks=[r]``, one
shard ``[0, 0] + [rows, dim]`` placed on ``rank:r/cuda:r``, or ``rank:r/cpu``; a table that a plan
splits column-wise (NeuroShard, :attr:`Plan.splits`, or uneven blocks) is ``column_wise`` with one
shard of ``[rows, dim_j]`` per column block, on the ranks its blocks were given; a row-wise table is
``row_wise`` over all ranks or ``table_row_wise`` over a subset, shard ``j`` ``[j x block, 0] +
[rows_j, dim]`` on its ``j``-th rank (trailing empty blocks included, as TorchRec writes them); a
grid table is ``grid_shard``, column block ``c`` (at column offset ``o_c``, dim ``w_c``) row-wise over
one whole host's ranks in rank order, shard ``(c, j)`` ``[j x block, o_c] + [rows_j, w_c]``; a
data-parallel table is ``data_parallel`` on the ``dense`` kernel with every rank and no sharding
spec). :func:`torchrec_problem` says why TorchRec cannot apply a sharding (a row-wise table over
neither every rank nor one host's, a grid block that is not one host's ranks). JSON rather than a
pickle, so loading a plan never executes code. :func:`export_plan` writes both files for one task;
:func:`export_plans` writes a directory for many (task, algorithm) records.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from shardcore import io
from shardcore.errors import ShardError
from shardcore.plan import COLUMN_WISE, GRID, ROW_WISE, TABLE_WISE, Plan, Sharding, row_blocks
from shardcore.tables import TableConfig
from shardcore.interop.torchrec_lib import require_torchrec as _torchrec

TORCHREC_FORMAT = "shardcore-torchrec-plan-v1"
PLAN_FORMAT = "shardcore-plan-v1"


def default_names(tables: Sequence[TableConfig]) -> list[str]:
    """``table_<dataset index>``; a table that a task uses more than once (NeuroShard's task files
    draw ids with replacement) is named ``table_<index>_<k>`` at its k-th repeat, so names stay unique."""
    seen: dict[int, int] = {}
    names = []
    for t in tables:
        k = seen.get(t.index, 0)
        seen[t.index] = k + 1
        names.append(f"table_{t.index}" if k == 0 else f"table_{t.index}_{k}")
    return names


def _check_names(tables: Sequence[TableConfig], names: Sequence[str] | None) -> list[str]:
    names = default_names(tables) if names is None else [str(n) for n in names]
    if len(names) != len(tables):
        raise ShardError(f"{len(names)} table names for {len(tables)} tables")
    seen: dict[str, int] = {}
    for pos, n in enumerate(names):
        if not n:
            raise ShardError(f"table at position {pos} has an empty name")
        if n in seen:
            raise ShardError(f"duplicate table name {n!r} (positions {seen[n]} and {pos})")
        seen[n] = pos
    return names


def column_shards(plan: Plan) -> list[list[tuple[int, int, int]]]:
    """Per task table, its column shards as ``(rank, dim offset, dim)``: one shard covering the whole
    table when the plan does not split it, ``k`` shards of ``dim / k`` (in column order, on the ranks
    the plan's allocation gives the expanded table list) when ``plan.splits`` cuts it into ``k``."""
    out = []
    for t, s in zip(plan.tables, plan.shardings):
        if s.type == TABLE_WISE:
            out.append([(int(s.devices[0]), 0, t.dim)])
        elif s.type == COLUMN_WISE:
            offs = [sum(s.dims[:j]) for j in range(len(s.dims))]
            out.append([(int(d), o, int(w)) for d, o, w in zip(s.devices, offs, s.dims)])
        else:
            raise ShardError(f"table {t.index} is {s.type}: it has no column shards")
    return out


def torchrec_problem(s: Sharding, world: int, local_world_size: int | None = None) -> str | None:
    """Why TorchRec cannot apply sharding ``s`` over ``world`` ranks in hosts of ``local_world_size``
    (None: unknown, a grid's hosts then its blocks' size), or None when it can: its ``row_wise`` spans
    every rank in rank order, ``table_row_wise`` and each ``grid_shard`` column block one whole host's
    ranks in rank order (its process groups cut the ranks into hosts of ``LOCAL_WORLD_SIZE``)."""
    if s.type not in (ROW_WISE, GRID) or (s.type == ROW_WISE and list(s.devices) == list(range(world))):
        return None
    k = len(s.devices) // len(s.dims or (1,))
    local = int(local_world_size or (k if s.type == GRID else 0))
    if s.type == ROW_WISE and not local:
        return None    # hosts unknown: table_row_wise, as the caller said

    def one_host(devs) -> bool:
        first = devs[0] // local * local
        return not world % local and list(devs) == list(range(first, first + local))

    if s.type == ROW_WISE:
        return None if one_host(s.devices) else (
            f"row-wise over ranks {list(s.devices)}: TorchRec's row_wise spans all {world} ranks in rank order "
            f"and its table_row_wise one whole host's ranks in order " +
            (f"(hosts of {local} ranks)" if local < world else "(the plan has one host)"))
    if k != local or world % local:
        return (f"grid blocks of {k} ranks: TorchRec's grid_shard puts each column block on one whole host "
                f"({local} of the {world} ranks)")
    bad = next((s.devices[j:j + k] for j in range(0, len(s.devices), k) if not one_host(s.devices[j:j + k])), None)
    return None if bad is None else (f"grid block on ranks {list(bad)}: TorchRec's grid_shard puts each column "
                                     f"block on one whole host's ranks in rank order (hosts of {local} ranks)")


def _torchrec_shards(t: TableConfig, s: Sharding, world: int) -> tuple[str, str, list[int], list[dict]]:
    """TorchRec's ``(sharding_type, compute_kernel, ranks, shards)`` of one table's sharding."""
    if s.type == TABLE_WISE:
        return "table_wise", "fused", [int(s.devices[0])], [
            {"offsets": [0, 0], "sizes": [t.row, t.dim], "rank": int(s.devices[0])}]
    if s.type == COLUMN_WISE:
        shards, off = [], 0
        for d, w in zip(s.devices, s.dims):
            shards.append({"offsets": [0, off], "sizes": [t.row, int(w)], "rank": int(d)})
            off += int(w)
        return "column_wise", "fused", [int(d) for d in s.devices], shards
    if s.type == ROW_WISE:
        kind = "row_wise" if list(s.devices) == list(range(world)) else "table_row_wise"
        shards, off = [], 0
        for d, rows in zip(s.devices, row_blocks(t.row, len(s.devices))):
            shards.append({"offsets": [off, 0], "sizes": [rows, t.dim], "rank": int(d)})
            off += rows
        return kind, "fused", [int(d) for d in s.devices], shards
    if s.type == GRID:
        shards, col, k = [], 0, len(s.devices) // len(s.dims)
        for j, w in enumerate(s.dims):
            off = 0
            for d, rows in zip(s.devices[j * k:(j + 1) * k], row_blocks(t.row, k)):
                shards.append({"offsets": [off, col], "sizes": [rows, int(w)], "rank": int(d)})
                off += rows
            col += int(w)
        return "grid_shard", "fused", [int(d) for d in s.devices], shards
    return "data_parallel", "dense", list(range(world)), []


def plan_json(plan: Plan, names: Sequence[str] | None = None, device_ids: Sequence[int] | None = None,
              **meta: Any) -> dict:
    """The plain form: ``{"tables": [{"name", "index", "rows", "dim", "pooling_factor", "device"}],
    "ndevices", "max_memory_gb", "memory_gb": [...], ...}``. ``device`` is the rank (0..N-1);
    ``device_ids`` (optional) names the physical device of each rank; ``meta`` (e.g. ``alg``,
    ``task``) is added as top-level keys. A table the plan splits column-wise has ``"device": null``
    and ``"column_shards": [{"device", "dim_offset", "dim"}, ...]`` (its ``k`` shards in column order)."""
    tables, shardings = plan.tables, plan.shardings
    names = _check_names(tables, names)
    if device_ids is not None and len(device_ids) != plan.ndevices:
        raise ShardError(f"{len(device_ids)} device ids for a plan over {plan.ndevices} devices")
    out: dict[str, Any] = {"format": PLAN_FORMAT}
    out.update(meta)
    rows = []
    for n, t, s in zip(names, tables, shardings):
        row = {"name": n, "index": t.index, "rows": t.row, "dim": t.dim, "pooling_factor": t.pooling_factor,
               "device": int(s.devices[0]) if s.type == TABLE_WISE else None, "sharding": s.to_json(t)}
        if s.type == COLUMN_WISE:
            offs = [sum(s.dims[:j]) for j in range(len(s.dims))]
            row["column_shards"] = [{"device": int(r), "dim_offset": o, "dim": int(d)}
                                    for r, o, d in zip(s.devices, offs, s.dims)]
        rows.append(row)
    out["tables"] = rows
    out["ndevices"] = plan.ndevices
    if device_ids is not None:
        out["device_ids"] = [int(x) for x in device_ids]
    out["max_memory_gb"] = plan.topology.max_memory_gb
    out["precision"] = plan.topology.precision
    out["memory_gb"] = [round(m, 6) for m in plan.device_memory_gb()]
    out["feasible"] = plan.feasible
    return out


def torchrec_plan_json(plan: Plan, names: Sequence[str] | None = None, module_path: str = "",
                       compute_kernel: str = "fused",
                       local_world_size: int | None = None) -> dict:
    """The TorchRec form: per table (by name) a ``ParameterSharding``: table-wise on one rank;
    column-wise with the ranks of its column blocks (shard ``j`` at ``[0, offset_j]`` of
    ``[rows, dim_j]``); row-wise (all ranks) or table-row-wise (a subset) with shard ``j`` at
    ``[j x block, 0]`` of ``[rows_j, dim]``; grid as ``grid_shard`` (shard ``(c, j)`` at
    ``[j x block, offset_c]`` of ``[rows_j, dim_c]``); data-parallel on the ``dense`` kernel, every
    rank, no shards. ``module_path`` is where the ``EmbeddingBagCollection`` sits in the user's model
    ("" when the model is the collection itself, e.g. ``"sparse_arch.embedding_bag_collection"``).
    A sharding TorchRec cannot apply (:func:`torchrec_problem`; with ``local_world_size``, the
    devices per host, recorded in the file) is a :class:`ShardError`."""
    names = _check_names(plan.tables, names)
    rows = []
    for n, t, s in zip(names, plan.tables, plan.shardings):
        why = torchrec_problem(s, plan.ndevices, local_world_size)
        if why:
            raise ShardError(f"table {n!r} cannot be written for TorchRec: {why}")
        kind, kernel, ranks, shards = _torchrec_shards(t, s, plan.ndevices)
        rows.append({"name": n, "sharding_type": kind,
                     "compute_kernel": kernel if kind == "data_parallel" else compute_kernel,
                     "ranks": ranks, "rows": t.row, "dim": t.dim, "shards": shards})
    return {
        "format": TORCHREC_FORMAT,
        "world_size": plan.ndevices,
        **({"local_world_size": int(local_world_size)} if local_world_size else {}),
        "module_path": module_path,
        "data_type": plan.topology.precision,
        "tables": rows,
    }


def torchrec_path_for(path: str | os.PathLike) -> Path:
    """``plan.json`` -> ``plan.torchrec.json`` (where ``plan.py --torchrec`` writes the TorchRec form)."""
    path = Path(path)
    stem = path.name[:-5] if path.name.endswith(".json") else path.name
    return path.with_name(stem + ".torchrec.json")


def export_plan(out_dir: str | os.PathLike, stem: str, plan: Plan, names: Sequence[str] | None = None,
                module_path: str = "", local_world_size: int | None = None, **meta: Any) -> tuple[Path, Path]:
    """Write ``out_dir/<stem>.json`` (plain form) and ``out_dir/<stem>.torchrec.json`` (TorchRec
    form, ``local_world_size`` as :func:`torchrec_plan_json`), each atomically; returns both paths."""
    out_dir = Path(out_dir)
    plain = out_dir / f"{stem}.json"
    trec = out_dir / f"{stem}.torchrec.json"
    trec_obj = torchrec_plan_json(plan, names, module_path, local_world_size=local_world_size)
    io.write_json(plain, plan_json(plan, names, **meta))
    io.write_json(trec, trec_obj)
    return plain, trec


@dataclass
class PlanRecord:
    """One planned task for :func:`export_plans`: the task's id, the algorithm, the plan (None: the
    algorithm found none) and optionally the tables' names (default ``table_<index>``)."""

    task: int
    alg: str
    plan: Plan | None
    names: Sequence[str] | None = None


def alg_slug(alg: str) -> str:
    """A directory name for an ``--alg`` value (which may be a checkpoint path)."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", alg).strip("._") or "alg"
    return slug


def export_plans(out_dir: str | os.PathLike, records: Iterable[PlanRecord | tuple],
                 max_memory_gb: float, precision: str = "fp16", module_path: str = "") -> list[Path]:
    """Write every record's plan in both forms: ``out_dir/<alg>/task_<k>.json`` and
    ``out_dir/<alg>/task_<k>.torchrec.json`` (``<alg>`` made safe as a directory name, ``k`` the task
    id zero-padded to 4 digits), plus ``out_dir/index.json`` listing them. ``records`` holds
    :class:`PlanRecord` or ``(task, alg, plan[, names])`` tuples; a record whose plan is
    ``None`` (the algorithm found none) writes no files and is listed with ``"plan": null``; one that
    TorchRec cannot apply (a grid block that is not one host, :func:`torchrec_problem`) writes its
    plain form only and is listed with ``"torchrec": null`` and the ``"torchrec_problem"``.
    Returns the paths written (the index last)."""
    out_dir = Path(out_dir)
    slugs: dict[str, str] = {}
    written: list[Path] = []
    index = []
    for rec in records:
        if not isinstance(rec, PlanRecord):
            rec = PlanRecord(*rec)
        slug = slugs.setdefault(rec.alg, alg_slug(rec.alg))
        clash = [a for a, s in slugs.items() if s == slug and a != rec.alg]
        if clash:
            raise ShardError(f"algorithms {clash[0]!r} and {rec.alg!r} would share the export directory {slug!r}")
        if rec.plan is None:
            index.append({"task": int(rec.task), "alg": rec.alg, "plan": None, "torchrec": None})
            continue
        stem = f"task_{int(rec.task):04d}"
        why = next((f"table {n!r}: {w}" for n, s in zip(_check_names(rec.plan.tables, rec.names),
                                                       rec.plan.shardings)
                    if (w := torchrec_problem(s, rec.plan.ndevices))), None)
        if why:   # the plain form only; the index says why TorchRec cannot apply it
            plain = out_dir / slug / f"{stem}.json"
            io.write_json(plain, plan_json(rec.plan, rec.names,
                                           alg=rec.alg, task=int(rec.task)))
            written.append(plain)
            index.append({"task": int(rec.task), "alg": rec.alg, "plan": str(plain.relative_to(out_dir)),
                          "torchrec": None, "torchrec_problem": why})
            continue
        plain, trec = export_plan(out_dir / slug, stem, rec.plan, rec.names, module_path, alg=rec.alg,
                                  task=int(rec.task))
        written += [plain, trec]
        index.append({"task": int(rec.task), "alg": rec.alg, "plan": str(plain.relative_to(out_dir)),
                      "torchrec": str(trec.relative_to(out_dir))})
    index_path = out_dir / "index.json"
    io.write_json(index_path, {"format": "shardcore-plan-index-v1", "max_memory_gb": max_memory_gb,
                               "precision": precision, "plans": index})
    written.append(index_path)
    return written


# --------------------------------------------------------------------------------------------
# Back into TorchRec (needs TorchRec)
# --------------------------------------------------------------------------------------------

def _read_json(path_or_obj: str | os.PathLike | Mapping) -> dict:
    if isinstance(path_or_obj, Mapping):
        return dict(path_or_obj)
    path = Path(path_or_obj)
    if not path.is_file():
        raise ShardError(f"plan not found: {path}")
    try:
        return json.loads(io.read_text(path, "plan (JSON)"))
    except json.JSONDecodeError as exc:
        raise ShardError(f"{path}: malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None


TORCHREC_TYPES = ("table_wise", "column_wise", "table_column_wise", "row_wise", "table_row_wise", "grid_shard",
                  "data_parallel")
# the kernels TorchRec's EmbeddingBagCollectionSharder applies to a table without further configuration
# (key_value and the virtual tables need their own parameters; data-parallel has the dense kernel only)
SHARD_KERNELS = ("fused", "fused_uvm", "fused_uvm_caching")
REPLICA_KERNELS = ("dense",)
DEVICE_TYPES = ("cpu", "cuda")


def _count(value, what: str, where: str, minimum: int = 0) -> int:
    """A whole number >= ``minimum`` from a plan file (one line naming it otherwise)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ShardError(f"{where}: {what} must be a whole number, got {value!r}")
    if value < minimum:
        raise ShardError(f"{where}: {what} must be >= {minimum}, got {value}")
    return int(value)


def _pair(value, what: str, where: str) -> tuple[int, int]:
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise ShardError(f"{where}: {what} must be [row, column], got {value!r}")
    return _count(value[0], what, where), _count(value[1], what, where)


def _one_host(ranks: Sequence[int], local: int, world: int) -> bool:
    """Whether ``ranks`` are one whole host's ranks in rank order (hosts of ``local`` ranks)."""
    first = ranks[0] // local * local if ranks else 0
    return not world % local and list(ranks) == list(range(first, first + local))


def _check_table(t: Mapping, world: int, local: int | None, where: str) -> None:
    """One table of a TorchRec plan file: its fields, its shards tiling the table exactly, its ranks, and
    the shape TorchRec's sharding type needs (see :func:`validate_torchrec_plan`)."""
    rows, dim = _count(t["rows"], "rows", where, 1), _count(t["dim"], "dim", where, 1)
    kind, kernel = t["sharding_type"], t["compute_kernel"]
    if kind not in TORCHREC_TYPES:
        raise ShardError(f"{where}: unknown sharding type {kind!r} (TorchRec's: {', '.join(TORCHREC_TYPES)})")
    allowed = REPLICA_KERNELS if kind == "data_parallel" else SHARD_KERNELS
    if kernel not in allowed:
        raise ShardError(f"{where}: compute kernel {kernel!r} cannot run {kind} (choose {', '.join(allowed)})")
    if not isinstance(t["ranks"], list):
        raise ShardError(f"{where}: ranks must be a list, got {t['ranks']!r}")
    ranks = [_count(r, "a rank", where) for r in t["ranks"]]
    bad = next((r for r in ranks if r >= world), None)
    if bad is not None:
        raise ShardError(f"{where}: rank {bad} in a plan for {world} ranks")
    shards = t.get("shards") or []
    if kind == "data_parallel":
        if shards:
            raise ShardError(f"{where}: a data_parallel table has no shards (a replica on every rank), got {len(shards)}")
        if sorted(ranks) != list(range(world)):
            raise ShardError(f"{where}: a data_parallel table is on every rank once (0..{world - 1}), got {ranks}")
        return
    if not isinstance(shards, list) or not shards:
        raise ShardError(f"{where}: a {kind} table needs its shards (a list of offsets, sizes and rank)")
    box = []
    for j, sh in enumerate(shards):
        at = f"{where}: shard {j}"
        if not isinstance(sh, Mapping) or any(k not in sh for k in ("offsets", "sizes", "rank")):
            raise ShardError(f"{at} must have offsets, sizes and rank, got {sh!r}")
        (r0, c0), (nr, nc) = _pair(sh["offsets"], "offsets", at), _pair(sh["sizes"], "sizes", at)
        rank = _count(sh["rank"], "rank", at)
        if rank >= world:
            raise ShardError(f"{at}: rank {rank} in a plan for {world} ranks")
        if r0 + nr > rows or c0 + nc > dim:
            raise ShardError(f"{at}: [{r0}, {c0}] + [{nr}, {nc}] reaches outside the {rows} x {dim} table")
        box.append((r0, c0, nr, nc, rank))
    placed = [b[4] for b in box]
    if ranks != placed:
        raise ShardError(f"{where}: ranks {ranks} do not match its shards' placements {placed}")
    full = [b for b in box if b[2] and b[3]]
    for i, a in enumerate(full):
        for b in full[i + 1:]:
            if a[0] < b[0] + b[2] and b[0] < a[0] + a[2] and a[1] < b[1] + b[3] and b[1] < a[1] + a[3]:
                raise ShardError(f"{where}: shards at [{a[0]}, {a[1]}] and [{b[0]}, {b[1]}] overlap")
    covered = sum(b[2] * b[3] for b in full)
    if covered != rows * dim:
        raise ShardError(f"{where}: its shards cover {covered} of its {rows} x {dim} = {rows * dim} weights (a gap)")
    if kind == "table_wise":
        if len(box) != 1:
            raise ShardError(f"{where}: a table_wise table is one shard on one rank, got {len(box)} shards")
        return
    if kind in ("column_wise", "table_column_wise"):
        if any(b[0] != 0 or b[2] != rows for b in box) or [b[1] for b in box] != sorted(b[1] for b in box):
            raise ShardError(f"{where}: {kind} shards are full-height column blocks in column order")
        if kind == "table_column_wise" and local and len({r // local for r in placed}) > 1:
            raise ShardError(f"{where}: table_column_wise blocks are on one host's ranks (hosts of {local}), got {placed}")
        return
    if kind == "grid_shard":
        cols: dict[int, list] = {}
        for b in box:
            cols.setdefault(b[1], []).append(b)
        groups = [cols[c] for c in sorted(cols)]
        k = len(groups[0])
        host = int(local or k)
        for g in groups:
            if len(g) != k or len({b[3] for b in g}) != 1 or [b[2] for b in g] != row_blocks(rows, k) \
                    or [b[0] for b in g] != [sum(row_blocks(rows, k)[:j]) for j in range(k)] \
                    or k != host or not _one_host([b[4] for b in g], host, world):
                raise ShardError(f"{where}: each grid_shard column block is row-wise over one whole host's ranks in "
                                 f"rank order (hosts of {host}), in row blocks of ceil({rows} / {host}) rows")
        return
    k = world if kind == "row_wise" else len(box)
    starts = [sum(row_blocks(rows, k)[:j]) for j in range(k)]
    if any(b[1] != 0 or b[3] != dim for b in box) or len(box) != k or [b[2] for b in box] != row_blocks(rows, k) \
            or [b[0] for b in box] != starts:
        raise ShardError(f"{where}: {kind} shards are full-width row blocks of ceil({rows} / {k}) rows in order "
                         f"(as TorchRec cuts them), got sizes {[b[2] for b in box]}")
    if kind == "row_wise" and placed != list(range(world)):
        raise ShardError(f"{where}: TorchRec's row_wise puts block j on rank j, got ranks {placed}")
    if kind == "table_row_wise":
        if len(set(placed)) != len(placed):
            raise ShardError(f"{where}: a table_row_wise table has one block per rank, got ranks {placed}")
        if local and not _one_host(placed, local, world):
            raise ShardError(f"{where}: table_row_wise spans one whole host's ranks in rank order (hosts of {local}), "
                             f"got {placed}")


def validate_torchrec_plan(obj: Any, world_size: int | None = None,
                           local_world_size: int | None = None) -> tuple[int, int | None]:
    """Check a TorchRec plan file's dict completely, before any rank sees it: its format and keys, the world
    size (the file's; ``world_size``, where given, must equal it), the hosts (``local_world_size``, else the
    file's; a whole number of ranks per host), and every table: a unique non-empty name, rows and a dim
    (FBGEMM's multiple of 4), a sharding type and a kernel TorchRec's collection sharder applies to it, ranks
    inside the world that match its shards' placements, and shards that tile the table exactly (no gap, no
    overlap, no negative offset, nothing outside it) in the shape the type needs (table-wise: one shard;
    column-wise: full-height blocks in column order, table-column-wise on one host; row-wise: ``ceil(rows /
    world)``-row blocks, block j on rank j; table-row-wise: one host's ranks in order where the hosts are
    known; grid: each column block row-wise over one host; data-parallel: no shards, every rank). Returns
    ``(world, ranks per host or None when unknown)``; every problem is a one-line :class:`ShardError`."""
    from shardcore.tables import dim_problem

    if not isinstance(obj, Mapping):
        raise ShardError(f"a TorchRec plan is a JSON object, got {type(obj).__name__}")
    if obj.get("format") != TORCHREC_FORMAT:
        raise ShardError(f"not a shardcore TorchRec plan (format {obj.get('format')!r}, expected {TORCHREC_FORMAT!r})")
    missing = [k for k in ("world_size", "tables") if k not in obj]
    if missing:
        raise ShardError(f"the plan has no {missing[0]!r} (a TorchRec plan written by plan.py --torchrec has "
                         "format, world_size, module_path, data_type and tables)")
    world = _count(obj["world_size"], "world_size", "plan", 1)
    if world_size is not None and _count(world_size, "world_size", "load_torchrec_plan", 1) != world:
        raise ShardError(f"the plan is for {world} ranks, not the {world_size} given")
    local = local_world_size if local_world_size is not None else obj.get("local_world_size")
    if local is not None:
        local = _count(local, "local_world_size", "plan", 1)
        if world % local:
            raise ShardError(f"the plan's {world} ranks do not split into hosts of {local} (local_world_size)")
    if not isinstance(obj.get("module_path", ""), str):
        raise ShardError(f"the plan's module_path must be a string, got {obj['module_path']!r}")
    if obj.get("data_type", "fp16") not in ("fp16", "fp32"):
        raise ShardError(f"the plan's data_type must be fp16 or fp32, got {obj['data_type']!r}")
    tables = obj["tables"]
    if not isinstance(tables, list) or not tables:
        raise ShardError("the plan's tables must be a non-empty list")
    seen: set = set()
    for pos, t in enumerate(tables):
        if not isinstance(t, Mapping):
            raise ShardError(f"plan table {pos} must be an object, got {t!r}")
        name = t.get("name")
        if not isinstance(name, str) or not name:
            raise ShardError(f"plan table {pos} has no name")
        where = f"plan table {name!r}"
        if name in seen:
            raise ShardError(f"{where} appears twice")
        seen.add(name)
        absent = [k for k in ("sharding_type", "compute_kernel", "ranks", "rows", "dim") if k not in t]
        if absent:
            raise ShardError(f"{where} has no {absent[0]!r}")
        _check_table(t, world, local, where)
        why = dim_problem(int(t["dim"]))
        if why:
            raise ShardError(f"{where}: {why}")
    return world, local


def sharding_plan_from_json(obj: Mapping, device_type: str = "cuda", module_path: str | None = None,
                            module=None, local_world_size: int | None = None, world_size: int | None = None):
    """TorchRec's ``ShardingPlan`` from :func:`torchrec_plan_json`'s dict, checked first by
    :func:`validate_torchrec_plan` (``world_size``: the ranks it will run on, default the initialised
    process group's where there is one).

    ``device_type``: where the shards live (``"cuda"``: ``rank:r/cuda:<r mod local_world_size>``;
    ``"cpu"``: ``rank:r/cpu``; ``local_world_size`` defaults to the file's, else the world size).
    ``module_path`` overrides the file's. With ``module`` (the
    ``EmbeddingBagCollection`` to shard) every table is checked to exist there with the same rows
    and dim."""
    if device_type not in DEVICE_TYPES:
        raise ShardError(f"device_type must be one of {', '.join(DEVICE_TYPES)}, got {device_type!r}")
    if module_path is not None and not isinstance(module_path, str):
        raise ShardError(f"module_path must be a string, got {module_path!r}")
    if module is not None and not callable(getattr(module, "embedding_bag_configs", None)):
        raise ShardError(f"module must be the EmbeddingBagCollection the plan shards, got {type(module).__name__}")
    _torchrec()
    import torch.distributed as dist
    from torch.distributed._shard.sharding_spec import EnumerableShardingSpec, ShardMetadata
    from torchrec.distributed.types import EmbeddingModuleShardingPlan, ParameterSharding, ShardingPlan

    if world_size is None and dist.is_available() and dist.is_initialized():
        world_size = dist.get_world_size()
    world, local = validate_torchrec_plan(obj, world_size, local_world_size)
    local = int(local or world)
    if device_type == "cpu":
        # FBGEMM's CPU kernels cannot run a shard of no rows (a row-wise table with fewer rows than ranks):
        # "weights[0] must be a GPU or MTIA tensor" on its rank, or a failing backward where it shares a
        # kernel with other tables; refused here rather than on every rank
        for t in obj["tables"]:
            empty = next((s["rank"] for s in t.get("shards") or [] if 0 in s["sizes"]), None)
            if empty is not None:
                raise ShardError(f"plan table {t['name']!r}: its {t['sharding_type']} block on rank {empty} is empty "
                                 f"({t['rows']} rows over more ranks), which FBGEMM's CPU kernels cannot run: on CPU "
                                 "ranks give it another sharding")
    if module is not None:
        shapes = {c.name: (c.num_embeddings, c.embedding_dim) for c in module.embedding_bag_configs()}
        unplanned = sorted(set(shapes) - {t["name"] for t in obj["tables"]})
        if unplanned:
            raise ShardError(f"the module's table {unplanned[0]!r} is not in the plan"
                             + (f" ({len(unplanned)} such tables)" if len(unplanned) > 1 else "")
                             + f" (the plan's tables: {sorted(t['name'] for t in obj['tables'])})")
        for t in obj["tables"]:
            if t["name"] not in shapes:
                raise ShardError(f"the plan's table {t['name']!r} is not in the module (tables: {sorted(shapes)})")
            if shapes[t["name"]] != (t["rows"], t["dim"]):
                raise ShardError(f"table {t['name']!r}: the plan has {t['rows']} x {t['dim']}, "
                                 f"the module {shapes[t['name']][0]} x {shapes[t['name']][1]}")

    def placement(rank: int) -> str:
        return f"rank:{rank}/cpu" if device_type == "cpu" else f"rank:{rank}/{device_type}:{rank % local}"

    params = {}
    for t in obj["tables"]:
        if t["sharding_type"] == "data_parallel":   # a replica everywhere: no sharding spec
            params[t["name"]] = ParameterSharding(sharding_type="data_parallel", compute_kernel=t["compute_kernel"],
                                                  ranks=[int(r) for r in t["ranks"]], sharding_spec=None)
            continue
        spec = EnumerableShardingSpec([
            ShardMetadata(shard_offsets=list(s["offsets"]), shard_sizes=list(s["sizes"]),
                          placement=placement(int(s["rank"])))
            for s in t["shards"]])
        params[t["name"]] = ParameterSharding(sharding_type=t["sharding_type"], compute_kernel=t["compute_kernel"],
                                              ranks=[int(r) for r in t["ranks"]], sharding_spec=spec)
    path = obj.get("module_path", "") if module_path is None else module_path
    return ShardingPlan({path: EmbeddingModuleShardingPlan(params)})


def load_torchrec_plan(path: str | os.PathLike, device_type: str = "cuda", module_path: str | None = None,
                       module=None, local_world_size: int | None = None, world_size: int | None = None):
    """Read a ``*.torchrec.json`` and return TorchRec's ``ShardingPlan`` (for
    ``DistributedModelParallel(model, plan=...)``), the file checked completely first
    (:func:`validate_torchrec_plan`); see :func:`sharding_plan_from_json`."""
    return sharding_plan_from_json(_read_json(path), device_type=device_type, module_path=module_path,
                                   module=module, local_world_size=local_world_size, world_size=world_size)
