#!/usr/bin/env python3
"""How far one pass of table placement gets with a given cost model (issue #24's decoder check).

Each model places every test task table-wise in one pass: the tables in decreasing modelled cost
(each alone), each on the device with room that keeps the model's predicted slowest device lowest
(ties: the lower predicted cost of that device itself). This is the decision a sequential policy
(DreamShard's, AutoShard's) makes at each step, without lookahead and without sampling. The plans
are judged by the oracle beside lookup_greedy's. Models (``--models``, comma-separated):

  judge                 the emulated judge's own compute model of each task (held out by the task's
                        tables, as the judge is): a model of the landscape as good as the judge's
  neuroshard:PATH       a NeuroShard compute model (compute.pt; its predicted fw + bw per device)
  dreamshard:PATH       a DreamShard checkpoint's cost network (per device its predicted forward,
                        backward and communication, whose maximum it feeds the policy)
  autoshard:PATH        an AutoShard checkpoint's cost model (per device its predicted compute)

  A=models/anchors/h200
  python tools/myopic_decoder.py --models judge,neuroshard:$A/neuroshard/compute.pt,\\
      dreamshard:$A/dreamshard/best.pt,autoshard:$A/autoshard/model.pt \\
      --task-path data/gpu_measurements/tasks/dlrm_tasks_50_test.txt --ndevices 4

With the judge's model the decoder reaches the table-wise optimum of shardkit's search; what a
learned method's decoder lacks is then its cost model, not lookahead (docs/methods.md, "The decoder is
not the limit"). Every figure is the oracle's: emulated by default (computed on this machine's CPU).
"""

from __future__ import annotations

import numpy as np

from shardcore.argtypes import device_count, positive_float, positive_int
from shardcore.baselines import make_baseline
from shardcore.cli.common import make_parser, run_main
from shardcore.dataset import load_table_configs
from shardcore.errors import InfeasibleError, ShardError
from shardcore.evaluation.report import format_table
from shardcore.oracles.emulated.emulator import MEASUREMENTS_DIR
from shardcore.oracles.factory import open_oracle
from shardcore.tasks import load_tasks
from shardcore.topology import DEFAULT_MAX_MEMORY_GB, Topology

DEFAULT_DATA = str(MEASUREMENTS_DIR / "dlrm_b65536")
DEFAULT_TASKS = str(MEASUREMENTS_DIR / "tasks" / "dlrm_tasks_50_test.txt")
KINDS = ("judge", "neuroshard", "dreamshard", "autoshard")


def parse_models(text: str) -> list[tuple[str, str | None]]:
    """``judge,neuroshard:PATH,dreamshard:PATH,autoshard:PATH`` -> ``[(kind, path or None), ...]``."""
    out = []
    for item in (s.strip() for s in text.split(",")):
        if not item:
            continue
        kind, _, path = item.partition(":")
        if kind not in KINDS:
            raise ShardError(f"--models: unknown model {item!r}: choose {', '.join(k + ('' if k == 'judge' else ':PATH') for k in KINDS)}")
        if (kind == "judge") != (not path):
            raise ShardError(f"--models: {item!r}: " + ("judge takes no path" if kind == "judge"
                                                         else f"{kind} needs a checkpoint path ({kind}:PATH)"))
        out.append((kind, path or None))
    if not out:
        raise ShardError("--models: no model given")
    return out


class DeviceModel:
    """``costs(shards) -> [D]`` predicted cost of each device's shard (ms) for one task's placement."""

    def __init__(self, kind: str, path: str | None, card: str):
        self.kind, self.card = kind, card
        if kind == "neuroshard":
            from neuroshard.checkpoints import load_model

            self.ns = load_model(path, "compute")
        elif kind == "dreamshard":
            from dreamshard.sharder import DreamShardModel

            self.ds = DreamShardModel.load(path)
            self.ds.cost_net.eval()
        elif kind == "autoshard":
            from autoshard.sharder import AutoShardModel

            self.auto = AutoShardModel.load(path)
            self.auto.cost_model.eval()

    def for_task(self, tables, batch: int):
        """A function of the task: ``costs(assignment lists of table positions) -> np.ndarray [D]``."""
        if self.kind == "judge":
            from shardcore.oracles.emulated.emulator import heldout_model

            judge = heldout_model(frozenset(t.index for t in tables), self.card)
            return lambda shards: judge.predict_many([[tables[i] for i in s] for s in shards], batch).sum(1)
        if self.kind == "neuroshard":
            return lambda shards: self.ns.predict_shards([[tables[i] for i in s] for s in shards]).sum(1)
        import torch

        def summed(emb, shards):   # each device's table representations summed, as both networks pool them
            return torch.stack([emb[list(s)].sum(0) if s else torch.zeros(emb.shape[1]) for s in shards])

        if self.kind == "autoshard":
            cm = self.auto.cost_model
            with torch.no_grad():
                emb = cm.embed(torch.from_numpy(self.auto.scaler.transform(list(tables))).float())

            @torch.no_grad()
            def costs(shards):
                used = torch.tensor([float(bool(s)) for s in shards])
                return (cm.cost(summed(emb, shards)) * used).numpy() * self.auto.cost_scale
            return costs
        net = self.ds.cost_net
        with torch.no_grad():
            emb = net.embed(self.ds.features(tables))

        @torch.no_grad()
        def costs(shards):
            count = torch.tensor([float(len(s)) for s in shards])
            return net.device_costs(summed(emb, shards), count).sum(-1).numpy() * self.ds.cost_scale
        return costs


