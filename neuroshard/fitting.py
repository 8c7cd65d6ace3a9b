"""Fitting NeuroShard's cost models (:func:`fit_compute_model`, :func:`fit_comm_model`).

The samples are split into train / validation / test (seeded); the loss is the squared error of log
costs (relative errors, so cheap and expensive shards count alike); after every epoch the
validation MAPE is computed and the best epoch's weights are kept; the held-out test MAPE is
reported. Feature standardisation (:class:`~shardcore.data.features.FeatureScaler` for tables, its base
:class:`~shardcore.data.features.Standardiser` for the communication features) and the target scale are
fitted on the training split and saved in the checkpoint (:mod:`neuroshard.checkpoints`).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch
from torch import nn

from shardcore import io
from shardcore.errors import ShardError
from shardcore.tables import TableConfig
from shardcore.data.features import NUM_FEATURES, SCALED_FEATURES, FeatureScaler, Standardiser

from .checkpoints import CommCostModel, ComputeCostModel
from .config import ModelConfig, comm_model_config, compute_model_config
from .networks import BW_FEATURES, FW_FEATURES, LOG_FEATURES, CommCostNet, ComputeCostNet, comm_features

EPS_MS = 1e-3   # costs are clipped at 1 microsecond before logs and relative errors


def mape(pred: np.ndarray, true: np.ndarray) -> float:
    """Mean absolute percentage error, in percent."""
    pred, true = np.asarray(pred, dtype=np.float64), np.asarray(true, dtype=np.float64)
    if pred.size == 0:
        return float("nan")
    return float(np.mean(np.abs(pred - true) / np.maximum(np.abs(true), EPS_MS)) * 100.0)


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
    width = next((f.shape[1] for f in feats if f.ndim == 2), NUM_FEATURES)
    x = np.zeros((n, t_max, width), dtype=np.float32)
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
    scaler = scaler or FeatureScaler.fit([t for k in tr for t in shards[k]], LOG_FEATURES, length_cv=cfg.length_cv_feature)
    cfg = dataclasses.replace(cfg, length_cv_feature=scaler.cv_default is not None)   # no CV in the data: 21
    scale = tuple(float(v) for v in costs[tr].mean(0))
    torch.manual_seed(cfg.seed)
    net = ComputeCostNet(cfg)
    if net.per_lookup:   # log10(1 + pf)'s standardisation, to undo it inside the network
        k = list(SCALED_FEATURES).index("pooling_factor")
        net.pf_scale.copy_(torch.tensor([float(scaler.mean[k]), float(scaler.std[k])]))
    model = ComputeCostModel(cfg, scaler, net, scale, setting=dict(setting or {}))
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
    noise = float(cfg.feature_noise)
    gen = torch.Generator().manual_seed(cfg.seed + 1)

    def predict(b):
        if noise > 0 and net.training:   # per-table jitter of the standardised features (not of the target)
            return net(b[0] + noise * torch.randn(b[0].shape, generator=gen) * b[1].unsqueeze(-1), b[1])
        return net(b[0], b[1])

    best_epoch, best_val, history = _train_loop(
        net, cfg, train, predict=predict, target=lambda b: b[2],
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
    scaler = Standardiser.fit_array(raw[tr][real], min_std=1e-9)
    scale = float(y[tr][real].mean())
    torch.manual_seed(cfg.seed)
    net = CommCostNet(cfg, raw.shape[-1])
    model = CommCostModel(kind, cfg, scaler, net, scale, setting=dict(setting or {}))
    x = torch.from_numpy(scaler.apply(raw).astype(np.float32))
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
                     "num_train": len(tr), "num_val": len(va), "num_test": len(te),
                     "ndevices": sorted({len(d) for d in dims})}   # CommCostModel.device_counts
    model.refresh()
    return model, result
