"""Each hyper-parameter stated once (shardcore.config), one scaler, one mlp(), one cost-part constant."""

from __future__ import annotations

import argparse
import json
import os
import re
from dataclasses import dataclass

import numpy as np
import pytest

import collect_comm_cost_data
import collect_compute_cost_data
import train_autoshard
import train_comm_cost_model
import train_dreamshard
import train_neuroshard
from autoshard.config import AutoShardConfig
from dreamshard.config import DreamShardConfig
from neuroshard.cli import add_search_args, search_kwargs
from neuroshard.config import (COLLECTION, COLLECTION_GROUPS, CollectionConfig, ModelConfig, SearchConfig,
                               comm_model_config, compute_model_config)
from shardcore.argtypes import positive_int
from shardcore.cli.common import check_resumed_config, flags_given
from shardcore.config import Config, add_config_args, config_from_args, flag_fields, param
from shardcore.errors import ShardError
from shardcore.layers import mlp
from shardcore.tables import TableConfig
from shardcore.data.features import SCALED_FEATURES, FeatureScaler, Standardiser

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass
class Toy(Config):
    hidden: int = 8                                   # internal: no flag
    steps: int = param(5, "steps (default {default})", type=positive_int)
    head_size: int = param(3, "head (default {default})", flags=("--head-size", "--head_size"), dest="head")
    lr: float = param(0.1, "learning rate (default {default})")
    use_x: bool = param(True, "no x", flags=("--no-x",), action="store_false")
    mode: str = param("a", "mode", choices=["a", "b"], cli_default=None)


def toy_parser(prefix="", underscore=False) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_config_args(p, Toy(steps=7), prefix=prefix, underscore_aliases=underscore)
    return p


def test_flags_are_generated_from_the_dataclass():
    p = toy_parser()
    assert "--hidden" not in p.format_help()
    a = p.parse_args([])
    assert (a.steps, a.head, a.lr, a.use_x, a.mode) == (7, 3, 0.1, True, None)   # defaults of the instance
    assert "steps (default 7)" in p.format_help()
    a = p.parse_args(["--steps", "2", "--head_size", "4", "--lr", "0.5", "--no-x", "--mode", "b"])
    assert config_from_args(Toy, a) == Toy(steps=2, head_size=4, lr=0.5, use_x=False, mode="b")
    assert config_from_args(Toy, p.parse_args([])) == Toy(steps=7)      # mode None: the config's own value
    assert config_from_args(Toy, p.parse_args([]), lr=1.0).lr == 1.0    # explicit overrides win
    with pytest.raises(SystemExit):
        p.parse_args(["--steps", "0"])                                   # the field's argparse type


def test_prefix_and_underscore_aliases():
    p = toy_parser(prefix="comm-", underscore=True)
    a = p.parse_args(["--comm_steps", "9", "--comm-head-size", "2", "--comm_head_size", "6"])
    assert (a.comm_steps, a.comm_head) == (9, 6)
    assert config_from_args(Toy, a, prefix="comm-") == Toy(steps=9, head_size=6)


def test_a_resumed_training_refuses_another_value_for_a_given_flag():
    p = toy_parser()
    argv = ["--lr", "0.1", "--head_size", "4", "--no-x"]
    assert flags_given(p, argv) == {"lr", "head", "use_x"}      # written ones only, the default's value included
    assert flags_given(p, []) == set() and p.parse_args([]).steps == 7     # the parser's defaults are restored
    stored = Toy(steps=7, head_size=4, use_x=False)
    check_resumed_config(stored, config_from_args(Toy, p.parse_args(argv)), flags_given(p, argv), "elsewhere")
    check_resumed_config(stored, config_from_args(Toy, p.parse_args([])), set(), "elsewhere")   # nothing given
    asked = ["--steps", "9", "--lr", "0.2"]
    with pytest.raises(ShardError, match=r"^--resume: the checkpoint was trained with --lr 0.1, this run gives 0.2: "
                                         r".*train anew elsewhere$"):
        check_resumed_config(stored, config_from_args(Toy, p.parse_args(asked)), flags_given(p, asked), "elsewhere",
                             free=("steps",))
    check_resumed_config(stored, config_from_args(Toy, p.parse_args(asked[:2])), {"steps"}, "elsewhere",
                         free=("steps",))   # a free field (how long to run) may change


def test_a_flag_needs_help_and_a_known_type():
    with pytest.raises(ValueError, match="help"):
        param(1, "")

    @dataclass
    class Bad(Config):
        sizes: list = param(None, "sizes")

    with pytest.raises(TypeError, match="sizes"):
        add_config_args(argparse.ArgumentParser(), Bad())


def test_one_serialiser_ignores_unknown_keys_and_fills_defaults():
    assert Toy.from_dict(Toy(steps=3).to_dict()) == Toy(steps=3)
    assert Toy.from_dict({"steps": 4, "removed_since": 1}) == Toy(steps=4)
    with pytest.raises(ShardError, match="expected an object"):
        Toy.from_dict([1, 2])
    for cls in (AutoShardConfig, DreamShardConfig, ModelConfig, SearchConfig):
        assert cls.from_dict(json.loads(json.dumps(cls().to_dict()))) == cls()


