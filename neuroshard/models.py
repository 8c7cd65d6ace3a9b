"""NeuroShard's three pre-trained cost models, their training and their checkpoints.

**Compute cost of a shard** (:class:`ComputeCostModel`): each table's 21 standardised features
(:class:`~shardcore.tables.FeatureScaler`, all four scaled features on a log scale:
:data:`LOG_FEATURES`) go through a table MLP; its outputs are *summed* over the shard; a head MLP
predicts the shard's forward and backward compute cost (two outputs; their sum is the shard's
compute cost). The sum makes the model apply to shards of any number of tables. By default
(``pooling="additive"``, :class:`ComputeCostNet`) the table MLP predicts each table's own costs,
whose sum is the shard's base cost, and the head a multiplicative shard-level correction of it.
An empty shard costs nothing.

**Communication per device** (:class:`CommCostModel`, one for the forward all-to-all and one for
the backward): the input is a plan's per-device dim sums (and, for the forward exchange, the
per-device start delays that imbalanced compute causes). Each device gets a vector of raw
features (its own dim sum, elements sent and received, its wait for the latest device, ...) and the
whole exchange's pooled context (sum / max / mean over devices); a per-device MLP encodes it, the
encodings are pooled (mean and max over devices) and a head maps ``[own features, own encoding,
pooled encodings]`` to that device's time. The same weights serve every device, so the model is
permutation-equivariant over devices and applies to any device count.

**Training** (:func:`fit_compute_model`, :func:`fit_comm_model`): the samples are split into
train / validation / test (seeded); the loss is the squared error of log costs (relative errors,
so cheap and expensive shards count alike); after every epoch the validation MAPE is computed and
the best epoch's weights are kept; the held-out test MAPE is reported. Feature standardisation
(:class:`~shardcore.tables.FeatureScaler` for tables, mean / std for the communication features)
and the target scale are fitted on the training split and saved in the checkpoint.

**Checkpoints** are dicts of plain tensors, numbers and strings (they load with
``weights_only=True``): ``method`` ("neuroshard"), ``kind`` ("compute", "fw_comm" or "bw_comm"),
``version``, ``config``, the standardisation, ``target_scale``, ``state_dict``, ``metrics`` (best
epoch, validation and test MAPE) and ``setting`` (hardware, dataset, batch size the data were
measured at). A bundle (``kind`` "bundle", :func:`save_bundle`) holds all three in one file.

For the search, every model also runs in NumPy (:class:`NumpyMLP`): the same weights, no autograd
or dispatcher overhead, which matters when thousands of candidate plans are scored.
"""

from __future__ import annotations

import copy
import math
import os
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch
from torch import nn

from shardcore import io
from shardcore.errors import ShardError
from shardcore.layers import mlp
from shardcore.tables import NUM_FEATURES, SCALED_FEATURES, FeatureScaler, TableConfig

from .config import ModelConfig, comm_model_config, compute_model_config

METHOD = "neuroshard"
VERSION = 1
KINDS = ("compute", "fw_comm", "bw_comm")
EPS_MS = 1e-3   # costs are clipped at 1 microsecond before logs and relative errors
# The compute model's table features: dim and pooling_factor on a log scale too (as row and size are
# for every method): a shard's compute is roughly multiplicative in them (lookups x dim).
LOG_FEATURES = SCALED_FEATURES


class NumpyMLP:
    """An :func:`~shardcore.layers.mlp` evaluated with NumPy (float64), for the search's many small evaluations."""

    def __init__(self, seq: nn.Sequential, relu_last: bool = False):
        linears = [m for m in seq if isinstance(m, nn.Linear)]
        self.weights = [m.weight.detach().double().numpy().T.copy() for m in linears]
        self.biases = [m.bias.detach().double().numpy().copy() for m in linears]
        self.relu_last = relu_last

    def __call__(self, x: np.ndarray) -> np.ndarray:
        last = len(self.weights) - 1
        for k, (w, b) in enumerate(zip(self.weights, self.biases)):
            x = x @ w
            x += b
            if k < last or self.relu_last:
                np.maximum(x, 0.0, out=x)
        return x


