"""NeuroShard as a :class:`~shardcore.baselines.Sharder` (``--alg neuroshard`` or a checkpoint path).

``make_sharder(ctx, config, checkpoint)`` (the registry's factory) is
``load_sharder(checkpoint, compute_model=..., fw_comm_model=..., bw_comm_model=..., batch_size, **search)``:

- ``path=None`` (``--alg neuroshard``): the three models from ``compute_model``, ``fw_comm_model``
  and ``bw_comm_model``, each defaulting to ``models/neuroshard/{compute,fw_comm,bw_comm}.pt``;
- ``path`` a bundle (``models/neuroshard/neuroshard.pt``, written by ``train_neuroshard.py``): all
  three from it, unless a model path is given explicitly;
- ``path`` one model's checkpoint (e.g. ``models/neuroshard/compute.pt``): that model from it, the
  others from the explicit paths or from their default names beside it.

Search settings (``k``, ``n``, ``max_length``, ``search_steps``, ``cap_start``, ``cap_end``,
``column_wise``: the ``--alg neuroshard`` flags, :class:`~neuroshard.config.PlannerConfig`) override a
bundle's stored ones; ``batch_size`` (the batch the plans will run at) is checked against the models'
training data.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from shardcore.baselines import Sharder
from shardcore.errors import InfeasibleError, ShardError
from shardcore.plan import Plan
from shardcore.planning import PlanningContext
from shardcore.tables import TableConfig
from shardcore.topology import Topology

from . import config
from .config import PlannerConfig, SearchConfig
from .checkpoints import read_checkpoint
from .search import SearchResult, search
from .simulator import Simulator

SEARCH_KEYS = ("k", "n", "max_length", "search_steps", "cap_start", "cap_end", "column_wise")


@dataclass
class NeuroShardSharder(Sharder):
    simulator: Simulator = None
    search: SearchConfig = field(default_factory=SearchConfig)
    last_result: SearchResult | None = field(default=None, init=False, repr=False)
    _warned: set = field(default_factory=set, init=False, repr=False)   # device counts warned about

    def check_device_count(self, ndevices: int) -> str | None:
        """A warning (printed once per device count, also returned) when the communication models were
        fitted on all-to-alls of other device counts: their ``ndevices`` feature is then extrapolated
        (the anchors' were fitted on 4 devices; on DLRM-100's 8, models fitted on 4- and 8-device
        samples planned within 0.2% of them: docs/methods.md)."""
        counts = sorted({c for m in (self.simulator.fw_comm, self.simulator.bw_comm)
                         for c in (getattr(m, "device_counts", None) or ())})
        if not counts or ndevices in counts or ndevices in self._warned:
            return None
        self._warned.add(ndevices)
        text = (f"warning: {self.name}: its communication models were fitted on all-to-alls of "
                f"{', '.join(map(str, counts))} devices; planning for {ndevices} extrapolates them (train_neuroshard.py "
                f"--comm-devices {','.join(map(str, sorted({*counts, ndevices})))} collects and trains on every count)")
        print(text, file=sys.stderr)
        return text

    def search_plan(self, tables: Sequence[TableConfig], topology: Topology) -> SearchResult:
        return search(self.simulator, tables, topology, self.search)

    def shard(self, tables, topology) -> Plan:
        if not tables:
            return Plan((), (), topology)
        self.check_device_count(topology.ndevices)
        result = self.search_plan(tables, topology)
        self.last_result = result
        if result.plan is None:
            raise InfeasibleError(
                f"infeasible: NeuroShard found no placement of {len(tables)} tables on {topology.ndevices} devices "
                f"under the {topology.max_memory_gb:g} GiB cap, even with column-wise splits")
        return result.plan


def _search_config(base: dict | None, overrides: dict) -> SearchConfig:
    cfg = SearchConfig.from_dict(dict(base or {}))
    for key in SEARCH_KEYS:
        value = overrides.get(key)
        if value is not None:
            setattr(cfg, key, type(getattr(cfg, key))(value))
    if cfg.k < 1 or cfg.n < 1 or cfg.max_length < 0 or cfg.search_steps < 1:
        raise ShardError(f"neuroshard: k, n and search_steps must be >= 1 and max_length >= 0 (got k={cfg.k}, "
                         f"n={cfg.n}, max_length={cfg.max_length}, search_steps={cfg.search_steps})")
    if not 0 < cfg.cap_start <= cfg.cap_end:
        raise ShardError(f"neuroshard: need 0 < cap_start <= cap_end, got {cfg.cap_start}, {cfg.cap_end}")
    return cfg


def make_sharder(ctx: PlanningContext, config: PlannerConfig | None = None, checkpoint=None,
                 planners=None) -> NeuroShardSharder:
    """``--alg neuroshard`` or a NeuroShard checkpoint for ``ctx`` (its batch, where known, checked against
    the models' training data), with ``config``'s model paths and search settings."""
    cfg = config or PlannerConfig()
    return load_sharder(checkpoint, cfg.compute_model, cfg.fw_comm_model, cfg.bw_comm_model, ctx.batch_size,
                        **cfg.search)


def load_sharder(path=None, compute_model=None, fw_comm_model=None, bw_comm_model=None,
                 batch_size: int | None = None, **search) -> NeuroShardSharder:
    """See the module docstring (``search``: :class:`SearchConfig` fields)."""
    paths = {"compute": compute_model, "fw_comm": fw_comm_model, "bw_comm": bw_comm_model}
    bundle = None
    search_defaults: dict = {}
    name = "neuroshard"
    if path is not None:
        obj = read_checkpoint(path)
        kind = obj.get("kind")
        name = str(path)
        if kind == "bundle":
            bundle = path
            search_defaults = dict(obj.get("search") or {})
        elif kind in paths:
            folder = Path(path).parent
            if paths[kind] is None:
                paths[kind] = path
            for other in paths:
                if paths[other] is None:
                    paths[other] = str(folder / Path(getattr(config, f"{other.upper()}_MODEL")).name)
        else:
            raise ShardError(f"{path}: unknown NeuroShard checkpoint kind {kind!r}")
    sim = Simulator.load(paths["compute"], paths["fw_comm"], paths["bw_comm"], bundle=bundle)
    sim.check_setting(batch_size=int(batch_size) if batch_size is not None else None)
    return NeuroShardSharder(name=name, simulator=sim, search=_search_config(search_defaults, search))


def default_model_paths() -> dict[str, str]:
    return {"compute": config.COMPUTE_MODEL, "fw_comm": config.FW_COMM_MODEL, "bw_comm": config.BW_COMM_MODEL}


def models_exist(paths: dict[str, str | os.PathLike] | None = None) -> bool:
    return all(os.path.isfile(p) for p in (paths or default_model_paths()).values())
