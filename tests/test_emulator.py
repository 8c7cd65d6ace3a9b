"""The emulated-GPU compute model: shipped parameters, physical properties, held-out accuracy,
reproducible fit, and the predict_shard_costs CLI."""

import dataclasses
import json
import os

import numpy as np
import pytest

from helpers import load_tool

from shardcore.topology import Topology
from shardcore.cli.common import run_main
from shardcore.dataset import load_table_configs
from shardcore.errors import ShardError
from shardcore.oracles.emulated.emulator import MEASUREMENTS_DIR, load_gpu_model, read_params, model_path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(MEASUREMENTS_DIR, "dlrm_b65536", "table_configs.json")
# Accuracy bounds a refit must stay within (held-out 10-fold shard MAPE at batch 65536: fw, bw, fw+bw;
# leave-one-task-out within-task Spearman and plan-cost MAPE % per plan source): regression guards, met
# with MARGIN to spare by the shipped fit, so that a change that costs the emulator accuracy shows here
REPORTED_KFOLD = {"fw": 4.66, "bw": 2.81, "fw+bw": 2.81}
MARGIN = 0.3
REPORTED_PLANS = {"plans": (0.879, 2.12), "gpucheck1": (0.854, 2.27), "gpucheck2": (0.843, 2.14),
                  "gpucheck4": (0.830, 2.22), "gpucheck5": (0.817, 2.10)}


def shipped_counts(batch: int = 65536) -> dict:
    """What the manifest's fitted measurement files hold, counted from the files themselves (not through
    the emulator's loader): ``lines`` (measurements), ``distinct`` shards (by their (table, dim) pairs),
    ``random`` (distinct shards measured as random ones), per fitted gpu_check run the ``plans`` it placed
    and those with a device of row-wise or replica pieces, and the shared plans file's plan count."""
    from shardcore.oracles.emulated.emulator import MANIFEST

    entry = MANIFEST["batches"][str(batch)]
    runs = [r for r in MANIFEST["runs"] if r["in_fit"] and int(r["batch"]) == batch]
    keys, random, lines = set(), set(), 0
    for name in list(entry["shards"]) + [r["shards"] for r in runs]:
        with open(os.path.join(MEASUREMENTS_DIR, name)) as fh:
            for line in filter(str.strip, fh):
                obj = json.loads(line)
                key = tuple(sorted(tuple(t) for t in obj["tables"]))
                lines += 1
                keys.add(key)
                if "random" in name or obj.get("kind") in ("random", "random_pieces"):
                    random.add(key)
    placed, with_pieces = {}, {}
    for r in runs:
        with open(os.path.join(MEASUREMENTS_DIR, r["summary"])) as fh:
            summary = json.load(fh)
        placed[r["name"]] = sum(1 for ts in summary["sets"] for p in ts["plans"] if "device_costs_ms" in p)
        owners = set()
        if r.get("pieces"):
            with open(os.path.join(MEASUREMENTS_DIR, r["pieces"])) as fh:
                owners = {(o["hardware"], o["task"], o["alg"]) for o in map(json.loads, filter(str.strip, fh))
                          if "task" in o}
        with_pieces[r["name"]] = len(owners)
    with open(os.path.join(MEASUREMENTS_DIR, entry["plans"])) as fh:
        shared = sum(1 for line in fh if line.strip())
    return {"lines": lines, "distinct": len(keys), "random": len(random), "placed": placed,
            "with_pieces": with_pieces, "shared_plans": shared, "runs": [r["name"] for r in runs],
            "files": list(entry["shards"]) + [r["shards"] for r in runs]}




@pytest.fixture(scope="module")
def tables():
    return load_table_configs(CONFIGS)


@pytest.fixture(scope="module")
def model():
    return load_gpu_model("h200")


def test_shipped_parameters_load(model):
    """The parameter file says what it was fitted on, and that is what the manifest's fitted files hold."""
    from shardcore.oracles.emulated.emulator import MANIFEST

    params = read_params(model_path("h200"))
    n = shipped_counts()
    assert "NVIDIA H200" in params["fitted_on"]
    assert f"{n['distinct']} shards ({n['lines']} measurements" in params["fitted_on"]
    assert all(name in params["fitted_on"] for name in n["files"])
    assert not any(r["shards"] in params["fitted_on"] for r in MANIFEST["runs"] if not r["in_fit"])
    assert model.batches == [4096, 65536]
    for wf, wb in model.weights.values():
        assert len(wf) == len(params["features"]) and (wf >= 0).all() and (wb >= 0).all()
        assert wf[0] > 0 and wb[0] > 0  # a launch cost: every non-empty shard costs something
    assert load_gpu_model("h200") is model  # cached


def test_empty_shard_costs_nothing(model, tables):
    assert model.predict([], 65536) == (0.0, 0.0)
    out = model.predict_many([[], tables[3:5], []], 65536)
    assert out[0].tolist() == [0.0, 0.0] and out[2].tolist() == [0.0, 0.0] and (out[1] > 0).all()
    assert np.allclose(out[1], model.predict(tables[3:5], 65536))


def test_predictions_positive_and_monotone_in_lookups(model, tables):
    rng = np.random.default_rng(1)
    for _ in range(20):
        shard = [tables[i] for i in rng.choice(len(tables), size=int(rng.integers(1, 40)), replace=False)]
        last = (0.0, 0.0)
        for scale in (0.25, 0.5, 1.0, 2.0, 4.0):
            scaled = [dataclasses.replace(t, pooling_factor=t.pooling_factor * scale) for t in shard]
            fw, bw = model.predict(scaled, 65536)
            assert fw > 0 and bw > 0
            assert fw >= last[0] - 1e-12 and bw >= last[1] - 1e-12
            last = (fw, bw)
        costs = [sum(model.predict(shard, b)) for b in (512, 4096, 16384, 65536, 262144)]
        assert all(c > 0 for c in costs) and costs == sorted(costs)  # more samples, more lookups
    # a wider table (or shard) costs at least as much
    t = tables[154]
    assert sum(model.predict([t.with_dim(128)], 65536)) > sum(model.predict([t.with_dim(16)], 65536))


def test_known_tables_get_their_bag_length_cv(model, tables):
    cvs = [model.table_cv(t) for t in tables if t.pooling_factor > 0]
    assert len(set(cvs)) > 100  # the default dataset's tables are recognised
    stranger = dataclasses.replace(tables[154], row=tables[154].row * 3, length_cv=None)
    assert model.table_cv(stranger) == model.default_cv
    # the CV matters: the same table with a larger CV costs more in the forward
    fw_lo, _ = model.predict([tables[154]], 65536, length_cv=[0.3])
    fw_hi, _ = model.predict([tables[154]], 65536, length_cv=[1.3])
    assert fw_hi > fw_lo
    # a table the block does not know is priced with its own CV where its configs carry one; a known
    # table keeps the block's, whatever its configs say
    assert model.table_cv(dataclasses.replace(stranger, length_cv=1.3)) == 1.3
    assert model.predict([dataclasses.replace(stranger, length_cv=1.3)], 65536) == \
        model.predict([stranger], 65536, length_cv=[1.3])
    assert model.table_cv(dataclasses.replace(tables[154], length_cv=9.0)) == model.table_cv(tables[154])


