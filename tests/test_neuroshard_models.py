"""NeuroShard cost models: they learn known synthetic costs; checkpoints round-trip (weights_only)."""

import numpy as np
import pytest
import torch

from neuroshard.checkpoints import CommCostModel, ComputeCostModel, load_model, save_bundle, save_model
from neuroshard.fitting import fit_comm_model, fit_compute_model, mape
from shardcore.errors import ShardError
from shardcore.data.features import Standardiser

from test_neuroshard_helpers import comm_data, compute_data, small_cfg

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def compute_model():
    shards, costs = compute_data(400, seed=0)
    model, res = fit_compute_model(shards, costs, small_cfg(80))
    return model, res


@pytest.fixture(scope="module")
def comm_models():
    dims, delays, fw, bw = comm_data(200, seed=1)
    cfg = small_cfg(80, hidden=32, embed=16, head_hidden=32, batch_size=16)
    return {kind: fit_comm_model(kind, dims, y, delays, cfg) for kind, y in (("fw_comm", fw), ("bw_comm", bw))}


def test_compute_model_learns_lookups_times_dim(compute_model):
    model, res = compute_model
    assert res.test_mape["total"] < 10.0, res.test_mape
    assert 0 <= res.best_epoch < 80 and res.num_train > res.num_val > 0 and res.num_test > 0
    # unseen shards, larger than any seen in training (up to 8 tables there, 16 here)
    shards, costs = compute_data(100, seed=7, max_tables=16)
    pred = model.predict_shards(shards)
    assert mape(pred.sum(1), costs.sum(1)) < 15.0
    assert np.all(model.predict_shards([[]]) == 0.0)


def test_compute_model_numpy_path_matches_torch(compute_model):
    model, _ = compute_model
    shards, _ = compute_data(20, seed=3)
    from neuroshard.fitting import _pad_shards
    x, m = _pad_shards([model.scaler.transform(s) for s in shards])
    with torch.no_grad():
        ref = model.net(x, m).double().numpy() * np.asarray(model.target_scale)
    assert np.allclose(model.predict_shards(shards), ref, rtol=1e-4)


@pytest.mark.parametrize("kind", ["fw_comm", "bw_comm"])
def test_comm_models_learn_dim_sums_and_waits(comm_models, kind):
    model, res = comm_models[kind]
    assert res.test_mape["per_device"] < 5.0, res.test_mape
    dims, delays, fw, bw = comm_data(50, seed=9)
    true = np.array(fw if kind == "fw_comm" else bw)
    pred = model.predict(np.array(dims), np.array(delays))
    assert mape(pred, true) < 6.0


def test_comm_models_are_permutation_equivariant_and_take_any_device_count(comm_models):
    model, _ = comm_models["fw_comm"]
    dims = np.array([100.0, 1500.0, 700.0, 30.0])
    delays = np.array([10.0, 0.0, 40.0, 5.0])
    perm = np.array([2, 0, 3, 1])
    out = model.predict(dims, delays)
    assert np.allclose(model.predict(dims[perm], delays[perm]), out[perm])
    eight = model.predict(np.tile(dims, 2), np.tile(delays, 2))
    assert eight.shape == (8,) and np.all(np.isfinite(eight)) and np.all(eight > 0)
    assert out[1] > out[2]   # the device that starts first waits longest


def test_checkpoints_roundtrip_with_weights_only(tmp_path, compute_model, comm_models):
    model, _ = compute_model
    save_model(model, tmp_path / "compute.pt")
    obj = torch.load(tmp_path / "compute.pt", weights_only=True)
    assert obj["method"] == "neuroshard" and obj["kind"] == "compute" and "test_mape" in obj["metrics"]
    again = load_model(tmp_path / "compute.pt", "compute")
    shards, _ = compute_data(10, seed=4)
    assert np.allclose(again.predict_shards(shards), model.predict_shards(shards))
    fw, bw = comm_models["fw_comm"][0], comm_models["bw_comm"][0]
    save_model(fw, tmp_path / "fw.pt")
    loaded = load_model(tmp_path / "fw.pt", "fw_comm")
    assert isinstance(loaded, CommCostModel) and type(loaded.scaler) is Standardiser   # the one scaler
    assert loaded.scaler == fw.scaler
    bad = torch.load(tmp_path / "fw.pt", weights_only=True)
    bad["feature_std"] = [0.0] * len(bad["feature_std"])
    torch.save(bad, tmp_path / "bad_fw.pt")
    with pytest.raises(ShardError, match="fw_comm model's feature scaler: .*standard deviations finite and positive"):
        load_model(tmp_path / "bad_fw.pt", "fw_comm")
    with pytest.raises(ShardError, match="expected 'bw_comm'"):
        load_model(tmp_path / "fw.pt", "bw_comm")
    save_bundle(tmp_path / "all.pt", model, fw, bw, {"k": 2})
    assert isinstance(load_model(tmp_path / "all.pt", "compute"), ComputeCostModel)
    d = np.array([10.0, 20.0, 30.0])
    assert np.allclose(load_model(tmp_path / "all.pt", "bw_comm").predict(d), bw.predict(d))
    with pytest.raises(ShardError, match="not found"):
        load_model(tmp_path / "missing.pt", "compute")
    torch.save({"method": "dreamshard"}, tmp_path / "other.pt")
    with pytest.raises(ShardError, match="not a NeuroShard checkpoint"):
        load_model(tmp_path / "other.pt", "compute")


