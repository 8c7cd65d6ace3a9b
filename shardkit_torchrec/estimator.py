"""``EmulatedPerfEstimator``: a TorchRec ``ShardEstimator`` whose per-shard ``Perf`` comes from this
project's emulated H200 (compute) and exchange model (communication), so that TorchRec's own
``EmbeddingShardingPlanner`` plans with them::

    estimator = EmulatedPerfEstimator(topology, constraints)
    planner = EmbeddingShardingPlanner(topology=topology, batch_size=batch, constraints=constraints,
                                       enumerator=EmbeddingEnumerator(topology=topology, batch_size=batch,
                                           constraints=constraints,
                                           estimator=[estimator, EmbeddingStorageEstimator(topology, constraints)]))
    plan = planner.plan(model, sharders)
    print(estimator.describe(plan))      # which kernels the plan uses, and how each was priced

**A shard as shardkit sees it.** Every shard of a sharding option becomes a piece
(:class:`~shardcore.plan.ShardPiece`, what :meth:`shardcore.plan.Sharding.pieces` gives our own plans):
a table-wise table or column block is a table of the shard's rows and columns with the table's lookups;
a row-wise (or table-row-wise, or grid) block holds the lookups in proportion to its rows; a
data-parallel replica looks up its rank's slice of the batch (the pooling factor over the world size).
The batch is the global one: the option's per-rank ``batch_size`` times the world size.

**Compute kernels.** TorchRec enumerates, per sharding type, every kernel the sharder offers on the
topology's device that the constraints allow: on CUDA ``fused`` (weights in HBM), ``fused_uvm`` (weights
in host memory, read over the host link), ``fused_uvm_caching`` (weights in host memory behind an HBM
cache of ``cache_load_factor`` of the rows), ``dense`` for data-parallel; the guarded ones (``key_value``
and the virtual tables) and the quantised ones when a constraint names them. This estimator prices:

* ``fused`` and ``dense``: the emulator's prediction for the piece as a shard of its own
  (:meth:`shardcore.oracles.emulated.emulator.GpuComputeModel.predict_many`, one batched call for all
  options). TorchRec adds the shards of a rank; the emulator prices a rank's tables as one fused kernel,
  so the sum over a rank counts the per-kernel constant once per table (a few microseconds each at batch
  65536): the one place this estimate differs from the emulated oracle's compute.
* ``fused_uvm``: that prediction plus the host-link time of the rows the piece touches, **modelled**:
  its distinct rows per batch (the emulator's rule: lookups over the mean reuse of the table's reuse
  histogram, at most its rows; without a histogram every lookup a distinct row) x the row's bytes cross
  the link once forward (read) and twice backward (the optimizer reads and writes each row in place),
  at :class:`HostLink`'s bandwidth x efficiency.
* ``fused_uvm_caching``: the same for the rows that miss the cache, once forward (fetched) and once
  backward (an evicted row, updated, written back). The hit rate of a batch's distinct rows
  (:func:`cache_hit_rate`): from TorchRec's own cache statistics where the option carries them
  (``CacheParams.stats``), else from the table's reuse histogram (the rows looked up more than once in
  a batch are taken as the hot set, cached while they fit; the others hit with the probability the
  rest of the cache holds them), else the cache load factor itself (uniform access). The load factor is
  the option's ``CacheParams.load_factor``, else the sharder's ``cache_load_factor``, else TorchRec's
  default (``UVM_CACHING_RATIO``, 0.2).
* every other kernel is **declined**: its ``fwd_compute`` is infinite. TorchRec's planner keeps a plan
  only when its rating is below its starting bound (a finite integer), so no plan containing such an
  option is ever chosen; a table left with no priced option at all is a one-line
  :class:`~shardcore.errors.ShardError` (allow ``fused`` in its ``ParameterConstraints.compute_kernels``).

Every UVM price is a model from stated figures (the host link's bandwidth and efficiency, the hit
rate), not a GPU measurement; :meth:`EmulatedPerfEstimator.describe` says so for every table a plan puts
on a UVM kernel, and that a plan without one holds all its weights in HBM.

**Communication** (``fwd_comms``, ``bwd_comms``): the bytes the piece adds to its rank's side of the
exchanges the emulated oracle prices (:meth:`shardcore.oracles.commmodel.CommModel.exchange_ms`), over the
bandwidth: the pooled outputs it sends to the other ranks' samples, ``4 x width x (B - B/n)`` in both
phases (:func:`~shardcore.oracles.commmodel.pooled_width`: none for a replica); forward, a row-wise block's
id all-to-all, ``8 x (B - B/n) x (ids per sample + 1)`` (:func:`~shardcore.oracles.commmodel.id_width`);
backward, a replica's gradient all-reduce (:func:`~shardcore.oracles.commmodel.allreduce_bytes`). These add
up over a rank's shards exactly as the oracle's byte counts do (its sent side); the per-collective
latency is left out, since a sum over shards would count it once per shard (it is the same constant on
every rank that exchanges anything).

**Precision.** The weights' precision is read from every option's tensor (``EmbeddingBagConfig.data_type``):
fp16 or fp32, one for all the options of a plan (a mix, or another type, is a one-line ``ShardError``);
it sets the bytes of the UVM traffic and of a replica's all-reduce, and goes to the compute model through
:func:`emulated_compute`. The emulated H200's measurements are fp16; it prices fp32 kernels by the bytes
they move, and :func:`precision_note` (in :meth:`~EmulatedPerfEstimator.describe`) says so, as every
other pricing output does.

**Ties.** Equally priced options (the emulator prices the ``fused`` and ``dense`` kernels of a type
alike, a one-block column-wise option like the table-wise one on its rank) are ordered by
:func:`shardkit_torchrec.torchrec_planner.tie_break_ms`, a femtosecond per step of a fixed order of types
and kernels (``fused`` first), added to ``fwd_compute``: TorchRec enumerates options in the order of a
Python ``set`` of their names and keeps the first of equals, so without it the plan followed the process's
string hash seed (one DLRM-50 task at 3.360 or 4.043 ms by ``PYTHONHASHSEED``).

**Table statistics.** A sharding option names its table and gives its pooling factor
(``input_lengths``, from ``ParameterConstraints``); ``tables`` (``{table name: TableConfig}``, e.g.
from :func:`shardkit_torchrec.stats.table_stats`) adds the reuse histogram and the pooling factor
measured on samples, ``length_cv`` (``{name: CV}``) the bag-length dispersion; a table without them
has no reuse information (every lookup a distinct row) and the emulator's default CV.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional

import numpy as np
import torch
from torchrec.distributed.planner.constants import HBM_TO_DDR_MEM_BW, UVM_CACHING_RATIO
from torchrec.distributed.planner.types import ParameterConstraints, Perf, ShardEstimator, ShardingOption, Topology

from shardcore.errors import ShardError
from shardkit_torchrec.torchrec_planner import TIE_BREAK_MS, TYPE_ORDER, kernel_order  # noqa: F401 - the tie-break's order, here too
from shardkit_torchrec.torchrec_planner import tie_break_ms as _tie_break
from shardcore.oracles.commmodel import ID_ELEMENT_SIZE, CommModel, allreduce_bytes, id_width, pooled_width
from shardcore.oracles.emulated.card import card_model
from shardcore.planning import is_card_file
from shardcore.oracles.emulated.model import BIN_REPS
from shardcore.plan import DATA_PARALLEL, ROW_WISE, ShardPiece
from shardcore.tables import GB, TableConfig, bytes_per_element
from shardcore.types import OUTPUT_ELEMENT_SIZE

WHOLE_ROW_TYPES = ("table_wise", "column_wise", "table_column_wise")
ROW_BLOCK_TYPES = ("row_wise", "table_row_wise", "grid_shard")
KERNEL_ORDER = kernel_order()
HBM_KERNELS = ("fused", "dense")                  # weights in HBM: the emulator's kernels
UVM_KERNELS = ("fused_uvm", "fused_uvm_caching")  # weights in host memory: the emulator's kernel + the host link
PRICED_KERNELS = HBM_KERNELS + UVM_KERNELS
DECLINED_MS = math.inf
PRECISIONS = {torch.float16: "fp16", torch.float32: "fp32"}

# NVIDIA H200 datasheet: PCIe Gen5 x16, 128 GB/s in both directions together, so 64 GB/s each way
H200_HOST_LINK_GBPS = 64.0
# the share of the link's bandwidth row-granular UVM accesses get: TorchRec's own planner assumes 1/10
# (constants.kernel_bw_lookup prices fused_uvm at hbm_to_ddr_mem_bw / 10); not measured here
UVM_LINK_EFFICIENCY = 0.1


def tie_break_ms(option: ShardingOption) -> float:
    """The option's tie-break (module notes, "Ties"; :func:`shardkit_torchrec.torchrec_planner.tie_break_ms`)."""
    return _tie_break(option.sharding_type, option.compute_kernel)