def softplus_np(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, x)


def mape(pred: np.ndarray, true: np.ndarray) -> float:
    """Mean absolute percentage error, in percent."""
    pred, true = np.asarray(pred, dtype=np.float64), np.asarray(true, dtype=np.float64)
    if pred.size == 0:
        return float("nan")
    return float(np.mean(np.abs(pred - true) / np.maximum(np.abs(true), EPS_MS)) * 100.0)


# ==============================================================================================
# Compute cost
# ==============================================================================================
class ComputeCostNet(nn.Module):
    """Table MLP -> per-table *masses* summed over the shard -> head with two outputs (fw, bw).

    Every variant sums a non-negative per-table vector over the shard (so the search can keep a
    running sum per device and add a table in O(1)); they differ in what the vector is:

    - ``"additive"`` (default): the table MLP gives each table two log-costs ``s`` (fw, bw) and a
      representation ``e``; the shard's base cost is ``sum(exp(s))``, the sum of per-table costs,
      and the head turns ``[sum(relu(e)), log(base)]`` into a multiplicative correction
      ``exp(r)`` (fusion, cache and memory effects of the shard as a whole): cost = base x exp(r).
      The correction starts at 1 (zero-initialised last layer), so a table's cost is learned from
      every shard it appears in, and a table alone is predicted as well as in company.
    - ``"lse"``: log-masses ``z``, pooled as ``log(sum(exp(z)))`` per channel, a head predicting log costs.
    - ``"sum"``: ReLU representations summed, a softplus head (the plain DeepSets form).
    """

    CLAMP = 30.0
    POOLINGS = ("additive", "lse", "sum")

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.pooling = cfg.pooling
        if self.pooling not in self.POOLINGS:
            raise ShardError(f"unknown compute model pooling {self.pooling!r} ({', '.join(self.POOLINGS)})")
        extra = 2 if self.pooling == "additive" else 0
        self.table = mlp([NUM_FEATURES, cfg.hidden, cfg.hidden, cfg.embed + extra], last_act=False)
        self.head = mlp([cfg.embed + extra, cfg.head_hidden, cfg.head_hidden, 2], last_act=False)
        if self.pooling == "additive":
            nn.init.zeros_(self.head[-1].weight)
            nn.init.zeros_(self.head[-1].bias)

    def mass(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., 21]`` standardised features -> ``[..., M]`` non-negative masses (summed over a shard)."""
        z = self.table(x)
        if self.pooling == "additive":
            return torch.cat([torch.exp(z[..., :2].clamp(-self.CLAMP, self.CLAMP)), torch.relu(z[..., 2:])], -1)
        if self.pooling == "lse":
            return torch.exp(z.clamp(-self.CLAMP, self.CLAMP))
        return torch.relu(z)

    def cost(self, m: torch.Tensor) -> torch.Tensor:
        """Summed masses ``[..., M]`` (a non-empty shard) -> ``[..., 2]`` costs in target units."""
        if self.pooling == "additive":
            base = m[..., :2].clamp_min(1e-30)
            r = self.head(torch.cat([m[..., 2:], torch.log(base)], -1))
            return base * torch.exp(r.clamp(-self.CLAMP, self.CLAMP))
        if self.pooling == "lse":
            return torch.exp(self.head(torch.log(m.clamp_min(1e-30))).clamp(max=self.CLAMP))
        return nn.functional.softplus(self.head(m))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``x [N, T, 21]``, ``mask [N, T]`` (1 = a real table) -> ``[N, 2]`` costs in target units."""
        return self.cost((self.mass(x) * mask.unsqueeze(-1)).sum(1))


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
        """Rebuild the NumPy copies after the network's weights changed."""
        self.net.eval()
        self._pooling = self.net.pooling
        self._table_np = NumpyMLP(self.net.table)
        self._head_np = NumpyMLP(self.net.head)
        self._scale_np = np.asarray(self.target_scale, dtype=np.float64)

    # -- inference (NumPy) -------------------------------------------------------------------
    def features(self, tables: Sequence[TableConfig]) -> np.ndarray:
        return self.scaler.transform(tables, dtype=np.float64)

    @property
    def mass_size(self) -> int:
        return self.cfg.embed + (2 if self._pooling == "additive" else 0)

    def table_embeddings(self, tables: Sequence[TableConfig]) -> np.ndarray:
        """``[T, M]``: each table's masses, *summed* over a shard before :meth:`head`."""
        if not tables:
            return np.zeros((0, self.mass_size))
        z = self._table_np(self.features(tables))
        c = ComputeCostNet.CLAMP
        if self._pooling == "additive":
            return np.concatenate([np.exp(np.clip(z[:, :2], -c, c)), np.maximum(z[:, 2:], 0.0)], axis=1)
        if self._pooling == "lse":
            return np.exp(np.clip(z, -c, c))
        return np.maximum(z, 0.0)

    def head(self, emb_sum: np.ndarray) -> np.ndarray:
        """Summed masses ``[..., M]`` of a non-empty shard -> ``[..., 2]`` (fw, bw) in ms."""
        c = ComputeCostNet.CLAMP
        if self._pooling == "additive":
            base = np.maximum(emb_sum[..., :2], 1e-30)
            r = self._head_np(np.concatenate([emb_sum[..., 2:], np.log(base)], axis=-1))
            return base * np.exp(np.clip(r, -c, c)) * self._scale_np
        if self._pooling == "lse":
            z = self._head_np(np.log(np.maximum(emb_sum, 1e-30)))
            return np.exp(np.minimum(z, c)) * self._scale_np
        return softplus_np(self._head_np(emb_sum)) * self._scale_np

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
                "setting": _plain(self.setting)}

    @classmethod
    def from_state(cls, obj: dict, where: str = "checkpoint") -> "ComputeCostModel":
        _check_state(obj, cls.kind, where)
        cfg = ModelConfig.from_dict(obj["config"])
        net = ComputeCostNet(cfg)
        net.load_state_dict(obj["state_dict"])
        return cls(cfg, FeatureScaler.from_state(obj["scaler"], LOG_FEATURES), net, tuple(obj["target_scale"]),
                   dict(obj.get("metrics", {})), dict(obj.get("setting", {})))


