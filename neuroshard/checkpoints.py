"""NeuroShard's trained cost models and their checkpoints.

A trained model wraps its network (:mod:`neuroshard.networks`) with what was fitted beside it: the
feature standardisation (:class:`~shardcore.data.features.FeatureScaler` for the compute model's tables,
its base :class:`~shardcore.data.features.Standardiser` for the communication models' device features),
the target scale, the training metrics and the measurement setting; it predicts through the
network's NumPy copy (:mod:`neuroshard.numpy_nets`).

**Checkpoints** are dicts of plain tensors, numbers and strings (they load with
``weights_only=True``): ``method`` ("neuroshard"), ``kind`` ("compute", "fw_comm" or "bw_comm"),
``version``, ``config``, the standardisation, ``target_scale``, ``state_dict``, ``metrics`` (best
epoch, validation and test MAPE) and ``setting`` (hardware, dataset, batch size the data were
measured at). A bundle (``kind`` "bundle", :func:`save_bundle`) holds all three in one file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from shardcore import io
from shardcore.errors import ShardError
from shardcore.oracles.setting import PRODUCED_BY, produced_by
from shardcore.tables import TableConfig
from shardcore.data.features import FeatureScaler, Standardiser

from .config import ModelConfig
from .networks import BW_FEATURES, FW_FEATURES, LOG_FEATURES, CommCostNet, ComputeCostNet, comm_features
from .numpy_nets import NumpyCommNet, NumpyComputeNet

METHOD = "neuroshard"
VERSION = 1
KINDS = ("compute", "fw_comm", "bw_comm")


@dataclass
class ComputeCostModel:
    """A trained compute cost model: network, feature standardisation and target scale (ms)."""

    cfg: ModelConfig
    scaler: FeatureScaler
    net: ComputeCostNet
    target_scale: tuple[float, float] = (1.0, 1.0)      # ms per unit of the fw / bw outputs
    metrics: dict = field(default_factory=dict)
    setting: dict = field(default_factory=dict)

    kind = "compute"

    def __post_init__(self):
        self.refresh()

    def refresh(self) -> None:
        """Rebuild the NumPy copy after the network's weights changed."""
        self.net.eval()
        self._np = NumpyComputeNet(self.net)
        self._scale_np = np.asarray(self.target_scale, dtype=np.float64)

    # -- inference (NumPy) -------------------------------------------------------------------
    def features(self, tables: Sequence[TableConfig]) -> np.ndarray:
        return self.scaler.transform(tables, dtype=np.float64)

    @property
    def mass_size(self) -> int:
        return self.cfg.embed + (2 if self._np.pooling in ComputeCostNet.ADDITIVE else 0)

    def table_embeddings(self, tables: Sequence[TableConfig]) -> np.ndarray:
        """``[T, M]``: each table's masses, *summed* over a shard before :meth:`head`."""
        if not tables:
            return np.zeros((0, self.mass_size))
        return self._np.masses(self.features(tables))

    def head(self, emb_sum: np.ndarray) -> np.ndarray:
        """Summed masses ``[..., M]`` of a non-empty shard -> ``[..., 2]`` (fw, bw) in ms."""
        return self._np.cost(emb_sum) * self._scale_np

    def predict_shards(self, shards: Sequence[Sequence[TableConfig]]) -> np.ndarray:
        """``[len(shards), 2]``: predicted (fw, bw) compute of each shard in ms; empty shards cost 0."""
        out = np.zeros((len(shards), 2))
        flat = [t for s in shards for t in s]
        if not flat:
            return out
        emb = self.table_embeddings(flat)
        pos = 0
        sums = np.zeros((len(shards), emb.shape[1]))
        for k, s in enumerate(shards):
            sums[k] = emb[pos:pos + len(s)].sum(0)
            pos += len(s)
        nonempty = np.array([len(s) > 0 for s in shards])
        out[nonempty] = self.head(sums[nonempty])
        return out

    # -- checkpoint --------------------------------------------------------------------------
    def state(self) -> dict:
        return {"method": METHOD, "kind": self.kind, "version": VERSION, "config": self.cfg.to_dict(),
                "scaler": self.scaler.to_state(), "target_scale": [float(v) for v in self.target_scale],
                "state_dict": self.net.state_dict(), "metrics": _plain(self.metrics),
                "setting": _plain(self.setting), PRODUCED_BY: _produced_by(self)}

    @classmethod
    def from_state(cls, obj: dict, where: str = "checkpoint") -> "ComputeCostModel":
        _check_state(obj, cls.kind, where)
        cfg = ModelConfig.from_dict({"length_cv_feature": False, **obj["config"]})   # older: no CV feature
        net = ComputeCostNet(cfg)
        net.load_state_dict(obj["state_dict"])
        return cls(cfg, FeatureScaler.from_state(obj["scaler"], LOG_FEATURES), net, tuple(obj["target_scale"]),
                   dict(obj.get("metrics", {})), dict(obj.get("setting", {})))


