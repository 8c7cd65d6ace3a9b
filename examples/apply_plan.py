"""Apply a plan written by plan.py to your EmbeddingBagCollection with TorchRec's DistributedModelParallel,
on gloo CPU ranks, and run one forward and backward (docs/planning-your-tables.md, step 3).

    python examples/apply_plan.py --tables my_tables.csv --plan plan.torchrec.json [--world 4]

Every rank builds the collection from the tables file (one table per row, named as there, one feature per
table) on the meta device, so no rank ever holds an unsharded copy of a large table; the plan is read with
``shardcore.interop.plan_export.load_torchrec_plan``, which checks that its tables and the collection's agree by name
and shape (one line naming the first that does not); DMP then creates each rank's shards on its CPU. Each
rank looks up a small batch of random ids (bags around each table's pooling factor, capped at 4), sums the
pooled embeddings into a loss and runs the backward (the fused kernels update their rows in place). On GPUs,
use ``device_type="cuda"`` and ``torch.device("cuda", local_rank)`` (the rest is the same).
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


def user_collection(tables_file: str, device: torch.device):
    """Your model's EmbeddingBagCollection; here built from the tables file (name, rows, dim)."""
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig

    from shardcore.data.user_tables import read_tables

    tables, names = read_tables(tables_file)
    return EmbeddingBagCollection(
        tables=[EmbeddingBagConfig(name=n, embedding_dim=t.dim, num_embeddings=t.row, feature_names=[n])
                for t, n in zip(tables, names)], device=device), tables, names


def apply_plan(ebc, plan_file: str):
    """The snippet of docs/planning-your-tables.md: the plan file -> TorchRec's ShardingPlan -> DMP."""
    # --8<-- [apply]
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from shardcore.interop.plan_export import load_torchrec_plan

    plan = load_torchrec_plan(plan_file, device_type="cpu", module=ebc)   # names and shapes checked
    model = DistributedModelParallel(ebc, device=torch.device("cpu"), plan=plan,
                                     sharders=[EmbeddingBagCollectionSharder()])
    # --8<-- [apply]
    return model, plan


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


def worker(rank: int, world: int, port: int, tables_file: str, plan_file: str, local_batch: int, queue) -> None:
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        torch.set_num_threads(1)
        import logging
        import warnings

        import torch.distributed as dist

        logging.disable(logging.WARNING)                    # TorchRec's per-rank topology notes
        warnings.filterwarnings("ignore", category=FutureWarning)
        dist.init_process_group("gloo", rank=rank, world_size=world)
        ebc, tables, names = user_collection(tables_file, torch.device("meta"))
        model, plan = apply_plan(ebc, plan_file)
        kjt = sample_batch(tables, names, rank, local_batch)
        pooled = model(kjt).to_dict()
        loss = sum(v.float().pow(2).sum() for v in pooled.values()) / local_batch
        loss.backward()
        shapes = {n: list(v.shape) for n, v in pooled.items()}
        types = {n: ps.sharding_type for n, ps in next(iter(plan.plan.values())).items()}
        local = sum(s.tensor.numel() for v in model.state_dict().values() if hasattr(v, "local_shards")
                    for s in v.local_shards())
        queue.put((rank, {"loss": float(loss.detach()), "shapes": shapes, "types": types, "local_weights": local}))
        dist.barrier()
        dist.destroy_process_group()
    except Exception:   # noqa: BLE001 - the parent reports a rank's failure with its traceback
        queue.put((rank, {"error": traceback.format_exc()}))


def run(tables_file: str, plan_file: str, world: int = 4, local_batch: int = 8, timeout_s: float = 300.0):
    """Check the plan against the tables here (one line if they disagree), then spawn the gloo ranks;
    ``{rank: result}``."""
    import json


    from shardcore.errors import ShardError
    from shardcore.interop.plan_export import load_torchrec_plan

    ebc, _tables, _names = user_collection(tables_file, torch.device("meta"))
    load_torchrec_plan(plan_file, device_type="cpu", module=ebc)          # disagreements stop here, in one line
    planned = json.loads(Path(plan_file).read_text())["world_size"]
    if planned != world:
        raise ShardError(f"{plan_file} is a plan for {planned} ranks, not {world} (--world {planned})")
    return spawn_ranks(worker, world, tables_file, plan_file, local_batch, timeout_s=timeout_s)


def main(argv=None) -> int:
    from shardcore.cli.common import make_parser
    from shardcore.argtypes import positive_int

    ap = make_parser(__doc__)
    ap.add_argument("--tables", required=True, metavar="FILE", help="the tables file given to plan.py (CSV or JSON)")
    ap.add_argument("--plan", required=True, metavar="PLAN.torchrec.json", help="plan.py's --torchrec output")
    ap.add_argument("--world", type=positive_int, default=None, metavar="N",
                    help="gloo CPU ranks (default: the plan's world size)")
    ap.add_argument("--local-batch", type=positive_int, default=8, metavar="B", help="samples per rank (default 8)")
    args = ap.parse_args(argv)
    import json

    from shardcore.errors import ShardError
    from shardcore.io import read_text

    try:
        world = args.world or int(json.loads(read_text(Path(args.plan), "plan (JSON)"))["world_size"])
    except (OSError, ValueError, KeyError, TypeError):
        raise ShardError(f"{args.plan}: not a plan written by plan.py --torchrec") from None
    results = run(args.tables, args.plan, world, args.local_batch)
    failed = [r for r, res in sorted(results.items()) if "error" in res]
    for r in failed:
        print(f"rank {r} failed:\n{results[r]['error']}", file=sys.stderr)
    if failed:
        return 1
    types = results[0]["types"]
    counts = {k: list(types.values()).count(k) for k in sorted(set(types.values()))}
    print(f"DistributedModelParallel on {world} gloo ranks: {len(types)} tables ("
          + ", ".join(f"{k} {v}" for k, v in counts.items()) + ")")
    for r, res in sorted(results.items()):
        print(f"rank {r}: {res['local_weights']:,} weights in its shards, forward {len(res['shapes'])} pooled "
              f"features, loss {res['loss']:.4f}, backward done")
    return 0


if __name__ == "__main__":
    from shardcore.cli.common import run_main

    run_main(main)
