"""DreamShard's training loop, one iteration at a time:

1. sample ``bench_steps`` plans with the current policy on training tasks and have the cost
   oracle (:class:`~shardcore.types.CostOracle`: measured, through the cache, or emulated) judge
   them; store them in the buffer;
2. fit the cost network to the whole buffer (MSE on the per-device forward, backward and
   communication costs and on the plan cost);
3. train the policy with REINFORCE in the estimated MDP (returns normalised per batch, optionally with a
   floor on the spread: ``adv_std_floor``; entropy bonus);
   decay its learning rate;
4. save ``<out_dir>/<iteration>.pt`` and append a row to ``<out_dir>/train_log.csv`` (the run's last
   iteration only if its plans beat the untrained model's on the first ``VALIDATION_TASKS`` training
   tasks, judged by the oracle where there are at least ``MIN_JUDGED_TASKS``; non-finite weights never);
5. the learning curve (``curve_tasks``): judge the policy's greedy and decoded plans of training tasks
   beside lookup-greedy, append to ``<out_dir>/learning_curve.csv`` and draw ``learning_curve.png``
   (these plans are a monitor, not training data); then copy the checkpoint of the iteration whose
   plans cost least there so far (decoded, or greedy with ``decode_samples`` 0) to
   ``<out_dir>/best.pt`` (:data:`BEST`): training tasks only, never a test task. The policy trained
   in the estimated MDP can drift away from the measured landscape in late iterations (the
   anchor's decoded plans went from -2.7% against lookup-greedy at iteration 6 to +0.4% at 9), and
   the last iteration's checkpoint stays the paper's.
"""

from __future__ import annotations

import csv
import math
import os
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
from torch.distributions import Categorical

from shardcore import io
from shardcore.baselines import make_baseline
from shardcore.errors import InfeasibleError, ShardError
from shardcore.oracles.factory import (MIN_JUDGED_TASKS, check_beats_untrained, check_resume, is_emulated,
                                       training_provenance)
from shardcore.tables import TableConfig
from shardcore.data.features import FeatureScaler, augment_tasks
from shardcore.tasks import Task
from shardcore.types import CostOracle, Topology

from .config import DreamShardConfig
from .curve import CURVE_FIELDS, plot_curve
from .env import EstimatedMDP
from .sharder import DreamShardModel

BEST = "best.pt"   # the checkpoint of the iteration with the lowest learning-curve cost (run notes, step 5)

VALIDATION_TASKS = 10   # training tasks a run's final model is judged on against its untrained self
LOG_FIELDS = ["iteration", "measured_cost_ms", "cost_loss", "cost_mape", "rl_reward_ms", "buffer", "seconds"]


def advantages(returns: torch.Tensor, std_floor: float = 0.0) -> torch.Tensor:
    """REINFORCE's advantages of one batch of episodes: the returns centred and divided by their spread,
    or by ``std_floor`` x their mean's magnitude where that is larger. With the spread alone (the paper's
    normalisation, ``std_floor`` 0) a batch of near-identical plans, told apart by the cost network by
    less than its own error, still gives advantages of size one, and late iterations drift: the anchor's
    learning-curve plans went from -2.7% against lookup-greedy at iteration 6 to +0.4% at 9; with a floor
    of 0.03 the same run improved to its last iteration (-3.2%; docs/methods.md, issue #24)."""
    spread = returns.std()
    if std_floor > 0:
        spread = torch.maximum(spread, std_floor * returns.mean().abs())
    return (returns - returns.mean()) / (spread + 1e-8)


@dataclass
class Measured:
    """One measured plan in the buffer (plain values: it is saved in checkpoints for --resume)."""

    task: int
    allocation: list[int]
    ndevices: int
    device_costs: list[list[float]]   # per device: fw compute, fw comm, bw comm, bw compute (ms)
    cost: float                       # plan cost (ms)

    def targets(self) -> torch.Tensor:
        """``[D, 3]``: forward compute, backward compute, communication (fw + bw)."""
        return torch.tensor([[c[0], c[3], c[1] + c[2]] for c in self.device_costs], dtype=torch.float32)


