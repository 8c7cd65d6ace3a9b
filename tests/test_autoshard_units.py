import dataclasses
"""AutoShard's parts without hardware: V-trace, the environment (masking, order, rewards), the
network and checkpoints."""

import math

import pytest
import torch

from autoshard.config import AutoShardConfig
from autoshard.env import ShardingEnv, balance, final_reward, stack_obs
from autoshard.networks import NUM_ACTION_FEATURES, AutoShardNet, CostModel
from autoshard.sharder import AutoShardModel, load_sharder
from autoshard.vtrace import from_importance_weights, from_logits
from shardcore.errors import InfeasibleError, ShardError
from shardcore.tables import TableConfig
from shardcore.data.features import FeatureScaler
from shardcore.types import Topology

from helpers import FnOracle, build_planner


def gb_rows(gb, dim=64):
    """Rows of a dim-``dim`` fp16 table of ``gb`` GB."""
    return int(round(gb * 2 ** 30 / (dim * 2)))


def tables(n=10):
    return [TableConfig(i, 1000 * (i + 1), [8, 16, 32, 64][i % 4], float(1 + 3 * i)) for i in range(n)]


# -- V-trace ---------------------------------------------------------------------------------------
def test_vtrace_matches_a_hand_computed_case():
    # rho = (0.5, 2, 1) -> clipped (0.5, 1, 1); c = (0.5, 1, 1); gamma = (0.9, 0.9, 0)
    log_rhos = torch.log(torch.tensor([[0.5], [2.0], [1.0]]))
    discounts = torch.tensor([[0.9], [0.9], [0.0]])
    rewards = torch.tensor([[1.0], [0.0], [2.0]])
    values = torch.tensor([[0.5], [1.0], [1.5]])
    bootstrap = torch.tensor([3.0])
    out = from_importance_weights(log_rhos, discounts, rewards, values, bootstrap)
    # deltas: 0.5*(1+0.9*1-0.5)=0.7, 1*(0+0.9*1.5-1)=0.35, 1*(2+0-1.5)=0.5
    # v_s - V: 0.5 ; 0.35+0.9*1*0.5=0.8 ; 0.7+0.9*0.5*0.8=1.06
    assert out.vs[:, 0].tolist() == pytest.approx([1.56, 1.8, 2.0])
    # A_s = min(1,rho)(r + gamma v_{s+1} - V): 0.5*(1+0.9*1.8-0.5)=1.06, 0.9*2-1=0.8, 2-1.5=0.5
    assert out.pg_advantages[:, 0].tolist() == pytest.approx([1.06, 0.8, 0.5])


def test_vtrace_on_policy_gives_monte_carlo_returns():
    T = 5
    rewards = torch.tensor([0.0, 0.0, 1.0, 0.0, 0.5]).unsqueeze(1)
    discounts = torch.tensor([1.0, 1.0, 0.0, 1.0, 1.0]).unsqueeze(1)  # an episode ends at t=2
    values = torch.randn(T, 1)
    out = from_importance_weights(torch.zeros(T, 1), discounts, rewards, values, torch.tensor([2.0]))
    assert out.vs[:, 0].tolist() == pytest.approx([1.0, 1.0, 1.0, 2.5, 2.5])


def test_vtrace_from_logits_uses_the_taken_actions():
    logits = torch.tensor([[[0.0, 0.0]], [[1.0, -1.0]]])
    actions = torch.tensor([[1], [0]])
    ret, logp = from_logits(logits, logits.clone().requires_grad_(), actions, torch.ones(2, 1),
                            torch.zeros(2, 1), torch.zeros(2, 1), torch.zeros(1))
    assert logp[:, 0].tolist() == pytest.approx([math.log(0.5), -math.log1p(math.exp(-2.0))])
    assert logp.requires_grad


