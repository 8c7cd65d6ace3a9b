"""Apply a plan written by plan.py to your EmbeddingBagCollection with TorchRec's DistributedModelParallel,
on gloo CPU ranks, and check that the sharded collection computes what the unsharded one does
(docs/planning-your-tables.md, step 3; docs/torchrec.md, "The numerics check").

    python examples/apply_plan.py --tables my_tables.csv --plan plan.torchrec.json [--world 4]

The plan is checked completely in this process first (``shardcore.interop.plan_export.load_torchrec_plan``:
its tables and the collection's agree by name and shape, its shards tile every table, its ranks, types,
kernels and world size are ones TorchRec applies; one line naming the first problem), then every rank
builds the collection from the tables file (one table per row, named as there, one feature per table, in
the plan's weights precision) on the meta device, so no rank ever holds an unsharded copy of a large
table, and DMP creates each rank's shards on its CPU (the ranks form hosts of the plan's
``local_world_size`` where it has one, as torchrun's ``LOCAL_WORLD_SIZE`` would).

**The check.** Every weight is set to a fixed function of its table, row and column, written into each
rank's shards and replicas, so every rank can compute any row of the unsharded collection without
holding it. Each rank looks up its own small batch of random ids (bags around each table's pooling
factor, capped at 4) and compares its pooled embeddings with the unsharded collection's on the same
batch. Then one training step: loss ``sum(pooled ** 2) / 2`` on every rank, backward, exact SGD at
learning rate ``LR`` (FBGEMM's fused optimizer for the sharded tables, ``torch.optim.SGD`` for the
data-parallel replicas). TorchRec averages a step over the ranks: DDP averages the replicas' gradients,
and the sharded tables' backward all-to-all divides their gradients by the world size (its gradient
division, on by default), so the step is the unsharded model's step on the mean of the ranks' losses.
Every rank compares every weight it holds with that step's result (the rows the batches touched moved,
all others unchanged) and counts the touched rows that did move.

Data-parallel tables run FBGEMM's CPU ``dense`` kernel, whose op (``fbgemm::dense_embedding_codegen_lookup_function``)
has no autograd kernel registered for torch's autograd dispatch key, so torch warns during their backward
that this "may lead to silently incorrect behavior"; the check compares exactly those replicas' update
with the unsharded step, and this example silences that one warning only because it does.
On GPUs, use ``device_type="cuda"`` and ``torch.device("cuda", local_rank)`` (the rest is the same).
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from shardcore.oracles.measured.launch import spawn_ranks  # noqa: E402 - after the repository root is on the path

LR = 0.05                                     # the SGD step's learning rate
TOLERANCE = {"fp32": 1e-5, "fp16": 1e-3}      # max |sharded - unsharded| accepted (fp16: two of its ulps below 1)
DENSE_AUTOGRAD_WARNING = r"fbgemm::dense_embedding_codegen_lookup_function: an autograd kernel was not registered"


def user_collection(tables_file: str, device: torch.device, precision: str = "fp32"):
    """Your model's EmbeddingBagCollection; here built from the tables file (name, rows, dim)."""
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
    from torchrec.modules.embedding_configs import DataType

    from shardcore.data.user_tables import read_tables

    tables, names = read_tables(tables_file)
    data_type = {"fp16": DataType.FP16, "fp32": DataType.FP32}[precision]
    return EmbeddingBagCollection(
        tables=[EmbeddingBagConfig(name=n, embedding_dim=t.dim, num_embeddings=t.row, feature_names=[n],
                                   data_type=data_type)
                for t, n in zip(tables, names)], device=device), tables, names


def apply_plan(ebc, plan_file: str):
    """The snippet of docs/planning-your-tables.md: the plan file -> TorchRec's ShardingPlan -> DMP."""
    # --8<-- [apply]
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from shardcore.interop.plan_export import load_torchrec_plan

    plan = load_torchrec_plan(plan_file, device_type="cpu", module=ebc)   # the whole file checked first
    sharder = EmbeddingBagCollectionSharder(fused_params={"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": LR})
    model = DistributedModelParallel(ebc, device=torch.device("cpu"), plan=plan, sharders=[sharder])
    # --8<-- [apply]
    return model, plan


