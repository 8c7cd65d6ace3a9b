"""The fast NumPy copy of NeuroShard's cost networks, for the search.

The same weights as the PyTorch networks of :mod:`neuroshard.networks`, evaluated with NumPy
(float64): no autograd or dispatcher overhead, which matters when thousands of candidate plans are
scored. :class:`NumpyComputeNet` gives a table's *masses* (summed over a shard, so the search keeps
a running sum per device and adds a table in O(1)) and a shard's costs from its summed masses;
:class:`NumpyCommNet` gives every device's exchange time from its standardised features. Both are
rebuilt from the networks whenever the weights change (:meth:`ComputeCostModel.refresh`).
"""

from __future__ import annotations

import numpy as np
from torch import nn

from .networks import LN10, PF_COLUMN, CommCostNet, ComputeCostNet


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


class NumpyComputeNet:
    """:class:`~neuroshard.networks.ComputeCostNet` in NumPy: :meth:`masses` per table, :meth:`cost`
    of a shard's summed masses (in the network's target units)."""

    def __init__(self, net: ComputeCostNet):
        self.pooling = net.pooling
        self.table = NumpyMLP(net.table)
        self.head = NumpyMLP(net.head)
        self.const = (np.exp(np.clip(net.shard_log_const.detach().double().numpy(), -ComputeCostNet.CLAMP,
                                     ComputeCostNet.CLAMP)) if net.pooling == "affine" else None)

        self.pf_scale = net.pf_scale.detach().double().numpy().copy() if net.per_lookup else None

    def masses(self, x: np.ndarray) -> np.ndarray:
        """Standardised table features ``[T, 21]`` -> ``[T, M]`` non-negative masses."""
        z = self.table(x)
        c = ComputeCostNet.CLAMP
        if self.pooling in ComputeCostNet.ADDITIVE:
            s = z[:, :2]
            if self.pf_scale is not None:
                s = s + (x[:, PF_COLUMN:PF_COLUMN + 1] * self.pf_scale[1] + self.pf_scale[0]) * LN10
            return np.concatenate([np.exp(np.clip(s, -c, c)), np.maximum(z[:, 2:], 0.0)], axis=1)
        if self.pooling == "lse":
            return np.exp(np.clip(z, -c, c))
        return np.maximum(z, 0.0)

    def cost(self, emb_sum: np.ndarray) -> np.ndarray:
        """Summed masses ``[..., M]`` of a non-empty shard -> ``[..., 2]`` (fw, bw) in target units."""
        c = ComputeCostNet.CLAMP
        if self.pooling in ComputeCostNet.ADDITIVE:
            base = emb_sum[..., :2]
            if self.const is not None:
                base = base + self.const
            base = np.maximum(base, 1e-30)
            r = self.head(np.concatenate([emb_sum[..., 2:], np.log(base)], axis=-1))
            return base * np.exp(np.clip(r, -c, c))
        if self.pooling == "lse":
            z = self.head(np.log(np.maximum(emb_sum, 1e-30)))
            return np.exp(np.minimum(z, c))
        return softplus_np(self.head(emb_sum))


class NumpyCommNet:
    """:class:`~neuroshard.networks.CommCostNet` in NumPy: standardised per-device features
    ``[G, D, F]`` -> ``[G, D]`` times in target units."""

    def __init__(self, net: CommCostNet):
        self.device = NumpyMLP(net.device, relu_last=True)
        self.head = NumpyMLP(net.head)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        h = self.device(x)
        g, d, e = h.shape
        z = np.concatenate([x, h, np.broadcast_to(h.mean(1, keepdims=True), (g, d, e)),
                            np.broadcast_to(h.max(1, keepdims=True), (g, d, e))], axis=-1)
        return softplus_np(self.head(z))[..., 0]