# -- environment -----------------------------------------------------------------------------------
def make_env(ts, ndevices=3, cap=5.0, with_model=True):
    cfg = AutoShardConfig(length_cv_feature=False)   # the tables here carry no bag-length CV
    torch.manual_seed(0)
    return ShardingEnv(FeatureScaler.fit(ts), CostModel(cfg) if with_model else None, Topology(ndevices, cap))


def test_observation_shapes_and_fraction_placed():
    ts = tables(7)
    env = make_env(ts)
    obs = env.reset(ts)
    seen = 0
    while obs is not None:
        assert obs["action"].shape == (3, NUM_ACTION_FEATURES)
        assert float(obs["frac"]) == pytest.approx(seen / 7)
        obs = env.step(seen % 3)
        seen += 1
    assert seen == 7 and sorted(env.allocation) == sorted([k % 3 for k in range(7)])
    assert sum(len(s) for s in env.shards()) == 7


def test_without_cost_model_tables_go_largest_lookup_cost_first():
    ts = tables(6)
    env = make_env(ts, with_model=False)
    env.reset(ts)
    keys = [t.dim * t.pooling_factor for t in ts]
    assert [keys[i] for i in env.order] == sorted(keys, reverse=True)
    # no cost model: the predicted-cost features are zero
    assert env.observation()["action"][:, -4:-2].abs().sum() == 0


def test_cost_model_orders_by_predicted_single_table_cost():
    ts = tables(8)
    env = make_env(ts)
    env.reset(ts)
    with torch.no_grad():
        single = env.cost_model.cost(env.cost_model.embed(env.x))
    assert [float(single[i]) for i in env.order] == sorted(single.tolist(), reverse=True)


def test_full_devices_are_masked_and_memory_features_track_use():
    ts = [TableConfig(i, gb_rows(0.4), 64, 1.0) for i in range(5)]
    env = make_env(ts, ndevices=3, cap=1.0)
    obs = env.reset(ts)
    obs = env.step(0)
    obs = env.step(0)   # device 0 holds 0.8 GB: no room for another 0.4 GB table
    assert obs["mask"].tolist() == [False, True, True]
    assert obs["action"][0, -2].item() == pytest.approx(0.8, abs=1e-3)        # memory used / cap
    assert obs["action"][0, -1].item() == pytest.approx(1.2, abs=1e-3)        # ... after taking this table
    obs = env.step(1)
    obs = env.step(1)
    assert obs["mask"].tolist() == [False, False, True]


def placed_env(ts):
    """A 2-device environment that has placed the six tables ``ts``: two on device 0, four on device 1."""
    env = make_env(ts, ndevices=2)
    obs = env.reset(ts)
    while obs is not None:
        obs = env.step(0 if env.pos < 2 else 1)
    return env


def test_reward_is_the_measured_balance():
    ts = tables(6)
    env = placed_env(ts)
    oracle = FnOracle(lambda shards: [[10.0 * len(s), 0.0, 0.0, 0.0] for s in shards])  # 10 ms a table

    reward, info = final_reward(env, oracle)
    assert oracle.calls == 1 and reward == pytest.approx(2 / 4)
    assert info["cost_ms"] == pytest.approx(40.0) and info["overflow_gb"] == 0
    assert balance([5.0, 10.0, 0.0]) == 0.0 and balance([3.0, 3.0]) == 1.0


def test_over_cap_plan_gets_a_negative_reward_proportional_to_overflow_and_is_not_measured():
    ts = [TableConfig(i, gb_rows(0.6), 64, 1.0) for i in range(4)]   # 2.4 GB on 2 x 1 GB
    env = make_env(ts, ndevices=2, cap=1.0)
    obs = env.reset(ts)
    while obs is not None:
        if env.pos >= 2:   # both devices hold 0.6 GB: nothing fits anymore, so every device is allowed
            assert obs["mask"].tolist() == [True, True]
        obs = env.step(env.pos % 2)
    assert env.overflow_gb() == pytest.approx(0.4, abs=1e-3)

    def measure(shards):
        raise AssertionError("an over-cap plan must not be measured")

    reward, info = final_reward(env, FnOracle(measure), overflow_penalty=2.0)
    assert reward == pytest.approx(-2.0 * 0.4 / 1.0, abs=1e-3) and info["cost_ms"] is None


