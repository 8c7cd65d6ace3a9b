"""Calibrating a card (:mod:`shardcore.oracles.emulated.card`) on the hardware a measuring oracle runs on.

**The design** (:func:`design_shards`) is counted, not timed: ``shards`` devices, drawn with ``seed`` from
the dataset's looked-up tables outside the tables to avoid (a planner's test tasks), so the same command
on the same dataset measures the same shards. The tables are chosen to cover the ranges planners ask
about -- the largest and smallest table, the longest pooling, the narrowest and widest dim, the rest
evenly spaced in lookup work (pooling factor x dim) -- and dealt into **groups**, one pool of tables each
(pools disjoint while the tables last). Each group measures, from its own pool, :data:`GROUP_KINDS`: single
whole tables, multi-table shards of sizes spread from 2 to ``tables_per_device`` (what a plan's device
holds), a shard with column blocks (half or a quarter of a table's dim), a row block (a half or a quarter
of a table's rows, its lookups in proportion, beside whole tables or alone) and, with two or more devices,
data-parallel replicas over one device's batch slice (alone or beside a whole table), each piece made as
a plan makes it (:meth:`shardcore.plan.Sharding.pieces`). The groups are what the card's accuracy holds
out whole and ranks within (:func:`~shardcore.oracles.emulated.card.card_accuracy`).

**Measuring** (:func:`calibrate`) goes group by group through the oracle's ``measure_devices`` (a cache
layer stores the whole-table devices, so a second calibration of the machine reads them back); a time
budget is an outer cap only: past it the remaining groups are not measured, and the card says so. With two
or more devices whose exchange the oracle measures, :func:`sweep_exchange` times the pooled all-to-all over
message sizes (equal and unequal widths) and the data-parallel all-reduce over gradient sizes, and fits
latency and bandwidth to each by least squares (:func:`~shardcore.oracles.commmodel.fit_comm_model`); the
card's exchange model takes the all-to-all's (every collective is priced with one pair). With one device,
or an exchange the oracle itself models, the card keeps the exchange model's figures and says which.
Only one host: sweeps across hosts (torchrun) are not made here.
"""

from __future__ import annotations

import json
import math
import time
from typing import Callable, Sequence

import numpy as np

from shardcore.errors import ShardError
from shardcore.oracles.commmodel import CommModel, fit_comm_model, remote_bytes
from shardcore.plan import COLUMN_WISE, DATA_PARALLEL, ROW_WISE, Sharding
from shardcore.tables import TableConfig, bytes_per_element
from shardcore.types import CommLayout

from .card import MeasuredDevice, build_card, exchange_block

GROUP_KINDS = ("table", "table", "multi", "multi", "column", "row", "replica", "multi")
DEFAULT_SHARDS = 240           # the default design: 30 groups of 8 (about 6-8 minutes on a 2-core CPU)
DEFAULT_PER_DEVICE = 12        # the largest multi-table shard without tasks to size it by
MIN_DEVICES = 8                # a card is fitted on at least this many measured devices
SWEEP_DIMS = (4, 16, 64, 256, 1024)            # pooled widths per device of the all-to-all sweep
SWEEP_ALLREDUCE = (1 << 14, 1 << 16, 1 << 18, 1 << 20, 1 << 22)   # gradient elements of the all-reduce sweep


def _pick_tables(pool: list[TableConfig], count: int) -> list[TableConfig]:
    """``count`` tables of ``pool`` covering its ranges: the extremes first (most and fewest rows, longest
    pooling, narrowest and widest dim), then evenly spaced in pooling factor x dim."""
    if count >= len(pool):
        return list(pool)
    chosen: dict[int, TableConfig] = {}
    for key, pick in ((lambda t: t.row, max), (lambda t: t.row, min), (lambda t: t.pooling_factor, max),
                      (lambda t: t.dim, min), (lambda t: t.dim, max)):
        t = pick(pool, key=key)
        chosen.setdefault(t.index, t)
    rest = sorted((t for t in pool if t.index not in chosen), key=lambda t: (t.pooling_factor * t.dim, t.index))
    need = max(0, count - len(chosen))
    for k in np.linspace(0, len(rest) - 1, need).round().astype(int) if need and rest else []:
        chosen.setdefault(rest[k].index, rest[k])
    for t in rest:                       # rounding may repeat a position: fill up in order
        if len(chosen) >= count:
            break
        chosen.setdefault(t.index, t)
    return list(chosen.values())[:count]


def _sizes(top: int) -> list[int]:
    """Multi-table shard sizes from 2 to ``top``, spread geometrically."""
    top = max(2, int(top))
    return sorted({int(round(x)) for x in np.geomspace(2, top, min(top - 1, 5))})