def test_held_out_mape_matches_report():
    acc = load_tool("emulator_accuracy")
    from shardcore.oracles.emulated.emulator import DEFAULT_SPEC, default_cv_of, synthetic_length_cv
    from shardcore.dataset import load_table_configs as ltc

    known = synthetic_length_cv()
    cv0 = default_cv_of(known, ltc(CONFIGS), 65536)
    land = acc.Landscape(65536, MEASUREMENTS_DIR, dict(DEFAULT_SPEC), known, cv0)
    n = shipped_counts()
    assert len(land.fw) == n["distinct"] and sum(len(s["measured"]) for s in land.meas["shards"]) == n["lines"]
    sources = [p["source"] for p in land.meas["plans"]]
    assert sources.count("plans") == n["shared_plans"]
    for run in n["runs"]:   # a run's plans of whole tables and column pieces (those with pieces fit the replica law)
        assert sources.count(run) == n["placed"][run] - n["with_pieces"][run] > 0, run
    pred = land.kfold()
    got = {"fw": acc.mape(pred[:, 0], land.fw), "bw": acc.mape(pred[:, 1], land.bw),
           "fw+bw": acc.mape(pred.sum(1), land.fw + land.bw)}
    for key, value in got.items():
        assert value <= REPORTED_KFOLD[key] + MARGIN, (key, value)
    # the held-out predictions are not the training fit: they are (slightly) worse than in-sample
    wf, wb = land.fit(np.ones(len(land.fw), bool))
    assert acc.mape(land.X @ wf, land.fw) < got["fw"]
    # leave-one-task-out plan ranking (the report's figures; measurement noise between two H200s
    # gives within-task rho 0.98-0.99, the goal is 0.9: not reached, see docs/oracles.md)
    lto = land.leave_task_out()
    costs = {key: dict(zip(i.tolist(), p.sum(1).tolist())) for key, (i, p) in lto.items()}
    for source, (rho_min, mape_max) in REPORTED_PLANS.items():
        rhos, plan_mape, n = land.plan_scores(source, lambda key: costs[key])
        assert len(rhos) == 20 and n == sources.count(source)
        assert np.nanmean(rhos) >= rho_min - 0.01 and plan_mape <= mape_max + MARGIN, (source, np.nanmean(rhos), plan_mape)


def test_refit_reproduces_shipped_parameters():
    fit = load_tool("fit_gpu_emulator")
    fresh = json.loads(fit.format_params(fit.fit_from_measurements()))
    shipped = read_params(model_path("h200"))
    assert set(fresh) == set(shipped)
    for key in fresh:
        if key != "sets":
            assert fresh[key] == shipped[key], key
    # Columns identical over a set's shards (the batch-4096 set's launch floors max(1, lookups / 10^k) for k = 7,
    # 7.5 equal the constant: no shard there reaches 10^7 lookups) share their weight however the last bits of
    # the CPU's BLAS fall: on the machine that fitted the shipped file the backward weight went to
    # floor_lookups1e7, on an AVX-512 one to the constant. Such a group is compared by its sum,
    # and so is the prediction on every measured shard, each to within the constant's floor of 1 us
    # (fit_weights keeps the constant's weight >= 1e-3 ms: on the first machine it was 0 before that floor).
    from shardcore.oracles.emulated.emulator import measured_landscapes

    lands = {str(land.batch): land for land in measured_landscapes("h200")}
    for batch, s in shipped["sets"].items():
        assert fresh["sets"][batch]["shards"] == s["shards"]
        X = lands[batch].X
        first = [next(k for k in range(j + 1) if np.array_equal(X[:, k], X[:, j])) for j in range(X.shape[1])]
        for part in ("fw", "bw"):
            got, want = np.asarray(fresh["sets"][batch][part]), np.asarray(s[part])
            np.testing.assert_allclose(X @ got, X @ want, rtol=1e-9, atol=1.000001e-3)
            for g in sorted(set(first)):
                cols = [j for j in range(len(first)) if first[j] == g]
                np.testing.assert_allclose(got[cols].sum(), want[cols].sum(), rtol=1e-8,
                                           atol=1.000001e-3 if 0 in cols else 1e-15)


def _run_predict(argv, capsys):
    tool = load_tool("predict_shard_costs")
    with pytest.raises(SystemExit) as exc:
        run_main(tool.main, argv)
    cap = capsys.readouterr()
    return exc.value.code, cap.out, cap.err


def test_predict_shard_costs_round_trip(tmp_path, capsys, model, tables):
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"tables": [[1, 16], [2, 8]], "fw_ms": 0.5, "bw_ms": 0.9, "plan": "x"}) + "\n\n"
                   + json.dumps({"tables": [[154, 16]]}) + "\n")
    out = tmp_path / "out.jsonl"
    code, text, err = _run_predict(["--oracle", "emulated:h200", "--shards", str(src), "--out", str(out)], capsys)
    assert code == 0 and err == ""
    assert "MAPE vs the file's measurements (1 shards)" in text
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 2
    assert rows[0]["measured_fw_ms"] == 0.5 and rows[0]["measured_bw_ms"] == 0.9 and rows[0]["plan"] == "x"
    fw, bw = model.predict([tables[1], tables[2].with_dim(8)], 65536)
    assert rows[0]["fw_ms"] == pytest.approx(fw, abs=1e-6) and rows[0]["bw_ms"] == pytest.approx(bw, abs=1e-6)
    assert "measured_fw_ms" not in rows[1] and rows[1]["fw_ms"] > 0 and rows[1]["oracle"] == "emulated:h200"


@pytest.mark.parametrize("content, message", [
    (None, "shard file not found"),
    ('{"tables": [[1, 16]]}\n{"tables": [[1, 16]\n', "in.jsonl:2: malformed JSON"),
    ('{"tables": [[9999, 16]]}\n', "unknown table id 9999"),
    ('{"tables": [[1, 6]]}\n', "dim 6 must be a positive multiple of 4"),
    ('{"tables": [[1, 32]]}\n', "no larger than the table's dim 16"),
    ('{"tables": [[1, 16]], "fw_ms": "fast"}\n', "fw_ms must be a non-negative number"),
])
def test_predict_shard_costs_errors(tmp_path, capsys, content, message):
    src = tmp_path / "in.jsonl"
    if content is not None:
        src.write_text(content)
    out = tmp_path / "out.jsonl"
    code, text, err = _run_predict(["--shards", str(src), "--out", str(out)], capsys)
    assert code == 2 and message in err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert not out.exists()  # nothing half-written


