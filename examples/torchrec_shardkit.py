"""shardkit inside TorchRec: a small DLRM-style model planned by ``ShardkitPlanner`` and trained one step
with ``DistributedModelParallel`` on 4 gloo CPU ranks (docs/torchrec.md walks through it).

    python examples/torchrec_shardkit.py [--world 4] [--local-batch 64]

Every rank builds the same model (13 embedding tables of mixed dims, one large hot one), the planner
plans on rank 0 for 4 emulated H200s (a ``cuda`` topology; the shards are placed on the CPU ranks, as
``device_type="cpu"`` asks) and broadcasts the plan, DMP applies it, and each rank runs one forward and
backward step on its own batch. Rank 0 prints the plan in TorchRec's table format. As a check, every rank
also runs the unsharded model (same weights) on its batch: the sharded forward must give the same logits.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import traceback
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from shardcore.oracles.measured.launch import spawn_ranks  # noqa: E402 - after the repository root is on the path

# (rows, dim, pooling factor): one large hot table (pooling factor 150), twelve small and medium ones
TABLES = [(200_000, 64, 150.0), (5_000, 16, 2.0), (20_000, 32, 4.0), (1_000, 8, 1.0), (50_000, 64, 6.0),
          (3_000, 128, 3.0), (8_000, 32, 1.5), (12_000, 16, 8.0), (700, 64, 2.0), (40_000, 32, 3.0),
          (9_000, 16, 5.0), (2_500, 96, 2.5), (30_000, 48, 4.0)]
NUM_DENSE = 8
PER_RANK_BATCH = 16384      # the batch the plan is for (per rank, TorchRec's convention): 65536 in all on 4


class SmallDLRM(nn.Module):
    """Dense features through an MLP, sparse features through an EmbeddingBagCollection, both
    concatenated into an over-arch that gives one logit per sample."""

    def __init__(self, device: torch.device):
        super().__init__()
        from torchrec import EmbeddingBagCollection, EmbeddingBagConfig

        self.sparse = EmbeddingBagCollection(
            tables=[EmbeddingBagConfig(name=f"t{i}", embedding_dim=d, num_embeddings=r, feature_names=[f"f{i}"])
                    for i, (r, d, _pf) in enumerate(TABLES)], device=device)
        self.dense = nn.Sequential(nn.Linear(NUM_DENSE, 16), nn.ReLU())
        self.over = nn.Linear(16 + sum(d for _r, d, _pf in TABLES), 1)

    def forward(self, dense: torch.Tensor, sparse) -> torch.Tensor:
        by_feature = self.sparse(sparse).to_dict()   # a sharded collection may order its outputs otherwise
        pooled = torch.cat([by_feature[f"f{i}"] for i in range(len(TABLES))], dim=1)
        return self.over(torch.cat([self.dense(dense), pooled], dim=1)).squeeze(1)


def batch(rank: int, local_batch: int):
    """One rank's batch: dense features, a KeyedJaggedTensor of ids (bag lengths around each table's
    pooling factor, capped for a quick CPU run) and labels."""
    from torchrec import KeyedJaggedTensor

    g = torch.Generator().manual_seed(1000 + rank)
    lengths, values = [], []
    for rows, _dim, pf in TABLES:
        ls = torch.poisson(torch.full((local_batch,), min(pf, 20.0)), generator=g).long()
        lengths.append(ls)
        values.append(torch.randint(0, rows, (int(ls.sum()),), generator=g))
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=[f"f{i}" for i in range(len(TABLES))],
                                              values=torch.cat(values), lengths=torch.cat(lengths))
    dense = torch.randn(local_batch, NUM_DENSE, generator=g)
    labels = torch.randint(0, 2, (local_batch,), generator=g).float()
    return dense, kjt, labels


def load_full_weights(model: nn.Module, full: dict[str, torch.Tensor]) -> None:
    """Write each table's full weights into whatever part of it this rank holds (a shard or a replica)."""
    state = model.state_dict()
    for name, w in full.items():
        keys = [k for k in state if k.endswith(f"embedding_bags.{name}.weight")]
        if len(keys) != 1:
            raise RuntimeError(f"table {name}: {len(keys)} weights in the sharded model's state")
        value = state[keys[0]]
        with torch.no_grad():
            if hasattr(value, "local_shards"):
                for s in value.local_shards():
                    (r0, c0), (nr, nc) = s.metadata.shard_offsets, s.metadata.shard_sizes
                    s.tensor.copy_(w[r0:r0 + nr, c0:c0 + nc].to(s.tensor.dtype))
            else:
                value.copy_(w.to(value.dtype))


