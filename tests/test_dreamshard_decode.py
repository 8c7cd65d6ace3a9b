"""DreamShard's inference decoding (greedy, or the best of sampled plans by its own cost network) and
the learning curve its trainer writes beside the checkpoints."""

import csv

import pytest
import torch

from dreamshard.config import DreamShardConfig
from dreamshard.sharder import DreamShardModel, load_sharder
from dreamshard.trainer import DreamShardTrainer
from helpers import FnOracle
from shardcore.tables import TableConfig
from shardcore.data.features import FeatureScaler
from shardcore.tasks import Task
from shardcore.types import Topology


def tables(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [TableConfig(i, int(10 ** (1 + 5 * torch.rand(1, generator=g).item())),
                        int([4, 8, 16, 32][torch.randint(4, (1,), generator=g).item()]),
                        float(torch.rand(1, generator=g).item() * 30)) for i in range(n)]


@pytest.fixture(scope="module")
def model():
    cfg = DreamShardConfig(hidden=16, embed=8, head_hidden=8, decode_samples=0)
    return DreamShardModel.new(cfg, FeatureScaler.fit(tables(50)))


def test_greedy_decoding_is_the_policys_argmax(model):
    ts = tables(20, seed=1)
    alloc, pred, infeasible = model.decode(ts, Topology(4, 100.0), samples=0)
    a, p, i = model.place(ts, Topology(4, 100.0))
    assert alloc == a[0].tolist() and pred == pytest.approx(float(p[0])) and infeasible == bool(i[0])


def test_sampled_decoding_keeps_the_best_by_the_cost_network(model):
    ts = tables(30, seed=2)
    greedy = model.decode(ts, Topology(4, 100.0), samples=0)
    best = model.decode(ts, Topology(4, 100.0), samples=32, seed=5)
    # the greedy plan is a candidate: the kept plan is never predicted worse
    assert best[1] <= greedy[1] + 1e-9
    # the kept plan's prediction is its own, and the minimum over the same 32 samples
    alloc, pred, inf = model.place(ts, Topology(4, 100.0), sample=True, batch=32, generator=torch.Generator().manual_seed(5))
    assert best[1] == pytest.approx(min(greedy[1], float(pred[~inf].min())))
    from shardcore.plan import Plan
    assert model.predict(Plan.table_wise(ts, best[0], Topology(4, 100.0)))[1] == pytest.approx(best[1], rel=1e-5)
    # the same seed gives the same plan (eval.py results are reproducible)
    assert model.decode(ts, Topology(4, 100.0), samples=32, seed=5)[0] == best[0]


def test_the_checkpoint_carries_the_decoding_and_old_ones_decode_greedily(model, tmp_path):
    ts = tables(24, seed=3)
    path = tmp_path / "0.pt"
    model.cfg.decode_samples = 16
    try:
        model.save(path)
    finally:
        model.cfg.decode_samples = 0
    sharder = load_sharder(path)
    assert sharder.model.cfg.decode_samples == 16
    assert list(sharder.shard(ts, Topology(4, 100.0)).allocation) == model.decode(ts, Topology(4, 100.0), samples=16)[0]
    # a checkpoint written before decode_samples existed keeps the greedy decoding it was evaluated with
    obj = torch.load(path, weights_only=True)
    del obj["config"]["decode_samples"]
    torch.save(obj, tmp_path / "old.pt")
    old = load_sharder(tmp_path / "old.pt")
    assert old.model.cfg.decode_samples == 0
    assert list(old.shard(ts, Topology(4, 100.0)).allocation) == model.place(ts, Topology(4, 100.0))[0][0].tolist()


def test_the_trainer_writes_a_learning_curve_against_lookup_greedy(tmp_path):
    ts = tables(30, seed=4)
    tasks = [Task(tuple(range(k, k + 10))) for k in (0, 10, 20)]

    def device_costs(shards):
        return [[0.4 * sum(t.dim * t.pooling_factor for t in s) / 100, 0.0, 0.0,
                 0.6 * sum(t.dim * t.pooling_factor for t in s) / 100] for s in shards]

    oracle = FnOracle(device_costs)
    cfg = DreamShardConfig(hidden=16, embed=8, head_hidden=8, num_iterations=2, bench_steps=6,
                           bench_training_steps=10, rl_num_batches=2, rl_batch_size=4, decode_samples=4,
                           curve_tasks=2)
    trainer = DreamShardTrainer(cfg, ts, tasks, Topology(3, 100.0), oracle, tmp_path, log=lambda _: None)
    trainer.run(2)
    # per iteration: 6 sampled plans measured; the curve: lookup greedy once per task, greedy and decoded plans
    assert oracle.calls == 2 * 6 + 2 + 2 * 2 * 2
    assert len(trainer.buffer) == 12    # the curve's plans are not training data
    rows = list(csv.DictReader(open(tmp_path / "learning_curve.csv")))
    assert [int(r["iteration"]) for r in rows] == [0, 1] and all(int(r["tasks"]) == 2 for r in rows)
    for r in rows:
        lk, gr = float(r["lookup_greedy_ms"]), float(r["greedy_ms"])
        assert lk > 0 and gr > 0 and float(r["decoded_ms"]) > 0
        assert float(r["greedy_vs_lookup_pct"]) == pytest.approx(100 * (gr / lk - 1), abs=2e-3)
    assert (tmp_path / "learning_curve.png").stat().st_size > 1000


def test_defaults_depend_on_the_oracle(tmp_path):
    """200 measured plans per iteration and a 50-task curve where labels cost milliseconds (an emulated
    oracle), the paper's 10 and a 5-task curve on a measured one; given values are kept, and the
    checkpoint stores the values used."""
    assert DreamShardConfig().for_oracle(True).bench_steps == 200
    assert DreamShardConfig().for_oracle(True).curve_tasks == 50
    assert (DreamShardConfig().for_oracle(False).bench_steps, DreamShardConfig().for_oracle(False).curve_tasks) == (10, 5)
    assert DreamShardConfig(bench_steps=7, curve_tasks=0).for_oracle(True).bench_steps == 7
    ts = tables(20, seed=5)
    oracle = FnOracle(lambda shards: [[sum(t.dim for t in s) / 100, 0.0, 0.0, 0.0] for s in shards])
    trainer = DreamShardTrainer(DreamShardConfig(hidden=8, embed=8, head_hidden=8), ts, [Task(tuple(range(10)))], Topology(2, 100.0), oracle, tmp_path, log=lambda _: None)
    assert (trainer.cfg.bench_steps, trainer.cfg.curve_tasks) == (10, 5)   # "a test function": not emulated
    assert (trainer.model.cfg.bench_steps, trainer.model.cfg.curve_tasks) == (10, 5)