def test_predict_shard_costs_unknown_oracle_and_missing_configs(tmp_path, capsys):
    src = tmp_path / "in.jsonl"
    src.write_text('{"tables": [[1, 16]]}\n')
    code, _, err = _run_predict(["--oracle", "emulated:a100", "--shards", str(src), "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and err.startswith("error: unknown oracle 'emulated:a100'") and err.count("\n") == 1
    code, _, err = _run_predict(["--shards", str(src), "--out", str(tmp_path / "o"),
                                 "--table-configs", str(tmp_path / "none.json")], capsys)
    assert code == 2 and err.startswith("error: table configs not found") and err.count("\n") == 1


def test_gpucheck_runs_reconstructed_and_prediction_fast(model, tables):
    import time
    from shardcore.oracles.emulated.emulator import load_measurements

    meas = load_measurements(65536)
    shards = meas["shards"]
    for p in meas["plans"]:
        if p["source"] == "plans":
            continue
        # the compute cost is one of that run's device measurements, and no device is cheaper than all of them
        own = [[f + b for r, f, b in shards[k]["measured"] if r == p["source"]] for k in p["shards"]]
        assert all(own) and any(abs(c - p["gpu_cost_ms"]) <= 1e-9 for cs in own for c in cs)
        assert all(min(cs) <= p["gpu_cost_ms"] + 1e-9 for cs in own)
        assert all((p["set"], p["task"]) in shards[k]["tasks"] for k in p["shards"])
    assert sum(s["kind"] == "random" for s in shards) == shipped_counts()["random"]
    shard = tables[:50]
    model.predict(shard, 65536)
    t0 = time.perf_counter()
    for _ in range(20):
        model.predict(shard, 65536)
    assert (time.perf_counter() - t0) / 20 < 5e-3  # well under a millisecond on an idle core


# -- the held-out judge ----------------------------------------------------------------------------
def test_heldout_fit_never_sees_the_excluded_tables_and_refits_like_the_shipped_one(model, tables):
    from shardcore.oracles.emulated.emulator import MEASUREMENTS_DIR as MD, TASK_FILES, heldout_model, measured_landscapes, seen_tables

    land = measured_landscapes("h200")[0]
    # no table excluded: the same weights as the shipped fit at batch 65536
    full = heldout_model(frozenset(), "h200")
    np.testing.assert_allclose(full.weights[65536][0], model.weights[65536][0], rtol=1e-8, atol=1e-15)
    with open(os.path.join(MD, TASK_FILES["dlrm_tasks_50"])) as fh:
        task = frozenset(int(v) for v in fh.readline().split()[0].split(","))
    held = heldout_model(task, "h200")
    assert held.params["heldout"]["tables"] == sorted(task)
    used = int(held.params["sets"]["65536"]["shards"])
    holding = land.holding(task)
    assert used == int((~holding).sum()) and 0 < used < len(holding)
    # refitting on exactly the shards that hold none of the task's tables gives the same weights
    wf, wb = land.fit(~holding)
    np.testing.assert_allclose(held.weights[65536][0], wf)
    np.testing.assert_allclose(held.weights[65536][1], wb)
    assert not np.allclose(held.weights[65536][0], model.weights[65536][0])
    # a model that is not the judge: one fold of the judge's shards left out
    sub = heldout_model(task, "h200", "drop:0/5")
    assert 0.7 * used < int(sub.params["sets"]["65536"]["shards"]) < used
    # the measured tables are recognised by index, hash size and pooling factor; others never were
    assert seen_tables([tables[i] for i in task]) == task
    assert seen_tables([dataclasses.replace(tables[i], row=tables[i].row * 3 + 1000) for i in task]) == frozenset()
    with pytest.raises(ShardError, match="drop:k/K"):
        heldout_model(task, "h200", "half")


def test_heldout_oracle_judges_each_plan_without_its_tables(tables):
    from shardcore.oracles.cache import CachedOracle
    from shardcore.oracles.emulated.emulator import heldout_model
    from shardcore.oracles.emulated.oracle import EmulatedOracle
    from shardcore.plan import Plan

    data_dir = os.path.dirname(CONFIGS)
    task = [tables[i] for i in (3, 17, 40, 77, 120, 300)]
    plan = Plan.from_device_tables(task, [[0, 1, 2], [3, 4, 5]], Topology(2, 1e6)).device_pieces
    held = EmulatedOracle(data_dir, 2, batch_size=65536)
    full = EmulatedOracle(data_dir, 2, batch_size=65536, fit="full")
    assert held.fit == "heldout" and "held out" in held.hardware and "without" in held.parts["compute"]
    r_held, r_full = held.evaluate(plan), full.evaluate(plan)
    judge = heldout_model(frozenset(t.index for t in task), "h200")
    for d, shard in enumerate(plan):
        fw, bw = judge.predict(shard, 65536)
        assert r_held.device_costs_ms[d][0] == pytest.approx(fw) and r_held.device_costs_ms[d][3] == pytest.approx(bw)
    assert r_held.device_costs_ms != r_full.device_costs_ms
    with pytest.raises(ShardError, match="not cached"):
        CachedOracle(held, True)


# -- the optional terms (shard footprint, per-dim distinct sectors, table count) and the CV prior ----------
def test_cv_prior_is_the_known_tables_lookup_weighted_quantiles():
    from shardcore.oracles.emulated.emulator import DEFAULT_SPEC, synthetic_length_cv

    known = synthetic_length_cv()
    cv, pf = np.array(known["cv"]), np.array(known["pooling_factor"])
    order = np.argsort(cv)
    cum = np.cumsum(np.where(pf > 0, pf, 0.0)[order])
    cum /= cum[-1]
    q = [float(cv[order][np.searchsorted(cum, (i + 0.5) / 9)]) for i in range(9)]
    np.testing.assert_allclose(DEFAULT_SPEC["cv_prior"], q, atol=1e-4)


def test_unknown_cv_is_the_mean_over_the_prior(tables):
    from shardcore.oracles.emulated.emulator import DEFAULT_SPEC, shard_features, table_arrays

    shards = [tables[150:160], tables[3:5]]
    nan = [[float("nan")] * len(s) for s in shards]
    ta, of = table_arrays(shards, nan)
    X_unknown = shard_features(ta, of, 2, 65536, DEFAULT_SPEC)
    per_cv = []
    for c in DEFAULT_SPEC["cv_prior"]:
        ta, of = table_arrays(shards, [[c] * len(s) for s in shards])
        per_cv.append(shard_features(ta, of, 2, 65536, DEFAULT_SPEC))
    # every feature is a sum of per-table terms linear in (CV^2, hats of CV) or free of the CV
    np.testing.assert_allclose(X_unknown, np.mean(per_cv, 0), rtol=1e-12)
    assert not np.allclose(per_cv[0], per_cv[-1])   # the CV does enter


def test_unknown_tables_get_the_prior_in_predictions(model, tables):
    stranger = dataclasses.replace(tables[154], row=tables[154].row * 3, length_cv=None)
    assert model.table_cv(stranger) == model.default_cv      # the point value callers read
    by_default = model.predict([stranger], 65536)
    assert by_default == model.predict([stranger], 65536, length_cv=[float("nan")])
    assert by_default == model.predict([stranger], 65536, length_cv=[None])
    # a known table keeps its own CV
    known = tables[154]
    assert model.predict([known], 65536) == model.predict([known], 65536, length_cv=[model.table_cv(known)])


def test_parameter_sets_without_the_optional_terms_still_load(tables):
    """A parameter file fitted before the optional terms keeps its 37 features and the default CV."""
    from shardcore.oracles.emulated.emulator import DEFAULT_SPEC, GpuComputeModel, feature_names, shard_features, table_arrays

    old = {k: DEFAULT_SPEC[k] for k in ("cache_bytes", "cv_knots", "footprint_knots", "size_knots")}
    assert len(feature_names(old)) == 37 and len(feature_names(DEFAULT_SPEC)) == 50
    shards = [tables[150:170], tables[3:5]]
    ta, of = table_arrays(shards, [[0.5] * len(s) for s in shards])
    X_old = shard_features(ta, of, 2, 65536, old)
    X_new = shard_features(ta, of, 2, 65536, DEFAULT_SPEC)
    np.testing.assert_array_equal(X_new[:, :37], X_old)       # the new terms only append columns
    n = X_old.shape[1]
    w = np.full(n, 1e-9)
    w[0] = 0.1
    params = {"format": "shardkit-gpu-emulator-1", "spec": old, "default_cv": 0.5,
              "sets": {"65536": {"fw": list(w), "bw": list(w)}}}
    m = GpuComputeModel(params)
    stranger = dataclasses.replace(tables[154], row=tables[154].row * 3, length_cv=None)
    assert m.predict([stranger], 65536) == m.predict([stranger], 65536, length_cv=[0.5])


def test_the_devices_judge_never_sees_a_shard_made_only_of_the_plans_tables(tables):
    """--emulator-fit devices: the fit leaves out every measured shard made only of the plan's tables (any
    device a plan of them could have), and keeps the shards that mix them with other tables."""
    from shardcore.oracles.cache import CachedOracle
    from shardcore.oracles.emulated.emulator import heldout_model, judge_error, measured_landscapes, seen_tables
    from shardcore.oracles.emulated.oracle import EmulatedOracle
    from shardcore.plan import Plan
    from shardcore.tasks import load_tasks

    land = measured_landscapes("h200")[0]
    task = load_tasks(os.path.join(MEASUREMENTS_DIR, "tasks", "dlrm_tasks_50_test.txt"), num_tables=len(tables))[0]
    ids = seen_tables(task.tables(tables))
    within, holding = land.within(ids), land.holding(ids)
    assert within.sum() >= 30 and (holding & ~within).sum() > within.sum()   # its tables, mixed with others
    assert not (within & ~holding).any()
    by_devices, by_tables = heldout_model(ids, rule="devices"), heldout_model(ids)
    assert by_devices.params["heldout"]["rule"] == "devices"
    assert by_devices.weights[65536][0] != pytest.approx(by_tables.weights[65536][0])
    wf, wb = land.fit(~within)
    assert np.allclose(by_devices.weights[65536][0], wf) and np.allclose(by_devices.weights[65536][1], wb)
    # its own held-out error: the measured plan shards made only of the task's tables
    assert len(judge_error(ids, rule="devices")) == int((within & np.array([s["kind"] == "plan" for s in land.meas["shards"]])).sum())
    with pytest.raises(ShardError, match="hold-out rule"):
        land.held_out(ids, "rows")
    data_dir = os.path.dirname(CONFIGS)
    oracle = EmulatedOracle(data_dir, 4, batch_size=65536, fit="devices")
    assert "held out by devices" in oracle.hardware and "made only of" in oracle.parts["compute"]
    assert oracle.context.hardware.endswith(":devices")
    tt = task.tables(tables)
    shards = Plan.table_wise(tt, [k % 4 for k in range(len(tt))], Topology(4, 1e6)).device_pieces
    got = oracle.evaluate(shards)
    fw, bw = by_devices.predict(shards[0], 65536)
    assert got.device_costs_ms[0][0] == pytest.approx(fw) and got.device_costs_ms[0][3] == pytest.approx(bw)
    with pytest.raises(ShardError, match="not cached"):
        CachedOracle(oracle, True)


def test_the_devices_judge_prices_the_anchors_measured_plans_closer():
    """An H200 run's measured plans (gpucheck4), re-scored whole: the measured plans of the anchors come out closer to their measured
    cost under the judge held out by devices (which knows the tables from other shards, as the learned
    methods' training oracle did) than under the one held out by tables."""
    acc = load_tool("emulator_accuracy")
    res = {"judged_rows": [], "figures": {}}
    acc.judged_plan_rows(res, MEASUREMENTS_DIR, runs=acc.JUDGED_RUNS[1:2])
    fig = res["figures"]
    for name in ("DLRM-50", "DLRM-100"):
        for alg in ("torchrec-tw", "dreamshard"):
            f = fig[f"judged_gpucheck4_{name}_{alg}"]
            assert f["devices_mape_pct"] < f["mape_pct"] and abs(f["devices_bias_pct"]) < 1.0
    assert len(res["judged_rows"][0]) == 12


def test_the_stressed_judge_per_device_count_prices_unseen_plans_closely_and_is_kinder_to_shardkit():
    """An H200 run in no fit (gpucheck6): the stressed judge with its replica pools per device count (the
    default) prices shardkit's and TorchRec's measured plans within 1.2% on both sets, and is kinder to
    shardkit than to TorchRec on DLRM-50: why an emulated margin of shardkit's is an upper bound."""
    acc = load_tool("emulator_accuracy")
    res = {"judged_rows": [], "figures": {}}
    acc.judged_plan_rows(res, MEASUREMENTS_DIR, runs=acc.JUDGED_RUNS[-1:])
    fig = res["figures"]
    for name in ("DLRM-50", "DLRM-100"):
        sk, tr = fig[f"judged_gpucheck6_{name}_shardkit"], fig[f"judged_gpucheck6_{name}_torchrec"]
        assert abs(sk["stressed_bias_pct"]) < 1.2 and abs(tr["stressed_bias_pct"]) < 1.2
    sk, tr = fig["judged_gpucheck6_DLRM-50_shardkit"], fig["judged_gpucheck6_DLRM-50_torchrec"]
    assert tr["stressed_bias_pct"] > sk["stressed_bias_pct"]


def test_the_judge_prices_shardkit_and_torchrec_alike_on_their_measured_plans():
    """An H200 run (gpucheck4): shardkit's and TorchRec's plans of all 20 test tasks, measured; the
    held-out emulated judge re-scores each whole plan. With the replica kernel fitted on TorchRec's
    replicas alone it priced shardkit's DLRM-50 plans ~12% low on average (six of them 12-25%); now
    every planner's mean error is within a few percent, shardkit's still the kindest (winner's curse)."""
    acc = load_tool("emulator_accuracy")
    res = {"judged_rows": [], "figures": {}}
    acc.judged_plan_rows(res, MEASUREMENTS_DIR, runs=acc.JUDGED_RUNS[1:2])
    fig = res["figures"]
    for name in ("DLRM-50", "DLRM-100"):
        sk, tr = fig[f"judged_gpucheck4_{name}_shardkit"], fig[f"judged_gpucheck4_{name}_torchrec"]
        assert sk["plans"] == tr["plans"] == 10
        assert abs(sk["bias_pct"]) < 4 and abs(tr["bias_pct"]) < 3 and sk["mape_pct"] < 5
        assert sk["bias_pct"] < tr["bias_pct"]
    assert fig["judged_gpucheck4_DLRM-50_torchrec"]["measured_ms"] < fig["judged_gpucheck4_DLRM-50_shardkit"]["measured_ms"]


def test_accuracy_tool_reports_shard_classes():
    acc = load_tool("emulator_accuracy")
    from shardcore.oracles.emulated.emulator import DEFAULT_SPEC, default_cv_of, synthetic_length_cv
    from shardcore.dataset import load_table_configs as ltc

    known = synthetic_length_cv()
    land = acc.Landscape(65536, MEASUREMENTS_DIR, dict(DEFAULT_SPEC), known, default_cv_of(known, ltc(CONFIGS), 65536))
    classes = dict(acc.shard_classes(land))
    # the dim classes partition the shards, and so do plan / random
    dims = [classes["widest dim <= 16"], classes["widest dim 17-64"], classes["widest dim >= 128"]]
    assert (np.sum(dims, 0) == 1).all() and all(c.any() for c in dims)
    assert ((classes["plan shards"].astype(int) + classes["random shards"]) == 1).all()
    assert (classes["random, 1-5 tables"] | classes["random, >= 6 tables"] == classes["random shards"]).all()
    pred = land.kfold()
    # held-out figures of the report: random shards of 6+ tables (dims 4-128) within 5%
    sel = classes["random, >= 6 tables"]
    assert acc.mape(pred[sel].sum(1), land.fw[sel] + land.bw[sel]) <= 4.03 + MARGIN
    # the unknown-CV features average over the prior: they differ from the known ones, and cost more
    # MAPE than the known CVs do (the information is missing), but within the report's figure
    pu = land.kfold(land.X_unknown)
    assert not np.allclose(land.X_unknown, land.X)
    assert acc.mape(pred.sum(1), land.fw + land.bw) < acc.mape(pu.sum(1), land.fw + land.bw) <= 5.56 + MARGIN


def test_heldout_fit_with_few_shards_keeps_the_core_features():
    """A held-out fit whose largest set has fewer than two shards per weight of the full feature set
    keeps the core features (a DLRM-100 task's tables less shardkit's dropped fifth left 80 shards
    with only the first measurement files, 100-130 with the fitted gpu_check runs: two tasks' tables together
    leave fewer)."""
    from shardcore.oracles.emulated import emulator as E
    from shardcore.tasks import load_tasks

    land = E.measured_landscapes("h200")[0]
    core = {k: v for k, v in E.DEFAULT_SPEC.items() if k not in E.OPTIONAL_TERMS}
    ncore, nfull = len(E.feature_names(core)), len(E.feature_names(E.DEFAULT_SPEC))
    assert ncore < nfull == land.X.shape[1]
    tasks = load_tasks(os.path.join(ROOT, "data/gpu_measurements/tasks/dlrm_tasks_100_test.txt"))
    seen = set()
    # every task, and task 0's tables with the fewest of task 1's that leave too few shards for all features
    grow = next(frozenset(tasks[0].table_ids) | frozenset(tasks[1].table_ids[:j]) for j in range(len(tasks[1].table_ids))
                if int(E._fit_rows(land, frozenset(tasks[0].table_ids) | frozenset(tasks[1].table_ids[:j]),
                                   "drop:0/5").sum()) < 2 * nfull)
    for ex in [frozenset(t.table_ids) for t in tasks] + [grow]:
        n = int(E._fit_rows(land, ex, "drop:0/5").sum())
        m = E.heldout_model(ex, subset="drop:0/5")
        k = len(m.params["features"])
        assert k == (nfull if n >= 2 * nfull else ncore)
        seen.add(k)
        tables = [E.measured_landscapes("h200")[0].meas["tables"][0]]
        assert float(E.predict_devices(m, [tables], 65536, lambda t: 0.5).sum()) > 0
    assert seen == {ncore, nfull}   # both cases occur


def test_cpu_feature_family_scales_every_per_lookup_term_with_the_dim():
    """CPU_SPEC: as many features as names; halving a table's dim halves every dim-scaled feature (the
    lookups and the table count stay); an unknown CV enters as the prior's mean CV^2."""
    import math

    from shardcore.oracles.emulated.emulator import CPU_SPEC, feature_names, shard_features, table_arrays
    from shardcore.tables import NUM_BINS, TableConfig

    bins = [0.0] * NUM_BINS
    bins[1] = 1.0
    t = TableConfig(index=0, row=1_000_000, dim=32, pooling_factor=20.0, bins=tuple(bins))
    h = t.with_dim(16)
    names = feature_names(CPU_SPEC)
    ta, of = table_arrays([[t], [h]], [[0.5], [0.5]])
    X = shard_features(ta, of, 2, 4096, CPU_SPEC)
    assert X.shape == (2, len(names))
    fixed = [names.index(n) for n in ("const", "tables", "lookups", "tables_sq", "lookups_x_sort_passes")]
    scaled = [i for i in range(len(names)) if i not in fixed and X[0, i] != 0]
    np.testing.assert_allclose(X[1, fixed], X[0, fixed])
    # the footprint hats move with the table's bytes too, so compare the dim-scaled sum of the lookups
    assert X[1, names.index("lookups_x_dim")] == pytest.approx(X[0, names.index("lookups_x_dim")] / 2)
    assert X[1, names.index("batch_x_dim")] == pytest.approx(X[0, names.index("batch_x_dim")] / 2)
    assert sum(X[1, i] for i in scaled if "bytes1e" in names[i]) == pytest.approx(
        sum(X[0, i] for i in scaled if "bytes1e" in names[i]) / 2)
    ta_u, of_u = table_arrays([[t]], [[math.nan]])
    Xu = shard_features(ta_u, of_u, 1, 4096, CPU_SPEC)
    cv2 = float(np.mean(np.asarray(CPU_SPEC["cv_prior"]) ** 2))
    i = names.index("lookups_x_dim_x_cv2")
    assert Xu[0, i] == pytest.approx(X[0, names.index("lookups_x_dim")] * cv2)


def test_cpu_backward_terms_sort_passes_and_update_locality():
    """CPU_SPEC's backward terms: lookups x the radix sort's passes (one per 8 bits of the row count),
    distinct rows x hats of log2 of the bytes between consecutive updated rows (their sum is the distinct
    rows; a sparsely touched large table weighs on the wide gaps, a densely touched one on the narrow);
    a spec without them gives exactly the 13 features of the models fitted before (stored files keep
    predicting as they did), shards contiguous or not."""
    from shardcore.oracles.emulated.emulator import (CPU_SPEC, _distinct_rows, feature_names, shard_features,
                                                     sort_passes, table_arrays)
    from shardcore.tables import NUM_BINS, TableConfig

    np.testing.assert_array_equal(sort_passes(np.array([1, 255, 256, 65535, 65536, 2 ** 24 - 1, 2 ** 24])),
                                  [1, 1, 2, 2, 3, 3, 4])
    bins = [0.0] * NUM_BINS
    bins[0] = 1.0                       # every distinct row looked up once: distinct rows = lookups
    dense = TableConfig(index=0, row=50_000, dim=16, pooling_factor=10.0, bins=tuple(bins))     # 40,960 of 50K rows
    sparse = TableConfig(index=1, row=5_000_000, dim=16, pooling_factor=10.0, bins=tuple(bins))  # of 5M rows
    small = TableConfig(index=2, row=200, dim=8, pooling_factor=3.0, bins=tuple(bins))
    names = feature_names(CPU_SPEC)
    old = {k: v for k, v in CPU_SPEC.items() if k not in ("sort_passes", "gap_knots")}
    assert feature_names(old) == names[:13] and names[13] == "lookups_x_sort_passes"
    shards = [[dense, small], [sparse], [small, sparse, dense]]
    ta, of = table_arrays(shards, [[0.5] * len(s) for s in shards])
    X = shard_features(ta, of, 3, 4096, CPU_SPEC)
    assert X.shape == (3, len(names))
    np.testing.assert_allclose(shard_features(ta, of, 3, 4096, old), X[:, :13], rtol=1e-12)
    L = 4096 * ta.pf
    D = _distinct_rows(ta, L)
    passes = np.array([2, 1, 3, 1, 3, 2])     # dense 50K rows, small 200, sparse 5M (in ta's order)
    gap = [i for i, n in enumerate(names) if n.startswith("distinct_gap")]
    for k, rows in enumerate(([0, 1], [2], [3, 4, 5])):
        assert X[k, names.index("lookups_x_sort_passes")] == pytest.approx(float((L[rows] * passes[rows]).sum()))
        assert X[k, gap].sum() == pytest.approx(float(D[rows].sum()))
    knots = np.asarray(CPU_SPEC["gap_knots"])
    mean_knot = (X[:, gap] * knots).sum(1) / X[:, gap].sum(1)
    assert mean_knot[1] > 11.5 and mean_knot[0] < 7.5        # ~3.9 KB apart vs ~39 B apart
    # the shards' tables interleaved (not contiguous) give the same sums
    order = np.array([2, 0, 5, 1, 3, 4])
    from shardcore.oracles.emulated.emulator import TableArrays
    tb = TableArrays(ta.row[order], ta.pf[order], ta.dim[order], ta.bins[order], ta.cv[order])
    np.testing.assert_allclose(shard_features(tb, of[order], 3, 4096, CPU_SPEC), X, rtol=1e-12)


def test_replica_kernels_rest_on_the_h200_measurements_held_out_by_task(model):
    """Data-parallel replicas measured on an H200 (TorchRec's plans, shardkit's, random pieces): the replica kernel's traffic law is fitted on the measured devices, each device predicted
    by a judge that never saw its own task, within a few percent for every planner's plans alike --
    the first fit (TorchRec's replicas alone) priced shardkit's heavy replicas 15-19% low."""
    from shardcore.oracles.emulated.emulator import (REPLICA_FEATURES, fit_replica_weights, heldout_model,
                                                     predict_devices, replica_devices)
    from shardcore.plan import device_kernels

    w, n = fit_replica_weights(model)
    assert n == len(replica_devices()) >= 400
    assert w.shape == (2, len(REPLICA_FEATURES)) and (w >= 0).all()
    fixed = w[:, 0] + 3.0 * w[:, 3]                             # a kernel of 30 replicas, before its traffic
    assert 0.05 < fixed[0] < fixed[1] < 0.4                    # about a launch, the backward's larger
    assert (w[:, 1:3] > 0).all()                               # a replica kernel grows with its traffic
    assert (w[:, 3] > 0).all()                                 # and with its number of replicas
    task_sets = []
    for name in ("dlrm_tasks_50_test.txt", "dlrm_tasks_100_test.txt"):
        with open(os.path.join(MEASUREMENTS_DIR, "tasks", name)) as fh:
            task_sets += [frozenset(int(v) for v in line.split()[0].split(",")) for line in fh if line.strip()]
    err, plain_err, judges = {}, [], set()
    for pieces, fw, bw, alg in replica_devices_with_alg():
        own = [t for t in task_sets if {p.index for p in pieces} <= t]
        if len(own) != 1:          # a random device: no task's
            continue
        judge = heldout_model(own[0])
        if own[0] not in judges:   # once per judge (a fit reads every device)
            judges.add(own[0])
            assert fit_replica_weights(judge, own[0])[1] < n        # its own task's devices left out
        measured = fw + bw
        err.setdefault(alg, []).append(predict_devices(judge, [list(pieces)], 65536)[0].sum() / measured - 1)
        plain = sum(judge.predict_many([ks], b)[0].sum() for b, ks in device_kernels(list(pieces), 65536))
        plain_err.append(abs(plain - measured) / measured)
    assert {"torchrec", "shardkit"} <= set(err)
    for alg, e in err.items():
        assert abs(np.mean(e)) < 0.05 and np.mean(np.abs(e)) < 0.07, alg
    assert np.mean(plain_err) > 0.3


def test_the_replica_fit_prices_every_device_in_one_call_as_one_at_a_time(model):
    """fit_replica_weights prices the measured devices' other kernels in one batched call: the residuals
    and weights are those of pricing each device's kernels on its own, one call per device."""
    from shardcore.oracles.emulated.emulator import (REPLICA_FEATURES, fit_replica_weights, known_cv, nnls,
                                                     replica_devices, replica_features)
    from shardcore.plan import device_kernels

    rows = replica_devices()
    X, resid = np.zeros((len(rows), len(REPLICA_FEATURES))), np.zeros((len(rows), 2))
    for i, (pieces, fw, bw) in enumerate(rows):
        other = np.zeros(2)
        for b, ks in device_kernels(list(pieces), 65536):
            if b < 65536:
                X[i] += replica_features([ks], b)[0]
            else:
                other += model.predict_many([ks], b, [[known_cv(model._known, t, np.nan) for t in ks]])[0]
        resid[i] = np.array([fw, bw]) - other
    one_at_a_time = np.stack([nnls(X, resid[:, j]) for j in (0, 1)])
    w, n = fit_replica_weights(model)
    assert n == len(rows) and np.allclose(w, one_at_a_time, rtol=1e-12, atol=0)


def replica_devices_with_alg():
    """Every measured device with replicas of the shipped pieces files, with the planner named on its line."""
    from shardcore.oracles.emulated.emulator import PIECE_FILES, piece_of
    from shardcore.dataset import load_table_configs

    tables = load_table_configs(os.path.join(MEASUREMENTS_DIR, "dlrm_b65536", "table_configs.json"))
    for name in PIECE_FILES[65536]:
        with open(os.path.join(MEASUREMENTS_DIR, name)) as fh:
            for line in fh:
                obj = json.loads(line)
                pieces = tuple(piece_of(p, tables) for p in obj["pieces"])
                if any(getattr(p, "kind", None) == "data_parallel" for p in pieces):
                    yield pieces, obj["fw_ms"], obj["bw_ms"], str(obj.get("alg", obj.get("kind")))


def test_piece_lines_are_read_back_as_pieces(tables):
    from shardcore.oracles.emulated.emulator import piece_of

    t = tables[100]
    rw = piece_of({"index": 100, "dim": 16, "kind": "row_wise", "rows": t.row // 2, "row_start": 0,
                   "full_row": t.row}, tables)
    dp = piece_of({"index": 100, "dim": 16, "kind": "data_parallel", "rows": t.row, "batch_part": [1, 4]}, tables)
    assert rw.kind == "row_wise" and rw.row == t.row // 2 and rw.pooling_factor == pytest.approx(t.pooling_factor * (t.row // 2) / t.row)
    assert dp.batch_part == (1, 4) and dp.row == t.row
    assert piece_of({"index": 100, "dim": 8, "kind": "column_wise", "rows": t.row}, tables).dim == 8
    with pytest.raises(ShardError, match="not a measured piece"):
        piece_of({"index": 100, "dim": 16, "kind": "grid", "rows": 3}, tables)


def test_replica_devices_by_batch_slice():
    """gpucheck6 measured gpucheck4's random replica devices again at slices 1/2 and 1/16: the shipped
    replica law, fitted at 1/4 and 1/8, carries to 1/2 and prices 1/16 well low (the median device)."""
    acc = load_tool("emulator_accuracy")
    res = {"shard_rows": [], "figures": {}}
    acc.slice_rows(res, MEASUREMENTS_DIR)
    fig = {k.split("_slice")[1]: v for k, v in res["figures"].items()}
    assert sorted(fig) == ["16_gpucheck6", "2_gpucheck6", "4_gpucheck4", "8_gpucheck4"]
    for run in ("gpucheck4", "gpucheck6"):   # every random device with replicas, each at one slice
        with open(os.path.join(MEASUREMENTS_DIR, f"h200_b65536_{run}_pieces.jsonl")) as fh:
            lines = [o for o in map(json.loads, filter(str.strip, fh)) if o.get("kind") == "random_pieces"
                     and any(p["kind"] == "data_parallel" for p in o["pieces"])]
        assert sum(v["devices"] for k, v in fig.items() if k.endswith(run)) == len(lines) > 0
    assert abs(fig["2_gpucheck6"]["median_ratio"] - fig["4_gpucheck4"]["median_ratio"]) < 0.01
    assert fig["16_gpucheck6"]["median_ratio"] > 1.15 > fig["8_gpucheck4"]["median_ratio"]


def test_a_piece_line_names_its_task_set_and_an_old_one_its_device_counts(tmp_path, monkeypatch):
    """A measured device with pieces is judged by the held-out judge of its own task: a line names its set
    (NS and the training-pool sets have 4 or 8 devices too); a line that names none is of the test set of
    its device count."""
    from shardcore.oracles.emulated import measurements as E   # where the loading reads its files

    (tmp_path / "dlrm_b65536").mkdir()
    os.symlink(os.path.join(MEASUREMENTS_DIR, "dlrm_b65536", "table_configs.json"),
               tmp_path / "dlrm_b65536" / "table_configs.json")
    piece = {"index": 3, "dim": 16, "kind": "data_parallel", "rows": 1000, "batch_part": [0, 4]}
    lines = [{"tables": [[3, 16]], "pieces": [piece], "fw_ms": 1.0, "bw_ms": 2.0, "task": 2, "alg": "x",
              "hardware": "NVIDIA H200, 4 plan devices"},
             {"tables": [[3, 16]], "pieces": [piece], "fw_ms": 1.0, "bw_ms": 2.0, "task": 1, "alg": "x", "set": "NS",
              "hardware": "NVIDIA H200, 4 plan devices"},
             {"tables": [[3, 16]], "pieces": [piece], "fw_ms": 1.0, "bw_ms": 2.0, "task": 0, "alg": "x",
              "set": "DLRM-100-train", "hardware": "NVIDIA H200, 8 plan devices"},
             {"tables": [[3, 16]], "pieces": [piece], "fw_ms": 1.0, "bw_ms": 2.0, "kind": "random_pieces",
              "hardware": "NVIDIA H200"}]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    monkeypatch.setattr(E, "MEASUREMENTS_DIR", tmp_path)
    monkeypatch.setattr(E, "PIECE_FILES", {65536: ("p.jsonl",)})
    E.measured_piece_devices.cache_clear()
    try:
        got = [(d[3], d[4], d[5]) for d in E.measured_piece_devices("h200", 65536)]
        assert got == [(2, 4, "dlrm_tasks_50"), (1, 4, "ns_tasks"), (0, 8, "dlrm_tasks_100_train"), (None, None, None)]
        lines[1]["set"] = "XY"
        (tmp_path / "p.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
        E.measured_piece_devices.cache_clear()
        with pytest.raises(ShardError, match=r"p.jsonl:2: unknown task set 'XY'"):
            E.measured_piece_devices("h200", 65536)
    finally:
        E.measured_piece_devices.cache_clear()


def test_the_judges_error_on_devices_no_fit_saw_grows_as_its_shards_shrink():
    """emulator_accuracy's table "What the held-out judge lacks": the whole-table plan devices of the runs
    in no fit, predicted by each task's judge (as shipped), by it on fewer shards, and by the full fit. The
    judge's spread grows as its shards shrink, the full fit, which has seen the tables, is the tightest,
    and a DLRM-100 task's judge (fitted without 100 tables' shards) spreads wider than a DLRM-50 one's."""
    acc = load_tool("emulator_accuracy")
    res = {"unseen_rows": [], "figures": {}}
    acc.unseen_device_rows(res, draws=1)
    fig = res["figures"]
    for which in ("dlrm_tasks_50", "dlrm_tasks_100"):
        sd = {k[len(f"unseen_{which}_"):]: v["sd_pct"] for k, v in fig.items() if k.startswith(f"unseen_{which}_")}
        judge = sd["held out by the task's tables (the judge)"]
        full = sd["the full fit (has seen the tables, not these devices)"]
        assert full < judge < sd["the same, a random 0.25 of its shards"]
    from shardcore.oracles.emulated.emulator import plan_devices

    want = {"DLRM-50": 0, "DLRM-100": 0}   # the unseen runs' whole-table plan devices, counted from their files
    for name in acc.UNSEEN_SHARD_FILES:
        with open(os.path.join(MEASUREMENTS_DIR, name)) as fh:
            for o in map(json.loads, filter(str.strip, fh)):
                if "task" in o and o.get("kind") not in ("random", "random_pieces"):
                    want["DLRM-50" if plan_devices(o) == 4 else "DLRM-100"] += 1
    assert {r[0]: r[2] for r in res["unseen_rows"]} == want
    judge = "held out by the task's tables (the judge)"
    assert fig[f"unseen_dlrm_tasks_100_{judge}"]["sd_pct"] > fig[f"unseen_dlrm_tasks_50_{judge}"]["sd_pct"]


def test_a_run_of_training_pool_sets_joins_the_fit_and_every_test_judge_keeps_it(tmp_path, monkeypatch):
    """What registering a gpu_check run of the training-pool sets (--sets DLRM-50-train, --shard-pool train)
    does: its plan devices and random shards load as measured shards of their own tasks, and a judge held
    out by a test task's tables keeps every one of them. (The run here is made up to test the loader; its
    costs are no measurement.)"""
    from shardcore.oracles.emulated import emulator as E
    from shardcore.tasks import load_tasks

    for f in os.listdir(MEASUREMENTS_DIR):
        os.symlink(os.path.join(MEASUREMENTS_DIR, f), tmp_path / f)
    tables = load_table_configs(os.path.join(MEASUREMENTS_DIR, "dlrm_b65536", "table_configs.json"))
    train = load_tasks(os.path.join(MEASUREMENTS_DIR, E.TASK_FILES["dlrm_tasks_50_train"]), num_tables=len(tables))
    ids = list(train[0].table_ids)
    devices = [ids[k::4] for k in range(4)]
    costs = [[1.0 + k / 10, 0.1, 0.1, 2.0 + k / 10] for k in range(4)]
    lines = [{"tables": [[i, tables[i].dim] for i in dev], "fw_ms": c[0], "bw_ms": c[3], "task": 0, "alg": "x",
              "set": "DLRM-50-train", "hardware": "NVIDIA H200, 4 plan devices"} for dev, c in zip(devices, costs)]
    lines.append({"tables": [[ids[0], 16], [ids[1], 32]], "fw_ms": 0.3, "bw_ms": 0.5, "kind": "random", "pool": "train",
                  "hardware": "NVIDIA H200"})
    (tmp_path / "run8_shards.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (tmp_path / "run8.json").write_text(json.dumps({"sets": [
        {"name": "DLRM-50-train (4)", "hardware": "NVIDIA H200, 4 plan devices",
         "plans": [{"task": 0, "alg": "x", "cost_ms": 3.0, "device_costs_ms": costs}]}]}))
    monkeypatch.setitem(E.GPUCHECK_RUNS, 65536, E.GPUCHECK_RUNS[65536] + (("gpucheck8", "run8_shards.jsonl", "run8.json", None),))
    meas = E.load_measurements(65536, tmp_path)
    new = [s for s in meas["shards"] if any(run == "gpucheck8" for run, _, _ in s["measured"])]
    assert len(new) == 5 and sum(s["kind"] == "random" for s in new) == 1
    assert all(s["tasks"] == {("dlrm_tasks_50_train", 0)} for s in new if s["kind"] == "plan")
    assert [p for p in meas["plans"] if p["source"] == "gpucheck8"][0]["set"] == "dlrm_tasks_50_train"
    land = E.MeasuredLandscape(65536, tmp_path)
    for name in ("dlrm_tasks_50", "dlrm_tasks_100"):
        for task in load_tasks(os.path.join(MEASUREMENTS_DIR, E.TASK_FILES[name]), num_tables=len(tables)):
            held = land.holding(frozenset(task.table_ids))
            assert not any(held[i] for i, s in enumerate(land.meas["shards"]) if s in new)


