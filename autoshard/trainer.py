"""AutoShard's actor-learner training (IMPALA with V-trace), read top to bottom:

* **actors** (processes) roll out episodes with a recent copy of the policy and the cost model,
  ``unroll_length`` steps at a time, and send the unrolls to the learner. When an episode ends the
  actor sends its plan to the **measurement server** and waits for the reward.
* the **measurement server** (a thread of the learner's process) owns the shared cost oracle
  (:class:`~shardcore.types.CostOracle`: the measuring evaluator inside its cache, or an emulated
  GPU): it has the plans of all actors judged one at a time, answers with the per-device costs, and
  hands the measured shards' compute costs to the cost model's buffer. In an actor the server is seen
  through :class:`_ServerOracle`, an oracle like any other.
* the **learner** takes ``batch_size`` unrolls, recomputes the policy and values over them, corrects
  for the actors' lag with V-trace, and takes one step on policy, value and entropy losses; then a few
  steps of the cost model on the measured shards; then publishes the weights to the actors (shared
  memory).

Logs: ``train_log.csv`` (one row per learner update), ``episodes.csv`` (one row per episode),
``train_curve.png``; checkpoint ``model.pt`` every ``checkpoint_interval_s`` and at the end, and ``best.pt``
(planning weights only) at every check of the greedy policy on the training tasks (``policy_eval.csv``)
whose mean cost over the lookup greedy's is the lowest so far: a late drift of the policy (seen: 0.98x
greedy at 54k steps, 1.07x at the last check) does not reach the model that is evaluated. The last
weights are always checked, also when the time limit ends a run between two checks. Ctrl-C only
raises a flag, checked between steps; the checkpoint is then written first, while further Ctrl-Cs are
answered with a note and otherwise ignored. When an actor dies (checked about once a second) or a
measurement fails, the checkpoint is saved and the failure reported in one line. A run that ends (its
steps done or its time up) saves its model only if the model's plans beat the untrained model's on the
first ``EVAL_TASKS`` training tasks (judged by the oracle where there are at least ``MIN_JUDGED_TASKS``;
the untrained plans are judged once, before the first actor starts); the periodic and interrupted
checkpoints are training state for ``--resume`` and are not judged.
"""

from __future__ import annotations

import dataclasses
import csv
import os
import queue
import random
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from shardcore import io
from shardcore.errors import ShardError
from shardcore.processes import exit_now, preloaded_context, run_then_exit
from shardcore.oracles.factory import (MIN_JUDGED_TASKS, check_beats_untrained, check_resume, is_emulated,
                                       training_provenance)
from shardcore.tables import TableConfig
from shardcore.data.features import FeatureScaler, augment_tasks
from shardcore.tasks import Task
from shardcore.types import CostOracle, PlanResult, Topology

from . import vtrace
from .config import AutoShardConfig
from .env import ShardingEnv, final_reward, stack_obs
from .networks import AutoShardNet, CostModel
from .sharder import AutoShardModel

LOG_FIELDS = ["update", "step", "episodes", "mean_return", "mean_cost_ms", "cost_model_mape", "pg_loss",
              "baseline_loss", "entropy", "policy_lag", "plans_measured", "sps", "elapsed_s"]
EVAL_FIELDS = ["step", "elapsed_s", "task", "alg", "cost_ms", "overflow_gb"]
EVAL_TASKS = 10   # training tasks the greedy policy is checked on during training
# what an actor imports, once in the forkserver that forks the actors (when this process started none
# before: then they come from that one's, and import the rest themselves); torch.multiprocessing shares
# the networks' memory with them
ACTOR_PRELOAD = ("torch", "torch.multiprocessing", "autoshard.trainer")
EPISODE_FIELDS = ["episode", "step", "actor", "task", "return", "cost_ms", "overflow_gb"]
ARRAY_KEYS = ("table", "frac", "action", "mask", "done", "reward", "act", "logits")


# ------------------------------------------------------------------------------------------------
# Actors
# ------------------------------------------------------------------------------------------------
@dataclass
class ActorSpec:
    cfg: dict
    scaler: dict
    tasks: list            # list of lists of TableConfig
    topology: Topology
    references: list | None = None   # per task, the reference plan's cost (ms) of the speedup reward


