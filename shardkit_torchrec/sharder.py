"""``--alg torchrec-emu``: TorchRec's ``EmbeddingShardingPlanner`` with :class:`EmulatedPerfEstimator`
in place of its own performance estimator (TorchRec's ``EmbeddingStorageEstimator`` still counts memory).

Everything else is ``--alg torchrec``'s (:class:`shardkit_torchrec.torchrec_planner.TorchRecSharder`): the same
collection on the ``meta`` device, the same constraints (every sharding type the oracle measures,
``fused`` / ``dense`` kernels, each table's pooling factor), the same topology (built by that module, so a
change to how it describes the hardware reaches both), the same per-rank batch, memory model, reserve and
exact conversion of TorchRec's plan back to ours. So ``eval.py --alg torchrec,torchrec-emu`` differs in the
estimator alone. The estimator gets each table's :class:`~shardcore.tables.TableConfig` (reuse histogram,
dataset index: the emulator's known bag-length CVs apply as in the emulated oracle, or the dataset's
``data.pt`` CVs where it has one) and the exchange model of ``--comm-bandwidth`` / ``--comm-latency``.

Declared in ``shardkit_methods.PLANNERS``; the core names nothing of this package. Importing this
module needs no TorchRec (``eval.py`` imports every declared planner for its flags).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from shardcore.oracles.commmodel import CommModel
from shardcore.errors import ShardError
from shardcore.planning import PlanningContext
from shardcore.tables import TableConfig
from shardkit_torchrec import torchrec_planner as trp
from shardkit_torchrec.config import TorchRecConfig


@dataclass
class EmulatedTorchRecSharder(trp.TorchRecSharder):
    """TorchRec's planner priced by the emulated card (see the module notes)."""

    card: str = "h200"
    comm: CommModel | None = None
    length_cv: list[float] | None = None     # per dataset table (data.pt), None: the emulator's known tables

    def estimators(self, topology, constraints, tables: Sequence[TableConfig], names: Sequence[str],
                   batch_size: int) -> list:
        from torchrec.distributed.planner.shard_estimators import EmbeddingStorageEstimator

        from .estimator import EmulatedPerfEstimator

        cvs = None
        if self.length_cv is not None:
            cvs = {n: self.length_cv[t.index] for n, t in zip(names, tables) if 0 <= t.index < len(self.length_cv)}
        return [EmulatedPerfEstimator(topology, constraints, comm=self.comm, card=self.card,
                                      tables=dict(zip(names, tables)), length_cv=cvs),
                EmbeddingStorageEstimator(topology=topology, constraints=constraints,
                                          is_inference=self.memory_model == "weights")]


def make_sharder(ctx: PlanningContext, config: TorchRecConfig | None = None, checkpoint=None,
                 planners=None) -> EmulatedTorchRecSharder:
    """``--alg torchrec-emu`` for ``ctx``: its landscape's emulated card (an emulated one; another landscape
    still gets the H200's, the estimator having no model of the measured CPU), the dataset's ``data.pt``
    bag-length CVs where it has one (as the emulated oracle reads them), the exchange model of the
    landscape's constants and the topology's hosts; ``config``: TorchRec's settings (what it counts against
    the cap)."""
    if checkpoint is not None:
        raise ShardError("--alg torchrec-emu takes no checkpoint")
    trp._torchrec()
    from shardkit_planner.costmodel import length_cvs

    cfg = config or TorchRecConfig()
    land, hosts = ctx.landscape, ctx.topology.devices_per_host or None
    card = land.card or "h200"
    batch = ctx.batch
    comm = CommModel.of(**land.comm_kwargs(ctx.topology))
    hardware = trp.hardware_for(land.name if land.emulated else f"emulated:{card}", land.comm_bandwidth,
                                land.comm_latency, devices_per_host=hosts,
                                inter_host_bandwidth=land.inter_host_bandwidth)
    return EmulatedTorchRecSharder("torchrec-emu", batch_size=batch, memory_model=cfg.memory, hardware=hardware,
                                   local_world_size=hosts, card=card, comm=comm,
                                   length_cv=length_cvs(land.data_dir, batch) if land.data_dir else None)
