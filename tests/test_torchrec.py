"""TorchRec interop: --alg torchrec, and exported plans applied through TorchRec's own API.

Skipped when TorchRec cannot be imported, except where SHARDKIT_REQUIRE_TORCHREC=1 (set by `make test`,
which installs TorchRec): there a missing or broken TorchRec fails the run with the reason and the way
to install it (shardkit_torchrec.torchrec_planner.INSTALL_HINT)."""

import dataclasses
import json
import os
import traceback

import pytest

from helpers import require_torchrec  # noqa: E402
from shardcore.oracles.measured.launch import free_port, rank_context  # noqa: E402
from shardcore.processes import run_then_exit  # noqa: E402

require_torchrec()

import torch  # noqa: E402

from shardcore.interop import plan_export as pe  # noqa: E402
from shardkit_torchrec import torchrec_planner as trp  # noqa: E402
from shardcore.errors import InfeasibleError, ShardError  # noqa: E402
from shardcore.plan import Plan, column_wise, data_parallel, row_wise, table_wise  # noqa: E402
from shardcore.tables import TableConfig  # noqa: E402
from shardcore.types import Topology  # noqa: E402
from helpers import BIG_CAP, build_planner, planning_ctx
from shardcore.planning import DEFAULT_BATCH_SIZE


def torchrec(name="torchrec", oracle=None, batch_size=None, hosts=0, comm_bandwidth=None, **settings):
    """TorchRec's planner from the registry, for the judged landscape ``oracle`` (None: TorchRec's defaults)."""
    ctx = planning_ctx(oracle=oracle, batch_size=batch_size, devices_per_host=hosts, comm_bandwidth=comm_bandwidth)
    return build_planner(name, ctx, **settings)

# A small task: rows from 10 to 2M, dims 4..128, pooling factors 0..60 (fp16: 0.53 GB in all).
TASK = [TableConfig(i, row, dim, pf) for i, (row, dim, pf) in enumerate([
    (2_000_000, 32, 1.0), (1_000_000, 128, 20.0), (500_000, 32, 5.0), (10, 4, 0.0),
    (300_000, 64, 60.0), (1_000, 16, 3.0), (80_000, 128, 12.0), (250, 8, 1.0),
    (750_000, 32, 8.0), (40_000, 64, 30.0), (5_000, 4, 2.0), (1_200_000, 16, 1.5)])]


def test_alg_torchrec_tw_gives_feasible_table_wise_plans():
    sharder = torchrec("torchrec-tw", batch_size=1024)
    assert isinstance(sharder, trp.TorchRecSharder) and sharder.batch_size == 1024
    assert sharder.name == "torchrec-tw" and sharder.types_for(4) == ["table_wise"]
    for ndevices, cap in [(2, 0.5), (4, 0.25), (4, 5.0)]:
        plan = sharder.shard(TASK, Topology(ndevices, cap))
        assert len(plan.allocation) == len(TASK) and plan.ndevices == ndevices
        assert plan.feasible
        # the translation is faithful to TorchRec's own plan
        module_plan = sharder.last_plan.plan[""]
        assert [module_plan[f"t{i}"].ranks for i in range(len(TASK))] == [[d] for d in plan.allocation]
        assert {ps.sharding_type for ps in module_plan.values()} == {"table_wise"}
        assert {ps.compute_kernel for ps in module_plan.values()} == {"fused"}


def test_alg_torchrec_default_batch_and_a_bad_memory_model():
    sharder = torchrec()
    assert sharder.batch_size == DEFAULT_BATCH_SIZE
    assert sharder.shard(TASK[:3], Topology(1, 1.0)).allocation == (0, 0, 0)
    assert sharder.shard([], Topology(2, 1.0)).allocation == ()
    with pytest.raises(ShardError, match="memory_model"):
        torchrec(memory="vibes")


def test_alg_torchrec_infeasible_raises():
    sharder = torchrec("torchrec-tw")
    big = TASK[1].memory_gb()  # the largest table, 0.24 GB
    with pytest.raises(InfeasibleError, match="TorchRec's planner found no plan.*table 1"):
        sharder.shard(TASK, Topology(4, big * 0.9))  # a table larger than the cap, table-wise
    full = torchrec().shard(TASK, Topology(4, big * 0.9))   # the full planner splits it by rows
    assert full.feasible and list(full.shardings)[1].type in ("row_wise", "column_wise")
    sharder = torchrec()
    with pytest.raises(InfeasibleError, match="TorchRec's planner found no plan"):
        sharder.shard(TASK, Topology(2, 0.2))  # 0.5 GB does not fit in 2 x 0.2 GB


def test_memory_models_differ_by_torchrecs_io_buffers():
    # Two tables that exactly fill two devices: weights-only accounting places them, TorchRec's
    # training estimate (weights + input/output buffers of a batch) does not.
    tables = [TableConfig(0, 1 << 20, 64, 10.0), TableConfig(1, 1 << 20, 64, 10.0)]
    cap = tables[0].memory_gb("fp16")  # 0.125 GB exactly
    plan = torchrec("torchrec-tw", memory="weights").shard(tables, Topology(2, cap))
    assert sorted(plan.allocation) == [0, 1] and plan.feasible
    with pytest.raises(InfeasibleError):
        torchrec("torchrec-tw").shard(tables, Topology(2, cap))
    # fp32 weights count 4 bytes: the same cap cannot hold them
    with pytest.raises(InfeasibleError):
        torchrec("torchrec-tw", memory="weights").shard(tables, Topology(2, cap, "fp32"))


def _ebc(tables, names, device="meta"):
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig

    configs = [EmbeddingBagConfig(name=n, embedding_dim=t.dim, num_embeddings=t.row, feature_names=[f"f_{n}"])
               for n, t in zip(names, tables)]
    return EmbeddingBagCollection(tables=configs, device=torch.device(device))