def design_shards(tables: Sequence[TableConfig], shards: int, ndevices: int, *, exclude: set | frozenset = frozenset(),
                  tables_per_device: int | None = None, seed: int = 0) -> list[tuple[str, int, list[TableConfig]]]:
    """The counted design (module notes): ``(kind, group, pieces)`` of at most ``shards`` distinct devices."""
    if int(shards) < 1:
        raise ShardError(f"--shards must be at least 1, got {shards}")
    pool = [t for t in tables if t.index not in exclude and t.pooling_factor > 0]
    if not pool:
        raise ShardError("no table to calibrate on: every looked-up table of the dataset is among the tables to avoid")
    rng = np.random.default_rng(seed)
    per_device = max(2, min(int(tables_per_device or DEFAULT_PER_DEVICE), len(pool)))
    ngroups = math.ceil(int(shards) / len(GROUP_KINDS))
    size = min(len(pool), max(4, per_device))
    picked = _pick_tables(pool, ngroups * size)
    order = [picked[i] for i in rng.permutation(len(picked))]
    sizes = _sizes(per_device)
    out, seen, counter = [], set(), 0
    for g in range(ngroups):
        if len(order) >= (g + 1) * size:             # disjoint pools while the tables last
            members = order[g * size:(g + 1) * size]
        else:                                        # then pools drawn from every picked table
            members = [order[i] for i in rng.choice(len(order), size=size, replace=False)]
        by_work = sorted(members, key=lambda t: (t.pooling_factor * t.dim, t.index))
        for kind in GROUP_KINDS:
            if len(out) >= int(shards):
                break
            counter += 1
            pieces, kind = _shard(kind, members, by_work, sizes[counter % len(sizes)], ndevices, counter, rng)
            key = tuple(sorted(p.key for p in pieces))
            if key in seen:
                k = min(len(members), sizes[(counter + 1) % len(sizes)])
                pieces, kind = [members[i] for i in rng.choice(len(members), size=k, replace=False)], "multi"
                key = tuple(sorted(p.key for p in pieces))
                if key in seen:
                    continue
            seen.add(key)
            out.append((kind, g, pieces))
    return out