@dataclass(frozen=True)
class HostLink:
    """The link UVM rows cross between host memory and the GPU: ``bandwidth_gbps`` one way (GB/s, 1e9
    bytes), ``efficiency`` the share of it row-granular accesses get, ``source`` where both come from."""

    bandwidth_gbps: float = H200_HOST_LINK_GBPS
    efficiency: float = UVM_LINK_EFFICIENCY
    source: str = (f"H200 PCIe Gen5 x16, {H200_HOST_LINK_GBPS:g} GB/s each way (NVIDIA datasheet), "
                   f"{UVM_LINK_EFFICIENCY:g} of it for row accesses (TorchRec's own assumption)")

    def __post_init__(self):
        if not (self.bandwidth_gbps > 0 and 0 < self.efficiency <= 1):
            raise ShardError(f"HostLink: bandwidth must be > 0 and efficiency in (0, 1], got "
                             f"{self.bandwidth_gbps} GB/s and {self.efficiency}")

    @property
    def bytes_per_ms(self) -> float:
        return self.bandwidth_gbps * 1e6 * self.efficiency

    @classmethod
    def of(cls, topology: Topology) -> "HostLink":
        """The topology's ``hbm_to_ddr_mem_bw`` where it states one; TorchRec's built-in default (a
        nominal 32 GiB/s) is taken as "not stated" and the H200's PCIe link is used."""
        bw = float(getattr(topology, "hbm_to_ddr_mem_bw", HBM_TO_DDR_MEM_BW))   # bytes per ms
        if math.isclose(bw, HBM_TO_DDR_MEM_BW):
            return cls()
        return cls(bw / 1e6, UVM_LINK_EFFICIENCY,
                   f"the topology's hbm_to_ddr_mem_bw, {bw / 1e6:.1f} GB/s, {UVM_LINK_EFFICIENCY:g} of it for row "
                   "accesses (TorchRec's own assumption)")