def test_exported_plan_loads_into_torchrec_sharding_plan(tmp_path):
    from torchrec.distributed.types import ShardingPlan

    plan = torchrec("torchrec-tw").shard(TASK, Topology(4, 0.25))
    names = [f"emb_{t.index}" for t in TASK]
    plain, trec = pe.export_plan(tmp_path, "task", plan, names=names, module_path="sparse.ebc")
    assert json.loads(plain.read_text())["feasible"]
    ebc = _ebc(TASK, names)
    sp = pe.load_torchrec_plan(trec, module=ebc)
    assert isinstance(sp, ShardingPlan) and list(sp.plan) == ["sparse.ebc"]
    module_plan = sp.plan["sparse.ebc"]
    for n, t, d in zip(names, TASK, plan.allocation):
        ps = module_plan[n]
        assert ps.sharding_type == "table_wise" and ps.ranks == [d]
        (shard,) = ps.sharding_spec.shards
        assert shard.shard_sizes == [t.row, t.dim] and str(shard.placement) == f"rank:{d}/cuda:{d}"
    cpu = pe.load_torchrec_plan(trec, device_type="cpu", module_path="")
    assert str(cpu.plan[""][names[0]].sharding_spec.shards[0].placement) == f"rank:{plan.allocation[0]}/cpu"

    wrong = _ebc([t.with_dim(t.dim * 2) for t in TASK], names)
    with pytest.raises(ShardError, match="the plan has"):
        pe.load_torchrec_plan(trec, module=wrong)
    with pytest.raises(ShardError, match="not in the module"):
        pe.load_torchrec_plan(trec, module=_ebc(TASK[:2], names[:2]))


# ---- DistributedModelParallel on 2 gloo CPU ranks ---------------------------------------------

DMP_TABLES = [TableConfig(i, row, dim, pf) for i, (row, dim, pf) in enumerate([
    (100, 8, 2.0), (50, 4, 1.0), (200, 16, 3.0), (30, 8, 0.0), (70, 4, 5.0), (10, 8, 1.0)])]


def _spawn_ranks(target, world: int, args_of) -> dict:
    """Run ``target(*args_of(rank, port, queue))`` in ``world`` spawned processes; ``{rank: rest}`` of what
    each puts on the queue as ``(rank, *rest)`` (every process joined, or killed)."""
    ctx = rank_context()
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=run_then_exit, args=(target, *args_of(r, port, queue))) for r in range(world)]
    for p in procs:
        p.start()
    try:
        return dict((r, rest) for r, *rest in (queue.get(timeout=240) for _ in procs))
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()


def _dmp_worker(rank, world, port, plan_path, names, queue):
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        torch.set_num_threads(1)
        import torch.distributed as dist

        dist.init_process_group("gloo", rank=rank, world_size=world)
        from torchrec import KeyedJaggedTensor
        from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
        from torchrec.distributed.model_parallel import DistributedModelParallel

        ebc = _ebc(DMP_TABLES, names)
        sharding_plan = pe.load_torchrec_plan(plan_path, device_type="cpu", module=ebc)
        model = DistributedModelParallel(ebc, device=torch.device("cpu"), plan=sharding_plan,
                                         sharders=[EmbeddingBagCollectionSharder()])
        local = {}
        for key, value in model.state_dict().items():
            if key.endswith(".weight") and hasattr(value, "local_shards"):
                table = key.split(".")[-2]
                local[table] = [(s.metadata.placement.rank(), list(s.tensor.shape)) for s in value.local_shards()]
        # one forward pass: 2 samples per rank, one lookup per table and sample
        keys = [f"f_{n}" for n in names]
        lengths = torch.ones(len(keys) * 2, dtype=torch.int64)
        values = torch.tensor([k % t.row for k, t in enumerate(DMP_TABLES) for _ in range(2)], dtype=torch.int64)
        out = model(KeyedJaggedTensor.from_lengths_sync(keys=keys, values=values, lengths=lengths)).wait()
        queue.put((rank, local, list(out.values().shape), bool(torch.isfinite(out.values()).all())))
        dist.barrier()
        dist.destroy_process_group()
    except Exception:
        queue.put((rank, "error", traceback.format_exc(), None))


def test_exported_plan_applied_by_distributed_model_parallel_on_cpu(tmp_path):
    names = [f"tbl_{t.index}" for t in DMP_TABLES]
    plan = Plan.table_wise(DMP_TABLES, (1, 0, 1, 1, 0, 0), Topology(2, 1.0))  # ours, deliberately not TorchRec's choice
    _, trec = pe.export_plan(tmp_path, "dmp", plan, names=names)
    results = _spawn_ranks(_dmp_worker, 2, lambda r, port, queue: (r, 2, port, str(trec), names, queue))
    for rank in range(2):
        local, shape, finite = results[rank]
        assert local != "error", shape  # the worker's traceback
        for n, t, d in zip(names, DMP_TABLES, plan.allocation):
            if d == rank:
                assert local[n] == [(rank, [t.row, t.dim])], (rank, n, local)
            else:
                assert local.get(n, []) == [], (rank, n, local)
        assert shape == [2, sum(t.dim for t in DMP_TABLES)] and finite


def test_plan_cli_with_alg_torchrec(tmp_path):
    import importlib.util

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    spec = importlib.util.spec_from_file_location("plan_script_tr", os.path.join(root, "plan.py"))
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    csv_path = tmp_path / "t.csv"
    csv_path.write_text("name,rows,dim,pooling_factor\n" + "".join(
        f"t{t.index},{t.row},{t.dim},{t.pooling_factor}\n" for t in TASK))
    out = tmp_path / "plan.json"
    assert script.main(["--tables", str(csv_path), "--ndevices", "2", "--max-memory", "0.5", "--alg",
                        "torchrec-tw", "--batch-size", "2048", "--out", str(out), "--torchrec"]) == 0
    plain = json.loads(out.read_text())
    assert plain["feasible"] and plain["alg"] == "torchrec-tw" and max(plain["memory_gb"]) <= 0.5
    sp = pe.load_torchrec_plan(pe.torchrec_path_for(out))
    assert {n: ps.ranks for n, ps in sp.plan[""].items()} == {t["name"]: [t["device"]] for t in plain["tables"]}
    # the full planner: every table's sharding in the plain form, and the TorchRec form loads
    assert script.main(["--tables", str(csv_path), "--ndevices", "4", "--max-memory", "0.5", "--alg", "torchrec",
                        "--out", str(out), "--torchrec"]) == 0
    plain = json.loads(out.read_text())
    sp = pe.load_torchrec_plan(pe.torchrec_path_for(out))
    assert {n: ps.sharding_type for n, ps in sp.plan[""].items()} == {
        t["name"]: ("data_parallel" if t["sharding"]["type"] == "data_parallel" else ps_type(t["sharding"], 4))
        for t in plain["tables"]}


