"""Persistent cache of hardware measurements (SQLite).

Measuring a shard or a plan costs real time, so every measurement is stored and reused: a shard is
never benchmarked twice for the same setting, and a plan already measured comes back at once.
Later stages read the stored entries back as training data (NeuroShard's compute-cost data,
DreamShard's buffer of measured plans) through :meth:`CostCache.shard_entries` and
:meth:`CostCache.plan_entries`.

**Setting** (:class:`CacheContext`): what a measurement depends on besides the shard itself, namely

- ``hardware``: a fingerprint of the device and the software that ran the kernels (device name,
  torch and fbgemm-gpu versions, compute threads per device), see :func:`hardware_fingerprint`;
- ``dataset``: a content digest of the dataset directory (:func:`dataset_digest`), because the
  lookup data decide the cost;
- ``batch_size``, ``optimizer`` (e.g. ``exact_sgd``) and weights ``precision`` (``fp16``/``fp32``).

**Entries.** Two tables:

- ``shard_costs``: one shard's compute cost (forward and backward, the backward including the
  sparse optimizer update), keyed by the setting plus the shard's contents: the multiset of
  ``(dataset table index, rows, dim)`` triples, sorted, so the order of tables in a shard does not
  matter.
- ``plan_costs``: a whole plan, keyed by the setting plus the ordered list of shards (device order
  matters: device ``d`` receives the ``d``-th slice of the batch) and the cost convention it was
  measured under (:data:`PLAN_CONVENTION`), holding per device the four costs ``[forward compute,
  forward communication, backward communication, backward compute]`` in ms and the plan cost (max
  over devices of their sum). A plan stored under an older convention is neither answered nor
  listed by :meth:`CostCache.plan_entries` (a shard's compute is the same under both and stays).

**The layer.** :class:`CachedOracle` puts the cache around any oracle (the measured evaluator, an
emulated GPU): it answers stored plans itself, hands the oracle the stored compute of known shards,
and stores what the oracle measured. The oracles know nothing of it.

The primary key of each row is the SHA-256 of a canonical JSON of the setting and contents; the
components are stored in their own columns as well, for queries.

**Concurrency.** Several processes (training actors, evaluation scripts) may share one file: the
database runs in WAL mode with a busy timeout, every write is one short autocommitted statement, and
each process opens its own connection (a connection is never carried across ``fork``).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from shardcore.errors import ShardError
from shardcore.plan import has_pieces
from shardcore.tables import TableConfig
from shardcore.types import CacheContext, CommLayout, ComputeCost, DeviceCost, OracleInfo, PlanResult, device_costs

DEFAULT_CACHE_PATH = "data/cost_cache.sqlite"
SCHEMA_VERSION = 1
# What a stored plan's exchange costs include, part of its key: "exchange-2" = the input ids of every
# model-parallel table travel (forward) and a data-parallel replica runs its own kernel over its batch
# slice (shardcore.oracles.commmodel, shardcore.plan.device_kernels). Plans keyed "plan" (before it) priced
# only the row-wise tables' ids.
PLAN_CONVENTION = "exchange-2"
_PLAN_KIND = f"plan:{PLAN_CONVENTION}"

# The shard key: sorted (dataset table index, rows, dim) triples.
ShardKey = tuple[tuple[int, int, int], ...]


def shard_key(tables: Iterable[TableConfig | Sequence[int]]) -> ShardKey:
    """A shard's contents as sorted ``(index, row, dim)`` triples (the order of tables is irrelevant)."""
    out = []
    for t in tables:
        if isinstance(t, TableConfig):
            out.append((int(t.index), int(t.row), int(t.dim)))
        else:
            index, row, dim = t
            out.append((int(index), int(row), int(dim)))
    return tuple(sorted(out))