# ==============================================================================================
# Communication cost
# ==============================================================================================
BW_FEATURES = ("dim", "dim_sum", "dim_max", "dim_mean", "dim_min", "sent", "received", "ndevices")
FW_FEATURES = BW_FEATURES + ("wait", "delay", "delay_max", "delay_mean")


def comm_features(dim_sums: np.ndarray, delays_ms: np.ndarray | None, with_delays: bool) -> np.ndarray:
    """Raw per-device features ``[G, D, F]`` from dim sums ``[G, D]`` (and delays ``[G, D]``).

    ``sent``: the elements per sample a device sends to the others (its dim sum times the share of
    the batch that is remote); ``received``: the elements it receives (the others' dim sums, for
    its own slice of the batch). ``wait``: how long the device waits for the latest starter;
    ``delay``: its own start delay above the earliest device's.
    """
    dims = np.asarray(dim_sums, dtype=np.float64)
    if dims.ndim == 1:
        dims = dims[None]
    g, d = dims.shape
    total = dims.sum(1, keepdims=True)
    feats = [dims,
             np.broadcast_to(total, (g, d)),
             np.broadcast_to(dims.max(1, keepdims=True), (g, d)),
             np.broadcast_to(total / d, (g, d)),
             np.broadcast_to(dims.min(1, keepdims=True), (g, d)),
             dims * (d - 1) / d,
             (total - dims) / d,
             np.full((g, d), float(d))]
    if with_delays:
        if delays_ms is None:
            delays = np.zeros_like(dims)
        else:
            delays = np.asarray(delays_ms, dtype=np.float64).reshape(g, d)
        rel = delays - delays.min(1, keepdims=True)
        feats += [rel.max(1, keepdims=True) - rel, rel,
                  np.broadcast_to(rel.max(1, keepdims=True), (g, d)),
                  np.broadcast_to(rel.mean(1, keepdims=True), (g, d))]
    return np.stack(feats, axis=-1)