def actor_main(actor_id: int, spec: ActorSpec, shared_net: AutoShardNet, shared_cost: CostModel,
               req_q, resp_q, out_q, stop, version=None) -> None:
    """Entry point of an actor process, started through :func:`~shardcore.processes.run_then_exit` (which
    asks it to die with its parent); errors are reported to the learner, never raised."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # the learner handles Ctrl-C and stops us
    torch.set_num_threads(1)
    try:
        _actor_loop(actor_id, spec, shared_net, shared_cost, req_q, resp_q, out_q, stop, version)
    except _Stopped:
        pass
    except BaseException as exc:  # noqa: BLE001 - reported, then the process ends
        out_q.put(("error", actor_id, f"{type(exc).__name__}: {exc}"))
    # On exit the queues' feeder threads finish their writes (the learner drains out_q meanwhile):
    # a message cut off half-way would leave the learner's next read waiting forever. exit_now runs
    # multiprocessing's exit handlers, which wait for them, and skips the interpreter's teardown.
    exit_now(0)


class _Stopped(Exception):
    pass


class _ServerOracle:
    """An actor's view of the measurement server: a :class:`~shardcore.types.CostOracle` whose
    ``evaluate`` sends the plan to the learner's server and waits for its per-device costs."""

    hardware = "the learner's cost oracle"

    def __init__(self, actor_id: int, req_q, resp_q, stop):
        self.actor_id, self.req_q, self.resp_q, self.stop = actor_id, req_q, resp_q, stop

    @property
    def parts(self) -> dict:
        return {}

    def __enter__(self) -> "_ServerOracle":
        return self

    def __exit__(self, *exc) -> None:
        pass

    def evaluate(self, shards: list[list[TableConfig]], no_cache: bool | None = None) -> PlanResult:
        self.req_q.put((self.actor_id, shards))
        while True:
            try:
                reply = self.resp_q.get(timeout=0.5)
            except queue.Empty:
                if self.stop.is_set():
                    raise _Stopped
                continue
            if reply[0] == "ok":
                return PlanResult(reply[1], hardware=self.hardware)
            raise _Stopped  # the server failed; it reports the error itself


def _put(q, item, stop) -> None:
    """``q.put`` on a bounded queue that gives up (raises :class:`_Stopped`) once ``stop`` is set."""
    while True:
        try:
            q.put(item, timeout=0.5)
            return
        except queue.Full:
            if stop.is_set():
                raise _Stopped from None


def _actor_loop(actor_id, spec, shared_net, shared_cost, req_q, resp_q, out_q, stop, version=None) -> None:
    cfg = AutoShardConfig.from_dict(spec.cfg)
    net, cost = AutoShardNet(cfg), CostModel(cfg)
    env = ShardingEnv(FeatureScaler.from_state(spec.scaler), cost if cfg.use_cost_model else None,
                      spec.topology,
                      scaled_device_features=cfg.scaled_device_features, relative_costs=cfg.relative_costs)
    seed = cfg.seed * 1000 + actor_id + 1
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)

    synced = [0]

    def sync() -> None:
        # the version is read before the weights: a lag counted from it is never under-stated
        synced[0] = int(version.value) if version is not None else 0
        net.load_state_dict(shared_net.state_dict())
        cost.load_state_dict(shared_cost.state_dict())

    oracle = _ServerOracle(actor_id, req_q, resp_q, stop)

    @torch.no_grad()
    def act(obs: dict, done: bool, state):
        inputs = stack_obs([obs])
        inputs["done"] = torch.tensor([[done]])
        logits, _, new_state = net(inputs, state)
        probs = torch.softmax(logits[0, 0], -1)
        return logits[0, 0], int(torch.multinomial(probs, 1, generator=gen)), new_state

    def new_episode():
        k = rng.randrange(len(spec.tasks))
        return k, env.reset(spec.tasks[k])

    sync()
    task, obs = new_episode()
    reward, done = 0.0, True
    state = net.initial_state(1)
    prev_state = state
    logits, action, state = act(obs, done, state)
    current = (obs, reward, done, action, logits)
    while not stop.is_set():
        sync()
        h0, c0 = prev_state
        steps, episodes = [current], []
        for _ in range(cfg.unroll_length):
            before = env.potential()
            obs = env.step(action)
            # potential-based shaping (Ng et al., 1999): gamma * phi(s') - phi(s), phi = 0 at the end, so
            # an episode's shaped return is its measured reward minus phi(s_0): the optimum is unchanged
            shaped = cfg.shaping * (cfg.discounting * env.potential() - before)
            if obs is None:
                final, info = final_reward(env, oracle, cfg.overflow_penalty,
                                           spec.references[task] if spec.references is not None else None)
                episodes.append({"actor": actor_id, "task": task, "return": final, "cost_ms": info["cost_ms"],
                                 "overflow_gb": info["overflow_gb"]})
                task, obs = new_episode()
                reward, done = final + shaped, True
            else:
                reward, done = shaped, False
            if cfg.reward_clipping == "abs_one":
                reward = max(-1.0, min(1.0, reward))
            prev_state = state
            logits, action, state = act(obs, done, state)
            current = (obs, reward, done, action, logits)
            steps.append(current)
        unroll = _pack(steps, h0, c0)
        unroll["version"] = synced[0]
        _put(out_q, ("unroll", actor_id, unroll, episodes), stop)


def _pack(steps, h0, c0) -> dict:
    return {"table": np.stack([s[0]["table"].numpy() for s in steps]),
            "frac": np.array([float(s[0]["frac"]) for s in steps], dtype=np.float32),
            "action": np.stack([s[0]["action"].numpy() for s in steps]),
            "mask": np.stack([s[0]["mask"].numpy() for s in steps]),
            "reward": np.array([s[1] for s in steps], dtype=np.float32),
            "done": np.array([s[2] for s in steps], dtype=bool),
            "act": np.array([s[3] for s in steps], dtype=np.int64),
            "logits": np.stack([s[4].numpy() for s in steps]),
            "h0": h0.numpy(), "c0": c0.numpy()}


