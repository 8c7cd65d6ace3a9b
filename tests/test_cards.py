"""Calibrated cards (shardcore/oracles/emulated/card.py, calibration.py, tools/calibrate.py): the format read
back as written, malformed and foreign cards refused in one line, the shipped H200 card pricing exactly as
``emulated:h200`` does, a card's accuracy computed from its measurements, and tools/calibrate.py on this CPU
producing a card that eval.py and plan.py plan against."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from helpers import make_dataset, one_line_error, run_script
from shardcore.dataset import load_dataset, load_table_configs
from shardcore.errors import ShardError
from shardcore.oracles.commmodel import CommModel
from shardcore.oracles.emulated.calibration import calibrate, design_shards
from shardcore.oracles.emulated.card import read_card, write_card
from shardcore.oracles.emulated.oracle import EmulatedOracle
from shardcore.planning import Landscape, parse_landscape
from shardcore.plan import DATA_PARALLEL, ROW_WISE, Plan, column_wise, data_parallel, row_wise, table_wise
from shardcore.tables import TableConfig
from shardcore.tasks import load_tasks
from shardcore.topology import Topology
from shardcore.types import CacheContext, ComputeCost, OracleInfo

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
H200_CARD = os.path.join(ROOT, "data", "cards", "h200.json")
GPU_DATA = os.path.join(ROOT, "data", "gpu_measurements", "dlrm_b65536")
TASK_DIR = os.path.join(ROOT, "data", "gpu_measurements", "tasks")


class AsMeasured:
    """The emulated H200 (its shipped fit) standing in for a measuring oracle of a CUDA machine: what it
    answers is what a card calibrated on it must recover. ``scramble``: each device's cost multiplied by a
    random factor (measurements no model can follow)."""

    comm_measured = False
    info = OracleInfo("cuda", 0.0, None)
    hardware = "NVIDIA H200 (emulated), 4 devices"

    def __init__(self, ndevices=4, scramble=None):
        self.inner = EmulatedOracle(GPU_DATA, ndevices, batch_size=65536, fit="full")
        self.ndevices, self.comm_model, self.scramble = ndevices, self.inner.comm_model, scramble

    @property
    def context(self):
        c = self.inner.context
        fp = json.dumps({"device": "NVIDIA H200 (emulated)", "torch": "t", "fbgemm": "f"})
        return CacheContext(fp, c.dataset, c.batch_size, c.optimizer, c.precision)

    def measure_devices(self, shards):
        out = self.inner.measure_devices(shards)
        if self.scramble is not None:
            f = np.random.default_rng(self.scramble).uniform(0.3, 3.0, len(out))
            out = [ComputeCost(c.fw_ms * k, c.bw_ms * k) for c, k in zip(out, f)]
        return out


@pytest.fixture(scope="module")
def gpu_card(tmp_path_factory):
    """A card calibrated on the emulated H200 (120 designed devices), written and read back."""
    path = tmp_path_factory.mktemp("card") / "h200_recalibrated.json"
    card = calibrate(AsMeasured(), load_dataset(GPU_DATA, with_lookups=False), shards=120, seed=0)
    write_card(card, path)
    return card, path


def test_a_card_calibrated_on_a_known_device_recovers_it_and_knows_its_accuracy(gpu_card):
    card, path = gpu_card
    acc = card["accuracy"]
    assert acc["predicted"] == acc["devices"] == 120 and set(acc["by_kind"]) == {"table", "multi", "column", "row",
                                                                                  "replica"}
    assert acc["mape_pct"] < 5.0 and acc["spearman_within_groups"] > 0.9     # a model of its own family, held out
    assert card["model"]["replica_weights"] is not None and card["device_type"] == "cuda"
    assert card["exchange"]["source"] == "modelled" and "25 us + bytes / 200 GB/s" in card["exchange"]["note"]
    # measurements no model can follow: the same design, the accuracy says so
    bad = calibrate(AsMeasured(scramble=1), load_dataset(GPU_DATA, with_lookups=False), shards=120, seed=0)["accuracy"]
    assert bad["mape_pct"] > 5 * acc["mape_pct"] and bad["spearman_within_groups"] < acc["spearman_within_groups"] - 0.3
    # the card predicts devices it never measured about as well: a fresh design's devices, against the truth
    truth = AsMeasured()
    model = read_card(path).model
    fresh = [p for _, _, p in design_shards(load_dataset(GPU_DATA, with_lookups=False).tables, 48, 4, seed=7)]
    meas = np.array([c.fw_ms + c.bw_ms for c in truth.measure_devices(fresh)])
    pred = EmulatedOracle(GPU_DATA, 4, card=str(path), batch_size=65536).measure_devices(fresh)
    err = np.abs(np.array([c.fw_ms + c.bw_ms for c in pred]) - meas) / meas
    assert float(err.mean()) < 0.08, err
    assert model is read_card(path).model          # read once per state of the file


def test_the_design_is_counted_covers_every_kind_and_avoids_the_tables_it_is_told_to():
    tables = load_table_configs(os.path.join(GPU_DATA, "table_configs.json"))
    avoid = set(range(0, 856, 2))
    a = design_shards(tables, 80, 4, exclude=avoid, seed=3)
    b = design_shards(tables, 80, 4, exclude=avoid, seed=3)
    assert [(k, g, [p.key for p in s]) for k, g, s in a] == [(k, g, [p.key for p in s]) for k, g, s in b]
    assert len(a) == 80 and {k for k, _, _ in a} == {"table", "multi", "column", "row", "replica"}
    assert not {p.index for _, _, s in a for p in s} & avoid
    kinds = {getattr(p, "kind", "table_wise") for _, _, s in a for p in s}
    assert {ROW_WISE, DATA_PARALLEL} <= kinds
    assert any(p.dim < tables[p.index].dim for k, _, s in a if k == "column" for p in s)
    pool = [t for t in tables if t.index not in avoid and t.pooling_factor > 0]
    used = {p.index for _, _, s in a for p in s}
    assert max(pool, key=lambda t: t.row).index in used and max(pool, key=lambda t: t.pooling_factor).index in used
    one = design_shards(tables, 16, 1, seed=0)
    assert not any(getattr(p, "kind", None) == DATA_PARALLEL for _, _, s in one for p in s)   # no replica on 1 device
    with pytest.raises(ShardError, match="no table to calibrate on"):
        design_shards(tables[:4], 8, 2, exclude={0, 1, 2, 3})


def test_the_card_format_reads_back_as_written(gpu_card, tmp_path):
    card, path = gpu_card
    c = read_card(path)
    assert json.loads(open(path).read()) == json.loads(json.dumps(card))
    assert (c.name, c.device_type, c.batch_size, c.precision, c.optimizer) == (
        card["name"], "cuda", 65536, "fp16", "exact_sgd")
    assert len(c.devices) == 120 and {d.kind for d in c.devices} == set(card["accuracy"]["by_kind"])
    again = tmp_path / "again.json"
    write_card(c.obj, again)
    assert again.read_text() == open(path).read()
    d = c.devices[5]
    assert [p.key for p in d.pieces] == [p.key for p in read_card(again).devices[5].pieces]
    assert read_card(again).model.predict_many([list(d.pieces)], 65536).tolist() == \
        c.model.predict_many([list(d.pieces)], 65536).tolist()


def _broken(card: dict, edit) -> dict:
    obj = json.loads(json.dumps(card))
    edit(obj)
    return obj


@pytest.mark.parametrize("edit, message", [
    (lambda o: o.pop("domain"), "domain must be an object"),
    (lambda o: o.update(physical_weights=[[0, 0], [0, 0]]), "physical_weights must be 2 x 3"),
    (lambda o: o.update(batch_size=0), "batch_size must be a whole number > 0"),
    (lambda o: o.update(precision="int3"), "precision must be one of fp16, fp32"),
    (lambda o: o.update(device_type="tpu"), "device_type must be cpu or cuda"),
    (lambda o: o["exchange"].update(bandwidth_gbps=-1), "bandwidth_gbps must be a number > 0"),
    (lambda o: o["model"]["sets"]["65536"]["fw"].pop(), "model: GPU emulator parameters for batch 65536"),
    (lambda o: o.update(device_type="cpu"), "a cpu card needs the cpu feature family"),
    (lambda o: o["measurements"][0]["pieces"].append({"index": 99999, "dim": 16}), "table 99999 is not in the card"),
    (lambda o: o["measurements"][0].update(kind="gpu"), "kind must be one of table, multi"),
    (lambda o: o["accuracy"].update(error_ratios=[1.0, -2.0]), "error_ratios must be a list of positive numbers"),
])
def test_a_malformed_card_is_one_line(gpu_card, tmp_path, edit, message):
    card, _ = gpu_card
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(_broken(card, edit)))
    with pytest.raises(ShardError, match=message) as exc:
        read_card(path)
    assert str(path) in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize("content, message", [
    ("{not json", "malformed JSON at line 1"),
    ("[1, 2]", "format None"),
    (json.dumps({"format": "shardkit-gpu-emulator-1", "sets": {}}), "a GPU emulator parameter file"),
    (json.dumps({"format": "shardkit-planner-cost-1"}), "a shardkit cost model"),
    (json.dumps({"format": "shardkit-card/2"}), "another format version"),
])
def test_a_foreign_file_is_not_a_card(tmp_path, capsys, content, message):
    path = tmp_path / "foreign.json"
    path.write_text(content)
    with pytest.raises(ShardError, match=message):
        read_card(path)
    code, _, err = run_script("eval.py", ["--alg", "lookup_greedy", "--oracle", f"emulated:{path}", "--data-dir",
                                          GPU_DATA, "--task-path", os.path.join(TASK_DIR, "dlrm_tasks_50_test.txt"),
                                          "--max-tasks", "1", "--batch-size", "65536"], capsys)
    one_line_error(code, err, "not a card|not a readable card")


def test_the_landscape_names_a_card_file_and_refuses_what_is_none():
    assert parse_landscape(f"emulated:{H200_CARD}") == f"emulated:{H200_CARD}"
    assert Landscape(f"emulated:{H200_CARD}").card == H200_CARD
    assert parse_landscape("EMULATED:H200") == "emulated:h200"
    with pytest.raises(ShardError, match="no such card file"):
        parse_landscape("emulated:no/such/Card.json")
    with pytest.raises(ShardError, match="unknown oracle 'emulated:a100': choose one of measured, emulated:h200"):
        parse_landscape("emulated:a100")


def _plans(tables, ndevices):
    """A baseline plan and one with every piece kind (row blocks, column blocks, replicas) for ``tables``."""
    from shardcore.baselines import make_baseline

    topo = Topology(ndevices, 50.0)
    yield make_baseline("size_lookup_greedy").shard(tables, topo)
    order = sorted(range(len(tables)), key=lambda i: -tables[i].row)
    shardings = []
    for rank, i in enumerate(order):
        t = tables[i]
        if rank == 0:
            shardings.append(row_wise(list(range(ndevices))))
        elif rank == 1 and t.dim % 8 == 0:
            shardings.append(column_wise([(0, t.dim // 2), (1, t.dim // 2)]))
        elif rank >= len(order) - 3:
            shardings.append(data_parallel(ndevices))
        else:
            shardings.append(table_wise(rank % ndevices))
    yield Plan([tables[i] for i in order], shardings, topo)


@pytest.mark.parametrize("task_file, ndevices", [("dlrm_tasks_50_test.txt", 4), ("dlrm_tasks_100_test.txt", 8)])
def test_the_h200_card_prices_exactly_as_the_shipped_h200(task_file, ndevices):
    tables = load_table_configs(os.path.join(GPU_DATA, "table_configs.json"))
    shipped = EmulatedOracle(GPU_DATA, ndevices, batch_size=65536, fit="full")
    card = EmulatedOracle(GPU_DATA, ndevices, card=H200_CARD, batch_size=65536)
    assert card.fit == "full" and "calibrated card" in card.hardware and "held-out refits exist only" in card.parts["compute"]
    assert card.comm_model.bandwidth_gbps == shipped.comm_model.bandwidth_gbps
    for task in load_tasks(os.path.join(TASK_DIR, task_file), num_tables=len(tables))[:3]:
        for plan in _plans(task.tables(tables), ndevices):
            a, b = shipped.evaluate(plan.device_pieces), card.evaluate(plan.device_pieces)
            assert a.device_costs_ms == b.device_costs_ms and a.cost_ms == b.cost_ms
    big = [TableConfig(0, 40_000_000, 128, 500.0)]   # far outside the measured range: the same extrapolation
    assert shipped.measure_devices([big]) == card.measure_devices([big])
    assert card.domain_note(big) == shipped.domain_note(big).replace("emulated:h200", f"emulated:{H200_CARD}")


def test_the_shipped_card_is_the_shipped_fit():
    from shardcore.oracles.emulated.measurements import load_gpu_model, model_path, read_params

    card = read_card(H200_CARD)
    shipped = read_params(model_path("h200"))
    assert {k: v for k, v in card.obj["model"].items() if k != "replica_weights"} == shipped
    assert np.array_equal(card.model.replica_weights, load_gpu_model("h200").replica_weights)
    assert card.accuracy["mape_pct"] > 0 and card.exchange["source"] == "modelled"


def test_flags_that_state_other_exchange_figures_replace_the_cards(gpu_card):
    _, path = gpu_card
    card = read_card(path)
    assert card.comm_model(CommModel()) == card.comm_model()          # the flags' defaults: the card's figures
    given = CommModel(bandwidth_gbps=50.0, latency_us=10.0)
    assert card.comm_model(given) is given
    two = card.comm_model(CommModel(devices_per_host=4))
    assert two.devices_per_host == 4 and two.bandwidth_gbps == card.comm_model().bandwidth_gbps


# -- tools/calibrate.py on this CPU, then the card as an oracle and a planner's landscape --------------------
@pytest.fixture(scope="module")
def cpu_card(tmp_path_factory):
    d = tmp_path_factory.mktemp("cpucard")
    make_dataset(d / "D", num_tables=40, batch_size=32)
    (d / "tasks.txt").write_text("0,1,2,3,4,5\n6,7,8,9,10,11\n")
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, "tools/calibrate.py", "--data-dir", d / "D", "--ndevices", "2",
                           "--out", d / "card.json", "--shards", "16", "--exclude-tasks", d / "tasks.txt",
                           "--cache-path", d / "cache.sqlite", "--bench-iters", "2", "--warmup-iters", "1",
                           "--comm-iters", "3", "--quiet"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return d, proc.stdout


def test_calibrate_py_writes_a_cpu_card_with_its_exchange_and_accuracy(cpu_card):
    d, out = cpu_card
    card = read_card(d / "card.json")
    assert card.device_type == "cpu" and card.model.spec.get("family") == "cpu" and card.batch_size == 32
    assert "accuracy: held-out MAPE" in out and "exchange (measured)" in out and f"wrote {d / 'card.json'}" in out
    assert card.obj["calibration"]["measured"] == len(card.devices) == 16
    assert not {p.index for dev in card.devices for p in dev.pieces} & set(range(12))   # never the tasks' tables
    ex = card.exchange
    assert ex["source"] == "measured" and ex["all_to_all"]["bandwidth_gbps"] == ex["bandwidth_gbps"] > 0
    assert len(ex["all_to_all"]["samples"]) >= 10 and ex["all_reduce"]["latency_us"] >= 0
    acc = card.accuracy
    assert acc["predicted"] > 0 and acc["mape_pct"] > 0 and len(acc["error_ratios"]) == acc["predicted"]
    assert np.median(acc["error_ratios"]) == pytest.approx(1.0)
    with pytest.raises(ShardError, match="measured with fp16 weights on a CPU"):
        EmulatedOracle(d / "D", 2, card=str(d / "card.json"), precision="fp32")


def test_eval_and_plan_plan_against_the_card(cpu_card, capsys):
    d, _ = cpu_card
    card = f"emulated:{d / 'card.json'}"
    code, out, err = run_script("eval.py", ["--alg", "lookup_greedy,shardkit", "--oracle", card, "--data-dir", d / "D",
                                            "--task-path", d / "tasks.txt", "--ndevices", "2", "--max-memory", "5",
                                            "--shardkit-work", "2000", "--quiet", "--out", d / "r.jsonl"], capsys)
    assert code == 0, err
    assert "calibrated card" in out and "the card's own fit" in out and "fitted to measured all-to-alls" in out
    records = [json.loads(line) for line in (d / "r.jsonl").read_text().splitlines()]
    assert {r["alg"] for r in records} == {"lookup_greedy", "shardkit"} and all(r["cost_ms"] > 0 for r in records)
    model = read_card(d / "card.json")
    rec = next(r for r in records if r["alg"] == "shardkit")
    assert "calibrated card" in rec["pricing"]["oracle"]
    code, out, err = run_script("plan.py", ["--tables", d / "D" / "table_configs.json", "--ndevices", "2", "--alg",
                                            "lookup_greedy,shardkit", "--oracle", card, "--shardkit-work", "2000",
                                            "--out", d / "plan.json"], capsys)
    assert code == 0, err
    assert "the plan written: " in out and (d / "plan.json").is_file()
    code, _, err = run_script("eval.py", ["--alg", "lookup_greedy", "--oracle", card, "--data-dir", d / "D",
                                          "--task-path", d / "tasks.txt", "--ndevices", "2", "--out", d / "card.json"],
                              capsys)
    one_line_error(code, err, "would replace it")
    assert read_card(d / "card.json").obj == model.obj


def test_shardkit_plans_with_the_cards_model_and_exchange(cpu_card):
    from helpers import build_planner, planning_ctx

    d, _ = cpu_card
    path = str(d / "card.json")
    card = read_card(path)
    sk = build_planner("shardkit", planning_ctx(2, oracle=f"emulated:{path}", batch_size=32, data_dir=d / "D"),
                       work=2000)
    tables = load_dataset(d / "D", with_lookups=False).tables[:6]
    plan = sk.shard(tables, Topology(2, 5.0))
    model = sk.task_model(tables)
    assert model.compute is card.model and model.comm.bandwidth_gbps == card.exchange["bandwidth_gbps"]
    assert np.array_equal(model.error, card.error_ratios())
    judged = EmulatedOracle(d / "D", 2, card=path).evaluate(plan.device_pieces)
    assert judged.cost_ms == pytest.approx(model.plan_cost(plan), rel=1e-9)


def test_torchrec_estimator_prices_with_the_card(cpu_card):
    pytest.importorskip("torchrec")
    from torchrec.distributed.planner.types import KernelConfig, TopologyFactory, TrainerConfig

    from shardkit_torchrec.estimator import EmulatedPerfEstimator

    d, _ = cpu_card
    path = str(d / "card.json")
    topo = TopologyFactory.create_topology(TrainerConfig(world_size=2, local_world_size=2, hbm_cap_bytes=2 << 30),
                                           kernel_config=KernelConfig(compute_device="cuda"))
    est = EmulatedPerfEstimator(topo, card=path)
    card = read_card(path)
    assert est.model is card.model and est.comm.bandwidth_gbps == card.exchange["bandwidth_gbps"]


def test_shardkit_planner_plans_a_collection_against_a_cpu_card(cpu_card):
    pytest.importorskip("torchrec")
    import torch
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner.types import KernelConfig, TopologyFactory, TrainerConfig
    from torchrec.modules.embedding_configs import DataType

    from shardkit_torchrec.planner import ShardkitPlanner

    d, _ = cpu_card
    topo = TopologyFactory.create_topology(TrainerConfig(world_size=2, local_world_size=2, ddr_cap_bytes=2 << 30),
                                           kernel_config=KernelConfig(compute_device="cpu"))

    def ebc(dtype):
        return EmbeddingBagCollection(tables=[EmbeddingBagConfig(name=f"t{i}", embedding_dim=16, num_embeddings=r,
                                                                 feature_names=[f"f{i}"], data_type=dtype)
                                              for i, r in enumerate([1000, 50000, 300, 8000])], device=torch.device("meta"))

    planner = ShardkitPlanner(topo, batch_size=16, oracle=f"emulated:{d / 'card.json'}", time_budget_s=5,
                              types=("table_wise", "column_wise", "data_parallel"))
    plan = planner.plan(ebc(DataType.FP16), [EmbeddingBagCollectionSharder()])
    assert sorted(plan.plan[""]) == ["t0", "t1", "t2", "t3"]
    assert f"{read_card(d / 'card.json').exchange['bandwidth_gbps']:.1f} GB/s" in planner.last_info["comm"]
    with pytest.raises(ShardError, match="measured with fp16 weights on a CPU"):   # the card's precision only
        planner.plan(ebc(DataType.FP32), [EmbeddingBagCollectionSharder()])


def test_the_time_cap_stops_between_groups_and_the_card_says_so():
    ds = load_dataset(GPU_DATA, with_lookups=False)
    card = calibrate(AsMeasured(), ds, shards=40, seed=0, budget_s=1e-9)
    cal = card["calibration"]
    assert cal["stopped_early"] and cal["measured"] == 8 and cal["designed"] == 40
    assert "stopped by the time cap" in cal["stop"] and "1 of 5 groups" in cal["stop"]
    assert len(card["measurements"]) == 8 and not calibrate(AsMeasured(), ds, shards=40, seed=0)["calibration"]["stopped_early"]
    with pytest.raises(ShardError, match="only 4 devices measured"):
        calibrate(AsMeasured(), ds, shards=4, seed=0)


def test_the_card_proof_says_whether_compute_exchange_or_the_slowest_device_misses():
    """card_proof.card_parts: per device the card's compute and exchange against their medians over the
    rounds, and the slowest device of the medians against the measured plan cost."""
    from tools.card_proof import card_parts

    # one plan of two devices, three rounds; the card prices compute 10% low and the exchange right
    rounds = [[[4.0, 1.0, 1.0, 6.0], [2.0, 1.0, 1.0, 3.0]],
              [[4.4, 1.0, 1.0, 6.6], [2.2, 1.0, 1.0, 3.3]],
              [[3.6, 1.0, 1.0, 5.4], [1.8, 1.0, 1.0, 2.7]]]
    row = {"card_devices": [[3.6, 1.0, 1.0, 5.4], [1.8, 1.0, 1.0, 2.7]], "device_rounds": rounds,
           "measured_ms": 12.0}
    got = card_parts([row])
    assert got["compute"] == {"devices": 2, "mape_pct": pytest.approx(10.0), "bias_pct": pytest.approx(-10.0)}
    assert got["exchange"] == {"devices": 2, "mape_pct": 0.0, "bias_pct": 0.0}
    # the slowest device of the medians (4 + 1 + 1 + 6 = 12) is the measured plan cost
    assert got["slowest_of_medians_vs_measured_pct"] == pytest.approx(0.0)