def _digest(kind: str, ctx: CacheContext, contents) -> str:
    text = json.dumps([kind, ctx.as_list(), contents], separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class ShardEntry:
    """One stored shard measurement."""

    tables: ShardKey            # sorted (dataset table index, rows, dim)
    fw_ms: float                # forward compute
    bw_ms: float                # backward compute (with the sparse optimizer update)
    hardware: str
    dataset: str
    batch_size: int
    optimizer: str
    precision: str
    created: float

    @property
    def total_ms(self) -> float:
        return self.fw_ms + self.bw_ms


@dataclass(frozen=True)
class PlanEntry:
    """One stored plan measurement."""

    shards: tuple[ShardKey, ...]             # per device, sorted (index, row, dim)
    device_costs_ms: tuple[DeviceCost, ...]  # per device: fw comp, fw comm, bw comm, bw comp
    cost_ms: float                           # max over devices of the sum
    hardware: str
    dataset: str
    batch_size: int
    optimizer: str
    precision: str
    created: float

    @property
    def ndevices(self) -> int:
        return len(self.shards)


_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS shard_costs (
    key TEXT PRIMARY KEY,
    hardware TEXT NOT NULL, dataset TEXT NOT NULL, batch_size INTEGER NOT NULL,
    optimizer TEXT NOT NULL, precision TEXT NOT NULL,
    shard TEXT NOT NULL,           -- JSON [[index, row, dim], ...] sorted
    num_tables INTEGER NOT NULL,
    fw_ms REAL NOT NULL, bw_ms REAL NOT NULL,
    bench_iters INTEGER, warmup_iters INTEGER,
    created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS plan_costs (
    key TEXT PRIMARY KEY,
    hardware TEXT NOT NULL, dataset TEXT NOT NULL, batch_size INTEGER NOT NULL,
    optimizer TEXT NOT NULL, precision TEXT NOT NULL,
    ndevices INTEGER NOT NULL,
    shards TEXT NOT NULL,          -- JSON per device [[index, row, dim], ...] sorted
    device_costs TEXT NOT NULL,    -- JSON per device [fw_comp, fw_comm, bw_comm, bw_comp] in ms
    cost_ms REAL NOT NULL,
    bench_iters INTEGER, warmup_iters INTEGER,
    created REAL NOT NULL);
CREATE INDEX IF NOT EXISTS shard_costs_setting ON shard_costs (hardware, dataset, batch_size, optimizer, precision);
CREATE INDEX IF NOT EXISTS plan_costs_setting ON plan_costs (hardware, dataset, batch_size, optimizer, precision);
"""


class CostCache:
    """The measurement cache in one SQLite file (created on first use).

    Safe to share between processes; an instance opens one connection per process and thread.
    """

    def __init__(self, path: str | os.PathLike = DEFAULT_CACHE_PATH, busy_timeout_s: float = 60.0):
        self.path = Path(path)
        self.busy_timeout_s = float(busy_timeout_s)
        self._local = threading.local()

    # -- connection -------------------------------------------------------------------------
    def _path_problem(self) -> str | None:
        """Why the cache file cannot be opened for writing (a directory in its place, a read-only file
        or directory), in words; None when nothing is wrong that way."""
        p = self.path
        if p.is_dir():
            return "is a directory, not a cache file"
        base = p.parent
        while not base.exists() and base != base.parent:
            base = base.parent
        if not base.is_dir():
            return f"{base} is a file, not a directory"
        if p.exists():
            if not os.access(p, os.R_OK | os.W_OK):
                return "the file is read-only (or unreadable)"
            if not os.access(p.parent, os.W_OK | os.X_OK):
                return f"its directory {p.parent} is read-only (SQLite writes its journal beside it)"
        elif not os.access(base, os.W_OK | os.X_OK):
            return f"directory {base} is read-only"
        return None

    def check_usable(self) -> None:
        """Open (or create) the cache now: an unusable ``--cache-path`` is found before any worker starts."""
        self._conn()

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is not None and getattr(self._local, "pid", None) == os.getpid():
            return conn
        problem = self._path_problem()
        if problem:
            raise ShardError(f"cost cache {self.path}: {problem}; choose another --cache-path (or --no-cache)")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(str(self.path), timeout=self.busy_timeout_s, isolation_level=None)
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_s * 1000)}")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise ShardError(f"cost cache {self.path}: cannot switch to WAL mode (got {mode}); "
                                 "is it on a network file system?")
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.executescript(_SCHEMA)
            conn.execute("INSERT OR IGNORE INTO meta (name, value) VALUES ('schema_version', ?)",
                         (str(SCHEMA_VERSION),))
            version = conn.execute("SELECT value FROM meta WHERE name = 'schema_version'").fetchone()[0]
        except sqlite3.OperationalError as exc:
            if _is_locked(exc):
                raise ShardError(self._locked_message(exc)) from None
            problem = self._path_problem()
            if problem or "readonly" in str(exc).lower() or "unable to open" in str(exc).lower():
                raise ShardError(f"cost cache {self.path}: {problem or exc}; make it writable or choose another "
                                 "--cache-path (or --no-cache)") from None
            raise ShardError(f"cost cache {self.path}: {exc} (delete the file to start a new cache)") from None
        except sqlite3.DatabaseError as exc:
            if not self.path.read_bytes()[:16].startswith(b"SQLite format 3"):   # someone's other file: never delete it
                raise ShardError(f"cost cache {self.path}: not an SQLite database (another kind of file); choose "
                                 "another --cache-path") from None
            raise ShardError(f"cost cache {self.path}: {exc} (delete the file to start a new cache)") from None
        except OSError as exc:
            raise ShardError(f"cost cache {self.path}: {exc.strerror or exc}") from None
        if int(version) != SCHEMA_VERSION:
            conn.close()
            raise ShardError(f"cost cache {self.path} has schema version {version}, this code reads "
                             f"{SCHEMA_VERSION}: use another --cache-path or delete the file")
        self._local.conn, self._local.pid = conn, os.getpid()
        return conn

    def _execute(self, sql: str, params: Sequence = ()) -> sqlite3.Cursor:
        try:
            return self._conn().execute(sql, params)
        except sqlite3.DatabaseError as exc:
            if _is_locked(exc):
                raise ShardError(self._locked_message(exc)) from None
            raise ShardError(f"cost cache {self.path}: {exc}") from None

    def _locked_message(self, exc: Exception) -> str:
        return (f"cost cache {self.path}: {exc} for {self.busy_timeout_s:g} s: another process holds it; "
                "wait for it to finish, or give this run its own --cache-path (do not delete a cache in use)")

    def _bad_row(self, table: str, what: str) -> ShardError:
        return ShardError(f"cost cache {self.path}: corrupt {table} entry ({what}); measure without it "
                          "(--no-cache), or use another --cache-path")

    def _costs(self, table: str, text, ndevices: int | None = None) -> list[DeviceCost]:
        """A stored ``device_costs`` JSON: per device four finite costs >= 0 (ms), as :class:`DeviceCost` s."""
        try:
            costs = json.loads(text)
            costs = [[float(v) for v in dev] for dev in costs]
        except (TypeError, ValueError):
            raise self._bad_row(table, "device_costs is not a JSON list of per-device cost lists") from None
        if not costs or any(len(c) != 4 for c in costs) or (ndevices is not None and len(costs) != ndevices):
            raise self._bad_row(table, "device_costs must hold four costs per device")
        if not all(math.isfinite(v) and v >= 0 for c in costs for v in c):
            raise self._bad_row(table, "a negative or non-finite cost")
        return device_costs(costs)

    def _shard_costs(self, fw, bw) -> tuple[float, float]:
        try:
            fw, bw = float(fw), float(bw)
        except (TypeError, ValueError):
            raise self._bad_row("shard_costs", "non-numeric cost") from None
        if not (math.isfinite(fw) and math.isfinite(bw) and fw >= 0 and bw >= 0):
            raise self._bad_row("shard_costs", f"a negative or non-finite cost ({fw}, {bw})")
        return fw, bw

    def _json(self, table: str, column: str, text):
        try:
            return json.loads(text)
        except (TypeError, ValueError):
            raise self._bad_row(table, f"{column} is not JSON") from None

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None and getattr(self._local, "pid", None) == os.getpid():
            conn.close()
        self._local.conn = None

    def __enter__(self) -> "CostCache":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- shards -----------------------------------------------------------------------------
    def get_shard(self, ctx: CacheContext, tables: Iterable[TableConfig | Sequence[int]]) -> tuple[float, float] | None:
        """The stored ``(fw_ms, bw_ms)`` of a shard, or ``None``."""
        key = _digest("shard", ctx, shard_key(tables))
        row = self._execute("SELECT fw_ms, bw_ms FROM shard_costs WHERE key = ?", (key,)).fetchone()
        return None if row is None else self._shard_costs(row[0], row[1])

    def put_shard(self, ctx: CacheContext, tables: Iterable[TableConfig | Sequence[int]], fw_ms: float,
                  bw_ms: float, bench_iters: int | None = None, warmup_iters: int | None = None) -> None:
        """Store (or replace) a shard's compute cost."""
        skey = shard_key(tables)
        self._execute(
            "INSERT OR REPLACE INTO shard_costs (key, hardware, dataset, batch_size, optimizer, precision, "
            "shard, num_tables, fw_ms, bw_ms, bench_iters, warmup_iters, created) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (_digest("shard", ctx, skey), *ctx.as_list(), json.dumps(skey), len(skey), float(fw_ms),
             float(bw_ms), bench_iters, warmup_iters, time.time()))

    # -- the reference speed ----------------------------------------------------------------
    def reference_ms(self, key: str) -> float | None:
        """The stored nominal cost of the measured oracle's reference shard for ``key`` (see
        :mod:`shardcore.oracles.measured.driver`, 'Repeatability on the CPU'), or None."""
        row = self._execute("SELECT value FROM meta WHERE name = ?", ("reference:" + key,)).fetchone()
        try:
            value = float(row[0]) if row else None
        except ValueError:
            value = None
        return value if value is not None and math.isfinite(value) and value > 0 else None

    def store_reference_ms(self, key: str, value: float) -> float:
        """Store ``value`` as the nominal reference cost for ``key`` unless one is stored already;
        returns the stored one (the first value ever measured on this machine wins)."""
        self._execute("INSERT OR IGNORE INTO meta (name, value) VALUES (?, ?)", ("reference:" + key, repr(float(value))))
        return self.reference_ms(key) or float(value)

    # -- plans ------------------------------------------------------------------------------
    def get_plan(self, ctx: CacheContext, shards: Sequence[Iterable[TableConfig | Sequence[int]]]
                 ) -> list[DeviceCost] | None:
        """The stored per-device costs of a plan, or ``None``."""
        key = _digest(_PLAN_KIND, ctx, [shard_key(s) for s in shards])
        row = self._execute("SELECT device_costs FROM plan_costs WHERE key = ?", (key,)).fetchone()
        return None if row is None else self._costs("plan_costs", row[0], len(shards))

    def put_plan(self, ctx: CacheContext, shards: Sequence[Iterable[TableConfig | Sequence[int]]],
                 device_costs_ms: Sequence[Sequence[float]], bench_iters: int | None = None,
                 warmup_iters: int | None = None) -> None:
        """Store (or replace) a plan's per-device costs."""
        skeys = [shard_key(s) for s in shards]
        costs = [[float(v) for v in dev] for dev in device_costs_ms]
        if len(costs) != len(skeys) or any(len(c) != 4 for c in costs):
            raise ValueError("device_costs_ms needs four costs per device")
        cost = max((sum(c) for c in costs), default=0.0)
        self._execute(
            "INSERT OR REPLACE INTO plan_costs (key, hardware, dataset, batch_size, optimizer, precision, "
            "ndevices, shards, device_costs, cost_ms, bench_iters, warmup_iters, created) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (_digest(_PLAN_KIND, ctx, skeys), *ctx.as_list(), len(skeys), json.dumps(skeys),
             json.dumps(costs), cost, bench_iters, warmup_iters, time.time()))

    # -- queries ----------------------------------------------------------------------------
    @staticmethod
    def _where(ctx: CacheContext | None, **filters) -> tuple[str, list]:
        conds, params = [], []
        if ctx is not None:
            for name, value in zip(("hardware", "dataset", "batch_size", "optimizer", "precision"),
                                   ctx.as_list()):
                conds.append(f"{name} = ?")
                params.append(value)
        for name, value in filters.items():
            if value is not None:
                conds.append(f"{name} = ?")
                params.append(value)
        return (" WHERE " + " AND ".join(conds)) if conds else "", params

    def shard_entries(self, ctx: CacheContext | None = None, *, hardware: str | None = None,
                      dataset: str | None = None, batch_size: int | None = None,
                      optimizer: str | None = None, precision: str | None = None,
                      limit: int | None = None) -> list[ShardEntry]:
        """Stored shard measurements, oldest first; ``ctx`` or the keyword filters narrow them."""
        where, params = self._where(ctx, hardware=hardware, dataset=dataset, batch_size=batch_size,
                                    optimizer=optimizer, precision=precision)
        sql = ("SELECT shard, fw_ms, bw_ms, hardware, dataset, batch_size, optimizer, precision, created "
               f"FROM shard_costs{where} ORDER BY created, key")
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        out = []
        for shard, fw, bw, hw, ds, b, opt, prec, created in self._execute(sql, params).fetchall():
            fw, bw = self._shard_costs(fw, bw)
            out.append(ShardEntry(tuple(tuple(t) for t in self._json("shard_costs", "shard", shard)), fw, bw,
                                  hw, ds, int(b), opt, prec, float(created)))
        return out

    def plan_entries(self, ctx: CacheContext | None = None, *, hardware: str | None = None,
                     dataset: str | None = None, batch_size: int | None = None,
                     optimizer: str | None = None, precision: str | None = None,
                     ndevices: int | None = None, limit: int | None = None) -> list[PlanEntry]:
        """Stored plan measurements of the current cost convention (:data:`PLAN_CONVENTION`), oldest
        first; ``ctx`` or the keyword filters narrow them."""
        where, params = self._where(ctx, hardware=hardware, dataset=dataset, batch_size=batch_size,
                                    optimizer=optimizer, precision=precision, ndevices=ndevices)
        sql = ("SELECT key, shards, device_costs, cost_ms, hardware, dataset, batch_size, optimizer, precision, "
               f"created FROM plan_costs{where} ORDER BY created, key")
        out = []
        for key, shards, costs, cost, hw, ds, b, opt, prec, created in self._execute(sql, params).fetchall():
            shards = self._json("plan_costs", "shards", shards)
            costs = self._costs("plan_costs", costs, len(shards))
            if key != _digest(_PLAN_KIND, CacheContext(hw, ds, int(b), opt, prec), shards):
                continue   # measured under an older cost convention (PLAN_CONVENTION)
            if limit is not None and len(out) >= int(limit):
                break
            out.append(PlanEntry(
                tuple(tuple(tuple(t) for t in s) for s in shards),
                tuple(costs),
                max(sum(c) for c in costs), hw, ds, int(b), opt, prec, float(created)))
        return out

    def counts(self) -> dict[str, int]:
        """Number of stored shard and plan entries."""
        n_shard = self._execute("SELECT COUNT(*) FROM shard_costs").fetchone()[0]
        n_plan = self._execute("SELECT COUNT(*) FROM plan_costs").fetchone()[0]
        return {"shards": int(n_shard), "plans": int(n_plan)}


