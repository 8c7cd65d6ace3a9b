"""``--alg torchrec-emu``: TorchRec's ``EmbeddingShardingPlanner`` with :class:`EmulatedPerfEstimator`
in place of its own performance estimator (TorchRec's ``EmbeddingStorageEstimator`` still counts memory).

Everything else is ``--alg torchrec``'s (:class:`shardcore.interop.torchrec_planner.TorchRecSharder`): the same
collection on the ``meta`` device, the same constraints (every sharding type the oracle measures,
``fused`` / ``dense`` kernels, each table's pooling factor), the same topology (built by that module, so a
change to how it describes the hardware reaches both), the same per-rank batch, memory model, reserve and
exact conversion of TorchRec's plan back to ours. So ``eval.py --alg torchrec,torchrec-emu`` differs in the
estimator alone. The estimator gets each table's :class:`~shardcore.tables.TableConfig` (reuse histogram,
dataset index: the emulator's known bag-length CVs apply as in the emulated oracle, or the dataset's
``data.pt`` CVs where it has one) and the exchange model of ``--comm-bandwidth`` / ``--comm-latency``.

Declared in ``shardkit_methods.PLANNER_PLUGINS``; the core names nothing of this package. Importing this
module needs no TorchRec (``eval.py`` imports every declared planner for its flags).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from shardcore.oracles.commmodel import CommModel
from shardcore.errors import ShardError
from shardcore.tables import TableConfig
from shardcore.interop import torchrec_planner as trp


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


def load_sharder(path=None, batch_size: int | None = None, oracle: str | None = None, data_dir=None,
                 comm_bandwidth=None, comm_latency=None, devices_per_host=None, inter_host_bandwidth=None,
                 inter_host_latency=None, memory_model: str = "torchrec", reserve: float = 0.0,
                 compute_device: str | None = None, local_world_size: int | None = None,
                 sharding_types: Sequence[str] | None = None, **_ignored) -> EmulatedTorchRecSharder:
    """``--alg torchrec-emu``. ``oracle``: ``emulated:<card>`` picks the card (default h200; the estimator
    has no model of the measured CPU landscape, so another oracle still gets the H200's); ``data_dir``:
    the dataset whose ``data.pt`` gives the bag-length CVs, as the emulated oracle reads them; the
    exchange model from ``comm_bandwidth`` / ``comm_latency`` and the hosts (``devices_per_host``,
    ``inter_host_*``: the oracle's flags)."""
    if path is not None:
        raise ShardError("--alg torchrec-emu takes no checkpoint")
    trp._torchrec()
    from shardkit_planner.costmodel import length_cvs

    card_given = bool(oracle and oracle.lower().startswith("emulated:"))
    card = oracle.split(":", 1)[1] if card_given else "h200"
    batch = int(batch_size or trp.DEFAULT_BATCH_SIZE)
    comm = CommModel.of(comm_bandwidth, comm_latency, devices_per_host, inter_host_bandwidth, inter_host_latency)
    hardware = trp.hardware_for(oracle if card_given else f"emulated:{card}", comm_bandwidth, comm_latency,
                                devices_per_host=devices_per_host, inter_host_bandwidth=inter_host_bandwidth)
    return EmulatedTorchRecSharder("torchrec-emu", batch_size=batch, memory_model=memory_model, reserve=reserve,
                                   compute_device=compute_device, hardware=hardware,
                                   local_world_size=local_world_size or devices_per_host or None,
                                   sharding_types=tuple(sharding_types) if sharding_types else None,
                                   card=card, comm=comm,
                                   length_cv=length_cvs(data_dir, batch) if data_dir else None)