def test_the_piece_errors_file_is_used_only_for_the_replica_law_it_was_written_with(tmp_path, monkeypatch):
    """h200_piece_errors.json is a cache of the held-out judge's error on the measured piece devices; the
    replica law is code, not part of the parameter file its digest ties it to, so the file also names the
    law's features and is computed afresh when they differ (as when the law took a cost per replica)."""
    from shardcore.oracles.emulated import measurements as E   # where the loading reads its files

    shipped = json.loads((E.MEASUREMENTS_DIR / E.PIECE_ERROR_FILES["h200"]).read_text())
    assert shipped["replica_features"] == list(E.REPLICA_FEATURES)
    fresh = (("data_parallel", frozenset({1}), 1.0, 4),)
    monkeypatch.setattr(E, "compute_piece_error_rows", lambda card, batch, rule: fresh)
    for law, expect_cached in ((list(E.REPLICA_FEATURES), True), (list(E.REPLICA_FEATURES[:3]), False)):
        path = tmp_path / f"piece_errors_{len(law)}.json"
        path.write_text(json.dumps({**shipped, "replica_features": law}))
        monkeypatch.setattr(E, "PIECE_ERROR_FILES", {"h200": str(path)})   # absolute: joins to itself
        rows = E.piece_error_rows.__wrapped__("h200", 65536, "tables")
        assert (rows != fresh) == expect_cached
        if expect_cached:
            assert len(rows) == len(shipped["devices"])