def _is_locked(exc: Exception) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text


def open_cache(cache: "CostCache | str | os.PathLike | None | bool") -> CostCache | None:
    """``None``/``False``: no cache; ``True``: the default file; a path: that file; a cache: itself."""
    if cache is None or cache is False:
        return None
    if cache is True:
        return CostCache(DEFAULT_CACHE_PATH)
    if isinstance(cache, CostCache):
        return cache
    return CostCache(cache)


class CachedOracle:
    """The measurement cache as a layer around an oracle (any
    :class:`~shardcore.types.ShardCostOracle`: measured on the CPU or on CUDA GPUs, or emulated).

    ``evaluate(shards)``: a plan stored for the oracle's setting (:attr:`context`) comes back at
    once (``from_cache``); otherwise every shard whose compute is stored is passed to the oracle as
    known (``oracle.evaluate(shards, compute=...)``), which measures only the others and the
    exchange; then the freshly measured shards and, when the exchange was measured rather than
    modelled (``oracle.comm_measured``), the plan are stored. ``measure_devices`` reads and fills the
    shard entries the same way. ``no_cache=True`` (per call, or the default given here) reads
    nothing but still stores what it measured, replacing older entries.

    The rest of the oracle contract (``hardware``, ``parts``, ``context``, ``info``, ``batch_size``,
    ``measure_comm``, ``start``...) is the wrapped oracle's, answered by it; anything else of that
    oracle is read on :attr:`oracle`. ``stats`` counts plan and shard hits and misses. What the
    layer stores is read through :func:`measurement_store` and :meth:`is_stored`: caching stays
    inside this layer.
    """

    def __init__(self, oracle, cache: "CostCache | str | os.PathLike | bool", no_cache: bool = False):
        store = open_cache(cache)
        if store is None:
            raise ShardError("a cache layer needs a cache: give a CostCache or a path")
        if getattr(oracle, "fit", None) in ("heldout", "devices"):
            raise ShardError("the held-out emulated oracle judges each plan with a fit made without that plan's "
                             "tables or devices, so its answers are not cached (use its full fit to cache)")
        self.oracle = oracle
        self.cache = store
        self.no_cache = bool(no_cache)
        self.stats = {"plan_hits": 0, "plan_misses": 0, "shard_hits": 0, "shard_misses": 0}
        if hasattr(oracle, "reference_store"):   # a measured CPU oracle keeps its nominal speed here
            oracle.reference_store = store

    # -- the wrapped oracle's contract (shardcore.types.ShardCostOracle) ----------------------
    @property
    def hardware(self) -> str:
        return self.oracle.hardware

    @property
    def parts(self) -> dict:
        return self.oracle.parts

    @property
    def context(self) -> CacheContext:
        return self.oracle.context

    @property
    def info(self) -> OracleInfo:
        return self.oracle.info

    @property
    def comm_measured(self) -> bool:
        return self.oracle.comm_measured

    @property
    def ndevices(self) -> int:
        return self.oracle.ndevices

    @property
    def batch_size(self) -> int:
        return self.oracle.batch_size

    @property
    def bench_iters(self) -> int:
        return self.oracle.bench_iters

    @property
    def warmup_iters(self) -> int:
        return self.oracle.warmup_iters

    @property
    def optimizer(self) -> str:
        return self.oracle.optimizer

    @property
    def precision(self) -> str:
        return self.oracle.precision

    @property
    def dataset(self):
        """The dataset the oracle's shards index (:class:`~shardcore.dataset.Dataset`)."""
        return self.oracle.dataset

    @property
    def comm_model(self):
        """The exchange model where the exchange is not measured (:class:`~shardcore.oracles.commmodel.CommModel`)."""
        return self.oracle.comm_model

    @property
    def fits_exchange(self) -> bool:
        """Whether that model is fitted to measured all-to-alls (the measured oracle's)."""
        return bool(getattr(self.oracle, "fits_exchange", False))

    @property
    def running(self) -> bool:
        return self.oracle.running

    def start(self) -> None:
        self.oracle.start()

    def close(self) -> None:
        self.oracle.close()

    def check_devices(self, shards):
        return self.oracle.check_devices(shards)

    def measure_comm(self, layout: CommLayout, delays_ms=None):
        """The wrapped oracle's exchange (never stored: a plan's is, with the plan)."""
        return self.oracle.measure_comm(layout, delays_ms)

    def is_stored(self, tables) -> bool:
        """Whether :meth:`measure_devices` would answer this shard from the store (never under
        ``no_cache``; never for pieces)."""
        tables = list(tables)
        return (not self.no_cache and bool(tables) and not has_pieces(tables)
                and self.cache.get_shard(self.context, tables) is not None)

    def __enter__(self) -> "CachedOracle":
        self.oracle.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.oracle.__exit__(*exc)

    def __repr__(self) -> str:
        return f"CachedOracle({self.oracle!r}, {self.cache.path})"

    def _iters(self) -> tuple[int | None, int | None]:
        return getattr(self.oracle, "bench_iters", None), getattr(self.oracle, "warmup_iters", None)

    # -- costs -----------------------------------------------------------------------------
    def evaluate(self, shards, no_cache: bool | None = None, *, compute=None):
        """The plan's :class:`~shardcore.types.PlanResult`, from the cache where it can."""

        t0 = time.perf_counter()
        no_cache = self.no_cache if no_cache is None else no_cache
        shards = self.oracle.check_devices(shards)
        ctx = self.oracle.context
        pieces = [has_pieces(s) for s in shards]       # row-wise / data-parallel: never cached
        # a modelled exchange is not stored as a plan
        plan_cache = bool(self.oracle.comm_measured) and not any(pieces)
        if plan_cache and not no_cache:
            hit = self.cache.get_plan(ctx, shards)
            if hit is not None:
                self.stats["plan_hits"] += 1
                return PlanResult(hit, from_cache=True, compute_from_cache=[True] * len(shards),
                                  wall_s=time.perf_counter() - t0, parts=self.oracle.parts,
                                  hardware=self.oracle.hardware)
        self.stats["plan_misses"] += 1
        known = dict(compute or {})
        for d, s in enumerate(shards):
            if not s or d in known:
                continue
            hit = None if no_cache or pieces[d] else self.cache.get_shard(ctx, s)
            if hit is not None:
                known[d] = ComputeCost(*hit)
                self.stats["shard_hits"] += 1
            else:
                self.stats["shard_misses"] += 1
        result = self.oracle.evaluate(shards, no_cache=no_cache, compute=known)
        bench, warmup = self._iters()
        for d, s in enumerate(shards):
            if s and d not in known and not pieces[d]:
                cost = result.devices[d]
                self.cache.put_shard(ctx, s, cost.fw_comp, cost.bw_comp, bench, warmup)
        if plan_cache:
            self.cache.put_plan(ctx, shards, result.device_costs_ms, bench, warmup)
        result.wall_s = time.perf_counter() - t0
        return result

    def measure_devices(self, shards, no_cache: bool | None = None):
        """Compute costs of single shards, stored ones read back, the others measured and stored."""

        no_cache = self.no_cache if no_cache is None else no_cache
        shards = [list(s) for s in shards]
        ctx = self.oracle.context
        out: list = [None] * len(shards)
        for k, s in enumerate(shards):
            if not s:
                out[k] = ComputeCost(0.0, 0.0)
                continue
            hit = None if no_cache or has_pieces(s) else self.cache.get_shard(ctx, s)
            if hit is not None:
                out[k] = ComputeCost(*hit)
                self.stats["shard_hits"] += 1
        missing = [k for k in range(len(shards)) if out[k] is None]
        if missing:
            # the oracle sees every position (hits as empty shards), so its errors name the right shard
            todo = set(missing)
            measured = self.oracle.measure_devices([s if k in todo else [] for k, s in enumerate(shards)],
                                                  no_cache=True)
            bench, warmup = self._iters()
            stored: set = set()
            for k in missing:
                out[k] = measured[k]
                key = shard_key(shards[k])
                if key not in stored and not has_pieces(shards[k]):   # stored once; pieces never
                    stored.add(key)
                    self.stats["shard_misses"] += 1
                    self.cache.put_shard(ctx, shards[k], measured[k].fw_ms, measured[k].bw_ms, bench, warmup)
        return out


def measurement_store(oracle) -> CostCache | None:
    """The store behind ``oracle``: the cache layer's :class:`CostCache`, None for a bare oracle
    (which keeps nothing). What a consumer reads back as training data (NeuroShard's collectors,
    shardkit's calibration) it reads here, not on the oracle."""
    return oracle.cache if isinstance(oracle, CachedOracle) else None