def test_shaping_potential_is_zero_at_the_end():
    ts = tables(4)
    env = make_env(ts)
    env.reset(ts)
    assert env.potential() == 0.0          # nothing placed: every device empty
    env.step(0)
    assert env.potential() < 0.0
    while not env.done:
        env.step(1)
    assert env.potential() == 0.0


# -- network and checkpoints ---------------------------------------------------------------------
@pytest.mark.parametrize("D, cv", [(2, False), (5, True)])
def test_network_masks_and_resets_state(D, cv):
    cfg = AutoShardConfig(length_cv_feature=cv)   # 21 table features, 22 with the bag-length CV
    net = AutoShardNet(cfg)
    T, B = 4, 3
    obs = {"table": torch.randn(T, B, 21 + cv), "frac": torch.rand(T, B),
           "action": torch.randn(T, B, D, NUM_ACTION_FEATURES + cv),
           "mask": torch.ones(T, B, D, dtype=torch.bool), "done": torch.zeros(T, B, dtype=torch.bool)}
    obs["mask"][:, :, 0] = False
    logits, value, state = net(obs, net.initial_state(B))
    assert logits.shape == (T, B, D) and value.shape == (T, B) and state[0].shape == (1, B, cfg.lstm_hidden)
    assert (torch.softmax(logits, -1)[..., 0] == 0).all()
    # a step flagged done starts afresh: the result does not depend on the incoming state
    obs["done"][0] = True
    a, _, _ = net(obs, net.initial_state(B))
    b, _, _ = net(obs, (torch.randn(1, B, cfg.lstm_hidden), torch.randn(1, B, cfg.lstm_hidden)))
    assert torch.allclose(a, b)


@pytest.mark.parametrize("cv", [False, True])
def test_checkpoint_round_trip_and_resolve(tmp_path, cv):
    ts = [dataclasses.replace(t, length_cv=0.1 * k if cv else None) for k, t in enumerate(tables(12))]
    model = AutoShardModel.new(AutoShardConfig(seed=3), FeatureScaler.fit(ts, length_cv=cv))
    assert model.cfg.length_cv_feature == cv   # the networks' width follows the scaler
    model.cost_scale, model.steps = 12.5, 400
    path = tmp_path / "m" / "model.pt"
    model.save(path)
    back = AutoShardModel.load(path)
    assert back.steps == 400 and back.cost_scale == 12.5 and back.cfg.seed == 3
    assert back.cfg.length_cv_feature == cv and back.scaler.num_features == 21 + cv
    for a, b in zip(model.net.state_dict().values(), back.net.state_dict().values()):
        assert torch.equal(a, b)
    assert model.place(ts, Topology(3, 5.0)) == back.place(ts, Topology(3, 5.0))
    sharder = build_planner(str(path))
    plan = sharder.shard(ts, Topology(4, 5.0))
    assert plan.ndevices == 4 and len(plan.allocation) == 12
    assert build_planner("autoshard", checkpoint=str(path)).shard(ts, Topology(4, 5.0)) == plan


def test_inference_reports_infeasible_tasks(tmp_path):
    ts = [TableConfig(i, gb_rows(0.6), 64, 1.0) for i in range(4)]
    model = AutoShardModel.new(AutoShardConfig(), FeatureScaler.fit(ts))
    model.save(tmp_path / "model.pt")
    with pytest.raises(InfeasibleError):
        load_sharder(tmp_path / "model.pt").shard(ts, Topology(2, 1.0))