def myopic_plan(costs, alone: np.ndarray, memory: list[float], topology: Topology) -> list[list[int]]:
    """One pass: positions by decreasing ``alone``, each on the device with room minimising the predicted
    maximum over devices (then that device's own predicted cost)."""
    ndevices = topology.ndevices
    shards: list[list[int]] = [[] for _ in range(ndevices)]
    used = [0.0] * ndevices
    for i in sorted(range(len(alone)), key=lambda i: (-float(alone[i]), -memory[i], i)):
        best = None
        for d in range(ndevices):
            if not topology.holds(used[d] + memory[i]):
                continue
            trial = [s + [i] if k == d else s for k, s in enumerate(shards)]
            c = costs(trial)
            key = (float(np.max(c)), float(c[d]))
            if best is None or key < best[0]:
                best = (key, d)
        if best is None:
            raise InfeasibleError(f"infeasible: table position {i} fits on no device under the {topology.max_memory_gb:g} GiB cap")
        shards[best[1]].append(i)
        used[best[1]] += memory[i]
    return shards


def main(argv=None):
    p = make_parser(__doc__)
    p.add_argument("--models", default="judge", help="comma-separated: judge, neuroshard:PATH, dreamshard:PATH, "
                                                     "autoshard:PATH (default %(default)s)")
    p.add_argument("--task-path", default=DEFAULT_TASKS, help="task file (default %(default)s)")
    p.add_argument("--data-dir", default=DEFAULT_DATA, help="dataset the tasks index (default %(default)s)")
    p.add_argument("--ndevices", type=device_count, default=4, help="devices per plan (default %(default)s)")
    p.add_argument("--max-memory", type=positive_float, default=DEFAULT_MAX_MEMORY_GB, metavar="GiB",
                   help="weights per device, fp16 (default %(default)s)")
    p.add_argument("--oracle", default="emulated:h200",
                   help="the judge: emulated:<card> (held out by each plan's tables; default %(default)s)")
    p.add_argument("--max-tasks", type=positive_int, default=None, metavar="N", help="only the first N tasks")
    args = p.parse_args(argv)
    if not args.oracle.startswith("emulated:"):
        raise ShardError(f"--oracle {args.oracle}: this check judges with an emulated oracle (emulated:h200)")
    card = args.oracle.split(":", 1)[1]
    from shardcore.planning import is_card_file

    if is_card_file(card):
        raise ShardError(f"--oracle {args.oracle}: this check's judges are held-out refits of a shipped card's "
                         "measurements (emulated:h200); a card file judges with its own fit only")
    models = [(k + (f":{p_}" if p_ else ""), DeviceModel(k, p_, card)) for k, p_ in parse_models(args.models)]
    all_tables = load_table_configs(f"{args.data_dir}/table_configs.json")
    tasks = load_tasks(args.task_path, num_tables=len(all_tables))[: args.max_tasks]
    topo = Topology(args.ndevices, args.max_memory, "fp16")
    costs: dict[str, list[float]] = {"lookup_greedy": []} | {name: [] for name, _ in models}
    greedy = make_baseline("lookup_greedy")
    from tqdm import tqdm

    with open_oracle(args.data_dir, args.ndevices, oracle=args.oracle) as oracle:
        batch = oracle.batch_size
        for task in tqdm(tasks, desc="tasks", unit="task"):
            tables = task.tables(all_tables)
            plan = greedy.shard(tables, topo)
            costs["lookup_greedy"].append(oracle.evaluate(plan.device_pieces).cost_ms)
            memory = [t.memory_gb("fp16") for t in tables]
            for name, model in models:
                f = model.for_task(tables, batch)
                alone = np.array([float(f([[i]])[0]) for i in range(len(tables))])
                shards = myopic_plan(f, alone, memory, topo)
                costs[name].append(oracle.evaluate([[tables[i] for i in s] for s in shards]).cost_ms)
        hardware = getattr(oracle, "hardware", args.oracle)
    base = np.mean(costs["lookup_greedy"])
    rows = [[name, f"{np.mean(v):.3f}", f"{(1 - np.mean(v) / base) * 100:+.1f}%"] for name, v in costs.items()]
    print(f"{len(tasks)} tasks of {args.task_path}, {args.ndevices} devices, cap {args.max_memory:g} GiB; "
          f"judged by {hardware}")
    print(format_table(["placement", "mean cost ms", "below lookup_greedy"], rows))


if __name__ == "__main__":
    run_main(main)