# ------------------------------------------------------------------------------------------------
# Measurement server
# ------------------------------------------------------------------------------------------------
class MeasurementServer(threading.Thread):
    """Measures the actors' plans one at a time with the shared evaluator (and its cache)."""

    def __init__(self, oracle: CostOracle, req_q, resp_qs, on_measured: Callable, lock: threading.Lock | None = None):
        super().__init__(name="autoshard-measure", daemon=True)
        self.oracle, self.req_q, self.resp_qs, self.on_measured = oracle, req_q, resp_qs, on_measured
        self.lock = lock or threading.Lock()   # the learner's policy checks share the oracle
        self.stop_event = threading.Event()
        self.error: str | None = None
        self.plans = 0

    def run(self) -> None:
        while not self.stop_event.is_set():
            try:
                actor, shards = self.req_q.get(timeout=0.2)
            except queue.Empty:
                continue
            try:
                with self.lock:
                    device_costs = self.oracle.evaluate(shards).device_costs_ms
            except BaseException as exc:  # noqa: BLE001 - the learner raises it
                self.error = str(exc) if isinstance(exc, ShardError) else f"{type(exc).__name__}: {exc}"
                self.resp_qs[actor].put(("error",))
                return
            self.plans += 1
            self.on_measured(shards, device_costs)
            self.resp_qs[actor].put(("ok", [[float(v) for v in c] for c in device_costs]))


# ------------------------------------------------------------------------------------------------
# Cost model data
# ------------------------------------------------------------------------------------------------
class ShardBuffer:
    """Measured shards (features and compute cost in ms) for the cost model; thread safe.

    New shards wait in ``pending`` until the learner has scored them with the current model (the
    online error, on shards the model has never seen) and moved them into the training set."""

    def __init__(self):
        self.features: list[np.ndarray] = []
        self.costs: list[float] = []
        self.pending: list[tuple[np.ndarray, float]] = []
        self.lock = threading.Lock()

    def add(self, features: np.ndarray, cost_ms: float) -> None:
        with self.lock:
            self.pending.append((features.astype(np.float32), float(cost_ms)))

    def take_pending(self) -> list[tuple[np.ndarray, float]]:
        with self.lock:
            new, self.pending = self.pending, []
        return new

    def extend(self, items) -> None:
        for f, c in items:
            self.features.append(f)
            self.costs.append(c)

    def __len__(self) -> int:
        return len(self.costs)

    def to_state(self) -> dict:
        pending = self.take_pending()
        self.extend(pending)
        lengths = [len(f) for f in self.features]
        feats = np.concatenate(self.features) if self.features else np.zeros((0, 0), np.float32)
        return {"features": torch.from_numpy(feats), "lengths": torch.tensor(lengths, dtype=torch.long),
                "costs": torch.tensor(self.costs, dtype=torch.float64)}

    def load_state(self, state: dict) -> None:
        feats = state["features"].numpy()
        start = 0
        for n, c in zip(state["lengths"].tolist(), state["costs"].tolist()):
            self.features.append(feats[start:start + n])
            self.costs.append(float(c))
            start += n