@pytest.mark.parametrize("module,defaults,prefix", [(train_autoshard, AutoShardConfig(), ""),
                                                     (train_dreamshard, DreamShardConfig(), ""),
                                                     (train_neuroshard, compute_model_config(), ""),
                                                     (train_neuroshard, comm_model_config(), "comm-")])
def test_every_config_flag_reaches_the_script_with_the_config_default(module, defaults, prefix):
    """The scripts' flags are the config's: each field declared with param() is a flag of the script,
    with the config's value as its default (or None: "keep the config's") and a help text."""
    p = module.build_parser()
    by_flag = {s: a for a in p._actions for s in a.option_strings}
    for f in flag_fields(defaults):
        meta = f.metadata["cli"]
        if prefix == "comm-" and meta["group"] == "compute-only":   # NeuroShard's compute-model-only fields
            assert f"--comm-{f.name.replace('_', '-')}" not in by_flag, f.name
            continue
        action = by_flag[f"--{prefix}{(meta['flags'] or ('--' + f.name.replace('_', '-'),))[0][2:]}"]
        expected = None if meta["cli_default"] is None else getattr(defaults, f.name)
        assert action.default == expected, f.name
        assert action.help and "{default}" not in action.help, f.name
    args = p.parse_args([])
    assert config_from_args(type(defaults), args, base=defaults, prefix=prefix) == defaults


@pytest.mark.parametrize("module,script", [(collect_compute_cost_data, "compute"), (collect_comm_cost_data, "comm"),
                                           (train_neuroshard, "train")])
def test_the_collection_flags_of_the_three_scripts_come_from_one_config(module, script):
    """NeuroShard's collection flags are CollectionConfig's: a field is a flag of exactly the scripts
    its group names (ungrouped: all three), with the config's default (a collect script's --data_size:
    its kind's samples) and a help text; the precision every script records is the config's."""
    p = module.build_parser()
    by_flag = {s: a for a in p._actions for s in a.option_strings}
    for f in flag_fields(CollectionConfig):
        meta = f.metadata["cli"]
        flag = (meta["flags"] or ("--" + f.name.replace("_", "-"),))[0]
        if meta["group"] and meta["group"] not in COLLECTION_GROUPS[script]:
            if f.name != "weights_precision":      # where --max-memory is, --weights-precision comes with it
                assert flag not in by_flag, (script, flag)
            continue
        action = by_flag[flag]
        expected = getattr(COLLECTION, f"{script}_samples") if f.name == "data_size" else getattr(COLLECTION, f.name)
        assert action.default == expected and action.dest == (meta["dest"] or f.name), (script, f.name)
        assert action.help and "{default}" not in action.help, f.name
    assert by_flag["--weights-precision"].default == COLLECTION.weights_precision
    args = p.parse_args([])
    cfg = config_from_args(CollectionConfig, args)
    assert cfg.T_range == [10, 59] and cfg.sleep_range == [0.0, 300.0] and cfg.max_dim == COLLECTION.max_dim
    if script != "train":
        # the compute collection's size comes from the oracle (config.COMPUTE_DEFAULTS), the comm one is fixed
        assert args.data_size == cfg.data_size == {"compute": None, "comm": 500}[script]


def test_one_num_actors_default():
    """AutoShard's actor count has one default, the config's (one per core, 2..8), which the script keeps."""
    from autoshard.config import default_num_actors

    assert AutoShardConfig().num_actors == default_num_actors()
    args = train_autoshard.build_parser().parse_args([])
    assert args.num_actors is None and config_from_args(AutoShardConfig, args).num_actors == default_num_actors()
    assert config_from_args(AutoShardConfig, train_autoshard.build_parser().parse_args(["--num-actors", "1"])
                            ).num_actors == 1


def test_old_flag_spellings_and_destinations_still_work():
    a = train_autoshard.build_parser().parse_args(
        ["--disable-cost-model", "--cost-learning-rate", "0.01", "--num-cost-updates", "3", "--seed", "4"])
    cfg = config_from_args(AutoShardConfig, a)
    assert (cfg.use_cost_model, cfg.cost_lr, cfg.cost_steps_per_update, cfg.seed) == (False, 0.01, 3, 4)
    assert a.cost_updates == 3
    d = config_from_args(DreamShardConfig, train_dreamshard.build_parser().parse_args(["--batch-size", "7"]))
    assert d.cost_batch_size == 7
    e = train_comm_cost_model.build_parser().parse_args(["--batch_size", "5", "--head_hidden", "9"])
    assert (e.train_batch_size, e.head_hidden) == (5, 9)
    p = argparse.ArgumentParser()
    add_search_args(p)
    assert search_kwargs(p.parse_args([])) == {}
    assert search_kwargs(p.parse_args(["--k", "2", "--max_length", "0", "--no-column-wise"])) == \
        {"k": 2, "max_length": 0, "column_wise": False}


