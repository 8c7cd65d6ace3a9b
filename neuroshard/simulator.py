"""The sharding simulator: a plan's cost from the three pre-trained models, without hardware.

For a plan (shards per device, column splits applied):

1. **compute**: the compute model predicts each device's forward and backward compute cost from its
   shard (an empty shard costs nothing);
2. **backward communication**: the backward model predicts each device's time from the per-device
   dim sums;
3. **forward communication**: the forward model predicts each device's time from the dim sums *and
   per-device start delays*: a device whose compute is shorter reaches the forward all-to-all
   earlier and waits for the others. The delay of device ``d`` is its predicted compute (forward
   plus backward: the work between two forward exchanges of consecutive iterations) minus the
   smallest one, which is how the communication data were collected (random start delays);
4. the cost of device ``d`` is the sum of its four costs, and the plan's cost is the maximum over
   devices (the cost of a plan, README "Measurement").

The same four numbers per device as the hardware evaluator reports
(``[fw_comp, fw_comm, bw_comm, bw_comp]``), so simulated and measured plans compare column by
column. Every function is vectorised over a leading batch of candidate plans for the search.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from shardcore.plan import Plan
from shardcore.tables import TableConfig
from shardcore.types import DeviceCost, PlanResult, device_costs

from . import config
from .checkpoints import CommCostModel, ComputeCostModel, load_model


@dataclass
class Simulator:
    compute: ComputeCostModel
    fw_comm: CommCostModel
    bw_comm: CommCostModel

    # -- batched core ------------------------------------------------------------------------
    @staticmethod
    def delays(compute_ms: np.ndarray) -> np.ndarray:
        """Start delays ``[..., D]`` of the forward exchange from per-device compute ``[..., D]``."""
        return compute_ms - compute_ms.min(-1, keepdims=True)

    def score(self, compute: np.ndarray, dim_sums: np.ndarray) -> np.ndarray:
        """Per-device ``[fw_comp, fw_comm, bw_comm, bw_comp]``, shape ``[G, D, 4]``, from predicted
        compute ``[G, D, 2]`` (fw, bw) and dim sums ``[G, D]``."""
        compute = np.asarray(compute, dtype=np.float64)
        dim_sums = np.asarray(dim_sums, dtype=np.float64)
        total = compute.sum(-1)
        bw = self.bw_comm.predict(dim_sums)
        fw = self.fw_comm.predict(dim_sums, self.delays(total))
        return np.stack([compute[..., 0], fw, bw, compute[..., 1]], axis=-1)

    # -- plans -------------------------------------------------------------------------------
    def device_costs(self, devices: Sequence[Sequence[TableConfig]]) -> np.ndarray:
        """``[D, 4]`` for one plan given as the tables on each device (the search's array form)."""
        comp = self.compute.predict_shards(devices)
        dims = np.array([sum(t.dim for t in s) for s in devices], dtype=np.float64)
        return self.score(comp[None], dims[None])[0]

    def estimate(self, plan: Plan) -> list[DeviceCost]:
        """Per device of ``plan`` its predicted cost."""
        return device_costs(self.device_costs(plan.device_pieces))

    def plan_cost(self, plan: Plan) -> float:
        """Max over devices of the sum of the four predicted costs (ms)."""
        return float(self.device_costs(plan.device_pieces).sum(-1).max())

    # -- the cost-oracle interface (shardcore.types.CostOracle) ---------------------------------
    @property
    def hardware(self) -> str:
        """What the simulated figures stand for."""
        hw = self.compute.setting.get("hardware")
        return "simulated by NeuroShard's cost models" + (f" (trained on measurements of {hw})" if hw else "")

    @property
    def parts(self) -> dict:
        return {"compute": "modelled (NeuroShard compute model)",
                "comm": "modelled (NeuroShard forward and backward communication models)"}

    def evaluate(self, devices: Sequence[Sequence[TableConfig]], no_cache: bool | None = None) -> PlanResult:
        """The simulated :class:`~shardcore.types.PlanResult` of a plan (``no_cache`` is ignored:
        nothing is cached)."""
        t0 = time.perf_counter()
        costs = self.device_costs(devices)
        return PlanResult(device_costs(costs), wall_s=time.perf_counter() - t0, parts=self.parts,
                          hardware=self.hardware)

    def __enter__(self) -> "Simulator":
        return self

    def __exit__(self, *exc) -> None:
        pass

    # -- loading -----------------------------------------------------------------------------
    @classmethod
    def load(cls, compute_model: str | os.PathLike | None = None, fw_comm_model: str | os.PathLike | None = None,
             bw_comm_model: str | os.PathLike | None = None, bundle: str | os.PathLike | None = None
             ) -> "Simulator":
        """From checkpoints (each defaults to ``models/neuroshard/<kind>.pt``, or to ``bundle``)."""
        paths = {"compute": compute_model, "fw_comm": fw_comm_model, "bw_comm": bw_comm_model}
        defaults = {"compute": config.COMPUTE_MODEL, "fw_comm": config.FW_COMM_MODEL,
                    "bw_comm": config.BW_COMM_MODEL}
        models = {k: load_model(p if p is not None else (bundle if bundle is not None else defaults[k]), k)
                  for k, p in paths.items()}
        return cls(models["compute"], models["fw_comm"], models["bw_comm"])

    def check_setting(self, batch_size: int | None = None) -> list[str]:
        """Warn (stderr) when the models were trained on data measured in different settings, or
        at another batch size than the plans will run at. Returns the warnings."""
        warnings = []
        settings = {k: m.setting for k, m in (("compute", self.compute), ("fw_comm", self.fw_comm),
                                               ("bw_comm", self.bw_comm))}
        for key in ("hardware", "batch_size", "optimizer", "precision"):
            values = {k: s.get(key) for k, s in settings.items() if s.get(key) is not None}
            if len(set(map(str, values.values()))) > 1:
                warnings.append(f"the NeuroShard models were trained on data with different {key}: {values}")
        if batch_size is not None:
            b = {s.get("batch_size") for s in settings.values() if s.get("batch_size") is not None}
            if b and int(batch_size) not in {int(x) for x in b}:
                warnings.append(f"the NeuroShard models were trained at batch size {sorted(b)}, "
                                f"plans will run at {batch_size}: predicted costs will be off")
        for w in warnings:
            print(f"warning: {w}", file=sys.stderr)
        return warnings