class CommCostNet(nn.Module):
    def __init__(self, cfg: ModelConfig, num_features: int):
        super().__init__()
        self.device = mlp([num_features, cfg.hidden, cfg.embed], last_act=False)
        self.head = mlp([num_features + 3 * cfg.embed, cfg.head_hidden, cfg.head_hidden, 1], last_act=False)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``x [N, D, F]`` standardised features, ``mask [N, D]`` (1 = a real device) -> ``[N, D]``."""
        h = torch.relu(self.device(x))
        m = mask.unsqueeze(-1)
        mean = (h * m).sum(1, keepdim=True) / m.sum(1, keepdim=True).clamp_min(1.0)
        mx = h.masked_fill(m == 0, 0.0).max(1, keepdim=True).values   # h >= 0, so padding as 0 is safe
        z = torch.cat([x, h, mean.expand_as(h), mx.expand_as(h)], dim=-1)
        return nn.functional.softplus(self.head(z)).squeeze(-1)


@dataclass
class CommCostModel:
    """A trained forward (``kind="fw_comm"``, uses delays) or backward (``"bw_comm"``) comm model."""

    kind: str
    cfg: ModelConfig
    mean: np.ndarray          # feature standardisation, fitted on the training split
    std: np.ndarray
    net: CommCostNet
    target_scale: float = 1.0
    metrics: dict = field(default_factory=dict)
    setting: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.kind not in ("fw_comm", "bw_comm"):
            raise ShardError(f"unknown communication model kind {self.kind!r}")
        self.mean = np.asarray(self.mean, dtype=np.float64)
        self.std = np.asarray(self.std, dtype=np.float64)
        if not (np.isfinite(self.mean).all() and np.isfinite(self.std).all() and (self.std > 0).all()):
            raise ShardError(f"{self.kind} model: feature means must be finite and standard deviations finite "
                             "and positive")
        self.refresh()

    @property
    def with_delays(self) -> bool:
        return self.kind == "fw_comm"

    def refresh(self) -> None:
        self.net.eval()
        self._dev_np = NumpyMLP(self.net.device, relu_last=True)
        self._head_np = NumpyMLP(self.net.head)

    def standardise(self, raw: np.ndarray) -> np.ndarray:
        return (raw - self.mean) / self.std

    def predict(self, dim_sums: np.ndarray, delays_ms: np.ndarray | None = None) -> np.ndarray:
        """Per-device time in ms, ``[G, D]`` for ``dim_sums [G, D]`` (a single plan ``[D]`` -> ``[D]``)."""
        single = np.asarray(dim_sums).ndim == 1
        x = self.standardise(comm_features(dim_sums, delays_ms, self.with_delays))
        h = self._dev_np(x)
        g, d, e = h.shape
        z = np.concatenate([x, h, np.broadcast_to(h.mean(1, keepdims=True), (g, d, e)),
                            np.broadcast_to(h.max(1, keepdims=True), (g, d, e))], axis=-1)
        out = softplus_np(self._head_np(z))[..., 0] * self.target_scale
        return out[0] if single else out

    def state(self) -> dict:
        return {"method": METHOD, "kind": self.kind, "version": VERSION, "config": self.cfg.to_dict(),
                "features": list(FW_FEATURES if self.with_delays else BW_FEATURES),
                "feature_mean": [float(v) for v in self.mean], "feature_std": [float(v) for v in self.std],
                "target_scale": float(self.target_scale), "state_dict": self.net.state_dict(),
                "metrics": _plain(self.metrics), "setting": _plain(self.setting)}

    @classmethod
    def from_state(cls, obj: dict, kind: str | None = None, where: str = "checkpoint") -> "CommCostModel":
        kind = kind or obj.get("kind")
        _check_state(obj, kind, where)
        expected = list(FW_FEATURES if kind == "fw_comm" else BW_FEATURES)
        if list(obj.get("features", [])) != expected:
            raise ShardError(f"{where}: the {kind} model was trained on other features "
                             f"({obj.get('features')}), this code computes {expected}")
        cfg = ModelConfig.from_dict(obj["config"])
        net = CommCostNet(cfg, len(expected))
        net.load_state_dict(obj["state_dict"])
        return cls(kind, cfg, np.asarray(obj["feature_mean"]), np.asarray(obj["feature_std"]), net,
                   float(obj["target_scale"]), dict(obj.get("metrics", {})), dict(obj.get("setting", {})))


# ==============================================================================================
# Checkpoints
# ==============================================================================================
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


# ==============================================================================================
# Training
# ==============================================================================================
@dataclass
class FitResult:
    best_epoch: int
    val_mape: float
    test_mape: dict          # name -> MAPE in percent on the held-out test split
    num_train: int
    num_val: int
    num_test: int
    seconds: float
    history: list = field(default_factory=list)   # per epoch (train loss, val MAPE)


def split_indices(n: int, val_fraction: float, test_fraction: float, seed: int
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Seeded random train / validation / test split (each non-empty when ``n >= 3``)."""
    if n < 3:
        raise ShardError(f"need at least 3 samples to split into train/validation/test, got {n}")
    perm = np.random.default_rng(seed).permutation(n)
    n_test = max(1, int(round(n * test_fraction)))
    n_val = max(1, int(round(n * val_fraction)))
    n_test = min(n_test, n - 2)
    n_val = min(n_val, n - n_test - 1)
    return perm[n_test + n_val:], perm[n_test:n_test + n_val], perm[:n_test]