def worker(rank: int, world: int, port: int, local_batch: int, queue) -> None:
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        torch.set_num_threads(1)
        import torch.distributed as dist

        dist.init_process_group("gloo", rank=rank, world_size=world)
        from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
        from torchrec.distributed.model_parallel import DistributedModelParallel
        from torchrec.distributed.planner import ParameterConstraints
        from torchrec.distributed.planner.types import KernelConfig, TopologyFactory, TrainerConfig

        from shardkit_torchrec import ShardkitPlanner

        torch.manual_seed(0)                      # the same initial model on every rank
        model = SmallDLRM(torch.device("cpu"))
        reference = copy.deepcopy(model)          # unsharded, for the check
        full = {f"t{i}": reference.sparse.embedding_bags[f"t{i}"].weight.detach().clone() for i in range(len(TABLES))}

        # what a TorchRec user states: the hardware planned for, and each table's mean lookups per sample
        topology = TopologyFactory.create_topology(
            TrainerConfig(world_size=world, local_world_size=world, hbm_cap_bytes=2 << 30),
            kernel_config=KernelConfig(compute_device="cuda"))
        constraints = {f"t{i}": ParameterConstraints(pooling_factors=[pf]) for i, (_r, _d, pf) in enumerate(TABLES)}
        planner = ShardkitPlanner(topology, batch_size=PER_RANK_BATCH, constraints=constraints,
                                  device_type="cpu", time_budget_s=2.0)
        sharders = [EmbeddingBagCollectionSharder()]
        plan = planner.collective_plan(model, sharders, dist.GroupMember.WORLD)
        if rank == 0:
            print(plan, flush=True)
            if planner.last_info:
                print(f"\nshardkit's modelled cost on {world} emulated H200s: {planner.last_info['shardkit_model_ms']} ms "
                      f"(batch {planner.global_batch})", flush=True)

        dmp = DistributedModelParallel(model, device=torch.device("cpu"), plan=plan, sharders=sharders)
        load_full_weights(dmp, full)
        dense, kjt, labels = batch(rank, local_batch)
        logits = dmp(dense, kjt)
        loss = nn.functional.binary_cross_entropy_with_logits(logits, labels)
        loss.backward()
        with torch.no_grad():
            expected = reference(dense, kjt)
        grads = [p.grad for p in dmp.parameters() if p.grad is not None]
        types = {name: ps.sharding_type for name, ps in plan.plan["sparse"].items()}
        queue.put((rank, {"plan": str(plan), "types": types, "loss": float(loss.detach()),
                          "max_err": float((logits.detach() - expected).abs().max()),
                          "dense_grads": len(grads), "grads_finite": all(bool(torch.isfinite(g).all()) for g in grads)}))
        dist.barrier()
        dist.destroy_process_group()
    except Exception:   # noqa: BLE001 - the parent reports a rank's failure with its traceback
        queue.put((rank, {"error": traceback.format_exc()}))


def run(world: int = 4, local_batch: int = 64, timeout_s: float = 240.0) -> dict[int, dict]:
    """Spawn ``world`` gloo ranks running :func:`worker`; ``{rank: its result}``."""
    return spawn_ranks(worker, world, local_batch, timeout_s=timeout_s)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=4, help="gloo CPU ranks (default 4)")
    ap.add_argument("--local-batch", type=int, default=64, help="samples per rank in the training step (default 64)")
    args = ap.parse_args(argv)
    results = run(args.world, args.local_batch)
    failed = [r for r, res in sorted(results.items()) if "error" in res]
    for r in failed:
        print(f"rank {r} failed:\n{results[r]['error']}", file=sys.stderr)
    if failed:
        return 1
    for r, res in sorted(results.items()):
        print(f"rank {r}: loss {res['loss']:.4f}, sharded vs unsharded logits max |diff| {res['max_err']:.2e}, "
              f"{res['dense_grads']} dense gradients, finite: {res['grads_finite']}")
    same = len({res["plan"] for res in results.values()}) == 1
    print(f"all {len(results)} ranks got the same plan: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