def precision_of_dtype(dtype: torch.dtype, name: str) -> str:
    """``fp16`` or ``fp32`` for an option's weights (one-line ``ShardError`` for any other type)."""
    if dtype not in PRECISIONS:
        raise ShardError(f"EmulatedPerfEstimator prices fp16 or fp32 weights; table {name} is {dtype}")
    return PRECISIONS[dtype]


def precision_note(model, precision: str) -> str | None:
    """How ``precision``'s kernel compute is priced where the emulated card did not measure it (None
    where it did): fp32 from the fp16 measurements by the bytes it moves, as every other pricing output says."""
    card = getattr(model, "measured", None)
    if hasattr(card, "precision_note"):   # a calibrated card: the precision it measured, else its own rule
        return card.precision_note(precision, f"the card {card.path}")
    if precision == "fp16":
        return None
    from shardcore.oracles.emulated.model import FP32_NOTE

    return FP32_NOTE


def emulated_compute(model, shards, batch: int, length_cv, precision: str) -> np.ndarray:
    """``[n, 2]`` forward and backward ms of ``shards`` at the global ``batch`` in the weights' ``precision``
    (the emulator prices fp32 by the bytes it moves: :func:`precision_note`)."""
    return np.asarray(model.predict_many(shards, batch, length_cv=length_cv, precision=precision))


