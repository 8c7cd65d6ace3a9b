import pytest
import torch

from dreamshard.config import DreamShardConfig
from dreamshard.env import EstimatedMDP
from dreamshard.sharder import DreamShardModel, load_sharder
from helpers import build_planner
from shardcore.errors import InfeasibleError
from shardcore.tables import TableConfig
from shardcore.data.features import FeatureScaler
from shardcore.types import Topology


def tables(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        row = int(10 ** (1 + 5 * torch.rand(1, generator=g).item()))
        dim = int([4, 8, 16, 32][torch.randint(4, (1,), generator=g).item()])
        out.append(TableConfig(i, row, dim, float(torch.rand(1, generator=g).item() * 30)))
    return out


@pytest.fixture(scope="module")
def model():
    cfg = DreamShardConfig(hidden=16, embed=8, head_hidden=8)
    return DreamShardModel.new(cfg, FeatureScaler.fit(tables(50)))


@pytest.mark.parametrize("T, D", [(1, 2), (7, 3), (30, 8)])
def test_cost_net_shapes(model, T, D):
    P = 4
    x = torch.randn(P, T, 21)
    assign = torch.zeros(P, D, T)
    assign[:, torch.randint(D, (T,)), torch.arange(T)] = 1
    dc, overall = model.cost_net(x, assign)
    assert dc.shape == (P, D, 3) and overall.shape == (P,)
    # empty devices compute nothing
    empty = assign.sum(-1) == 0
    assert torch.all(dc[..., :2][empty] == 0)


@pytest.mark.parametrize("T, D", [(5, 2), (40, 4), (100, 8)])
def test_policy_places_every_table_on_a_legal_device(model, T, D):
    ts = tables(T, seed=T)
    cap = sum(t.memory_gb() for t in ts) / D * 1.3 + max(t.memory_gb() for t in ts)
    alloc, cost, infeasible = model.place(ts, Topology(D, cap), sample=True, batch=6)
    assert alloc.shape == (6, T) and cost.shape == (6,) and not infeasible.any()
    for row in alloc:
        mem = [0.0] * D
        for t, d in zip(ts, row.tolist()):
            mem[d] += t.memory_gb()
        assert max(mem) <= cap + 1e-9


def test_mask_forbids_full_devices(model):
    ts = [TableConfig(0, 1 << 29, 1, 1.0), TableConfig(1, 1 << 29, 1, 1.0), TableConfig(2, 1 << 29, 1, 1.0)]
    x = model.features(ts)
    mem = torch.tensor([t.memory_gb() for t in ts], dtype=torch.float64)   # 1 GB each
    env = EstimatedMDP(model.cost_net, x, mem, Topology(3, 1.0), batch=5)
    obs = env.reset()
    seen = []
    while obs is not None:
        assert obs.mask.shape == (5, 3) and obs.cost_feats.shape == (5, 3, 5)
        legal = obs.mask.float()
        action = torch.multinomial(legal, 1).squeeze(-1)
        seen.append(obs.mask.sum(-1))
        obs, reward, done, info = env.step(action)
    # with a 1 GB cap each device takes exactly one table: legal devices shrink 3 -> 2 -> 1
    assert [int(s[0]) for s in seen] == [3, 2, 1]
    assert done and reward.shape == (5,) and not info["infeasible"].any()
    assert torch.all(env.allocations().sort(-1).values == torch.arange(3))


def test_one_episode_reward_is_minus_predicted_cost(model):
    ts = tables(12)
    env = EstimatedMDP(model.cost_net, model.features(ts), torch.tensor([t.memory_gb() for t in ts]), Topology(4, 100.0), batch=3)
    obs = env.reset()
    steps = 0
    rewards = []
    while obs is not None:
        obs, r, done, info = env.step(torch.randint(4, (3,)))
        rewards.append(r)
        steps += 1
    assert steps == 12 and all(torch.all(r == 0) for r in rewards[:-1])
    assert torch.allclose(rewards[-1], -info["predicted_cost"])
    # tables are placed largest predicted single-table cost first: a permutation of all tables
    assert sorted(env.order) == list(range(12))


def test_infeasible_task_is_reported(model):
    sharder_model = model
    ts = [TableConfig(0, 1 << 29, 4, 1.0)]  # 4 GB
    from dreamshard.sharder import DreamShardSharder
    with pytest.raises(InfeasibleError):
        DreamShardSharder(name="d", model=sharder_model).shard(ts, Topology(2, 1.0))


def test_checkpoint_round_trip(model, tmp_path):
    model.cost_scale = 3.5
    model.iteration = 4
    model.extra = {"buffer": [{"task": 0, "allocation": [0, 1], "ndevices": 2,
                               "device_costs": [[1.0, 2.0, 3.0, 4.0]] * 2, "cost": 10.0}]}
    path = tmp_path / "4.pt"
    model.save(path)
    obj = torch.load(path, weights_only=True)
    assert obj["method"] == "dreamshard"
    again = load_sharder(path)
    assert again.model.cost_scale == 3.5 and again.model.iteration == 4
    assert again.model.extra["buffer"][0]["cost"] == 10.0
    ts = tables(20, seed=3)
    a = model.place(ts, Topology(4, 100.0))[0]
    b = again.model.place(ts, Topology(4, 100.0))[0]
    assert torch.equal(a, b)
    # and through the --alg resolution used by eval.py
    plan = build_planner(str(path)).shard(ts, Topology(4, 100.0))
    assert list(plan.allocation) == model.decode(ts, Topology(4, 100.0))[0]


def test_the_bag_length_cv_feature_round_trips_and_older_checkpoints_load_without_it(tmp_path):
    import dataclasses

    ts = [dataclasses.replace(t, length_cv=0.1 * (k % 7)) for k, t in enumerate(tables(30))]
    cfg = DreamShardConfig(hidden=16, embed=8, head_hidden=8)
    with_cv = DreamShardModel.new(cfg, FeatureScaler.fit(ts, length_cv=True))
    assert with_cv.cfg.length_cv_feature and with_cv.features(ts).shape == (30, 22)
    with_cv.save(tmp_path / "cv.pt")
    back = DreamShardModel.load(tmp_path / "cv.pt")
    assert back.cfg.length_cv_feature and torch.equal(back.place(ts, Topology(3, 100.0))[0], with_cv.place(ts, Topology(3, 100.0))[0])
    # a checkpoint written before the feature existed: no length_cv_feature key, a 21-feature scaler
    plain = DreamShardModel.new(cfg, FeatureScaler.fit(ts))
    assert not plain.cfg.length_cv_feature
    plain.save(tmp_path / "old.pt")
    obj = torch.load(tmp_path / "old.pt", weights_only=True)
    del obj["config"]["length_cv_feature"]
    torch.save(obj, tmp_path / "old.pt")
    old = DreamShardModel.load(tmp_path / "old.pt")
    assert not old.cfg.length_cv_feature and old.features(ts).shape == (30, 21)


def test_pf_augment_makes_a_share_of_the_training_tables_heavier_on_an_emulated_oracle_only():
    from shardcore.data.features import augment_tasks
    from shardcore.errors import ShardError

    tasks = [[TableConfig(index=i, row=1000 + i, dim=16, pooling_factor=2.0 + i % 5, bins=(0.5, 0.3, 0.2) + (0.0,) * 14)
              for i in range(k, k + 20)] for k in (0, 20)]
    assert augment_tasks(tasks, 0.0, 0, emulated=False) is tasks            # the paper's tasks, as they are
    out = augment_tasks(tasks, 0.5, 0, emulated=True)
    assert out == augment_tasks(tasks, 0.5, 0, emulated=True) != augment_tasks(tasks, 0.5, 1, emulated=True)
    ratios = [a.pooling_factor / t.pooling_factor for ts, os_ in zip(tasks, out) for t, a in zip(ts, os_)]
    assert set(ratios) == {1.0, 2.0, 4.0} and 8 <= sum(r > 1 for r in ratios) <= 32
    assert all((a.index, a.row, a.dim) == (t.index, t.row, t.dim) and sum(a.bins) == pytest.approx(sum(t.bins))
               for ts, os_ in zip(tasks, out) for t, a in zip(ts, os_))
    with pytest.raises(ShardError, match="emulated oracle"):
        augment_tasks(tasks, 0.25, 0, emulated=False)
    from autoshard.config import AutoShardConfig

    assert DreamShardConfig().pf_augment == 0.0 and AutoShardConfig().pf_augment == 0.0   # the papers' tasks


def test_the_advantage_floor_keeps_near_identical_plans_from_full_size_updates():
    from dreamshard.trainer import advantages

    spread_out = torch.tensor([-3.0, -2.8, -3.2, -2.9])
    plain = advantages(spread_out)                       # the paper's: centred, over the batch's spread
    assert plain.mean().abs() < 1e-6 and plain.std() == pytest.approx(1.0, abs=1e-5)
    assert torch.allclose(advantages(spread_out, 0.03), plain)   # a spread above the floor: unchanged
    near = torch.tensor([-3.000, -3.001, -2.999, -3.000])        # plans 0.03% apart: below any cost model's error
    assert advantages(near).abs().max() > 1.0                    # the spread alone blows them up to full size
    floored = advantages(near, 0.03)                             # the floor: 3% of 3 ms = 0.09 ms of spread
    assert floored.abs().max() == pytest.approx(0.001 / 0.09, rel=1e-3)
    assert torch.equal(torch.sign(floored), torch.sign(advantages(near)))   # the same direction, smaller steps
    assert DreamShardConfig().adv_std_floor == 0.0                # the paper's normalisation by default