def initial_weights(table: int, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """The weights of rows ``rows`` and columns ``cols`` of table ``table``: a fixed function of the three
    (values in [-0.5, 0.5)), so any rank computes any part of the unsharded collection."""
    r, c = rows.to(torch.int64)[:, None], cols.to(torch.int64)[None, :]
    return (((r * 7919 + c * 104729 + table * 1299709) % 1000).double() / 1000.0 - 0.5).float()


def sample_batch(tables, names, rank: int, local_batch: int):
    """A KeyedJaggedTensor of random ids for every feature (one feature per table, named as the table)."""
    from torchrec import KeyedJaggedTensor

    g = torch.Generator().manual_seed(100 + rank)
    lengths, values = [], []
    for t in tables:
        ls = torch.poisson(torch.full((local_batch,), min(t.pooling_factor, 4.0)), generator=g).long()
        lengths.append(ls)
        values.append(torch.randint(0, t.row, (int(ls.sum()),), generator=g))
    return KeyedJaggedTensor.from_lengths_sync(keys=list(names), values=torch.cat(values), lengths=torch.cat(lengths))


def unsharded_step(tables, names, batches, precision: str):
    """The unsharded collection on every rank's batch, only the rows the batches touch: per table
    ``(touched row ids, their weights before, after one SGD step on the mean of the ranks' losses)`` and
    per rank the pooled embeddings ``{name: [samples, dim]}``."""
    dtype = torch.float16 if precision == "fp16" else torch.float32
    rows, before, subs = {}, {}, {}
    for i, (t, n) in enumerate(zip(tables, names)):
        ids = torch.cat([b[n].values() for b in batches])
        rows[n] = torch.unique(ids)
        w = initial_weights(i, rows[n], torch.arange(t.dim)).to(dtype).float()   # what the shards hold
        before[n] = w
        subs[n] = w.clone().requires_grad_(True)
    pooled = []
    for b in batches:
        out = {}
        for n in names:
            jt = b[n]
            local = torch.searchsorted(rows[n], jt.values())
            out[n] = torch.nn.functional.embedding_bag(local, subs[n], jt.offsets(), mode="sum",
                                                       include_last_offset=True)
        pooled.append(out)
    loss = sum(sum((v ** 2).sum() / 2 for v in out.values()) for out in pooled) / len(batches)
    loss.backward()
    after = {n: (subs[n] - LR * subs[n].grad).detach() for n in names}
    return {n: (rows[n], before[n], after[n]) for n in names}, [{n: v.detach() for n, v in o.items()} for o in pooled]


def _chunks(rows: int, size: int = 1 << 18):
    """Row ranges of at most ``size`` rows covering ``rows`` (a large shard is written and checked in parts)."""
    return [(a, min(a + size, rows)) for a in range(0, rows, size)]


def _held(model, names):
    """``{name: [(row offset, col offset, tensor), ...]}``: the weights this rank holds (shards or a replica)."""
    state = model.state_dict()
    out = {}
    for n in names:
        keys = [k for k in state if k.endswith(f"embedding_bags.{n}.weight")]
        if len(keys) != 1:
            raise RuntimeError(f"table {n}: {len(keys)} weights in the sharded model's state")
        v = state[keys[0]]
        if hasattr(v, "local_shards"):
            out[n] = [(int(s.metadata.shard_offsets[0]), int(s.metadata.shard_offsets[1]), s.tensor)
                      for s in v.local_shards()]
        else:
            out[n] = [(0, 0, v)]
    return out


def worker(rank: int, world: int, port: int, tables_file: str, plan_file: str, local_batch: int,
           local_world_size: int, precision: str, queue) -> None:
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world), RANK=str(rank),
                          LOCAL_WORLD_SIZE=str(local_world_size), LOCAL_RANK=str(rank % local_world_size))
        torch.set_num_threads(1)
        import logging
        import warnings

        import torch.distributed as dist

        logging.disable(logging.WARNING)                    # TorchRec's per-rank topology notes
        warnings.filterwarnings("ignore", category=FutureWarning)
        warnings.filterwarnings("ignore", message=DENSE_AUTOGRAD_WARNING)   # checked below (module notes)
        dist.init_process_group("gloo", rank=rank, world_size=world)
        ebc, tables, names = user_collection(tables_file, torch.device("meta"), precision)
        model, plan = apply_plan(ebc, plan_file)
        held = _held(model, names)
        with torch.no_grad():                               # the fixed weights, into this rank's part
            for i, (t, n) in enumerate(zip(tables, names)):
                for r0, c0, w in held[n]:
                    for a, b in _chunks(w.shape[0]):
                        w[a:b].copy_(initial_weights(i, torch.arange(r0 + a, r0 + b), torch.arange(c0, c0 + w.shape[1])))
        batches = [sample_batch(tables, names, r, local_batch) for r in range(world)]
        expected, pooled_ref = unsharded_step(tables, names, batches, precision)
        pooled = model(batches[rank]).to_dict()
        fw_err = max(float((pooled[n].detach().float() - pooled_ref[rank][n]).abs().max()) for n in names)
        loss = sum((v.float() ** 2).sum() / 2 for v in pooled.values())
        types = {n: ps.sharding_type for n, ps in next(iter(plan.plan.values())).items()}
        replicas = [p for name, p in model.named_parameters()
                    if any(name.endswith(f"embedding_bags.{n}.weight") for n, k in types.items() if k == "data_parallel")]
        optimizer = torch.optim.SGD(replicas, lr=LR) if replicas else None
        loss.backward()
        if optimizer is not None:
            optimizer.step()
        step_err, step_size, touched, moved, weights = 0.0, 0.0, 0, 0, 0
        with torch.no_grad():
            for i, (t, n) in enumerate(zip(tables, names)):
                ids, before, after = expected[n]
                for r0, c0, w in _held(model, names)[n]:
                    weights += w.numel()
                    cols = slice(c0, c0 + w.shape[1])
                    for a, b in _chunks(w.shape[0]):            # every weight held: the step's, or unchanged
                        want = initial_weights(i, torch.arange(r0 + a, r0 + b), torch.arange(c0, c0 + w.shape[1]))
                        want = want.to(w.dtype).float()
                        inside = (ids >= r0 + a) & (ids < r0 + b)
                        local = ids[inside] - r0 - a
                        want[local] = after[inside][:, cols]
                        got = w[a:b].float()
                        step_err = max(step_err, float((got - want).abs().max()))
                        touched += int(inside.sum())
                        change = (got[local] - before[inside][:, cols]).abs()
                        if change.numel():
                            moved += int((change.amax(1) > 0).sum())
                            step_size = max(step_size, float(change.max()))
        queue.put((rank, {"types": types, "local_weights": weights, "fw_err": fw_err, "step_err": step_err,
                          "step_size": step_size, "touched": touched, "moved": moved, "loss": float(loss.detach())}))
        dist.barrier()
        dist.destroy_process_group()
    except Exception:   # noqa: BLE001 - the parent reports a rank's failure with its traceback
        queue.put((rank, {"error": traceback.format_exc()}))