def option_pieces(option: ShardingOption, table: TableConfig, world: int) -> list[TableConfig | None]:
    """The piece of every shard of ``option`` (``None`` for a shard of no rows)."""
    kind = str(option.sharding_type)
    out: list[TableConfig | None] = []
    for j, shard in enumerate(option.shards):
        rows, cols = int(shard.size[0]), int(shard.size[1])
        if rows == 0 or cols == 0:
            out.append(None)
        elif kind in WHOLE_ROW_TYPES:
            out.append(TableConfig(table.index, rows, cols, table.pooling_factor, table.bins))
        elif kind in ROW_BLOCK_TYPES:
            out.append(ShardPiece(table.index, rows, cols, table.pooling_factor * rows / table.row, table.bins,
                                  kind=ROW_WISE, row_start=int(shard.offset[0]), full_row=table.row))
        elif kind == "data_parallel":
            out.append(ShardPiece(table.index, rows, cols, table.pooling_factor / world, table.bins,
                                  kind=DATA_PARALLEL, full_row=table.row, batch_part=(j, world)))
        else:
            raise ShardError(f"EmulatedPerfEstimator: table {option.name} has sharding type {kind}, which the "
                             "emulated H200 has no model of")
    return out


def shard_comm_bytes(piece: TableConfig, batch_size: int, world: int, precision: str) -> tuple[float, float]:
    """``(forward, backward)`` bytes the piece adds to its rank's side of the exchanges (module notes)."""
    if world < 2:
        return 0.0, 0.0
    others = batch_size - batch_size / world
    pooled = OUTPUT_ELEMENT_SIZE * pooled_width(piece) * others
    ids = ID_ELEMENT_SIZE * others * id_width(piece)
    return pooled + ids, pooled + allreduce_bytes(piece, world, precision)


def distinct_rows(piece: TableConfig, batch_size: int) -> float:
    """The piece's expected distinct rows per batch: its lookups over the mean reuse of its table's reuse
    histogram, at most its rows; without a histogram every lookup a distinct row (the emulator's rule)."""
    lookups = float(batch_size) * float(piece.pooling_factor)
    reuse = float(np.asarray(piece.bins, dtype=float) @ BIN_REPS)
    return float(min(piece.row, lookups / reuse if reuse > 0 and lookups > 0 else lookups))


def cache_hit_rate(piece: TableConfig, distinct: float, load_factor: float, stats: Any = None,
                   share: float = 1.0) -> float:
    """The share of a batch's distinct rows that an HBM cache of ``load_factor`` of the piece's rows holds
    (module notes): from TorchRec's ``CacheStatistics`` where given (its LRU miss rate at that load factor
    times its expected distinct ids per batch, times the piece's ``share`` of the table's rows: the cache
    fetches TorchRec's own estimator counts, at most every distinct row), else from the reuse histogram
    (rows looked up more than once in a batch are the hot set, cached while they fit; a row looked up once
    hits with the probability the rest of the cache holds it), else ``load_factor`` (uniform access)."""
    clf = min(max(float(load_factor), 0.0), 1.0)
    if distinct <= 0:
        return 1.0
    if stats is not None:
        fetches = float(stats.expected_miss_rate(clf)) * float(stats.expected_lookups) * float(share)
        return 1.0 - min(distinct, fetches) / distinct
    cache = clf * piece.row
    bins = np.asarray(piece.bins, dtype=float)
    hot_share = float(1.0 - bins[0] / bins.sum()) if bins.sum() > 0 else 0.0
    hot = hot_share * distinct
    cached_hot = min(hot, cache)
    rest = piece.row - cached_hot           # the rows outside the cached hot set, which the rest of the cache samples
    p_cold = min(1.0, (cache - cached_hot) / rest) if rest > 0 else 1.0
    misses = (hot - cached_hot) + (distinct - hot) * (1.0 - p_cold)
    return float(min(1.0, max(0.0, 1.0 - misses / distinct)))