def pad(shards: Sequence[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
    n = max(len(s) for s in shards)
    x = torch.zeros(len(shards), n, shards[0].shape[1])
    mask = torch.zeros(len(shards), n, dtype=torch.bool)
    for p, s in enumerate(shards):
        x[p, : len(s)] = torch.from_numpy(s)
        mask[p, : len(s)] = True
    return x, mask


# ------------------------------------------------------------------------------------------------
# Learner
# ------------------------------------------------------------------------------------------------
class AutoShardTrainer:
    def __init__(self, cfg: AutoShardConfig, dataset_tables: Sequence[TableConfig], tasks: Sequence[Task],
                 topology: Topology, oracle: CostOracle, out_dir: str | os.PathLike,
                 model: AutoShardModel | None = None,
                 checkpoint_interval_s: float = 300.0, log: Callable[[str], None] = print):
        """``oracle`` judges the actors' plans (per device ``[fw compute, fw comm, bw comm, bw compute]`` ms)."""
        self.cfg = cfg
        self.tasks = list(tasks)
        self.task_tables = augment_tasks([t.tables(dataset_tables) for t in self.tasks], cfg.pf_augment, cfg.seed,
                                         is_emulated(oracle))
        for t, ts in zip(self.tasks, self.task_tables):
            if not ts:
                raise ShardError("a training task has no tables")
        self.topology = topology
        self.ndevices = topology.ndevices
        self.oracle = oracle
        self.out_dir = Path(out_dir)
        self.checkpoint_interval_s = float(checkpoint_interval_s)
        self.log = log
        resumed = model is not None
        if model is None:
            train_tables = list({(t.index, t.pooling_factor): t for ts in self.task_tables for t in ts}.values())
            model = AutoShardModel.new(cfg, FeatureScaler.fit(train_tables, length_cv=cfg.length_cv_feature))
        self.model = model
        # the networks' width follows the model's features (a resumed one keeps its own)
        self.cfg = cfg = dataclasses.replace(cfg, length_cv_feature=model.cfg.length_cv_feature)
        torch.manual_seed(cfg.seed + model.steps)
        self.rng = random.Random(cfg.seed + model.steps)
        self.opt = torch.optim.Adam(model.net.parameters(), lr=cfg.learning_rate)
        self.cost_opt = torch.optim.Adam(model.cost_model.parameters(), lr=cfg.cost_lr)
        self.buffer = ShardBuffer()
        extra = model.extra or {}
        self.updates = int(extra.get("updates", 0))
        self.episodes = int(extra.get("episodes", 0))
        self.elapsed_before = float(extra.get("elapsed_s", 0.0))
        self.best_ratio = extra.get("best_ratio")   # the best policy check so far (best.pt), kept on --resume
        if resumed and extra:
            self._check_resume(extra)
            self.opt.load_state_dict(extra["optimizer"])
            self.cost_opt.load_state_dict(extra["cost_optimizer"])
            self.buffer.load_state(extra["cost_buffer"])
        self.have_scale = resumed and len(self.buffer) > 0
        # the untrained model's plans on the validation tasks (judged before the first update, kept in the
        # checkpoint): the bar the model of a completed run must clear (check_beats_untrained)
        self.untrained_ms = extra.get("untrained_ms")
        self._greedy_costs: list[float] = []
        self.interrupted = False
        self.replay: list[dict] = []
        self.timed_out = False

    def _provenance(self) -> dict:
        """What this training's measurements depend on: a resumed run must match it."""
        return training_provenance(self.oracle, self.topology, self.cfg.pf_augment)

    def _check_resume(self, extra: dict) -> None:
        stored = dict(extra.get("provenance") or {})
        for key in ("ndevices", "max_memory_gb"):   # checkpoints written before provenance
            if key in extra:
                stored.setdefault(key, extra[key])
        check_resume(stored, self._provenance(), "with another --xpid")

    # -- cost model --------------------------------------------------------------------------
    def _on_measured(self, shards: list[list[TableConfig]], device_costs) -> None:
        for tables, c in zip(shards, device_costs):
            if tables:
                self.buffer.add(self.model.scaler.transform(tables), float(c[0]) + float(c[3]))

    def update_cost_model(self) -> float | None:
        """Score the newly measured shards (online MAPE), add them, take a few training steps."""
        new = self.buffer.take_pending()
        cm = self.model.cost_model
        mape = None
        if new:
            if not self.have_scale:   # fix the cost unit once, from the first measurements
                self.model.cost_scale = max(float(np.mean([c for _, c in new])), 1e-6)
                self.have_scale = True
            with torch.no_grad():
                pred = cm(*pad([f for f, _ in new])) * self.model.cost_scale
            target = torch.tensor([c for _, c in new])
            mape = float(((pred - target).abs() / target.clamp_min(1e-6)).mean())
            self.buffer.extend(new)
        if len(self.buffer) < max(1, self.cfg.cost_min_buffer):
            return mape
        for _ in range(self.cfg.cost_steps_per_update):
            idx = [self.rng.randrange(len(self.buffer)) for _ in range(min(self.cfg.cost_batch_size, len(self.buffer)))]
            x, mask = pad([self.buffer.features[i] for i in idx])
            y = torch.tensor([self.buffer.costs[i] for i in idx], dtype=torch.float32) / self.model.cost_scale
            loss = ((cm(x, mask) - y) ** 2).mean()
            self.cost_opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(cm.parameters(), self.cfg.grad_norm_clipping)
            self.cost_opt.step()
        return mape

    def reference_costs(self) -> list[float]:
        """Per training task, the cost (ms) of its lookup-greedy plan (the size greedy's where that one
        is over the cap), judged by the training oracle: the speedup reward's reference."""
        from shardcore.baselines import make_baseline
        from shardcore.errors import InfeasibleError

        out = []
        topology = self.topology
        for tables in self.task_tables:
            try:
                plan = make_baseline("lookup_greedy").shard(tables, topology)
            except InfeasibleError:
                plan = make_baseline("size_greedy").shard(tables, topology)
            out.append(self._plan_cost(tables, plan.allocation, threading.Lock()))
        return out

    # -- policy checks (the learning curve against the lookup greedy) -------------------------
    def _plan_cost(self, tables: Sequence[TableConfig], allocation: Sequence[int], lock: threading.Lock) -> float:
        shards: list[list[TableConfig]] = [[] for _ in range(self.ndevices)]
        for t, d in zip(tables, allocation):
            shards[d].append(t)
        try:
            with lock:
                return max(self.oracle.evaluate(shards).device_totals_ms)
        except ShardError as exc:   # reported as an actor's failed measurement is (the policy check measures too)
            raise ShardError(f"measurement failed: {exc}") from None

    def check_policy(self, writer, lock: threading.Lock, elapsed_s: float, reference: bool = False) -> float | None:
        """Plan the first ``EVAL_TASKS`` training tasks with the greedy (argmax) policy, judge them with the
        training oracle and log them (with ``reference``, the lookup greedy's plans first). Returns the
        policy's mean cost over the greedy's, or None when a plan went over the cap."""
        from shardcore.baselines import make_baseline

        tasks = self.task_tables[:EVAL_TASKS]
        if reference or not self._greedy_costs:
            greedy = make_baseline("lookup_greedy")
            self._greedy_costs = []
            for k, tables in enumerate(tasks):
                alloc = greedy.shard(tables, self.topology).allocation
                self._greedy_costs.append(self._plan_cost(tables, alloc, lock))
                writer.writerow({"step": self.model.steps, "elapsed_s": round(elapsed_s, 2), "task": k,
                                 "alg": "lookup_greedy", "cost_ms": round(self._greedy_costs[-1], 5),
                                 "overflow_gb": 0.0})
        self.model.net.eval()
        ratios = []
        try:
            for k, tables in enumerate(tasks):
                alloc, over = self.model.place(tables, self.topology, samples=0)
                cost = self._plan_cost(tables, alloc, lock) if over <= 0 else None
                writer.writerow({"step": self.model.steps, "elapsed_s": round(elapsed_s, 2), "task": k,
                                 "alg": "policy", "cost_ms": "" if cost is None else round(cost, 5),
                                 "overflow_gb": round(over, 5)})
                ratios.append(None if cost is None else cost / self._greedy_costs[k])
        finally:
            self.model.net.train()
        return None if any(r is None for r in ratios) else float(np.mean(ratios))

    def validation_costs(self, lock: threading.Lock) -> list[float | None]:
        """Per validation task (the first ``EVAL_TASKS`` training tasks) the training oracle's cost (ms)
        of the plan the model gives at inference (:meth:`AutoShardModel.place`), None over the cap."""
        self.model.net.eval()
        try:
            out = []
            for tables in self.task_tables[:EVAL_TASKS]:
                alloc, over = self.model.place(tables, self.topology)
                out.append(self._plan_cost(tables, alloc, lock) if over <= 0 else None)
            return out
        finally:
            self.model.net.train()

    # -- policy ------------------------------------------------------------------------------
    def learn(self, unrolls: Sequence[dict]) -> dict:
        """One V-trace update on ``batch_size`` unrolls of ``unroll_length + 1`` steps."""
        cfg = self.cfg
        b = {k: torch.from_numpy(np.stack([u[k] for u in unrolls], 1)) for k in ARRAY_KEYS}
        state = (torch.from_numpy(np.concatenate([u["h0"] for u in unrolls], 1)),
                 torch.from_numpy(np.concatenate([u["c0"] for u in unrolls], 1)))
        logits, values, _ = self.model.net(b, state)
        discounts = cfg.discounting * (~b["done"][1:]).float()
        returns, logp = vtrace.from_logits(b["logits"][:-1], logits[:-1], b["act"][:-1], discounts,
                                           b["reward"][1:], values[:-1].detach(), values[-1].detach(),
                                           rho_bar=cfg.rho_bar, c_bar=cfg.c_bar, pg_rho_bar=cfg.pg_rho_bar)
        pg_loss = -(logp * returns.pg_advantages).mean()
        baseline_loss = 0.5 * ((returns.vs - values[:-1]) ** 2).mean()
        probs = torch.softmax(logits[:-1], -1)
        entropy = -(probs * torch.log_softmax(logits[:-1], -1)).sum(-1).mean()
        loss = pg_loss + cfg.baseline_cost * baseline_loss - cfg.entropy_cost * entropy
        self.opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.net.parameters(), cfg.grad_norm_clipping)
        self.opt.step()
        return {"pg_loss": pg_loss.item(), "baseline_loss": baseline_loss.item(), "entropy": entropy.item()}

    # -- checkpoint and logs -----------------------------------------------------------------
    def save(self, elapsed_s: float) -> Path:
        self.model.extra = {"optimizer": self.opt.state_dict(), "cost_optimizer": self.cost_opt.state_dict(),
                            "cost_buffer": self.buffer.to_state(), "updates": self.updates,
                            "episodes": self.episodes, "elapsed_s": float(elapsed_s),
                            "tasks": [t.to_line() for t in self.tasks], "ndevices": self.ndevices,
                            "max_memory_gb": self.topology.max_memory_gb, "provenance": self._provenance(),
                            "untrained_ms": self.untrained_ms, "best_ratio": self.best_ratio}
        path = self.out_dir / "model.pt"
        self.model.save(path)
        return path

    def _check_and_keep_best(self, logs: dict, lock: threading.Lock, elapsed_s: float) -> float | None:
        """A check of the greedy policy (:meth:`check_policy`), written to ``policy_eval.csv``; ``best.pt``
        when it beats every earlier one."""
        ratio = self.check_policy(logs["policy_eval.csv"][1], lock, elapsed_s)
        logs["policy_eval.csv"][0].flush()
        if ratio is not None and (self.best_ratio is None or ratio < self.best_ratio):
            self.save_best(ratio, elapsed_s)
        return ratio

    def save_best(self, ratio: float, elapsed_s: float) -> Path:
        """``best.pt``: the weights at a policy check better than every earlier one (``ratio``: its mean
        cost over the lookup greedy's on the training tasks), without the learner's resume state."""
        self.best_ratio = float(ratio)
        path = self.out_dir / "best.pt"
        self.model.save(path, extra={
            "updates": self.updates, "episodes": self.episodes, "elapsed_s": float(elapsed_s),
            "ndevices": self.ndevices, "max_memory_gb": self.topology.max_memory_gb, "provenance": self._provenance(),
            "best_ratio": self.best_ratio,
            "selected": f"the greedy policy's check at step {self.model.steps} with the lowest mean cost over the "
                        f"lookup greedy's on the training tasks ({ratio:.4f})"})
        return path

    def _open_logs(self, fresh: bool):
        self.out_dir.mkdir(parents=True, exist_ok=True)
        files = {}
        for name, fields in (("train_log.csv", LOG_FIELDS), ("episodes.csv", EPISODE_FIELDS),
                             ("policy_eval.csv", EVAL_FIELDS)):
            path = self.out_dir / name
            new = fresh or not path.exists()
            f = open(path, "w" if new else "a", newline="")
            w = csv.DictWriter(f, fieldnames=fields)
            if new:
                w.writeheader()
            files[name] = (f, w)
        return files

    # -- the loop ----------------------------------------------------------------------------
    def run(self, total_steps: int, num_actors: int | None = None, progress=None,
            time_limit_s: float | None = None) -> dict:
        """Train until ``total_steps`` (or ``time_limit_s`` of this run, or Ctrl-C); save; summarise."""
        cfg = self.cfg
        num_actors = num_actors or cfg.num_actors
        fresh = self.model.steps == 0
        start_steps = self.model.steps
        logs = self._open_logs(fresh)
        ctx = preloaded_context(ACTOR_PRELOAD)
        shared_net, shared_cost = AutoShardNet(cfg), CostModel(cfg)
        shared_net.load_state_dict(self.model.net.state_dict())
        shared_cost.load_state_dict(self.model.cost_model.state_dict())
        shared_net.share_memory()
        shared_cost.share_memory()
        spec = ActorSpec(cfg.to_dict(), self.model.scaler.to_state(), self.task_tables, self.topology,
                         self.reference_costs() if cfg.reward == "speedup" else None)
        # the unrolls waiting for the learner are bounded (torchbeast's --num_buffers): an actor that is
        # ahead waits, rather than the learner learning from a policy many updates old
        req_q, out_q, stop = ctx.Queue(), ctx.Queue(maxsize=cfg.buffers(num_actors)), ctx.Event()
        version = ctx.Value("l", self.updates, lock=False)
        resp_qs = [ctx.Queue() for _ in range(num_actors)]
        oracle_lock = threading.Lock()
        if fresh and self.untrained_ms is None and len(self.tasks) >= MIN_JUDGED_TASKS:
            self.untrained_ms = self.validation_costs(oracle_lock)   # before any actor starts or update is made
        self._refused = False
        server = MeasurementServer(self.oracle, req_q, resp_qs, self._on_measured, oracle_lock)
        interval = cfg.eval_interval
        if interval is None:   # checks measure plans: rarer where a measurement takes a second or more
            interval = 2000 if is_emulated(self.oracle) else 10000
        next_check = self.model.steps if interval else None
        checked_at = None   # the step of the last policy check
        vs_greedy = None
        actors = []
        t_start = time.perf_counter()
        last_ckpt = t_start
        recent: list[float] = []
        recent_cost: list[float] = []
        mape = None
        self._stop_requested = False
        self._stopping = False
        self._actor_died = False
        self._saved_path: Path | None = None
        self._next_liveness_check = 0.0
        main_thread = threading.current_thread() is threading.main_thread()
        previous_handler = signal.getsignal(signal.SIGINT) if main_thread else None
        previous_term = signal.getsignal(signal.SIGTERM) if main_thread else None
        self._diverged = False
        try:
            if main_thread:  # spawned actors start with Ctrl-C ignored (they inherit it through exec)
                signal.signal(signal.SIGINT, signal.SIG_IGN)
            try:
                for a in range(num_actors):
                    p = ctx.Process(target=run_then_exit, name=f"autoshard-actor-{a}", daemon=True,
                                    args=(actor_main, a, spec, shared_net, shared_cost, req_q, resp_qs[a], out_q,
                                          stop, version))
                    p.start()
                    actors.append(p)
            finally:
                if main_thread:
                    # Ctrl-C only raises a flag, checked between steps: an exception in the middle of
                    # reading an unroll from the queue would leave its pipe unreadable
                    signal.signal(signal.SIGINT, self._request_stop)
                    signal.signal(signal.SIGTERM, self._request_stop)   # SIGTERM saves as Ctrl-C does
            server.start()
            while self.model.steps < total_steps:
                if self._stop_requested:
                    raise KeyboardInterrupt
                if time_limit_s is not None and time.perf_counter() - t_start >= time_limit_s:
                    self.timed_out = True
                    break
                unrolls, episodes = [], []
                while len(unrolls) < cfg.batch_size:
                    msg = self._next(out_q, server, actors)
                    unrolls.append(msg[2])
                    episodes.extend(msg[3])
                lag = float(np.mean([self.updates - u.pop("version", self.updates) for u in unrolls]))
                stats = self.learn(unrolls)
                self.replay.extend(unrolls)
                self.replay = self.replay[-cfg.replay_size:]
                for _ in range(cfg.replay_ratio):   # reuse recent unrolls; V-trace corrects for their age
                    self.learn(self.rng.sample(self.replay, min(cfg.batch_size, len(self.replay))))
                m = self.update_cost_model()
                mape = m if m is not None else mape
                self._check_finite_weights(stats)
                shared_net.load_state_dict(self.model.net.state_dict())
                shared_cost.load_state_dict(self.model.cost_model.state_dict())
                version.value = self.updates + 1
                steps = cfg.batch_size * cfg.unroll_length
                self.model.steps += steps
                self.updates += 1
                elapsed = self.elapsed_before + time.perf_counter() - t_start
                for e in episodes:
                    self.episodes += 1
                    logs["episodes.csv"][1].writerow({"episode": self.episodes, "step": self.model.steps, **e})
                    recent.append(e["return"])
                    if e["cost_ms"] is not None:
                        recent_cost.append(e["cost_ms"])
                recent, recent_cost = recent[-50:], recent_cost[-50:]
                row = {"update": self.updates, "step": self.model.steps, "episodes": self.episodes,
                       "mean_return": round(float(np.mean([e["return"] for e in episodes])), 5) if episodes else "",
                       "mean_cost_ms": round(float(np.mean([e["cost_ms"] for e in episodes if e["cost_ms"] is not None])), 4)
                       if any(e["cost_ms"] is not None for e in episodes) else "",
                       "cost_model_mape": round(m, 5) if m is not None else "",
                       **{k: round(v, 6) for k, v in stats.items()}, "policy_lag": round(lag, 2),
                       "plans_measured": server.plans,
                       "sps": round((self.model.steps - start_steps) / max(time.perf_counter() - t_start, 1e-9), 2),
                       "elapsed_s": round(elapsed, 2)}
                logs["train_log.csv"][1].writerow(row)
                for f, _ in logs.values():
                    f.flush()
                if progress is not None:
                    progress.update(steps)
                    progress.set_postfix_str(
                        f"return {np.mean(recent) if recent else float('nan'):.3f} "
                        f"cost {np.mean(recent_cost) if recent_cost else float('nan'):.1f} ms "
                        f"model-err {100 * mape if mape is not None else float('nan'):.0f}% eps {self.episodes}"
                        + (f" argmax/greedy {vs_greedy:.3f}" if vs_greedy is not None else ""))
                if next_check is not None and (self.model.steps >= next_check or self.model.steps >= total_steps):
                    vs_greedy = self._check_and_keep_best(logs, oracle_lock, elapsed)
                    checked_at, next_check = self.model.steps, self.model.steps + interval
                if time.perf_counter() - last_ckpt >= self.checkpoint_interval_s:
                    self.save(elapsed)
                    last_ckpt = time.perf_counter()
            if next_check is not None and checked_at != self.model.steps:
                # time up between two checks: the last weights are checked too, so that best.pt is never an
                # earlier policy only because the run stopped before its next check
                self._check_and_keep_best(logs, oracle_lock, self.elapsed_before + time.perf_counter() - t_start)
            if self.untrained_ms is not None:   # the trained model (steps done or time up) must beat its untrained self
                costs = self.validation_costs(oracle_lock)
                try:
                    check_beats_untrained(costs, self.untrained_ms, str(self.out_dir / "model.pt"))
                except ShardError:
                    self._refused = True
                    raise
        except KeyboardInterrupt:
            self.interrupted = True
        except ShardError as exc:
            # an actor or a measurement failed: keep what was learned, then report the failure (one line)
            saved = self._save_after_failure(start_steps, t_start)
            raise ShardError(f"{exc}; {saved}") from None
        finally:
            # Ctrl-C keeps only raising the flag until everything is stopped and saved: the checkpoint
            # below is written before a second Ctrl-C can cut it short
            self._stopping = True
            try:
                if self._saved_path is None and not self._refused and (self.interrupted or self.timed_out
                                                                       or self.model.steps >= total_steps):
                    try:
                        self._saved_path = self.save(self.elapsed_before + time.perf_counter() - t_start)
                    except Exception as exc:  # noqa: BLE001 - said in one line, never silently skipped
                        raise ShardError(f"{'interrupted; ' if self.interrupted else ''}the checkpoint could "
                                         f"not be saved to {self.out_dir / 'model.pt'} "
                                         f"({type(exc).__name__}: {exc})") from None
            finally:
                stop.set()
                server.stop_event.set()
                self._stop_actors(actors, out_q, drain=not self._actor_died)
                server.join(timeout=60)
                for f, _ in logs.values():
                    f.close()
                if main_thread:
                    signal.signal(signal.SIGINT, previous_handler)
                    signal.signal(signal.SIGTERM, previous_term)
        elapsed = self.elapsed_before + time.perf_counter() - t_start
        path = self._saved_path
        return {"checkpoint": str(path), "steps": self.model.steps, "updates": self.updates,
                "episodes": self.episodes, "plans_measured": server.plans, "elapsed_s": elapsed,
                "interrupted": self.interrupted, "timed_out": self.timed_out}

    def _request_stop(self, signum, frame) -> None:
        if self._stop_requested or self._stopping:
            # a second Ctrl-C: the checkpoint is being written; say so rather than lose it
            try:
                os.write(2, b"interrupted: stopping the actors and saving the checkpoint, please wait\n")
            except OSError:
                pass
        self._stop_requested = True

    def _check_finite_weights(self, stats: dict) -> None:
        """A learner update that made a loss or a weight NaN or infinite stops training in one line;
        nothing of it is saved (``model.pt`` keeps the last finite checkpoint)."""
        bad = io.nonfinite_entry({"losses": {k: float(v) for k, v in stats.items()},
                                  "policy": self.model.net.state_dict(), "cost_model": self.model.cost_model.state_dict()})
        if bad is not None:
            self._diverged = True
            raise ShardError(f"training diverged at update {self.updates + 1} (non-finite values in {bad}); "
                             "lower --learning-rate or --cost-learning-rate")

    def _save_after_failure(self, start_steps: int, t_start: float) -> str:
        """Save what this run learned before a failure is reported; the words for the error line."""
        self._stopping = True
        if getattr(self, "_refused", False):
            return f"{self.out_dir / 'model.pt'} keeps what it held"
        if getattr(self, "_diverged", False):
            return f"nothing saved from the diverged network ({self.out_dir / 'model.pt'} keeps the last finite checkpoint)"
        if self.model.steps <= start_steps:
            return "nothing trained in this run, no checkpoint written"
        try:
            self._saved_path = self.save(self.elapsed_before + time.perf_counter() - t_start)
        except Exception as exc:  # noqa: BLE001 - the original failure is the one to report
            return f"the checkpoint could not be saved ({type(exc).__name__}: {exc})"
        return f"checkpoint saved to {self._saved_path} at step {self.model.steps} (--resume continues)"

    def _check_actors(self, actors, server: "MeasurementServer | None" = None) -> None:
        """An actor that is gone (killed, crashed) stops training with one line; checked about once a
        second even while the other actors keep the queue busy. An actor leaves on its own after its
        plan's measurement failed: then the measurement's error is the one to report."""
        now = time.monotonic()
        if now < self._next_liveness_check:
            return
        self._next_liveness_check = now + 1.0
        for a, p in enumerate(actors):
            if not p.is_alive():
                if server is not None and server.error is not None:
                    raise ShardError(f"measurement failed: {server.error}")
                self._actor_died = True
                code = p.exitcode
                how = (f"killed by {signal.Signals(-code).name}" if code is not None and code < 0
                       and -code in signal.valid_signals() else f"exit code {code}")
                raise ShardError(f"actor {a} died ({how})")

    def _next(self, out_q, server: MeasurementServer, actors) -> tuple:
        while True:
            if self._stop_requested:
                raise KeyboardInterrupt
            if server.error is not None:
                raise ShardError(f"measurement failed: {server.error}")
            self._check_actors(actors, server)
            try:
                msg = out_q.get(timeout=1.0)
            except queue.Empty:
                self._next_liveness_check = 0.0
                self._check_actors(actors, server)
                continue
            if msg[0] == "error":
                raise ShardError(f"actor {msg[1]} failed: {msg[2]}")
            return msg

    @staticmethod
    def _stop_actors(actors, out_q, drain: bool = True) -> None:
        """Wait for the actors to leave (draining their unrolls, so none blocks on a full pipe); kill
        those still there after 10 s. Nothing is read after a kill (its last write may be cut), so
        after an actor died on its own the queue is not drained either."""
        deadline = time.monotonic() + 10
        while any(p.is_alive() for p in actors) and time.monotonic() < deadline:
            if not drain:
                time.sleep(0.1)
                continue
            try:
                out_q.get(timeout=0.1)
            except queue.Empty:
                pass
        for p in actors:
            if p.is_alive():
                p.kill()
            p.join(timeout=5)
