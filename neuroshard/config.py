"""Every NeuroShard default in one place: file locations, data collection, the three cost models,
their training, and the search.

Defaults are sized for the CPU oracle of this project (fbgemm-gpu-cpu, batch 4096): a shard's
compute there costs tens to hundreds of milliseconds, so the start delays that mimic imbalanced
compute in the communication data (``sleep_range``) span 0..300 ms rather than the original GPU
setting's 1..20 ms. ``collect_comm_cost_data.py --sleep_range 1,20`` restores the latter.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardcore.cli import fraction, nonnegative_int, positive_float, positive_int
from shardcore.cli import learning_rate as learning_rate_type
from shardcore.config import Config, param

# -- locations ----------------------------------------------------------------------------------
MODEL_DIR = "models/neuroshard"
COMPUTE_MODEL = f"{MODEL_DIR}/compute.pt"
FW_COMM_MODEL = f"{MODEL_DIR}/fw_comm.pt"
BW_COMM_MODEL = f"{MODEL_DIR}/bw_comm.pt"
BUNDLE_MODEL = f"{MODEL_DIR}/neuroshard.pt"      # all three models in one checkpoint (``--alg`` path)
COST_DATA_DIR = "data/cost_data"
COMPUTE_DATA_DIR = f"{COST_DATA_DIR}/compute"
COMM_DATA_DIR = f"{COST_DATA_DIR}/comm_4"        # one directory per device count, as in the original
COMPUTE_CSV = "compute_costs.csv"
COMM_CSV = "comm_costs.csv"
META_JSON = "meta.json"

# -- collection ---------------------------------------------------------------------------------
MAX_TABLES = 15            # tables per random shard: 1..MAX_TABLES
MAX_MEM_GB = 4.0           # total weight memory of a random shard (fp32 by default, as the original)
MAX_DIM = 128              # dims are drawn from MAX_DIM, MAX_DIM/2, ..., 4
MIN_DIM = 4
COMPUTE_SAMPLES = 2000     # --data_size of collect_compute_cost_data.py
COMM_SAMPLES = 500         # --data_size of collect_comm_cost_data.py
T_RANGE = (10, 59)         # tables per random communication sample (inclusive): the original's --T_range 10,60
T_RANGE_TEXT = "10,60"     # ... as typed: MAX exclusive, as in the original scripts
SLEEP_RANGE_MS = (0.0, 300.0)
COLLECT_CHUNK = 16         # samples measured between two (atomic) rewrites of the CSV
TRAIN_FRACTION = 0.5       # tables pool: the same train/test split of the dataset as tools/gen_tasks.py
POOL_SEED = 0


@dataclass
class ModelConfig(Config):
    """Architecture and training of one cost model (the ``param`` fields are the training scripts'
    flags, ``--comm-`` prefixed for the communication models in train_neuroshard.py)."""

    hidden: int = param(128, "MLP width (default {default})", type=positive_int)
    # ^ width of the per-table (compute) / per-device (comm) MLP
    embed: int = param(64, "pooled representation width (default {default})", type=positive_int)
    # ^ representation summed over a shard (compute) / pooled over devices (comm)
    head_hidden: int = param(128, "head MLP width (default {default})", type=positive_int)
    pooling: str = "additive"  # compute model: "additive" (sum of per-table costs x a learned shard-level
                               # correction), "lse" or "sum" (see neuroshard.networks.ComputeCostNet)
    epochs: int = param(300, "training epochs (default {default})", type=positive_int)
    batch_size: int = param(64, "samples per gradient step (default {default})", flags=("--train-batch-size",),
                            dest="train_batch_size", type=positive_int)
    lr: float = param(2e-3, "learning rate (default {default})", type=learning_rate_type)
    weight_decay: float = 1e-5
    lr_decay: float = 0.99     # learning rate multiplied by this after every epoch
    val_fraction: float = param(0.1, "share of samples for model selection (default {default})", type=fraction)
    test_fraction: float = param(0.1, "share of samples held out for the test MAPE (default {default})", type=fraction)
    seed: int = 0


def compute_model_config(**kw) -> ModelConfig:
    return ModelConfig(**kw)


def comm_model_config(**kw) -> ModelConfig:
    base = dict(hidden=64, embed=32, head_hidden=64, epochs=400, batch_size=32)
    base.update(kw)
    return ModelConfig(**base)


@dataclass
class SearchConfig(Config):
    """The online search (NeuroShard's; the ``param`` fields are the ``--alg neuroshard`` scripts'
    search flags, which override a bundle's stored search settings only when given)."""

    k: int = param(3, "beam width of the column-wise search (default {default})", type=positive_int,
                   cli_default=None)
    n: int = param(10, "split candidates per step: the n largest and n most costly tables (default {default})",
                   type=positive_int, cli_default=None)
    max_length: int = param(10, "most column-wise steps, 0 = table-wise only (default {default})",
                            flags=("--max-length", "--max_length"), type=nonnegative_int, cli_default=None)
    search_steps: int = param(11, "dim-sum caps tried by the table-wise search (default {default})",
                              flags=("--search-steps", "--search_steps"), type=positive_int, cli_default=None)
    # ^ caps tried evenly from cap_start to cap_end
    cap_start: float = param(1.0, "smallest dim-sum cap, x the mean dim sum per device (default {default})",
                             type=positive_float, cli_default=None)
    # ^ dim-sum cap = scale x the mean dim sum per device
    cap_end: float = param(1.5, "largest dim-sum cap (default {default})", type=positive_float, cli_default=None)
    min_dim: int = MIN_DIM     # a column shard's dim stays a multiple of this
    column_wise: bool = param(True, "table-wise search only: never split a table", flags=("--no-column-wise",),
                              action="store_false", cli_default=None)