def ps_type(sharding, world):
    if sharding["type"] == "row_wise":
        return "row_wise" if sharding["devices"] == list(range(world)) else "table_row_wise"
    return sharding["type"]


EVERY = [row_wise([0, 1, 2, 3]), column_wise([(3, 96), (0, 32)]), row_wise([2, 3]), data_parallel(4),
         column_wise([(1, 12), (2, 52)]), table_wise(1), data_parallel(4), table_wise(3), row_wise([3, 1, 0]),
         table_wise(0), table_wise(2), column_wise([(0, 8), (1, 8)])]


def test_every_type_exported_loaded_and_converted_back_exactly(tmp_path):
    plan = Plan(TASK, EVERY, Topology(4, BIG_CAP))
    assert plan.general
    names = [f"emb_{t.index}" for t in TASK]
    plain, trec = pe.export_plan(tmp_path, "every", plan, names=names)
    rows = json.loads(plain.read_text())["tables"]
    assert [r["sharding"]["type"] for r in rows] == [s.type for s in EVERY]
    assert rows[2]["sharding"]["rows"] == [250_000, 250_000] and rows[1]["column_shards"][1]["dim_offset"] == 96
    sp = pe.load_torchrec_plan(trec, module=_ebc(TASK, names))
    module_plan = sp.plan[""]
    kinds = [module_plan[n].sharding_type for n in names]
    assert kinds == ["row_wise", "column_wise", "table_row_wise", "data_parallel", "column_wise", "table_wise",
                     "data_parallel", "table_wise", "table_row_wise", "table_wise", "table_wise", "column_wise"]
    assert module_plan[names[3]].compute_kernel == "dense" and module_plan[names[3]].sharding_spec is None
    rw = module_plan[names[8]]   # 750,000 rows over ranks 3, 1, 0: blocks of 250,000 at offsets 0, 250k, 500k
    assert [(s.shard_offsets, s.shard_sizes, str(s.placement)) for s in rw.sharding_spec.shards] == [
        ([0, 0], [250_000, 32], "rank:3/cuda:3"), ([250_000, 0], [250_000, 32], "rank:1/cuda:1"),
        ([500_000, 0], [250_000, 32], "rank:0/cuda:0")]
    back = [trp.sharding_from_torchrec(module_plan[n], t, 4, n) for n, t in zip(names, TASK)]
    assert back == EVERY and Plan(TASK, back, Topology(4, BIG_CAP)) == plan
    # TorchRec's table-column-wise reads as our column-wise; a shard that is not a column block is refused
    twcw = module_plan[names[1]]
    twcw.sharding_type = "table_column_wise"
    assert trp.sharding_from_torchrec(twcw, TASK[1], 4) == EVERY[1]
    with pytest.raises(ShardError, match="not .*equal blocks"):
        trp.sharding_from_torchrec(module_plan[names[0]], TableConfig(0, 1_999_999, 32, 1.0), 4)


# ---- grid (TorchRec's grid_shard) and table-row-wise on 2 hosts of 2 ranks ----------------------

GRID_TABLES = [TableConfig(0, 1_000, 256, 4.0), TableConfig(1, 7, 32, 1.0), TableConfig(2, 500, 16, 2.0),
               TableConfig(3, 90, 8, 1.0)]


def test_grid_exports_as_torchrecs_grid_shard_and_converts_back(tmp_path):
    """A grid over 2 hosts x 2 ranks is written as the grid_shard TorchRec's own generator makes (shard
    (c, j) at [row offset j, column offset c] on host c's j-th rank), loads, and converts back exactly;
    a block that is not one whole host is refused in one line."""
    from shardcore.plan import grid
    from torchrec.distributed.sharding_plan import construct_module_sharding_plan, grid_shard

    shardings = [grid([([0, 1], 128), ([2, 3], 128)]), grid([([2, 3], 16), ([0, 1], 16)]), row_wise([2, 3]),
                 table_wise(1)]
    plan = Plan(GRID_TABLES, shardings, Topology(4, BIG_CAP))
    names = [f"g{t.index}" for t in GRID_TABLES]
    plain, trec = pe.export_plan(tmp_path, "grid", plan, names=names, local_world_size=2)
    obj = json.loads(trec.read_text())
    assert obj["local_world_size"] == 2 and json.loads(plain.read_text())["tables"][0]["sharding"]["type"] == "grid"
    assert [t["sharding_type"] for t in obj["tables"]] == ["grid_shard", "grid_shard", "table_row_wise", "table_wise"]
    sp = pe.load_torchrec_plan(trec, module=_ebc(GRID_TABLES, names))
    mp = sp.plan[""]
    g0 = mp["g0"]
    assert g0.ranks == [0, 1, 2, 3] and [(s.shard_offsets, s.shard_sizes, str(s.placement))
                                         for s in g0.sharding_spec.shards] == [
        ([0, 0], [500, 128], "rank:0/cuda:0"), ([500, 0], [500, 128], "rank:1/cuda:1"),
        ([0, 128], [500, 128], "rank:2/cuda:0"), ([500, 128], [500, 128], "rank:3/cuda:1")]
    # TorchRec's own grid_shard generator (column blocks of 128): the same shards, host 0 the first block
    theirs = construct_module_sharding_plan(_ebc(GRID_TABLES[:1], names[:1]), {"g0": grid_shard(host_indexes=[0, 1])},
                                            local_size=2, world_size=4, device_type="cuda")["g0"]
    assert theirs.sharding_type == "grid_shard" and theirs.ranks == g0.ranks
    assert [(s.shard_offsets, s.shard_sizes, str(s.placement)) for s in theirs.sharding_spec.shards] == [
        (s.shard_offsets, s.shard_sizes, str(s.placement)) for s in g0.sharding_spec.shards]
    assert trp.sharding_from_torchrec(theirs, GRID_TABLES[0], 4, "g0") == shardings[0]
    # 7 rows over 2 ranks: 4 and 3; the second table's first column block on host 1
    assert [(s.shard_offsets, s.shard_sizes, s.placement.rank()) for s in mp["g1"].sharding_spec.shards] == [
        ([0, 0], [4, 16], 2), ([4, 0], [3, 16], 3), ([0, 16], [4, 16], 0), ([4, 16], [3, 16], 1)]
    back = [trp.sharding_from_torchrec(mp[n], t, 4, n) for n, t in zip(names, GRID_TABLES)]
    assert back == shardings and Plan(GRID_TABLES, back, Topology(4, BIG_CAP)) == plan
    # what TorchRec cannot apply: one line each
    for bad, match in [(grid([([1, 0], 128), ([2, 3], 128)]), r"block on ranks \[1, 0\].*whole host"),
                       (grid([([0, 2], 128), ([1, 3], 128)]), r"block on ranks \[0, 2\]"),
                       (grid([([0], 128), ([1], 128)]), "grid blocks of 1 ranks"),
                       (row_wise([1, 2]), r"row-wise over ranks \[1, 2\]")]:
        p = Plan(GRID_TABLES, [bad] + shardings[1:], Topology(4, BIG_CAP))
        with pytest.raises(ShardError, match=match) as exc:
            pe.torchrec_plan_json(p, names, local_world_size=2)
        assert "\n" not in str(exc.value) and "'g0'" in str(exc.value)
    # without the hosts, a grid's hosts are its blocks: written as above
    assert pe.torchrec_plan_json(plan, names)["tables"][0]["shards"] == obj["tables"][0]["shards"]
    # a grid_shard whose blocks are not equal row blocks is refused
    bad = mp["g0"]
    bad.sharding_spec.shards[1].shard_sizes = [400, 128]
    with pytest.raises(ShardError, match="grid_shard table g0 has a column block at offset 0"):
        trp.sharding_from_torchrec(bad, GRID_TABLES[0], 4, "g0")