def run(tables_file: str, plan_file: str, world: int | None = None, local_batch: int = 8, timeout_s: float = 300.0):
    """Check the plan against the tables here (one line if anything is wrong), then spawn the gloo ranks;
    ``{rank: result}``."""
    from shardcore.interop.plan_export import _read_json, load_torchrec_plan, validate_torchrec_plan

    obj = _read_json(plan_file)
    planned, local = validate_torchrec_plan(obj, world)
    precision = obj.get("data_type", "fp32")
    ebc, _tables, _names = user_collection(tables_file, torch.device("meta"), precision)
    load_torchrec_plan(plan_file, device_type="cpu", module=ebc, world_size=planned)   # disagreements stop here
    return spawn_ranks(worker, planned, tables_file, plan_file, local_batch, int(local or planned), precision,
                       timeout_s=timeout_s)


def verdict(results: dict, precision: str) -> tuple[bool, list[str]]:
    """Whether every rank's sharded forward and step equal the unsharded ones (within :data:`TOLERANCE`) and
    moved every touched row; the lines that say so."""
    tol = TOLERANCE[precision]
    lines, ok = [], True
    for r, res in sorted(results.items()):
        good = res["fw_err"] <= tol and res["step_err"] <= tol and res["moved"] == res["touched"]
        ok &= good
        lines.append(f"rank {r}: {res['local_weights']:,} weights held; pooled embeddings vs the unsharded collection's "
                     f"max |diff| {res['fw_err']:.2e}; after one SGD step (lr {LR}) weights vs the unsharded step's "
                     f"max |diff| {res['step_err']:.2e}, {res['moved']} of {res['touched']} touched rows updated"
                     + ("" if good else "  <-- MISMATCH"))
    lines.append(("numerics: the sharded forward and one SGD step equal the unsharded collection's on every rank "
                  if ok else "numerics: the sharded collection does NOT compute what the unsharded one does ")
                 + f"(tolerance {tol:g}, {precision} weights)")
    return ok, lines


def main(argv=None) -> int:
    from shardcore.cli.common import make_parser
    from shardcore.argtypes import positive_int
    from shardcore.interop.plan_export import _read_json

    ap = make_parser(__doc__)
    ap.add_argument("--tables", required=True, metavar="FILE", help="the tables file given to plan.py (CSV or JSON)")
    ap.add_argument("--plan", required=True, metavar="PLAN.torchrec.json", help="plan.py's --torchrec output")
    ap.add_argument("--world", type=positive_int, default=None, metavar="N",
                    help="gloo CPU ranks (default: the plan's world size; another is refused)")
    ap.add_argument("--local-batch", type=positive_int, default=8, metavar="B", help="samples per rank (default 8)")
    args = ap.parse_args(argv)
    results = run(args.tables, args.plan, args.world, args.local_batch)
    failed = [r for r, res in sorted(results.items()) if "error" in res]
    for r in failed:
        print(f"rank {r} failed:\n{results[r]['error']}", file=sys.stderr)
    if failed:
        return 1
    types = results[0]["types"]
    counts = {k: list(types.values()).count(k) for k in sorted(set(types.values()))}
    print(f"DistributedModelParallel on {len(results)} gloo ranks: {len(types)} tables ("
          + ", ".join(f"{k} {v}" for k, v in counts.items()) + ")")
    ok, lines = verdict(results, _read_json(args.plan).get("data_type", "fp32"))
    print("\n".join(lines))
    if "data_parallel" in counts:
        print("(torch's warning that FBGEMM's CPU dense lookup has no autograd kernel is silenced: the data-parallel "
              "tables' update was compared above)")
    return 0 if ok else 1


if __name__ == "__main__":
    from shardcore.cli.common import run_main

    run_main(main)