def _tables(n=30, seed=0):
    rng = np.random.default_rng(seed)
    return [TableConfig(i, int(10 ** rng.uniform(1, 7)), int(rng.choice([4, 16, 128])), float(rng.uniform(0, 50)))
            for i in range(n)]


def test_one_scaler_two_log_scales_and_their_checkpoint_forms():
    assert issubclass(FeatureScaler, Standardiser)               # tables' features and others: one scaler
    x = np.array([[1.0, 5.0, 3.0], [3.0, 5.0, 7.0]])
    s = Standardiser.fit_array(x)
    np.testing.assert_array_equal(s.apply(x), [[-1.0, 0.0, -1.0], [1.0, 0.0, 1.0]])   # a constant feature: std 1
    with pytest.raises(ShardError, match="standard deviations finite and positive"):
        Standardiser([0.0], [0.0])
    train, other = _tables(), _tables(seed=1)
    default = FeatureScaler.fit(train)
    state = default.to_state()
    assert set(state) == {"features", "mean", "std"}           # the form AutoShard/DreamShard checkpoints hold
    z = default.transform(train)
    assert z.dtype == np.float32 and np.allclose(z[:, [0, 1, 2, 3]].mean(0), 0, atol=1e-5)
    all_log = FeatureScaler.fit(train, SCALED_FEATURES)
    assert all_log.to_state()["log"] == list(SCALED_FEATURES)  # the form NeuroShard checkpoints hold
    assert all_log.transform(other, dtype=np.float64).dtype == np.float64
    assert not np.allclose(all_log.transform(other), default.transform(other))
    again = FeatureScaler.from_state(json.loads(json.dumps(all_log.to_state())), SCALED_FEATURES)
    np.testing.assert_array_equal(again.transform(other), all_log.transform(other))
    with pytest.raises(ShardError, match="log scale"):
        FeatureScaler.from_state(state, SCALED_FEATURES)        # a model never reads another's scaling
    with pytest.raises(ShardError, match="other features"):
        FeatureScaler.from_state(all_log.to_state())


def test_one_mlp_says_its_last_activation():
    import torch

    assert [type(m).__name__ for m in mlp([3, 4, 2], last_act=False)] == ["Linear", "ReLU", "Linear"]
    assert [type(m).__name__ for m in mlp([3, 4, 2], last_act=True)] == ["Linear", "ReLU", "Linear", "ReLU"]
    with pytest.raises(TypeError):
        mlp([3, 4])                                               # no default to disagree about
    assert mlp([2, 2], last_act=True)(torch.full((1, 2), -5.0)).min() >= 0


def test_cost_parts_and_mlp_are_defined_once():
    """The cost-part names and mlp() have one definition (shardcore.costs, shardcore.layers)."""
    literal = re.compile(r"""\(\s*["']fw_comp["'],\s*["']fw_comm["'],\s*["']bw_comm["'],\s*["']bw_comp["']\s*\)""")
    found_parts, found_mlp = [], []
    for d, dirs, files in os.walk(ROOT):
        if os.path.relpath(d, ROOT) == ".":
            dirs[:] = [x for x in dirs if x not in (".venv", ".git", "data", "models", "results", "build")]
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(d, name)
                text = open(path, encoding="utf-8").read()
                if literal.search(text):
                    found_parts.append(os.path.relpath(path, ROOT))
                if re.search(r"^def mlp\(", text, re.M):
                    found_mlp.append(os.path.relpath(path, ROOT))
    assert found_mlp == [os.path.join("shardcore", "layers.py")]
    # a test may spell the expected value out; the code has one definition
    assert [p for p in found_parts if not p.startswith("tests" + os.sep)] == [os.path.join("shardcore", "costs.py")]



def test_the_oracle_flags_are_generated_from_one_config():
    """Every oracle flag comes from OracleConfig (default and help stated once), under its own name
    or, for the benchmark's batch, the name a script gives it."""
    import argparse
    import dataclasses

    from shardcore.cli.common import add_oracle_args, oracle_batch_size
    from shardcore.oracles.factory import OracleConfig
    from shardcore.oracles.setting import DEFAULT_TIMEOUT_S, EXACT_SGD

    p = argparse.ArgumentParser()
    add_oracle_args(p)
    args = p.parse_args([])
    defaults = OracleConfig()
    for f in dataclasses.fields(OracleConfig):
        assert getattr(args, f.name) == getattr(defaults, f.name), f.name
    assert args.timeout == DEFAULT_TIMEOUT_S and args.optimizer == EXACT_SGD
    assert p.parse_args(["--timeout", "7", "--no-cache", "--emulator-fit", "full"]).timeout == 7.0
    renamed = argparse.ArgumentParser()
    add_oracle_args(renamed, batch_flag="--bench-batch-size")
    got = renamed.parse_args(["--bench-batch-size", "64"])
    assert oracle_batch_size(got) == 64 and not hasattr(got, "batch_size")
    with pytest.raises(SystemExit):
        renamed.parse_args(["--batch-size", "64"])