@dataclass(frozen=True)
class KernelPrice:
    """How one option's kernel was priced: ``kind`` (``hbm``, ``uvm``, ``uvm_caching``, ``declined``), the
    host-link ms forward and backward it adds (the largest shard's), the cache load factor and modelled hit
    rate (caching only)."""

    kind: str
    link_fw_ms: float = 0.0
    link_bw_ms: float = 0.0
    load_factor: float | None = None
    hit_rate: float | None = None


class EmulatedPerfEstimator(ShardEstimator):
    """Fills every shard's ``Perf`` from the emulated GPU, the host link and the exchange model (module notes).

    ``comm``: the exchange model (default :class:`~shardcore.oracles.commmodel.CommModel`'s stated constants, the
    emulated oracle's; a card file's figures unless ``comm`` states others); ``card``: the emulated GPU
    (``h200``) or a calibrated card file (:mod:`shardcore.oracles.emulated.card`); ``tables`` / ``length_cv``: per table
    name, the statistics TorchRec's options do not carry; ``host_link``: the UVM kernels' link (default
    :meth:`HostLink.of` the topology).

    After ``estimate``: ``prices`` (``{(table, sharding type, kernel): KernelPrice}``), ``precision``."""

    def __init__(self, topology: Topology, constraints: Optional[Dict[str, ParameterConstraints]] = None,
                 comm: CommModel | None = None, card: str = "h200",
                 tables: Mapping[str, TableConfig] | None = None,
                 length_cv: Mapping[str, float] | None = None, host_link: HostLink | None = None) -> None:
        self._topology = topology
        self._constraints = constraints
        self.model = card_model(card)
        self.comm = self.model.measured.comm_model(comm) if is_card_file(card) else comm or CommModel()
        self.card = card
        self.tables = dict(tables or {})
        self.length_cv = dict(length_cv or {})
        self.host_link = host_link or HostLink.of(topology)
        self.prices: dict[tuple[str, str, str], KernelPrice] = {}
        self.precision: str | None = None
        self._shapes: dict[str, float] = {}

    def _table(self, option: ShardingOption) -> TableConfig:
        rows, dim = (int(x) for x in option.tensor.shape)
        t = self.tables.get(option.name)
        if t is not None:
            if (t.row, t.dim) != (rows, dim):
                raise ShardError(f"EmulatedPerfEstimator: table {option.name} is {rows} x {dim} in the model but "
                                 f"{t.row} x {t.dim} in the statistics given")
            return t
        return TableConfig(-1, rows, dim, float(sum(option.input_lengths)))

    def _precision(self, options: List[ShardingOption]) -> str:
        found: dict[str, list[str]] = {}
        for o in options:
            found.setdefault(precision_of_dtype(o.tensor.dtype, o.name), []).append(o.name)
        if len(found) > 1:
            raise ShardError("EmulatedPerfEstimator prices one weights precision per plan; the tables mix " + " and ".join(
                f"{p} ({', '.join(sorted(set(n))[:3])}{', ...' if len(set(n)) > 3 else ''})" for p, n in sorted(found.items())))
        return next(iter(found), "fp16")

    @staticmethod
    def _load_factor(option: ShardingOption, sharder_data_map: Any) -> float:
        clf = option.cache_load_factor
        if clf is None and sharder_data_map:
            data = sharder_data_map.get(option.module_type_key)
            clf = (getattr(data, "fused_params", None) or {}).get("cache_load_factor")
        return float(UVM_CACHING_RATIO if clf is None else clf)

    def _link_ms(self, option: ShardingOption, piece: TableConfig, batch: int, precision: str,
                 sharder_data_map: Any) -> tuple[float, float, KernelPrice]:
        """The host-link ms (forward, backward) a UVM kernel adds to the piece's compute (module notes)."""
        rows = distinct_rows(piece, batch)
        row_bytes = piece.dim * bytes_per_element(precision)
        per_ms = self.host_link.bytes_per_ms
        if option.compute_kernel == "fused_uvm":
            fw, bw = rows * row_bytes / per_ms, 2.0 * rows * row_bytes / per_ms
            return fw, bw, KernelPrice("uvm", fw, bw)
        clf = self._load_factor(option, sharder_data_map)
        stats = getattr(option.cache_params, "stats", None) if option.cache_params is not None else None
        share = piece.row / piece.full_row if getattr(piece, "full_row", 0) else 1.0
        hit = cache_hit_rate(piece, rows, clf, stats, share)
        miss_bytes = (1.0 - hit) * rows * row_bytes
        return miss_bytes / per_ms, miss_bytes / per_ms, KernelPrice("uvm_caching", miss_bytes / per_ms,
                                                                      miss_bytes / per_ms, clf, hit)

    def estimate(self, sharding_options: List[ShardingOption], sharder_data_map: Any = None) -> None:
        if not sharding_options:
            return
        world = self._topology.world_size
        precision = self._precision(sharding_options)
        self.precision = precision
        todo: dict[int, list[tuple[Any, TableConfig, float, float, tuple[float, float]]]] = {}
        priced_tables: set[str] = set()
        declined: dict[str, set[str]] = {}
        per_ms = self.comm.bandwidth_gbps * 1e6          # bytes per ms
        for option in sharding_options:
            kernel = str(option.compute_kernel)
            key = (option.name, str(option.sharding_type), kernel)
            self._shapes[option.name] = float(option.tensor.shape[0]) * float(option.tensor.shape[1])
            if kernel not in PRICED_KERNELS:
                for shard in option.shards:
                    shard.perf = Perf(fwd_compute=DECLINED_MS, fwd_comms=0.0, bwd_compute=0.0, bwd_comms=0.0)
                self.prices[key] = KernelPrice("declined")
                declined.setdefault(option.name, set()).add(kernel)
                continue
            priced_tables.add(option.name)
            table = self._table(option)
            batch = int(option.batch_size) * world
            cv = self.length_cv.get(option.name)
            cv = self.model.table_cv(table) if cv is None else float(cv)
            tie = tie_break_ms(option)
            price = KernelPrice("hbm")
            for shard, piece in zip(option.shards, option_pieces(option, table, world)):
                if piece is None:
                    shard.perf = Perf(fwd_compute=0.0, fwd_comms=0.0, bwd_compute=0.0, bwd_comms=0.0)
                    continue
                fw_b, bw_b = shard_comm_bytes(piece, batch, world, precision)
                shard.perf = Perf(fwd_compute=0.0, fwd_comms=fw_b / per_ms, bwd_compute=0.0, bwd_comms=bw_b / per_ms)
                link = (0.0, 0.0)
                if kernel in UVM_KERNELS:
                    lfw, lbw, p = self._link_ms(option, piece, batch, precision, sharder_data_map)
                    link = (lfw, lbw)
                    if p.link_fw_ms + p.link_bw_ms >= price.link_fw_ms + price.link_bw_ms:
                        price = p
                todo.setdefault(batch, []).append((shard, piece, cv, tie, link))
            self.prices[key] = price
        unpriced = sorted(set(declined) - priced_tables)
        if unpriced:
            name = unpriced[0]
            raise ShardError(f"EmulatedPerfEstimator prices the {', '.join(PRICED_KERNELS)} kernels; table {name}'s "
                             f"options use only {', '.join(sorted(declined[name]))}: allow one of those in its "
                             "ParameterConstraints.compute_kernels")
        for batch, items in todo.items():
            pred = emulated_compute(self.model, [[p] for _s, p, _c, _t, _l in items], batch,
                                    [[c] for _s, _p, c, _t, _l in items], precision)
            for (shard, _p, _c, tie, (lfw, lbw)), (fw, bw) in zip(items, pred):
                shard.perf.fwd_compute = float(fw) + lfw + tie
                shard.perf.bwd_compute = float(bw) + lbw

    # -- what a plan it priced holds ----------------------------------------------------------------
    def describe(self, plan) -> str:
        """Lines saying which kernels TorchRec's ``ShardingPlan`` ``plan`` puts its tables on and how each was
        priced: HBM only (every rank's weights against its HBM), or every table on a UVM kernel with its
        modelled host-link cost and, for the cache, its load factor and hit rate."""
        bpe = bytes_per_element(self.precision or "fp16")
        world = self._topology.world_size
        hbm_weights = [0.0] * world
        uvm: list[str] = []
        kernels: dict[str, int] = {}
        for params in plan.plan.values():
            for name, ps in sorted(params.items()):
                kernel, kind = str(ps.compute_kernel), str(ps.sharding_type)
                kernels[kernel] = kernels.get(kernel, 0) + 1
                price = self.prices.get((name, kind, kernel))
                if price is None or price.kind == "declined":
                    raise ShardError(f"EmulatedPerfEstimator did not price table {name}'s {kind} on {kernel}: "
                                     "the plan was not made with this estimator")
                shards = ps.sharding_spec.shards if ps.sharding_spec is not None else []
                if kind == "data_parallel":
                    t = self._dp_shape(name)
                    for r in ps.ranks or range(world):
                        hbm_weights[int(r)] += t * bpe
                for sm in shards:
                    size = float(sm.shard_sizes[0]) * float(sm.shard_sizes[1]) * bpe
                    share = 1.0 if kernel in HBM_KERNELS else (price.load_factor or 0.0)
                    hbm_weights[sm.placement.rank()] += size * share
                if price.kind == "uvm":
                    uvm.append(f"{name} ({kind}, fused_uvm: weights in host memory; + {price.link_fw_ms:.3f} / "
                               f"{price.link_bw_ms:.3f} ms forward / backward over the host link)")
                elif price.kind == "uvm_caching":
                    uvm.append(f"{name} ({kind}, fused_uvm_caching: cache load factor {price.load_factor:g}, modelled "
                               f"hit rate {price.hit_rate:.2f}; + {price.link_fw_ms:.3f} / {price.link_bw_ms:.3f} ms)")
        hbm = min(d.storage.hbm for d in self._topology.devices) / GB
        counts = ", ".join(f"{k} {v}" for k, v in sorted(kernels.items()))
        lines = [f"EmulatedPerfEstimator ({self.card}, {self.precision or 'fp16'} weights): kernels {counts}"]
        worst = max(hbm_weights) / GB if hbm_weights else 0.0
        if not uvm:
            lines.append(f"HBM only: every table's weights in HBM, at most {worst:.3f} GiB on a rank of {hbm:g} GiB")
        else:
            lines.append(f"UVM: {len(uvm)} table(s) keep their weights in host memory, priced as modelled (host link: "
                         f"{self.host_link.source}; not measured on a GPU): " + "; ".join(uvm))
            lines.append(f"weights and caches in HBM: at most {worst:.3f} GiB on a rank of {hbm:g} GiB")
        note = precision_note(self.model, self.precision or "fp16")
        if note:
            lines.append(note)
        return "\n".join(lines)

    def _dp_shape(self, name: str) -> float:
        """Rows x dim of a data-parallel table (its spec holds no shards), as the options priced gave it."""
        return float(self._shapes.get(name, 0.0))