def test_bad_checkpoints_give_clear_errors(tmp_path):
    with pytest.raises(ShardError, match="not found"):
        build_planner("autoshard", checkpoint=str(tmp_path / "missing.pt"))
    torch.save({"method": "dreamshard"}, tmp_path / "other.pt")
    with pytest.raises(ShardError, match="not an AutoShard checkpoint"):
        AutoShardModel.load(tmp_path / "other.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ShardError, match="cannot read"):
        AutoShardModel.load(tmp_path / "junk.pt")


def test_scaled_device_features_and_relative_costs():
    """The two observation options (on by default): a device's summed features over the task's tables per
    device, and its predicted costs minus the currently slowest device's; off, the plain observation."""
    ts = tables(8)
    cfg = AutoShardConfig(length_cv_feature=False)
    torch.manual_seed(0)
    model = CostModel(cfg)
    obs = {}
    for on in (False, True):
        env = ShardingEnv(FeatureScaler.fit(ts), model, Topology(2, 5.0), scaled_device_features=on, relative_costs=on)
        env.reset(ts)
        env.step(0)
        env.step(0)
        obs[on] = (env.observation()["action"], env)
    plain, env = obs[False]
    opt, _ = obs[True]
    nf = NUM_ACTION_FEATURES - 4
    assert torch.allclose(opt[:, :nf], plain[:, :nf] / (8 / 2))           # sums over 4 tables per device
    assert torch.equal(opt[:, nf + 2:], plain[:, nf + 2:])                 # memory features unchanged
    top = plain[:, nf].max()                                               # the slowest device's cost now
    assert torch.allclose(opt[:, nf:nf + 2], plain[:, nf:nf + 2] - top)
    assert float(opt[:, nf].max()) == pytest.approx(0.0)                   # device 0 is the slowest now
    assert float(opt[1, nf + 1]) < 0 < float(opt[0, nf + 1])               # taking the table: device 0 grows


def test_checkpoints_of_before_the_observation_options_load_without_them(tmp_path):
    ts = tables(6)
    model = AutoShardModel.new(AutoShardConfig(length_cv_feature=False), FeatureScaler.fit(ts))
    assert model.cfg.scaled_device_features and model.cfg.relative_costs   # the defaults
    path = tmp_path / "model.pt"
    model.save(path)
    obj = torch.load(path, weights_only=True)
    for key in ("scaled_device_features", "relative_costs"):
        del obj["config"][key]                                              # as written before the options existed
    torch.save(obj, path)
    back = AutoShardModel.load(path)
    assert not back.cfg.scaled_device_features and not back.cfg.relative_costs
    env = back.env(Topology(3, 5.0))
    assert not env.scaled_device_features and not env.relative_costs


def test_stack_obs_batches_steps():
    ts = tables(3)
    env = make_env(ts)
    o1 = env.reset(ts)
    o2 = env.step(0)
    s = stack_obs([o1, o2])
    assert s["action"].shape == (2, 1, 3, NUM_ACTION_FEATURES) and s["mask"].dtype == torch.bool


# -- issue #24: the speedup reward, decoding by sampling, the bounded actor queue, the curve ----------
def test_speedup_reward_is_the_reference_cost_over_the_plan_cost():
    ts = tables(6)
    env = placed_env(ts)
    oracle = FnOracle(lambda shards: [[10.0 * len(s), 0.0, 0.0, 1.0] for s in shards])
    reward, info = final_reward(env, oracle, reference_ms=30.5)   # slowest device: 4 tables, 41 ms
    assert reward == pytest.approx(30.5 / 41.0) and info["cost_ms"] == pytest.approx(41.0)
    assert final_reward(env, oracle)[0] == pytest.approx(21 / 41)   # the paper's balance stays the default


def test_sampled_decoding_keeps_the_plan_the_cost_model_rates_best():
    ts = tables(12)
    model = AutoShardModel.new(AutoShardConfig(seed=1, decode_samples=0), FeatureScaler.fit(ts))
    greedy, over = model.place(ts, Topology(3, 5.0))
    assert over == 0 and (greedy, over) == model.place(ts, Topology(3, 5.0), samples=0)
    allocs, overs = model.rollouts(ts, Topology(3, 5.0, "fp16"), samples=8, seed=0)
    assert len(allocs) == 9 and allocs[0] == greedy and all(o == 0 for o in overs)
    assert len({tuple(a) for a in allocs}) > 1            # the untrained policy's samples differ
    best, _ = model.place(ts, Topology(3, 5.0), samples=8)
    costs = [model.predicted_plan_cost(ts, a, 3) for a in allocs]
    assert best in allocs and model.predicted_plan_cost(ts, best, 3) == pytest.approx(min(costs))
    assert model.place(ts, Topology(3, 5.0), samples=8) == (best, 0.0)          # reproducible
    # the predicted plan cost is the slowest device's predicted cost, in ms
    model.cost_scale = 2.0
    alloc = [i % 2 for i in range(12)]            # device 2 stays empty: it costs nothing
    with torch.no_grad():
        emb = model.cost_model.embed(torch.from_numpy(model.scaler.transform(ts)).float())
        want = max(float(model.cost_model.cost(emb[d::2].sum(0))) for d in range(2)) * 2.0
    assert model.predicted_plan_cost(ts, alloc, 3) == pytest.approx(want, rel=1e-5)
    model.cost_scale = 1.0
    # the config's decode_samples is what a checkpoint decodes with
    model.cfg.decode_samples = 8
    assert model.place(ts, Topology(3, 5.0)) == (best, 0.0)


def test_sampled_decoding_prefers_plans_within_the_cap():
    ts = [TableConfig(i, gb_rows(0.3), 64, 1.0 + i) for i in range(6)]
    model = AutoShardModel.new(AutoShardConfig(seed=0, decode_samples=16), FeatureScaler.fit(ts))
    alloc, over = model.place(ts, Topology(2, 1.0))
    assert over == 0 and sorted(alloc.count(d) for d in range(2)) == [3, 3]


def test_actor_queue_is_bounded():
    assert AutoShardConfig().buffers(2) == 4 and AutoShardConfig(batch_size=8).buffers(2) == 8
    assert AutoShardConfig(num_buffers=3).buffers(8) == 3


def test_curve_ratios_against_greedy_and_the_table_wise_reference(tmp_path):
    import json

    from autoshard.curve import plot_curve, policy_ratios, reference_ratio

    rows = ["step,elapsed_s,task,alg,cost_ms,overflow_gb",
            "10,1,0,lookup_greedy,2.0,0", "10,1,1,lookup_greedy,4.0,0",
            "10,1,0,policy,3.0,0", "10,1,1,policy,4.0,0",
            "20,2,0,policy,2.0,0", "20,2,1,policy,2.0,0",
            "30,3,0,policy,,0.5", "30,3,1,policy,4.0,0"]
    (tmp_path / "policy_eval.csv").write_text("\n".join(rows) + "\n")
    r = policy_ratios(tmp_path / "policy_eval.csv")
    assert r["step"].tolist() == [10, 20, 30]
    assert r["ratio"].tolist()[:2] == pytest.approx([1.25, 0.75]) and math.isnan(r["ratio"].tolist()[2])
    ref = tmp_path / "ref.jsonl"
    ref.write_text("\n".join(json.dumps({"task": k, "alg": a, "cost_ms": c}) for k, a, c in
                             [(0, "lookup_greedy", 2.0), (1, "lookup_greedy", 4.0), (0, "shardkit", 1.8),
                              (1, "shardkit", 3.0), (2, "shardkit", 1.0)]) + "\n")
    assert reference_ratio(ref, [0, 1]) == pytest.approx((0.9 + 0.75) / 2)
    (tmp_path / "episodes.csv").write_text("episode,step,actor,task,return,cost_ms,overflow_gb\n"
                                           "1,10,0,0,0.8,3.0,0\n2,20,0,1,0.9,2.5,0\n")
    png = plot_curve(tmp_path / "episodes.csv", tmp_path / "c.png", reference_jsonl=ref)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
