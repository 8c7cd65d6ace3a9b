"""The network building block every learned method uses."""

from __future__ import annotations

from typing import Sequence

from torch import nn


def mlp(sizes: Sequence[int], *, last_act: bool) -> nn.Sequential:
    """Linear layers ``sizes[0] -> sizes[1] -> ... -> sizes[-1]`` with a ReLU after each hidden one,
    and after the last one too when ``last_act`` (no default: every caller says which it means)."""
    layers: list[nn.Module] = []
    for k in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[k], sizes[k + 1]))
        if last_act or k < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)