GRID_DMP = [TableConfig(0, 100, 16, 2.0), TableConfig(1, 50, 8, 1.0), TableConfig(2, 30, 8, 1.0)]


def _dmp_grid_worker(rank, port, plan_path, queue):
    try:
        # 4 ranks as 2 hosts of 2: TorchRec's intra-host groups are ranks {0, 1} and {2, 3}
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_WORLD_SIZE="2", WORLD_SIZE="4",
                          RANK=str(rank), LOCAL_RANK=str(rank % 2))
        torch.set_num_threads(1)
        import torch.distributed as dist

        dist.init_process_group("gloo", rank=rank, world_size=4)
        from torchrec import KeyedJaggedTensor
        from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
        from torchrec.distributed.model_parallel import DistributedModelParallel

        names = ["g", "r", "t"]
        sp = pe.load_torchrec_plan(plan_path, device_type="cpu", module=_ebc(GRID_DMP, names))
        model = DistributedModelParallel(_ebc(GRID_DMP, names), device=torch.device("cpu"), plan=sp,
                                         sharders=[EmbeddingBagCollectionSharder()])
        local = {}
        for key, value in model.state_dict().items():
            if key.endswith(".weight") and hasattr(value, "local_shards"):
                local[key.split(".")[-2]] = [(list(s.metadata.shard_offsets), list(s.tensor.shape))
                                             for s in value.local_shards()]
        keys = [f"f_{n}" for n in names]
        values = torch.tensor([k % t.row for k, t in enumerate(GRID_DMP) for _ in range(2)], dtype=torch.int64)
        out = model(KeyedJaggedTensor.from_lengths_sync(keys=keys, values=values,
                                                        lengths=torch.ones(len(keys) * 2, dtype=torch.int64))).wait()
        queue.put((rank, local, list(out.values().shape), bool(torch.isfinite(out.values()).all())))
        dist.barrier()
        dist.destroy_process_group()
    except Exception:
        queue.put((rank, "error", traceback.format_exc(), None))


def test_grid_and_table_row_wise_applied_by_distributed_model_parallel_on_two_cpu_hosts(tmp_path):
    """TorchRec's EmbeddingBagCollectionSharder takes our grid (16 columns in 2 blocks, one per host) and
    table-row-wise (host 1) tables: each rank holds the shards the plan gives it, and a forward pass
    pools every table's full dim."""
    from shardcore.plan import grid

    plan = Plan(GRID_DMP, [grid([([0, 1], 8), ([2, 3], 8)]), row_wise([2, 3]), table_wise(1)], Topology(4, BIG_CAP))
    path = tmp_path / "grid.torchrec.json"
    path.write_text(json.dumps(pe.torchrec_plan_json(plan, ["g", "r", "t"], local_world_size=2)))
    results = _spawn_ranks(_dmp_grid_worker, 4, lambda r, port, queue: (r, port, str(path), queue))
    expect = {0: {"g": [([0, 0], [50, 8])], "r": [], "t": []},
              1: {"g": [([50, 0], [50, 8])], "r": [], "t": [([0, 0], [30, 8])]},
              2: {"g": [([0, 8], [50, 8])], "r": [([0, 0], [25, 8])], "t": []},
              3: {"g": [([50, 8], [50, 8])], "r": [([25, 0], [25, 8])], "t": []}}
    for rank in range(4):
        local, shape, finite = results[rank]
        assert local != "error", shape  # the worker's traceback
        assert local == expect[rank] and shape == [2, 16 + 8 + 8] and finite