def _shard(kind: str, members: list[TableConfig], by_work: list[TableConfig], k: int, ndevices: int, counter: int,
           rng) -> tuple[list[TableConfig], str]:
    """One device of ``kind`` from a group's tables (``by_work``: the same, lightest first)."""
    k = min(k, len(members))
    if kind == "table":
        return [by_work[-1] if counter % 2 else members[int(rng.integers(len(members)))]], "table"
    if kind == "column":
        chosen = [members[i] for i in rng.choice(len(members), size=max(1, k // 2), replace=False)]
        out, split = [], False
        for j, t in enumerate(chosen):
            parts = 4 if (counter + j) % 2 else 2
            if t.dim % parts == 0 and t.dim // parts >= 4 and (not split or j % 2 == 0):
                piece = Sharding(COLUMN_WISE, tuple(range(parts)), (t.dim // parts,) * parts).pieces(t, parts)[0][1]
                out.append(piece)
                split = True
            else:
                out.append(t)
        return out, "column" if split else "multi"
    if kind == "row":
        by_rows = sorted(members, key=lambda x: (x.row, x.index))   # row blocks are for the larger tables
        t = by_rows[-1] if counter % 2 else by_rows[len(by_rows) // 2 + int(rng.integers(len(by_rows) - len(by_rows) // 2))]
        blocks = 4 if counter % 4 in (0, 1) else 2
        pieces = Sharding(ROW_WISE, tuple(range(blocks))).pieces(t, blocks)
        if not pieces or t.row < blocks:
            return [t], "table"
        piece = pieces[int(rng.integers(len(pieces)))][1]
        others = [x for x in members if x.index != t.index]
        extra = [others[i] for i in rng.choice(len(others), size=min(len(others), counter % 3), replace=False)] if others else []
        return [piece] + extra, "row"
    if kind == "replica" and ndevices >= 2:
        light = by_work[:max(1, min(3, 1 + counter % 3))]
        j = int(rng.integers(ndevices))
        pieces = [Sharding(DATA_PARALLEL, tuple(range(ndevices))).pieces(t, ndevices)[j][1] for t in light]
        if counter % 2 and len(by_work) > len(light):
            pieces.append(by_work[-1])
        return pieces, "replica"
    return [members[i] for i in rng.choice(len(members), size=max(2, k) if len(members) >= 2 else 1,
                                           replace=False)], "multi"


def sweep_exchange(oracle, batch_size: int, precision: str) -> dict:
    """The exchange of ``oracle`` measured and fitted (module notes), as a card's ``exchange``."""
    n = int(oracle.ndevices)
    points, samples = [], []
    for dim in SWEEP_DIMS:
        for dims in ([dim] * n, [dim * (1 + 3 * (j % 2)) for j in range(n)]):
            costs, _ = oracle.measure_comm(CommLayout(list(dims)))
            for (sent, recv), (fw, bw) in zip(remote_bytes(dims, batch_size), costs):
                points += [(max(sent, recv), fw), (max(sent, recv), bw)]
                samples.append([int(max(sent, recv)), round(float(fw), 6), round(float(bw), 6)])
    a2a = fit_comm_model(points, "all-to-all")
    out_a2a = {"latency_us": a2a.latency_us, "bandwidth_gbps": a2a.bandwidth_gbps,
               "mape_pct": _fit_mape(a2a, points), "samples": samples,
               "how": "pooled fp32 all-to-all, widths per device " + ", ".join(map(str, SWEEP_DIMS))
                      + " (equal, and alternately x1 / x4), both phases, per device max(bytes sent, received)"}
    elem = bytes_per_element(precision)
    points, samples = [], []
    for numel in SWEEP_ALLREDUCE:
        costs, _ = oracle.measure_comm(CommLayout([0] * n, allreduce=[numel] * n))
        ring = 2.0 * (n - 1) / n * numel * elem
        for _fw, bw in costs:
            points.append((ring, bw))
            samples.append([int(ring), round(float(bw), 6)])
    ar = fit_comm_model(points, "all-reduce")
    out_ar = {"latency_us": ar.latency_us, "bandwidth_gbps": ar.bandwidth_gbps, "mape_pct": _fit_mape(ar, points),
              "samples": samples, "how": f"{precision} ring all-reduce of " + ", ".join(map(str, SWEEP_ALLREDUCE))
                                         + " elements per device; bytes 2 (n-1)/n x elements x element size"}
    kind = "NCCL" if oracle.info.device_type == "cuda" else "gloo"
    comm = CommModel(a2a.bandwidth_gbps, a2a.latency_us, f"fitted to {kind} all-to-alls between {n} devices", "fitted")
    note = (f"measured on {n} devices of one host: every collective priced at the all-to-all's fit; the all-reduce's "
            f"own fit ({ar.latency_us:.1f} us + bytes / {ar.bandwidth_gbps:.2f} GB/s) is recorded beside it")
    return exchange_block("measured", comm, note, out_a2a, out_ar)


def _fit_mape(model: CommModel, points) -> float:
    x = np.array([b for b, _ in points], dtype=float)
    y = np.array([t for _, t in points], dtype=float)
    pred = model.latency_us * 1e-3 + x / (model.bandwidth_gbps * 1e9) * 1e3
    keep = y > 0
    return round(100.0 * float(np.mean(np.abs(pred[keep] - y[keep]) / y[keep])), 3) if keep.any() else math.nan


def modelled_exchange(oracle) -> dict:
    """A card's ``exchange`` where it is not measured: one device, or an oracle that models it."""
    n = int(oracle.ndevices)
    if n >= 2 and getattr(oracle, "fits_exchange", False):   # more plan devices than workers: their own fit
        oracle.measure_comm(CommLayout([16] * n))
        comm = oracle.comm_model
        return exchange_block("measured", comm, f"fitted by the measured oracle to the all-to-alls of its "
                                                f"{getattr(oracle, 'nworkers', '?')} workers (more plan devices than "
                                                f"workers): {comm.latency_us:.1f} us + bytes / "
                                                f"{comm.bandwidth_gbps:.3g} GB/s")
    comm = getattr(oracle, "comm_model", None) or CommModel()
    why = ("one device: nothing is exchanged here; plans over several devices are priced with the exchange "
           "model's figures" if n < 2 else "the oracle models the exchange (more plan devices than devices that "
           "measure, or an emulated oracle): the card keeps that model's figures")
    return exchange_block("modelled", comm, f"{why}: {comm.latency_us:g} us + bytes / {comm.bandwidth_gbps:g} GB/s "
                                            f"({comm.link})")


def _fingerprint(oracle) -> tuple[str, str, dict]:
    """(hardware in words, the cache fingerprint, software versions) of a measuring oracle."""
    fp = str(oracle.context.hardware)
    try:
        obj = json.loads(fp)
    except ValueError:
        obj = {}
    device = str(obj.get("device") or oracle.hardware)
    hardware = "CPU " + device[len("cpu: "):] if device.startswith("cpu: ") else device
    software = {k: str(obj[k]) for k in ("torch", "fbgemm", "threads", "protocol") if k in obj}
    return hardware, fp, software


def calibrate(oracle, dataset, *, shards: int = DEFAULT_SHARDS, seed: int = 0, budget_s: float = 600.0,
              exclude: set | frozenset = frozenset(), tables_per_device: int | None = None, name: str | None = None,
              progress: Callable[[int], None] | None = None, say: Callable[[str], None] | None = None) -> dict:
    """A card of ``oracle``'s hardware (a JSON object, :func:`~shardcore.oracles.emulated.card.build_card`):
    the design of :func:`design_shards` on ``dataset``'s tables measured group by group within ``budget_s``
    seconds (an outer cap), then the exchange sweep. ``progress(k)``: ``k`` more devices measured."""
    ctx = oracle.context
    batch, precision = int(ctx.batch_size), str(ctx.precision)
    n = int(oracle.ndevices)
    design = design_shards(dataset.tables, shards, n, exclude=exclude, tables_per_device=tables_per_device, seed=seed)
    t0 = time.perf_counter()
    devices, stopped = [], None
    groups = sorted({grp for _, grp, _ in design})
    for k, g in enumerate(groups):
        todo = [(kind, pieces) for kind, grp, pieces in design if grp == g]
        for (kind, pieces), cost in zip(todo, oracle.measure_devices([p for _, p in todo])):
            devices.append(MeasuredDevice(pieces, cost.fw_ms, cost.bw_ms, kind, g))
        if progress is not None:
            progress(len(todo))
        spent = time.perf_counter() - t0
        if spent > budget_s and k + 1 < len(groups):   # the time cap: the remaining groups are left out
            stopped = (f"stopped by the time cap ({spent:.0f} s spent, budget {budget_s:g} s) after {len(devices)} of "
                       f"{len(design)} designed devices ({k + 1} of {len(groups)} groups)")
            break
    if stopped and say is not None:
        say(stopped)
    if len(devices) < MIN_DEVICES:
        raise ShardError(f"only {len(devices)} devices measured (a card needs {MIN_DEVICES}): "
                         + (stopped or f"--shards {shards} is too few") + "; raise --shards or --budget")
    compute_s = time.perf_counter() - t0
    exchange = (sweep_exchange(oracle, batch, precision) if n >= 2 and getattr(oracle, "comm_measured", False)
                else modelled_exchange(oracle))
    hardware, fingerprint, software = _fingerprint(oracle)
    device_type = str(oracle.info.device_type)
    calibration = {"designed": len(design), "measured": len(devices), "stopped_early": stopped is not None,
                   "stop": stopped, "budget_s": float(budget_s), "compute_s": round(compute_s, 1),
                   "exchange_s": round(time.perf_counter() - t0 - compute_s, 1), "seed": int(seed),
                   "ndevices": n, "measured_on": str(oracle.hardware), "tables_avoided": len(exclude),
                   "groups": len({d.group for d in devices}), "kinds": {k: sum(d.kind == k for d in devices)
                                                                       for k in sorted({d.kind for d in devices})}}
    ds = {"source": str(getattr(dataset, "path", "") or ""), "digest": str(ctx.dataset), "tables": dataset.num_tables}
    return build_card(devices, {t.index: _with_cv(t, dataset, batch) for t in dataset.tables},
                      name=name or (device_type if device_type == "cpu" else _slug(hardware)), hardware=hardware,
                      fingerprint=fingerprint, device_type=device_type, software=software, batch_size=batch,
                      precision=precision, optimizer=str(ctx.optimizer), exchange=exchange, calibration=calibration,
                      dataset=ds)


def _with_cv(t: TableConfig, dataset, batch: int) -> TableConfig:
    """The table with the bag-length CV of its first ``batch`` samples (from the dataset's lookups, as the
    emulated oracle reads them), else its config's."""
    if not getattr(dataset, "has_lookups", False):
        return t
    import dataclasses

    off = dataset.offsets[t.index]
    lengths = np.diff(off[: min(int(batch), off.numel() - 1) + 1].numpy().astype(np.int64))
    mean = float(lengths.mean()) if len(lengths) else 0.0
    return dataclasses.replace(t, length_cv=round(float(lengths.std() / mean), 6) if mean > 0 else 0.0)


def _slug(text: str) -> str:
    out = "".join(c.lower() if c.isalnum() else "-" for c in text)
    return "-".join(p for p in out.split("-") if p)[:40] or "card"
