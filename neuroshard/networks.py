"""NeuroShard's cost networks (PyTorch) and their inputs.

**Compute cost of a shard** (:class:`ComputeCostNet`): each table's 21 standardised features
(:class:`~shardcore.data.features.FeatureScaler`, all four scaled features on a log scale:
:data:`LOG_FEATURES`) go through a table MLP; its outputs are *summed* over the shard; a head MLP
predicts the shard's forward and backward compute cost (two outputs; their sum is the shard's
compute cost). The sum makes the model apply to shards of any number of tables. By default
(``pooling="additive"``) the table MLP predicts each table's own costs, whose sum is the shard's
base cost, and the head a multiplicative shard-level correction of it. An empty shard costs nothing.

**Communication per device** (:class:`CommCostNet`, one for the forward all-to-all and one for
the backward): the input is a plan's per-device dim sums (and, for the forward exchange, the
per-device start delays that imbalanced compute causes). Each device gets a vector of raw
features (:func:`comm_features`: its own dim sum, elements sent and received, its wait for the
latest device, ...) and the whole exchange's pooled context (sum / max / mean over devices); a
per-device MLP encodes it, the encodings are pooled (mean and max over devices) and a head maps
``[own features, own encoding, pooled encodings]`` to that device's time. The same weights serve
every device, so the model is permutation-equivariant over devices and applies to any device count.

The trained models around these networks (standardisation, target scale, checkpoints) are in
:mod:`neuroshard.checkpoints`, their NumPy copies for the search in :mod:`neuroshard.numpy_nets`,
their training in :mod:`neuroshard.fitting`.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from shardcore.errors import ShardError
from shardcore.layers import mlp
from shardcore.data.features import FEATURE_NAMES, NUM_FEATURES, SCALED_FEATURES

from .config import ModelConfig

# The compute model's table features: dim and pooling_factor on a log scale too (as row and size are
# for every method): a shard's compute is roughly multiplicative in them (lookups x dim).
LOG_FEATURES = SCALED_FEATURES
PF_COLUMN = FEATURE_NAMES.index("pooling_factor")
LN10 = float(np.log(10.0))


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
    - ``"affine"``: as ``"additive"`` plus a learned per-shard constant ``c`` (fw, bw): the base is
      ``exp(c) + sum(exp(s))``, so a table's mass is its *marginal* cost in a shard (what the
      search's greedy compares) rather than its cost alone, which also pays the shard's fixed
      costs (kernel launches, the output write: on the emulated H200 ~0.46 ms of a 12-table
      shard's ~3 ms). The masses, and so the search's running sums, are the same as ``"additive"``'s.
    - ``"lse"``: log-masses ``z``, pooled as ``log(sum(exp(z)))`` per channel, a head predicting log costs.
    - ``"sum"``: ReLU representations summed, a softplus head (the plain DeepSets form).
    """

    CLAMP = 30.0
    POOLINGS = ("additive", "affine", "lse", "sum")
    ADDITIVE = ("additive", "affine")   # per-table log costs + a representation, a multiplicative head

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.pooling = cfg.pooling
        if self.pooling not in self.POOLINGS:
            raise ShardError(f"unknown compute model pooling {self.pooling!r} ({', '.join(self.POOLINGS)})")
        extra = 2 if self.pooling in self.ADDITIVE else 0
        self.table = mlp([NUM_FEATURES + bool(cfg.length_cv_feature), cfg.hidden, cfg.hidden, cfg.embed + extra],
                         last_act=False)
        self.head = mlp([cfg.embed + extra, cfg.head_hidden, cfg.head_hidden, 2], last_act=False)
        if self.pooling == "affine":   # exp(-2): ~0.14 of the mean shard's cost to start with
            self.shard_log_const = nn.Parameter(torch.full((2,), -2.0))
        # per_lookup (additive poolings): a table's cost masses are (1 + pooling factor) x exp(MLP), the MLP
        # giving a cost per lookup, so a table heavier than any seen in training extrapolates linearly in its
        # lookups instead of along the MLP's last linear piece; ``pf_scale`` (log10(1 + pf)'s standardisation
        # mean and std) is set by the fit from the feature scaler and saved with the weights
        self.per_lookup = bool(getattr(cfg, "per_lookup", False)) and self.pooling in self.ADDITIVE
        if self.per_lookup:
            self.register_buffer("pf_scale", torch.tensor([0.0, 1.0]))
        if self.pooling in self.ADDITIVE:
            nn.init.zeros_(self.head[-1].weight)
            nn.init.zeros_(self.head[-1].bias)

    def mass(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., 21]`` standardised features -> ``[..., M]`` non-negative masses (summed over a shard)."""
        z = self.table(x)
        if self.pooling in self.ADDITIVE:
            s = z[..., :2]
            if self.per_lookup:   # + ln(1 + pf), from the standardised log10(1 + pf) feature
                s = s + (x[..., PF_COLUMN:PF_COLUMN + 1] * self.pf_scale[1] + self.pf_scale[0]) * LN10
            return torch.cat([torch.exp(s.clamp(-self.CLAMP, self.CLAMP)), torch.relu(z[..., 2:])], -1)
        if self.pooling == "lse":
            return torch.exp(z.clamp(-self.CLAMP, self.CLAMP))
        return torch.relu(z)

    def cost(self, m: torch.Tensor) -> torch.Tensor:
        """Summed masses ``[..., M]`` (a non-empty shard) -> ``[..., 2]`` costs in target units."""
        if self.pooling in self.ADDITIVE:
            base = m[..., :2]
            if self.pooling == "affine":
                base = base + torch.exp(self.shard_log_const.clamp(-self.CLAMP, self.CLAMP))
            base = base.clamp_min(1e-30)
            r = self.head(torch.cat([m[..., 2:], torch.log(base)], -1))
            return base * torch.exp(r.clamp(-self.CLAMP, self.CLAMP))
        if self.pooling == "lse":
            return torch.exp(self.head(torch.log(m.clamp_min(1e-30))).clamp(max=self.CLAMP))
        return nn.functional.softplus(self.head(m))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``x [N, T, 21]``, ``mask [N, T]`` (1 = a real table) -> ``[N, 2]`` costs in target units."""
        return self.cost((self.mass(x) * mask.unsqueeze(-1)).sum(1))



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