def test_affine_pooling_learns_a_shard_constant_and_its_numpy_copy_matches(tmp_path):
    """``pooling="affine"``: a learned per-shard constant joins the summed per-table costs, so a table's
    mass is its marginal cost; the NumPy copy (the search's path) and a checkpoint agree with torch."""
    shards, costs = compute_data(400, seed=0)
    model, res = fit_compute_model(shards, costs, small_cfg(80, pooling="affine"))
    assert res.test_mape["total"] < 10.0, res.test_mape
    const = np.exp(model.net.shard_log_const.detach().double().numpy()) * np.asarray(model.target_scale)
    assert np.all(const > 0) and model.mass_size == model.cfg.embed + 2
    test, true = compute_data(60, seed=5, max_tables=12)
    from neuroshard.fitting import _pad_shards
    x, m = _pad_shards([model.scaler.transform(s) for s in test])
    with torch.no_grad():
        ref = model.net(x, m).double().numpy() * np.asarray(model.target_scale)
    pred = model.predict_shards(test)
    assert np.allclose(pred, ref, rtol=1e-4)
    assert mape(pred.sum(1), true.sum(1)) < 15.0
    path = tmp_path / "compute.pt"
    save_model(model, path)
    back = load_model(path, "compute")
    assert back.cfg.pooling == "affine" and np.allclose(back.predict_shards(test), pred)


def test_learning_curve_is_written_beside_the_model(tmp_path, compute_model):
    from neuroshard.curve import write_curve

    _, res = compute_model
    paths = write_curve({"compute": res}, tmp_path / "train_log.csv", tmp_path / "train_curve.png")
    import pandas as pd

    df = pd.read_csv(paths[0])
    assert len(df) == len(res.history) == 80 and df["best"].sum() == 1
    assert int(df.loc[df["best"], "epoch"].iloc[0]) == res.best_epoch
    assert df["val_mape"].min() == pytest.approx(res.val_mape)
    assert all(p.is_file() and p.stat().st_size > 0 for p in paths)


def test_per_lookup_extrapolates_to_heavier_tables_than_seen(tmp_path):
    """``per_lookup``: a table's cost is (1 + pf) x a learned cost per lookup; trained on tables of
    pooling factor <= 20, it errs less than the plain log-cost MLP on tables 4x heavier (the head's
    correction still extrapolates: 34% vs 42% here); NumPy copy and checkpoint agree."""
    from shardcore.tables import TableConfig

    from test_neuroshard_helpers import synthetic_tables

    light = [t for t in synthetic_tables(120, seed=3) if t.pooling_factor <= 20][:60]
    heavy = [TableConfig(1000 + k, t.row, 16, t.pooling_factor * 4 + 60, t.bins) for k, t in enumerate(light[:20])]
    shards, costs = compute_data(400, seed=0, tables=light)
    test, true = compute_data(60, seed=9, tables=light[20:] + heavy, max_tables=6)
    errs = {}
    for flag in (False, True):
        model, _ = fit_compute_model(shards, costs, small_cfg(80, per_lookup=flag))
        errs[flag] = mape(model.predict_shards(test).sum(1), true.sum(1))
    assert errs[True] < 0.9 * errs[False], errs
    from neuroshard.fitting import _pad_shards
    x, m = _pad_shards([model.scaler.transform(s) for s in test])
    with torch.no_grad():
        ref = model.net(x, m).double().numpy() * np.asarray(model.target_scale)
    assert np.allclose(model.predict_shards(test), ref, rtol=1e-4)
    save_model(model, tmp_path / "c.pt")
    back = load_model(tmp_path / "c.pt", "compute")
    assert back.cfg.per_lookup and np.allclose(back.predict_shards(test), model.predict_shards(test))


def test_comm_models_know_the_device_counts_they_were_fitted_on_and_the_sharder_warns_beyond_them(
        tmp_path, compute_model, comm_models, capsys):
    """A comm model records the device counts of its all-to-alls; one that does not is read from
    its scaler's constant ``ndevices`` feature. NeuroShard planning for another count warns once per count
    (the anchors' models were fitted on 4 devices and plan DLRM-100's 8)."""
    from neuroshard.sharder import NeuroShardSharder
    from neuroshard.simulator import Simulator
    from shardcore.types import Topology

    fw, bw = comm_models["fw_comm"][0], comm_models["bw_comm"][0]
    assert fw.device_counts == bw.device_counts == (4,)
    save_model(fw, tmp_path / "fw.pt")
    assert load_model(tmp_path / "fw.pt", "fw_comm").device_counts == (4,)
    older = CommCostModel(fw.kind, fw.cfg, fw.scaler, fw.net, fw.target_scale,
                          {k: v for k, v in fw.metrics.items() if k != "ndevices"})
    assert older.device_counts == (4,)                        # the constant feature's mean
    dims4, delays4, fw4, _ = comm_data(60, ndevices=4, seed=2)
    dims8, delays8, fw8, _ = comm_data(60, ndevices=8, seed=3)
    mixed, _ = fit_comm_model("fw_comm", dims4 + dims8, fw4 + fw8, delays4 + delays8, small_cfg(2, hidden=16, embed=8,
                                                                                                 head_hidden=16))
    assert mixed.device_counts == (4, 8)
    assert CommCostModel(mixed.kind, mixed.cfg, mixed.scaler, mixed.net, mixed.target_scale, {}).device_counts is None

    sharder = NeuroShardSharder(name="ns", simulator=Simulator(compute_model[0], fw, bw))
    tables, _ = compute_data(1, seed=5, max_tables=8)
    sharder.shard(tables[0], Topology(4, 100.0))
    assert "warning" not in capsys.readouterr().err
    sharder.shard(tables[0], Topology(8, 100.0))
    sharder.shard(tables[0], Topology(8, 100.0))
    err = capsys.readouterr().err
    assert err.count("fitted on all-to-alls of 4 devices; planning for 8 extrapolates them") == 1