def _check_targets(values: np.ndarray, what: str) -> None:
    """Training data are finite numbers >= 0 (the readers refuse others with their line; this guards
    every caller)."""
    if values.size and not (np.isfinite(values).all() and (values >= 0).all()):
        bad = values[~(np.isfinite(values) & (values >= 0))].ravel()[0]
        raise ShardError(f"{what} must be finite numbers >= 0 to train on, got {bad!r}")


# validation samples below which "beats its untrained self" is not judged (a handful of noisy
# measurements cannot tell two models apart; the tiny test pipelines have 3-6)
MIN_JUDGED_VALIDATION = 20


def _train_loop(net: nn.Module, cfg: ModelConfig, train: tuple[torch.Tensor, ...],
                predict: Callable[[tuple[torch.Tensor, ...]], torch.Tensor],
                target: Callable[[tuple[torch.Tensor, ...]], torch.Tensor],
                weight: Callable[[tuple[torch.Tensor, ...]], torch.Tensor],
                val_score: Callable[[], float], epochs: int, progress=None, val_count: int | None = None
                ) -> tuple[int, float, list]:
    """Minimise the weighted squared log error; keep the weights of the epoch with the best validation score.

    The kept model must beat the untrained one on the validation data when that holds at least
    :data:`MIN_JUDGED_VALIDATION` samples (``val_count``; None: always); on fewer, the two scores are
    within each other's noise and the rule is not applied."""
    opt = torch.optim.Adam(net.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=cfg.lr_decay)
    gen = torch.Generator().manual_seed(cfg.seed)
    n = train[0].shape[0]
    net.eval()
    untrained = val_score()   # the bar a trained model must beat to be kept
    best = (math.inf, -1, copy.deepcopy(net.state_dict()))
    history = []
    for epoch in range(epochs):
        net.train()
        perm = torch.randperm(n, generator=gen)
        total, count = 0.0, 0
        for start in range(0, n, cfg.batch_size):
            idx = perm[start:start + cfg.batch_size]
            batch = tuple(t[idx] for t in train)
            pred = predict(batch)
            y = target(batch)
            w = weight(batch)
            err = (torch.log(pred.clamp_min(1e-6)) - torch.log(y)) ** 2
            loss = (err * w).sum() / w.sum().clamp_min(1.0)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(idx)
            count += len(idx)
        sched.step()
        net.eval()
        score = val_score()
        history.append((total / max(count, 1), score))
        if math.isfinite(score) and score < best[0] and io.nonfinite_entry(net.state_dict()) is None:
            best = (score, epoch, copy.deepcopy(net.state_dict()))
        if progress is not None:
            progress.update(1)
            progress.set_postfix(loss=f"{total / max(count, 1):.4f}", val_mape=f"{score:.2f}%",
                                 best=f"{best[0]:.2f}%@{best[1]}")
    if best[1] < 0:
        # no epoch gave a finite validation score with finite weights: the training diverged
        last = history[-1][1] if history else float("nan")
        raise ShardError(f"training diverged: no epoch has finite weights and a finite validation MAPE (last "
                         f"{last:.2f}%, {untrained:.2f}% untrained); nothing saved: check the cost data, or lower "
                         "--lr")
    judged = val_count is None or val_count >= MIN_JUDGED_VALIDATION
    if judged and math.isfinite(untrained) and not best[0] < untrained:
        raise ShardError(f"training did not beat the untrained model on its own validation data (best validation "
                         f"MAPE {best[0]:.2f}% vs {untrained:.2f}% untrained); nothing saved: check the cost data, "
                         "or raise --epochs / lower --lr")
    net.load_state_dict(best[2])
    net.eval()
    return best[1], best[0], history