def test_torchrecs_planner_on_two_hosts_may_choose_grid_and_converts_it():
    """With local_world_size 2 of 4 ranks TorchRec's planner is offered grid_shard (a table whose dim is
    twice its 128-column block is cut in two blocks, one per host); its plan converts exactly."""
    task = [TableConfig(0, 400_000, 256, 30.0), TableConfig(1, 200_000, 64, 10.0), TableConfig(2, 1_000, 16, 2.0),
            TableConfig(3, 50_000, 32, 5.0)]
    sharder = trp.make_sharder(planning_ctx(oracle=None, devices_per_host=2), sharding_types=("grid_shard",))
    assert sharder.types_for(4) == ["grid_shard"] and sharder.types_for(2) == ["grid_shard"]
    plan = sharder.shard(task, Topology(4, 5.0))
    module_plan = sharder.last_plan.plan[""]
    assert sharder.last_info["torchrec_types"] == ["grid_shard"] * 4
    shardings = list(plan.shardings)
    assert [s.type for s in shardings] == ["grid"] * 4
    assert shardings[0].dims == (128, 128) and sorted(shardings[0].devices) == [0, 1, 2, 3]
    for i, (t, s) in enumerate(zip(task, shardings)):
        ps = module_plan[f"t{i}"]
        shards = sorted((sm.shard_offsets, sm.shard_sizes, sm.placement.rank()) for sm in ps.sharding_spec.shards)
        cols = {d: sum(s.dims[:j]) for j in range(len(s.dims))
                for d in s.devices[j * (len(s.devices) // len(s.dims)):(j + 1) * (len(s.devices) // len(s.dims))]}
        ours = sorted(([p.row_start, cols[d]], [p.row, p.dim], d) for d, p in s.pieces(t, 4))
        assert ours == [x for x in shards if x[1][0] > 0]
        assert pe.torchrec_problem(s, 4, 2) is None


def test_full_planner_plans_are_torchrecs_exactly():
    sharder = torchrec(batch_size=4096)
    assert sharder.types_for(4) == list(trp.ALL_TYPES)
    assert torchrec(hosts=2).types_for(4) == list(trp.ALL_TYPES) + ["table_row_wise", "grid_shard"]
    seen = set()
    for ndevices, cap in [(4, 0.25), (4, 5.0), (2, 0.5)]:
        plan = sharder.shard(TASK, Topology(ndevices, cap))
        assert plan.feasible
        module_plan = sharder.last_plan.plan[""]
        assert sharder.last_info["torchrec_types"] == [module_plan[f"t{i}"].sharding_type for i in range(len(TASK))]
        for i, (t, s) in enumerate(zip(TASK, list(plan.shardings))):
            ps = module_plan[f"t{i}"]
            seen.add(ps.sharding_type)
            if s.type == "data_parallel":
                assert ps.sharding_type == "data_parallel" and sorted(ps.ranks) == list(range(ndevices))
                continue
            shards = sorted((sm.shard_offsets, sm.shard_sizes, sm.placement.rank()) for sm in ps.sharding_spec.shards)
            # our pieces are TorchRec's non-empty shards: same offsets, sizes and ranks
            ours = []
            for d, piece in s.pieces(t, ndevices):
                off = [getattr(piece, "row_start", 0), 0]
                ours.append((off, [piece.row, piece.dim], d))
            if s.type == "column_wise":
                ours = [([0, sum(s.dims[:j])], [t.row, w], d) for j, (d, w) in enumerate(zip(s.devices, s.dims))]
            assert sorted(ours) == [x for x in shards if x[1][0] > 0]
    assert len(seen) >= 2   # the full planner does use more than table-wise here


# ---- the judged hardware and the judge's cost convention ------------------------------------

def test_hardware_for_maps_each_oracle():
    from shardcore.oracles.commmodel import CommModel

    emu = trp.hardware_for("emulated:h200")
    assert emu.compute_device == "cuda" and emu.hbm_bw_gbps == trp.H200_HBM_BANDWIDTH_GBPS == 4800.0
    assert emu.intra_host_bw_gbps == emu.inter_host_bw_gbps == CommModel().bandwidth_gbps
    assert emu.comm_latency_us == CommModel().latency_us and "H200 datasheet" in emu.source
    given = trp.hardware_for("emulated-h200", comm_bandwidth=80.0, comm_latency=5.0)
    assert (given.intra_host_bw_gbps, given.comm_latency_us) == (80.0, 5.0) and "--comm-bandwidth" in given.source
    cpu = trp.hardware_for("measured", device_type="cpu")
    assert cpu.compute_device == "cpu" and cpu.ddr_bw_gbps == trp.ASSUMED_CPU_DDR_BANDWIDTH_GBPS
    assert "assumed" in cpu.source
    if not torch.cuda.is_available():   # measured on this machine: the evaluator's rule, a CPU
        assert trp.hardware_for("measured").compute_device == "cpu"
    for name, bw in [("NVIDIA H200", 4800.0), ("NVIDIA H100 80GB HBM3", 3350.0), ("NVIDIA H100 PCIe", 2000.0)]:
        gpu = trp.hardware_for("measured", comm_bandwidth=150.0, device_type="cuda", device_name=name)
        assert (gpu.compute_device, gpu.hbm_bw_gbps, gpu.intra_host_bw_gbps) == ("cuda", bw, 150.0), name
    other = trp.hardware_for("measured", device_type="cuda", device_name="NVIDIA A10")
    assert other.hbm_bw_gbps == trp.TORCHREC_DEFAULT_HBM_GBPS and "unknown" in other.source
    plain = trp.hardware_for(None)   # nobody said: TorchRec's defaults, and the record says so
    assert plain.intra_host_bw_gbps == trp.TORCHREC_DEFAULT_INTRA_HOST_GBPS and "defaults" in plain.source
    with pytest.raises(ShardError, match="unknown oracle"):
        trp.hardware_for("emulated:tpu")


def test_topology_is_the_hardware_in_torchrecs_units():
    from torchrec.distributed.planner.types import CollectiveType

    hw = trp.hardware_for("emulated:h200", comm_bandwidth=100.0)
    topo = trp._topology(8, 1 << 30, hw)
    assert topo.compute_device == "cuda" and topo.devices[0].storage.hbm == 1 << 30
    assert topo.hbm_mem_bw == pytest.approx(4.8e9)          # bytes per ms: 4.8 TB/s
    assert topo.intra_host_bw == pytest.approx(1e8)         # 100 GB/s
    links = topo.comms_bandwidths
    assert links.get_bw(8, 8, CollectiveType.ALL_TO_ALL) == pytest.approx(1e8)
    # TorchRec divides a replica's gradient bytes by this: the ring's 2(n-1)/n per device at 100 GB/s
    assert 1.0 / links.get_bw(8, 8, CollectiveType.ALL_REDUCE) == pytest.approx(2 * 7 / 8 / 1e8)
    cpu = trp._topology(4, 1 << 30, trp.hardware_for("measured", device_type="cpu"))
    assert cpu.compute_device == "cpu" and cpu.devices[0].storage.ddr == 1 << 30


def _options(tables, ndevices, hardware, batch, objective=True):
    """TorchRec's estimated sharding options of ``tables`` (with or without our objective)."""
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import ParameterConstraints
    from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
    from torchrec.distributed.planner.shard_estimators import EmbeddingPerfEstimator

    names = [f"t{i}" for i in range(len(tables))]
    topo = trp._topology(ndevices, 1 << 34, hardware)
    cons = {n: ParameterConstraints(sharding_types=list(trp.ALL_TYPES), compute_kernels=["fused", "dense"],
                                    pooling_factors=[float(t.pooling_factor)]) for n, t in zip(names, tables)}
    est = (trp._objective_estimator(topo, cons, batch, tables) if objective
           else EmbeddingPerfEstimator(topology=topo, constraints=cons))
    enum = EmbeddingEnumerator(topology=topo, batch_size=batch // ndevices, constraints=cons, estimator=[est])
    opts = enum.enumerate(_ebc(tables, names), [EmbeddingBagCollectionSharder(
        qcomm_codecs_registry=trp._fp32_comm_codecs())])
    return {(o.name, o.sharding_type): o for o in opts}


def test_objective_adds_the_judges_ids_and_ring_allreduce(tmp_path):
    from shardcore.oracles.commmodel import CommModel, allreduce_bytes, id_width
    from shardcore.oracles.emulated.oracle import EmulatedOracle
    from helpers import make_dataset

    tables = make_dataset(tmp_path, num_tables=4, batch_size=64, seed=3, dims=(16, 32))
    t = next(x for x in tables if x.pooling_factor > 1 and x.row >= 4)
    n, batch, link = 4, 64, 100.0
    hw = trp.hardware_for("emulated:h200", comm_bandwidth=link)
    ours, plain = _options([t], n, hw, batch), _options([t], n, hw, batch, objective=False)
    per_ms = link * 1e6
    # row-wise: each shard's forward comms = TorchRec's own + its piece's ids, as the judge's id_width prices them
    plan_pieces = Plan([t], [row_wise(list(range(n)))], Topology(n, BIG_CAP)).device_pieces
    for shard, mine, theirs, (piece,) in zip(ours[("t0", "row_wise")].shards, ours[("t0", "row_wise")].shards,
                                             plain[("t0", "row_wise")].shards, plan_pieces):
        ids = 8 * id_width(piece) * (batch - batch / n) / per_ms
        assert ids > 0 and mine.perf.input_dist_comms == pytest.approx(ids)
        assert mine.perf.fwd_comms == pytest.approx(theirs.perf.fwd_comms + ids)
        assert (mine.perf.fwd_compute, mine.perf.bwd_compute, mine.perf.bwd_comms) == (
            theirs.perf.fwd_compute + trp.tie_break_ms("row_wise", "fused"), theirs.perf.bwd_compute,
            theirs.perf.bwd_comms)                                   # TorchRec's own, plus the tie-break
    assert len(plan_pieces) == n
    # ... which is what the judge charges that plan: with no latency, every holder's forward exchange is
    # its pooled outputs plus that id figure (the received ids; the blocks' rows differ by one at most, so
    # the ids a holder sends differ from those it receives by a few parts in 1e5)
    judge = EmulatedOracle(tmp_path, n, batch_size=batch, comm_model=CommModel(bandwidth_gbps=link, latency_us=0.0))
    res = judge.evaluate(plan_pieces)
    pooled = 4 * t.dim * (batch - batch / n) / per_ms
    for d, shard in enumerate(ours[("t0", "row_wise")].shards):
        assert res.device_costs_ms[d][1] == pytest.approx(pooled + shard.perf.input_dist_comms, rel=1e-4)
    # table-wise: the judge's fw exchange on the table's device beyond its pooled outputs is the id term
    tw_plan = Plan([t], [table_wise(0)], Topology(n, BIG_CAP)).device_pieces
    (tw_shard,) = ours[("t0", "table_wise")].shards
    assert judge.evaluate(tw_plan).device_costs_ms[0][1] == pytest.approx(pooled + tw_shard.perf.input_dist_comms)
    # data-parallel: no ids; the all-reduce is the judge's ring (beyond TorchRec's dense optimizer kernels)
    dp, dp_plain = ours[("t0", "data_parallel")], plain[("t0", "data_parallel")]
    # (_ebc's tables are fp32)
    ring = allreduce_bytes(Plan([t], [data_parallel(n)], Topology(n, BIG_CAP)).device_pieces[0][0], n, "fp32") / per_ms
    from torchrec.distributed.planner.constants import DP_ELEMENTWISE_KERNELS_PERF_FACTOR

    optimizer = t.row * t.dim * 4 * DP_ELEMENTWISE_KERNELS_PERF_FACTOR / (0.5 * 4.8e9)   # dense kernel: half the HBM bw
    for shard, base in zip(dp.shards, dp_plain.shards):
        assert shard.perf.input_dist_comms == 0 and shard.perf.fwd_comms == base.perf.fwd_comms == 0
        assert shard.perf.bwd_comms == pytest.approx(ring + optimizer)
    # TorchRec's pooled exchange in fp32, what the judge moves: a table-wise shard's forward comms
    assert tw_shard.perf.fwd_comms - tw_shard.perf.input_dist_comms == pytest.approx(4 * t.dim * batch / per_ms)


def test_records_carry_the_planner_configuration(tmp_path):
    import subprocess
    import sys

    from helpers import make_dataset

    make_dataset(tmp_path / "ds", num_tables=12, batch_size=64, seed=2)
    tasks = tmp_path / "tasks.txt"
    tasks.write_text("0,1,2,3,4,5\n6,7,8,9,10,11\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = tmp_path / "r.jsonl"
    proc = subprocess.run([sys.executable, os.path.join(root, "eval.py"), "--alg", "torchrec,torchrec-tw",
                           "--oracle", "emulated:h200", "--comm-bandwidth", "123", "--comm-latency", "7",
                           "--task-path", str(tasks), "--data-dir", str(tmp_path / "ds"), "--ndevices", "4",
                           "--max-memory", "5", "--quiet", "--out", str(out)],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(recs) == 4
    for rec in recs:
        cfg = rec["torchrec_config"]
        assert "123.0 GB/s" in rec["parts"]["comm"] and "7.0 us" in rec["parts"]["comm"]   # the judge's link...
        assert cfg["intra_host_bw_gbps"] == 123.0 and cfg["comm_latency_us"] == 7.0      # ...is TorchRec's
        assert cfg["compute_device"] == "cuda" and cfg["hbm_bw_gbps"] == trp.H200_HBM_BANDWIDTH_GBPS
        assert cfg["landscape"] == "emulated:h200" and cfg["world_size"] == cfg["local_world_size"] == 4
        assert cfg["batch_per_rank"] == rec["batch_size"] // 4 == 16
        assert cfg["sharding_types"] == (["table_wise"] if rec["alg"] == "torchrec-tw" else list(trp.ALL_TYPES))
        assert any("input ids" in term for term in cfg["objective"])
        est = rec["torchrec_estimate_ms"]
        assert len(est) == 4 and all(len(dev) == 4 for dev in est) and max(map(sum, est)) > 0
    # measured on this machine's CPU: TorchRec plans for host memory, not a GPU
    sharder = torchrec(oracle="measured", batch_size=64, comm_bandwidth=50.0)
    if torch.cuda.is_available():   # this test is of the CPU's planning: the hardware's compute device told so
        sharder = dataclasses.replace(sharder, compute_device="cpu")
    sharder.shard(TASK, Topology(2, 1.0))
    cfg = sharder.last_info["torchrec_config"]
    assert cfg["compute_device"] == "cpu" and cfg["intra_host_bw_gbps"] == 50.0 and cfg["batch_per_rank"] == 32
    assert cfg["ddr_bw_gbps"] == pytest.approx(trp.ASSUMED_CPU_DDR_BANDWIDTH_GBPS, abs=1e-3)


# ---- plan files are checked completely before any rank starts ------------------------------------

def _valid_plan():
    """A plan file with every type TorchRec applies on 4 ranks in hosts of 2 (its dict and the collection)."""
    from shardcore.plan import grid

    tables = [TableConfig(0, 100, 16, 2.0), TableConfig(1, 50, 8, 1.0), TableConfig(2, 30, 8, 1.0),
              TableConfig(3, 10, 8, 1.0), TableConfig(4, 9, 8, 1.0)]
    names = ["g", "cw", "rw", "trw", "dp"]
    shardings = [grid([([0, 1], 8), ([2, 3], 8)]), column_wise([(1, 4), (2, 4)]), row_wise([0, 1, 2, 3]),
                 row_wise([2, 3]), data_parallel(4)]
    obj = pe.torchrec_plan_json(Plan(tables, shardings, Topology(4, BIG_CAP, "fp32")), names, local_world_size=2)
    return obj, _ebc(tables, names)


def _edit(obj, fn):
    import copy

    out = copy.deepcopy(obj)
    fn(out)
    return out


def _table(obj, name):
    return next(t for t in obj["tables"] if t["name"] == name)


BAD_PLANS = [
    ("no world size", lambda o: o.pop("world_size"), "the plan has no 'world_size'"),
    ("no tables", lambda o: o.pop("tables"), "the plan has no 'tables'"),
    ("not a list of tables", lambda o: o.update(tables={}), "tables must be a non-empty list"),
    ("a table without a kernel", lambda o: _table(o, "cw").pop("compute_kernel"), "'cw' has no 'compute_kernel'"),
    ("an unknown sharding type", lambda o: _table(o, "cw").update(sharding_type="diagonal"), "unknown sharding type 'diagonal'"),
    ("an unknown kernel", lambda o: _table(o, "cw").update(compute_kernel="warp"), "compute kernel 'warp' cannot run column_wise"),
    ("dense on a sharded table", lambda o: _table(o, "cw").update(compute_kernel="dense"), "'dense' cannot run column_wise"),
    ("a gap", lambda o: _table(o, "cw")["shards"][1]["sizes"].__setitem__(1, 2), "cover 300 of its 50 x 8 = 400 weights"),
    ("an overlap", lambda o: _table(o, "rw")["shards"][1]["offsets"].__setitem__(0, 5), "overlap"),
    ("a negative offset", lambda o: _table(o, "rw")["shards"][0]["offsets"].__setitem__(0, -1), "offsets must be >= 0, got -1"),
    ("a shard outside the table", lambda o: _table(o, "cw")["shards"][1]["sizes"].__setitem__(1, 8),
     r"reaches outside the 50 x 8 table"),
    ("ranks not matching placements", lambda o: _table(o, "cw").update(ranks=[2, 1]),
     r"ranks \[2, 1\] do not match its shards' placements \[1, 2\]"),
    ("a rank outside the world", lambda o: _table(o, "cw")["shards"][0].update(rank=7), "rank 7 in a plan for 4 ranks"),
    ("row_wise blocks on other ranks", lambda o: (_table(o, "rw").update(ranks=[1, 0, 2, 3]),
                                                  _table(o, "rw")["shards"][0].update(rank=1),
                                                  _table(o, "rw")["shards"][1].update(rank=0)), "puts block j on rank j"),
    ("table_row_wise across hosts", lambda o: (_table(o, "trw").update(ranks=[1, 2]),
                                               _table(o, "trw")["shards"][0].update(rank=1),
                                               _table(o, "trw")["shards"][1].update(rank=2)), "one whole host's ranks"),
    ("a grid block across hosts", lambda o: _table(o, "g")["shards"][1].update(rank=2) or _table(o, "g").update(
        ranks=[0, 2, 2, 3]), "grid_shard column block"),
    ("a replica missing a rank", lambda o: _table(o, "dp").update(ranks=[0, 1, 2]), "every rank once"),
    ("a duplicate table", lambda o: o["tables"].append(dict(o["tables"][0])), "'g' appears twice"),
    ("a table without rows", lambda o: _table(o, "cw").update(rows=0), "rows must be >= 1, got 0"),
    ("a dim FBGEMM cannot run", lambda o: _table(o, "dp").update(dim=6), "dim 6 is not a multiple of 4"),
    ("a world size of 0", lambda o: o.update(world_size=0), "world_size must be >= 1, got 0"),
    ("hosts that do not divide the world", lambda o: o.update(local_world_size=3), "do not split into hosts of 3"),
]


@pytest.mark.parametrize("what,edit,match", BAD_PLANS, ids=[b[0] for b in BAD_PLANS])
def test_malformed_plan_file_is_one_line_error(tmp_path, what, edit, match):
    obj, module = _valid_plan()
    path = tmp_path / "plan.torchrec.json"
    path.write_text(json.dumps(_edit(obj, edit)))
    with pytest.raises(ShardError, match=match) as exc:
        pe.load_torchrec_plan(path, device_type="cpu", module=module)
    assert "\n" not in str(exc.value)


def test_plan_file_checks_against_the_collection_and_the_arguments(tmp_path):
    obj, module = _valid_plan()
    path = tmp_path / "plan.torchrec.json"
    path.write_text(json.dumps(obj))
    sp = pe.load_torchrec_plan(path, device_type="cpu", module=module, world_size=4)   # the valid one loads
    assert sorted(sp.plan[""]) == ["cw", "dp", "g", "rw", "trw"]
    for kwargs, match in [({"world_size": 2}, "the plan is for 4 ranks, not the 2 given"),
                          ({"local_world_size": 0}, "local_world_size must be >= 1, got 0"),
                          ({"device_type": "tpu"}, "device_type must be one of cpu, cuda, got 'tpu'"),
                          ({"module": torch.nn.Linear(2, 2)}, "module must be the EmbeddingBagCollection .* got Linear"),
                          ({"module": _ebc([TableConfig(0, 100, 16, 1.0)], ["other"])}, "not in the plan")]:
        with pytest.raises(ShardError, match=match) as exc:
            pe.load_torchrec_plan(path, **{"device_type": "cpu", **kwargs})
        assert "\n" not in str(exc.value)
    path.write_text("[1, 2]")
    with pytest.raises(ShardError, match="a TorchRec plan is a JSON object, got list"):
        pe.load_torchrec_plan(path)


# ---- the memory account beside TorchRec's storage estimate ---------------------------------------

def test_memory_account_is_never_below_torchrecs_storage_estimate():
    """Per device, for every sharding type, both precisions and every optimizer: the account (weights,
    FBGEMM's fp32 optimizer state, outputs, their gradients and ids at the batch) is at least TorchRec's
    estimate of the same shards; with fp32 weights both count the same Adagrad and Adam state."""
    from shardcore.interop.memory import OPTIMIZER_STATE
    from shardkit_torchrec.torchrec_memory import compare_memory, torchrec_storage

    for precision in ("fp16", "fp32"):
        plan = Plan(TASK, EVERY, Topology(4, 1.0, precision))
        base = compare_memory(plan, 8192, "exact_sgd")
        for optimizer in OPTIMIZER_STATE:
            cmp = compare_memory(plan, 8192, optimizer)
            assert cmp.torchrec is not None, cmp.why_not
            assert cmp.torchrec == torchrec_storage(plan, 8192, optimizer)
            for d in range(4):
                assert cmp.memory[d].total >= cmp.torchrec[d] > 0, (precision, optimizer, d)
                assert cmp.memory[d].weights == base.memory[d].weights
                theirs = cmp.torchrec[d] - base.torchrec[d]
                assert cmp.memory[d].optimizer >= theirs - 1024   # TorchRec rounds each shard's state up
                if precision == "fp32" and optimizer != "exact_row_wise_adagrad":
                    # a multiple of the weights' bytes, as FBGEMM's fp32 state (row-wise Adagrad: TorchRec
                    # splits a row's state over its column blocks, FBGEMM keeps one in every block)
                    assert theirs == pytest.approx(cmp.memory[d].optimizer, rel=1e-6)


def test_torchrecs_default_reservation_is_the_one_compared():
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.planner.types import TopologyFactory, TrainerConfig

    from shardkit_torchrec.torchrec_memory import TORCHREC_DEFAULT_RESERVE

    planner = EmbeddingShardingPlanner(topology=TopologyFactory.create_topology(TrainerConfig(world_size=2)))
    assert planner._storage_reservation._percentage == TORCHREC_DEFAULT_RESERVE


def _plan_script():
    import importlib.util

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    spec = importlib.util.spec_from_file_location("plan_script_mem", os.path.join(root, "plan.py"))
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def test_plan_cli_prints_memory_by_part_beside_torchrecs_estimate(tmp_path, capsys):
    from shardcore.interop.memory import device_memory

    script = _plan_script()
    csv_path = tmp_path / "t.csv"
    csv_path.write_text("name,rows,dim,pooling_factor\n" + "".join(
        f"t{t.index},{t.row},{t.dim},{t.pooling_factor}\n" for t in TASK))
    out = tmp_path / "plan.json"
    assert script.main(["--tables", str(csv_path), "--ndevices", "4", "--max-memory", "0.25", "--alg", "size_greedy",
                        "--batch-size", "8192", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    head = next(i for i, line in enumerate(lines) if "weights GiB" in line)
    assert all(k in lines[head] for k in ("optimizer GiB", "buffers GiB", "total GiB", "TorchRec's estimate GiB"))
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[head + 2:head + 6]]
    plain = json.loads(out.read_text())
    # the table's parts are the account of the plan written, computed here again
    mem = [m.gib() for m in device_memory(_plan_of(plain), "exact_sgd", 8192)]
    for row, m in zip(rows, mem):
        assert [float(x) for x in row[1:5]] == [round(m[p], 3) for p in ("weights", "optimizer", "buffers", "total")]
        assert float(row[5]) <= m["total"] + 1e-3 and float(row[6]) <= 0.0005   # TorchRec's: never above the account
    assert any(line.startswith("TorchRec's planner on devices of 0.25 GiB keeps 15% off limits") for line in lines)


def _plan_of(plain: dict) -> Plan:
    return Plan.from_json(TASK, [t["sharding"] for t in plain["tables"]], Topology(plain["ndevices"], BIG_CAP))


# ---- the same inputs give the same plan and labels ----------------------------------------------

def test_torchrecs_plans_and_labels_are_the_same_whatever_the_string_hash_seed(tmp_path):
    """TorchRec enumerates sharding types in the order of a set of their names and keeps the first of
    equally priced options: a table-wise table and a column-wise one of one block on the same rank cost the
    same, so the MLPerf DLRM plan read "DP 11, TW 10, RW 5" or "DP 11, CW 10, RW 5" by PYTHONHASHSEED.
    The estimators' tie-break orders them alike in every process."""
    import subprocess
    import sys

    assert trp.tie_break_ms("table_wise", "fused") < trp.tie_break_ms("column_wise", "fused") < 1e-9
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    mlperf = "/work/shared/models/mlperf_dlrm_criteo1tb.csv"
    if not os.path.exists(mlperf):
        pytest.skip("the MLPerf DLRM tables file is not on this machine")
    tables = []
    for seed in ("1", "2"):
        done = subprocess.run([sys.executable, os.path.join(root, "plan.py"), "--tables", mlperf, "--ndevices", "8",
                               "--max-memory", "8", "--alg", "torchrec,torchrec-emu", "--oracle", "emulated:h200"],
                              capture_output=True, text=True, timeout=600, env=dict(os.environ, PYTHONHASHSEED=seed))
        assert done.returncode == 0, done.stderr[-2000:]
        rows = [line for line in done.stdout.splitlines() if line.startswith("| torchrec")]
        assert len(rows) == 2
        tables.append([[c.strip() for i, c in enumerate(r.split("|")) if i != 8] for r in rows])   # all but the time
    assert tables[0] == tables[1]