@dataclass
class CommCostModel:
    """A trained forward (``kind="fw_comm"``, uses delays) or backward (``"bw_comm"``) comm model."""

    kind: str
    cfg: ModelConfig
    scaler: Standardiser      # feature standardisation, fitted on the training split
    net: CommCostNet
    target_scale: float = 1.0
    metrics: dict = field(default_factory=dict)
    setting: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.kind not in ("fw_comm", "bw_comm"):
            raise ShardError(f"unknown communication model kind {self.kind!r}")
        self.refresh()

    @property
    def with_delays(self) -> bool:
        return self.kind == "fw_comm"

    def refresh(self) -> None:
        self.net.eval()
        self._np = NumpyCommNet(self.net)

    @property
    def device_counts(self) -> tuple[int, ...] | None:
        """The device counts of the all-to-alls the model was fitted on: recorded at fitting
        (``metrics["ndevices"]``); for a model written before that was recorded, its scaler's ``ndevices`` feature where
        that was constant (a deviation of exactly 1, the constant feature's, around an integral mean);
        None where unknown. A plan of another count makes the model extrapolate in that feature."""
        recorded = (self.metrics or {}).get("ndevices")
        if recorded:
            return tuple(sorted(int(v) for v in recorded))
        i = BW_FEATURES.index("ndevices")
        mean, std = self.scaler.mean[i], self.scaler.std[i]
        return (int(mean),) if std == 1.0 and float(mean).is_integer() and mean >= 1 else None

    def predict(self, dim_sums: np.ndarray, delays_ms: np.ndarray | None = None) -> np.ndarray:
        """Per-device time in ms, ``[G, D]`` for ``dim_sums [G, D]`` (a single plan ``[D]`` -> ``[D]``)."""
        single = np.asarray(dim_sums).ndim == 1
        x = self.scaler.apply(comm_features(dim_sums, delays_ms, self.with_delays))
        out = self._np(x) * self.target_scale
        return out[0] if single else out

    def state(self) -> dict:
        return {"method": METHOD, "kind": self.kind, "version": VERSION, "config": self.cfg.to_dict(),
                "features": list(FW_FEATURES if self.with_delays else BW_FEATURES),
                "feature_mean": list(self.scaler.mean), "feature_std": list(self.scaler.std),
                "target_scale": float(self.target_scale), "state_dict": self.net.state_dict(),
                "metrics": _plain(self.metrics), "setting": _plain(self.setting), PRODUCED_BY: _produced_by(self)}

    @classmethod
    def from_state(cls, obj: dict, kind: str | None = None, where: str = "checkpoint") -> "CommCostModel":
        kind = kind or obj.get("kind")
        _check_state(obj, kind, where)
        expected = list(FW_FEATURES if kind == "fw_comm" else BW_FEATURES)
        if list(obj.get("features", [])) != expected:
            raise ShardError(f"{where}: the {kind} model was trained on other features "
                             f"({obj.get('features')}), this code computes {expected}")
        try:
            scaler = Standardiser(obj["feature_mean"], obj["feature_std"])
        except ShardError as exc:
            raise ShardError(f"{where}: the {kind} model's {exc}") from None
        cfg = ModelConfig.from_dict(obj["config"])
        net = CommCostNet(cfg, len(expected))
        net.load_state_dict(obj["state_dict"])
        return cls(kind, cfg, scaler, net, float(obj["target_scale"]), dict(obj.get("metrics", {})),
                   dict(obj.get("setting", {})))


def _produced_by(model) -> dict:
    """The stamp of a cost model: fitted by NeuroShard's training on the costs of its setting's hardware."""
    return produced_by(f"neuroshard ({model.kind} model)", (model.setting or {}).get("hardware"))


def _plain(obj):
    """Numbers, strings, lists and dicts only (``weights_only`` loading)."""
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, (np.floating, np.integer)):
        return obj.item()
    if isinstance(obj, (bool, int, float, str)) or obj is None:
        return obj
    return str(obj)


def _check_state(obj, kind: str | None, where: str) -> None:
    if not isinstance(obj, dict) or obj.get("method") != METHOD:
        raise ShardError(f"{where}: not a NeuroShard checkpoint")
    if obj.get("version") != VERSION:
        raise ShardError(f"{where}: checkpoint version {obj.get('version')} is not {VERSION}")
    if kind is not None and obj.get("kind") != kind:
        raise ShardError(f"{where}: holds a {obj.get('kind')!r} model, expected {kind!r}")


def read_checkpoint(path: str | os.PathLike) -> dict:
    if not os.path.isfile(path):
        raise ShardError(f"NeuroShard model not found: {path} (train one with train_neuroshard.py, or "
                         "train_compute_cost_model.py / train_comm_cost_model.py)")
    obj = io.load_checkpoint(path, METHOD, label="a NeuroShard")
    _check_state(obj, None, str(path))
    return obj


def save_model(model: "ComputeCostModel | CommCostModel", path: str | os.PathLike) -> None:
    io.save_checkpoint(model.state(), path)


def load_model(path: str | os.PathLike, kind: str) -> "ComputeCostModel | CommCostModel":
    """One model of ``kind`` from its own checkpoint or from a bundle."""
    obj = read_checkpoint(path)
    if obj.get("kind") == "bundle":
        if kind not in obj:
            raise ShardError(f"{path}: the bundle has no {kind} model")
        obj = obj[kind]
    with io.checkpoint_contents(path):
        if kind == "compute":
            return ComputeCostModel.from_state(obj, str(path))
        return CommCostModel.from_state(obj, kind, str(path))


def save_bundle(path: str | os.PathLike, compute: ComputeCostModel, fw: CommCostModel, bw: CommCostModel,
                search: dict | None = None) -> None:
    """All three models in one checkpoint (``eval.py --alg models/neuroshard/neuroshard.pt``)."""
    io.save_checkpoint({"method": METHOD, "kind": "bundle", "version": VERSION, "compute": compute.state(),
                   "fw_comm": fw.state(), "bw_comm": bw.state(), "search": _plain(search or {})}, path)
