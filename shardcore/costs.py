"""The four parts of a device's cost in a plan, in the order every result, cache row, table and plot
keeps them: forward compute (the fused embedding lookups over the whole batch), forward
communication (the all-to-all of pooled embeddings), backward communication (the all-to-all of
their gradients) and backward compute (gradients and sparse optimizer update), in ms. A plan's cost
is the maximum over its devices of the sum of the four."""

COST_PARTS = ("fw_comp", "fw_comm", "bw_comm", "bw_comp")


def expected_slowest(compute, comm, ratios, draws: int = 1000, seed: int = 0):
    """The expected slowest device when each device's compute is off by an independent factor drawn
    from ``ratios`` (e.g. a cost model's held-out measured / predicted ratios): the mean over
    ``draws`` draws of ``max_d(compute[..., d] x r_d + comm[..., d])``. ``compute`` and ``comm`` are
    arrays with devices on the last axis (leading axes: several plans, each given the same draws, so
    plans of one task are compared under common random numbers)."""
    import numpy as np

    comp = np.asarray(compute, dtype=float)
    com = np.asarray(comm, dtype=float)
    r = np.asarray(ratios, dtype=float)
    if r.ndim != 1 or len(r) == 0 or not np.all(np.isfinite(r)) or np.any(r <= 0):
        raise ValueError("ratios must be a non-empty list of positive finite numbers")
    rng = np.random.default_rng(seed)
    R = r[rng.integers(0, len(r), size=(int(draws), comp.shape[-1]))]          # [draws, devices]
    total = comp[..., None, :] * R + com[..., None, :]                           # [..., draws, devices]
    return total.max(axis=-1).mean(axis=-1)