def _pad_shards(feats: Sequence[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
    n = len(feats)
    t_max = max((f.shape[0] for f in feats), default=1) or 1
    x = np.zeros((n, t_max, NUM_FEATURES), dtype=np.float32)
    m = np.zeros((n, t_max), dtype=np.float32)
    for k, f in enumerate(feats):
        x[k, :len(f)] = f
        m[k, :len(f)] = 1.0
    return torch.from_numpy(x), torch.from_numpy(m)


def fit_compute_model(shards: Sequence[Sequence[TableConfig]], costs: np.ndarray,
                      cfg: ModelConfig | None = None, setting: dict | None = None, progress=None,
                      scaler: FeatureScaler | None = None) -> tuple[ComputeCostModel, FitResult]:
    """Fit the compute model to measured shards: ``costs[k] = (fw_ms, bw_ms)`` of ``shards[k]``."""
    cfg = cfg or compute_model_config()
    t0 = time.perf_counter()
    costs = np.asarray(costs, dtype=np.float64).reshape(len(shards), 2)
    _check_targets(costs, "compute costs")
    keep = [k for k, s in enumerate(shards) if len(s) > 0]
    shards = [list(shards[k]) for k in keep]
    costs = np.maximum(costs[keep], EPS_MS)
    tr, va, te = split_indices(len(shards), cfg.val_fraction, cfg.test_fraction, cfg.seed)
    scaler = scaler or FeatureScaler.fit([t for k in tr for t in shards[k]], LOG_FEATURES)
    scale = tuple(float(v) for v in costs[tr].mean(0))
    torch.manual_seed(cfg.seed)
    model = ComputeCostModel(cfg, scaler, ComputeCostNet(cfg), scale, setting=dict(setting or {}))
    feats = [scaler.transform(s, dtype=np.float64) for s in shards]
    x, m = _pad_shards(feats)
    y = torch.from_numpy((costs / np.asarray(scale)).astype(np.float32))
    net = model.net

    def totals(idx) -> tuple[np.ndarray, np.ndarray]:
        with torch.no_grad():
            pred = net(x[idx], m[idx]).double().numpy() * np.asarray(scale)
        return pred, costs[idx]

    def val_score() -> float:
        pred, true = totals(va)
        return mape(pred.sum(1), true.sum(1))

    train = (x[tr], m[tr], y[tr])
    best_epoch, best_val, history = _train_loop(
        net, cfg, train, predict=lambda b: net(b[0], b[1]), target=lambda b: b[2],
        weight=lambda b: torch.ones_like(b[2]), val_score=val_score, epochs=cfg.epochs, progress=progress,
        val_count=len(va))
    pred, true = totals(te)
    test = {"total": mape(pred.sum(1), true.sum(1)), "fw": mape(pred[:, 0], true[:, 0]),
            "bw": mape(pred[:, 1], true[:, 1])}
    result = FitResult(best_epoch, best_val, test, len(tr), len(va), len(te), time.perf_counter() - t0, history)
    model.metrics = {"best_epoch": best_epoch, "val_mape": best_val, "test_mape": test,
                     "num_train": len(tr), "num_val": len(va), "num_test": len(te)}
    model.refresh()
    return model, result


def _pad_devices(dims: Sequence[np.ndarray], delays: Sequence[np.ndarray] | None, with_delays: bool,
                 targets: Sequence[np.ndarray] | None = None):
    """Per-sample features of possibly different device counts, padded to the largest."""
    d_max = max(len(d) for d in dims)
    n = len(dims)
    f = len(FW_FEATURES if with_delays else BW_FEATURES)
    x = np.zeros((n, d_max, f))
    m = np.zeros((n, d_max))
    y = np.ones((n, d_max))
    for k, d in enumerate(dims):
        dl = None if delays is None else delays[k]
        x[k, :len(d)] = comm_features(np.asarray(d)[None], None if dl is None else np.asarray(dl)[None],
                                      with_delays)[0]
        m[k, :len(d)] = 1.0
        if targets is not None:
            y[k, :len(d)] = targets[k]
    return x, m, y


def fit_comm_model(kind: str, dim_sums: Sequence[Sequence[float]], targets_ms: Sequence[Sequence[float]],
                   delays_ms: Sequence[Sequence[float]] | None = None, cfg: ModelConfig | None = None,
                   setting: dict | None = None, progress=None) -> tuple[CommCostModel, FitResult]:
    """Fit a communication model: ``targets_ms[k][d]`` is device ``d``'s time in sample ``k``.
    ``kind="fw_comm"`` uses ``delays_ms`` (zeros if ``None``); ``"bw_comm"`` ignores them."""
    if kind not in ("fw_comm", "bw_comm"):
        raise ShardError(f"unknown communication model kind {kind!r}")
    cfg = cfg or comm_model_config()
    t0 = time.perf_counter()
    with_delays = kind == "fw_comm"
    dims = [np.asarray(d, dtype=np.float64) for d in dim_sums]
    delays = None if delays_ms is None else [np.asarray(d, dtype=np.float64) for d in delays_ms]
    for what, arrays in (("dim sums", dim_sums), ("delays", delays_ms or []), ("communication costs", targets_ms)):
        for a in arrays:
            _check_targets(np.asarray(a, dtype=np.float64), what)
    targets = [np.maximum(np.asarray(t, dtype=np.float64), EPS_MS) for t in targets_ms]
    if not (len(dims) == len(targets) and (delays is None or len(delays) == len(dims))):
        raise ShardError("dim sums, delays and targets must have one entry per sample")
    raw, m, y = _pad_devices(dims, delays if with_delays else None, with_delays, targets)
    tr, va, te = split_indices(len(dims), cfg.val_fraction, cfg.test_fraction, cfg.seed)
    real = m[tr].astype(bool)
    mean = raw[tr][real].mean(0)
    std = raw[tr][real].std(0)
    std[std < 1e-9] = 1.0
    scale = float(y[tr][real].mean())
    torch.manual_seed(cfg.seed)
    net = CommCostNet(cfg, raw.shape[-1])
    model = CommCostModel(kind, cfg, mean, std, net, scale, setting=dict(setting or {}))
    x = torch.from_numpy(((raw - mean) / std).astype(np.float32))
    mt = torch.from_numpy(m.astype(np.float32))
    yt = torch.from_numpy((y / scale).astype(np.float32))

    def score(idx) -> float:
        with torch.no_grad():
            pred = net(x[idx], mt[idx]).double().numpy() * scale
        real = m[idx].astype(bool)
        return mape(pred[real], y[idx][real])

    train = (x[tr], mt[tr], yt[tr])
    best_epoch, best_val, history = _train_loop(
        net, cfg, train, predict=lambda b: net(b[0], b[1]), target=lambda b: b[2].clamp_min(1e-6),
        weight=lambda b: b[1], val_score=lambda: score(va), epochs=cfg.epochs, progress=progress,
        val_count=len(va))
    test = {"per_device": score(te)}
    result = FitResult(best_epoch, best_val, test, len(tr), len(va), len(te), time.perf_counter() - t0, history)
    model.metrics = {"best_epoch": best_epoch, "val_mape": best_val, "test_mape": test,
                     "num_train": len(tr), "num_val": len(va), "num_test": len(te)}
    model.refresh()
    return model, result