class DreamShardTrainer:
    def __init__(self, cfg: DreamShardConfig, dataset_tables: Sequence[TableConfig], tasks: Sequence[Task],
                 topology: Topology, oracle: CostOracle, out_dir: str | os.PathLike,
                 model: DreamShardModel | None = None, log: Callable[[str], None] = print):
        # the oracle-dependent defaults filled in (and stored in the checkpoint)
        cfg = cfg.for_oracle(is_emulated(oracle))
        self.cfg = cfg
        self.tasks = list(tasks)
        self.task_tables = augment_tasks([t.tables(dataset_tables) for t in self.tasks], cfg.pf_augment, cfg.seed,
                                         is_emulated(oracle))
        self.topology = topology
        self.ndevices = topology.ndevices
        self.oracle = oracle   # judges the sampled plans: per device [fw comp, fw comm, bw comm, bw comp] ms
        self.out_dir = Path(out_dir)
        self.log = log
        if model is None:
            train_tables = list({(t.index, t.pooling_factor): t for ts in self.task_tables for t in ts}.values())
            model = DreamShardModel.new(cfg, FeatureScaler.fit(train_tables, length_cv=cfg.length_cv_feature))
        self.model = model
        self.features = [model.features(ts) for ts in self.task_tables]
        self.mem = [torch.tensor([t.memory_gb(topology.precision) for t in ts], dtype=torch.float64)
                    for ts in self.task_tables]
        if model.extra:   # a resumed training continues only in the setting it measured in
            check_resume(model.extra.get("provenance") or {}, self._provenance(), "in another --out-dir")
        self.buffer = [Measured(**m) for m in model.extra.get("buffer", [])]
        self.best_iteration: int | None = None   # the iteration best.pt holds (keep_best)
        self.rng = random.Random(cfg.seed + model.iteration + 1)
        self.gen = torch.Generator().manual_seed(cfg.seed + model.iteration + 1)
        torch.manual_seed(cfg.seed + model.iteration + 1)
        self.cost_opt = torch.optim.Adam(model.cost_net.parameters(), lr=cfg.cost_lr)
        lr = cfg.rl_lr * cfg.lr_decay ** (model.iteration + 1)
        self.policy_opt = torch.optim.Adam(model.policy.parameters(), lr=lr)
        self._lookup = make_baseline("lookup_greedy")
        self._lookup_cost: dict[int, float] = {}
        # the untrained model's plans on the validation tasks, judged once (kept in the checkpoints): the
        # bar the model a run hands over must clear (check_beats_untrained)
        self.untrained_ms = model.extra.get("untrained_ms")
        if self.untrained_ms is None and model.iteration < 0 and len(self.tasks) >= MIN_JUDGED_TASKS:
            self.untrained_ms = self.validation_costs()

    def _provenance(self) -> dict:
        """What this training's measurements depend on: a resumed run must match it."""
        return training_provenance(self.oracle, self.topology, self.cfg.pf_augment)

    # -- 1. measure plans sampled by the policy -------------------------------------------------
    def collect(self) -> list[Measured]:
        """``bench_steps`` plans: a random training task for each, sampled in one batch per task."""
        picks = [self.rng.randrange(len(self.tasks)) for _ in range(self.cfg.bench_steps)]
        new = []
        for k in sorted(set(picks)):
            alloc, _, infeasible = self.model.place(self.task_tables[k], self.topology, sample=True,
                                                    batch=picks.count(k), generator=self.gen)
            for b in range(alloc.shape[0]):
                if bool(infeasible[b]):
                    continue
                allocation = [int(d) for d in alloc[b]]
                answer = self.judge(k, allocation)
                new.append(Measured(k, allocation, self.ndevices, [list(map(float, c)) for c in answer.device_costs_ms],
                                    float(answer.cost_ms)))
        self.buffer.extend(new)
        return new

    def judge(self, k: int, allocation: Sequence[int]):
        """The oracle's answer for a plan of training task ``k``."""
        shards = [[] for _ in range(self.ndevices)]
        for t, d in zip(self.task_tables[k], allocation):
            shards[d].append(t)
        return self.oracle.evaluate(shards)

    # -- 2. fit the cost network ----------------------------------------------------------------
    def _batch(self, entries: Sequence[Measured]):
        P = len(entries)
        T = max(len(self.tasks[e.task]) for e in entries)
        D = max(e.ndevices for e in entries)
        x = torch.zeros(P, T, self.features[0].shape[1])
        assign = torch.zeros(P, D, T)
        dmask = torch.zeros(P, D, dtype=torch.bool)
        y_dev = torch.zeros(P, D, 3)
        y_all = torch.zeros(P)
        for p, e in enumerate(entries):
            n = len(e.allocation)
            x[p, :n] = self.features[e.task]
            assign[p, torch.tensor(e.allocation), torch.arange(n)] = 1.0
            dmask[p, : e.ndevices] = True
            y_dev[p, : e.ndevices] = e.targets()
            y_all[p] = e.cost
        return x, assign, dmask, y_dev / self.model.cost_scale, y_all / self.model.cost_scale

    def cost_loss(self, entries: Sequence[Measured]) -> tuple[torch.Tensor, torch.Tensor]:
        """MSE over all heads (in cost units) and the overall cost's absolute percentage errors."""
        x, assign, dmask, y_dev, y_all = self._batch(entries)
        dc, overall = self.model.cost_net(x, assign, dmask)
        m = dmask.unsqueeze(-1).expand_as(dc)
        loss = ((dc - y_dev)[m] ** 2).mean() + ((overall - y_all) ** 2).mean()
        ape = ((overall - y_all).abs() / y_all.clamp_min(1e-9)).detach()
        return loss, ape

    def fit_cost_net(self) -> tuple[float, float]:
        if not self.buffer:
            raise ShardError("no measured plan to fit the cost network on (every sampled plan was infeasible)")
        if self.model.iteration < 0:  # a fresh model: fix the cost unit once, from the first measurements
            self.model.cost_scale = float(np.mean([e.cost for e in self.buffer]))
        net = self.model.cost_net.train()
        losses = []
        for _ in range(self.cfg.bench_training_steps):
            batch = [self.rng.choice(self.buffer) for _ in range(min(self.cfg.cost_batch_size, len(self.buffer)))]
            loss, _ = self.cost_loss(batch)
            self.cost_opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), self.cfg.grad_clip)
            self.cost_opt.step()
            losses.append(loss.item())
        net.eval()
        with torch.no_grad():
            _, ape = self.cost_loss(self.buffer)
        return float(np.mean(losses[-20:])), float(ape.mean())

    # -- 3. REINFORCE in the estimated MDP ------------------------------------------------------
    def train_policy(self) -> float:
        cfg, policy = self.cfg, self.model.policy.train()
        rewards = []
        for _ in range(cfg.rl_num_batches):
            k = self.rng.randrange(len(self.tasks))
            env = EstimatedMDP(self.model.cost_net, self.features[k], self.mem[k], self.topology,
                               batch=cfg.rl_batch_size, infeasible_penalty=cfg.infeasible_penalty)
            emb = policy.embed(self.features[k])
            obs = env.reset()
            logp = torch.zeros(cfg.rl_batch_size)
            entropy = torch.zeros(cfg.rl_batch_size)
            while obs is not None:
                dist = Categorical(logits=policy(emb, obs.assign, obs.current, obs.cost_feats,
                                                 obs.placed_frac, obs.mask))
                action = dist.sample()
                logp = logp + dist.log_prob(action)
                entropy = entropy + dist.entropy()
                obs, reward, _, _ = env.step(action)
            adv = advantages(reward, cfg.adv_std_floor)
            loss = -(adv * logp).mean() - cfg.entropy_weight * entropy.mean() / env.T
            self.policy_opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.grad_clip)
            self.policy_opt.step()
            rewards.append(float(reward.mean()) * self.model.cost_scale)
        for group in self.policy_opt.param_groups:
            group["lr"] *= cfg.lr_decay
        policy.eval()
        return float(np.mean(rewards))

    # -- the validation: the plans the sharder makes, on the first VALIDATION_TASKS training tasks -----------
    def validation_costs(self) -> list[float | None]:
        """Per validation task the training oracle's cost (ms) of the plan the model gives at inference
        (:meth:`DreamShardModel.decode`), None where it is over the cap."""
        self.model.cost_net.eval()
        self.model.policy.eval()
        out = []
        for k in range(min(VALIDATION_TASKS, len(self.tasks))):
            alloc, _, infeasible = self.model.decode(self.task_tables[k], self.topology)
            out.append(None if infeasible else float(self.judge(k, alloc).cost_ms))
        return out

    # -- learning curve ---------------------------------------------------------------------------
    def curve_row(self, it: int) -> dict | None:
        """Judge the greedy and decoded plans of the first ``curve_tasks`` training tasks beside
        lookup-greedy (computed once); the plans are not added to the buffer."""
        n = min(self.cfg.curve_tasks, len(self.tasks))
        if n == 0:
            return None
        self.model.cost_net.eval()
        self.model.policy.eval()
        lookup, greedy, decoded, ape = [], [], [], []
        for k in range(n):
            if k not in self._lookup_cost:
                try:
                    plan = self._lookup.shard(self.task_tables[k], self.topology)
                    self._lookup_cost[k] = float(self.judge(k, plan.allocation).cost_ms)
                except InfeasibleError:
                    self._lookup_cost[k] = float("nan")
            alloc, pred, infeasible = self.model.decode(self.task_tables[k], self.topology, samples=0)
            if infeasible or self._lookup_cost[k] != self._lookup_cost[k]:
                continue
            g = float(self.judge(k, alloc).cost_ms)
            lookup.append(self._lookup_cost[k])
            greedy.append(g)
            ape.append(abs(pred - g) / g)
            if self.cfg.decode_samples > 0:
                alloc, _, infeasible = self.model.decode(self.task_tables[k], self.topology)
                decoded.append(float(self.judge(k, alloc).cost_ms) if not infeasible else float("nan"))
        if not lookup:
            return None
        lk = float(np.mean(lookup))
        gr = float(np.mean(greedy))
        de = float(np.mean(decoded)) if decoded else float("nan")
        return {"iteration": it, "tasks": len(lookup), "lookup_greedy_ms": round(lk, 4), "greedy_ms": round(gr, 4),
                "decoded_ms": round(de, 4), "greedy_vs_lookup_pct": round(100 * (gr / lk - 1), 3),
                "decoded_vs_lookup_pct": round(100 * (de / lk - 1), 3),
                "cost_net_mape_pct": round(100 * float(np.mean(ape)), 3), "buffer": len(self.buffer)}

    def keep_best(self) -> int | None:
        """Copy the checkpoint of the learning curve's cheapest iteration so far (decoded plans, or greedy
        ones with ``decode_samples`` 0; ties: the earlier) to ``<out_dir>/best.pt``; its iteration, or
        None when no row has a cost."""
        key = "decoded_ms" if self.cfg.decode_samples > 0 else "greedy_ms"
        with open(self.out_dir / "learning_curve.csv", newline="") as fh:
            rows = [(float(r[key]), int(r["iteration"])) for r in csv.DictReader(fh)]
        rows = [(ms, it) for ms, it in rows if math.isfinite(ms) and (self.out_dir / f"{it}.pt").is_file()]
        if not rows:
            return None
        _, it = min(rows)
        with io.atomic_path(self.out_dir / BEST) as tmp:
            shutil.copyfile(self.out_dir / f"{it}.pt", tmp)
        self.best_iteration = it
        return it

    def _write_curve(self, row: dict) -> None:
        path = self.out_dir / "learning_curve.csv"
        self._append_csv(path, CURVE_FIELDS, row)
        try:
            plot_curve(path, self.out_dir / "learning_curve.png")
        except ImportError as exc:   # matplotlib is optional: the CSV is the record
            self.log(f"learning curve not drawn ({exc})")

    # -- the loop --------------------------------------------------------------------------------
    def run(self, num_iterations: int, progress=None) -> list[dict]:
        rows = []
        start = self.model.iteration + 1
        for it in range(start, num_iterations):
            t0 = time.perf_counter()
            new = self.collect()
            measured = float(np.mean([e.cost for e in new])) if new else float("nan")
            loss, mape = self.fit_cost_net()
            reward = self.train_policy()
            self.model.iteration = it
            self.model.extra = {"buffer": [vars(e) for e in self.buffer], "tasks": [t.to_line() for t in self.tasks],
                                "provenance": self._provenance(), "untrained_ms": self.untrained_ms}
            if it == num_iterations - 1 and self.untrained_ms is not None:   # the model this run hands over
                check_beats_untrained(self.validation_costs(), self.untrained_ms, str(self.out_dir / f"{it}.pt"))
            self.model.save(self.out_dir / f"{it}.pt")
            row = {"iteration": it, "measured_cost_ms": round(measured, 4), "cost_loss": round(loss, 6),
                   "cost_mape": round(mape, 4), "rl_reward_ms": round(reward, 4), "buffer": len(self.buffer),
                   "seconds": round(time.perf_counter() - t0, 2)}
            rows.append(row)
            self._append_csv(self.out_dir / "train_log.csv", LOG_FIELDS, row)
            self.log(f"iteration {it}: measured cost {measured:.2f} ms, cost-net loss {loss:.4f} "
                     f"(train MAPE {100 * mape:.1f}%), RL reward {reward:.2f} ms, {row['seconds']:.0f} s")
            curve = self.curve_row(it)
            if curve is not None:
                self._write_curve(curve)
                dec = (f", decoded {curve['decoded_vs_lookup_pct']:+.2f}%" if self.cfg.decode_samples > 0 else "")
                best = self.keep_best()
                self.log(f"  training tasks vs lookup greedy: greedy {curve['greedy_vs_lookup_pct']:+.2f}%{dec}; "
                         f"cost net error on those plans {curve['cost_net_mape_pct']:.1f}%"
                         + (f"; {BEST} = iteration {best}" if best is not None else ""))
            if progress is not None:
                progress.update(1)
        return rows

    @staticmethod
    def _append_csv(path: Path, fields: Sequence[str], row: dict) -> None:
        old = path.read_text() if path.exists() else ""
        lines = old.splitlines(keepends=True)
        if not lines:
            lines = [",".join(fields) + "\n"]
        # keep rows of earlier iterations only (a resumed run rewrites from its start)
        kept = [lines[0]] + [ln for ln in lines[1:] if int(ln.split(",")[0]) < row["iteration"]]
        io.write_text(path, "".join(kept) + ",".join(str(row[f]) for f in fields) + "\n")
