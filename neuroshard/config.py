"""Every NeuroShard default in one place: file locations, data collection, the three cost models,
their training, and the search.

Defaults are sized for the CPU oracle of this project (fbgemm-gpu-cpu, batch 4096): a shard's
compute there costs tens to hundreds of milliseconds, so the start delays that mimic imbalanced
compute in the communication data (``sleep_range``) span 0..300 ms rather than the original GPU
setting's 1..20 ms. ``collect_comm_cost_data.py --sleep_range 1,20`` restores the latter.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

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
class ModelConfig:
    """Architecture and training of one cost model."""

    hidden: int = 128          # width of the per-table (compute) / per-device (comm) MLP
    embed: int = 64            # representation summed over a shard (compute) / pooled over devices (comm)
    head_hidden: int = 128     # width of the head MLP
    pooling: str = "additive"  # compute model: "additive" (sum of per-table costs x a learned shard-level
                               # correction), "lse" or "sum" (see neuroshard.models.ComputeCostNet)
    epochs: int = 300
    batch_size: int = 64
    lr: float = 2e-3
    weight_decay: float = 1e-5
    lr_decay: float = 0.99     # learning rate multiplied by this after every epoch
    val_fraction: float = 0.1
    test_fraction: float = 0.1
    seed: int = 0

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, obj: dict) -> "ModelConfig":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in obj.items() if k in names})


def compute_model_config(**kw) -> ModelConfig:
    return ModelConfig(**kw)


def comm_model_config(**kw) -> ModelConfig:
    base = dict(hidden=64, embed=32, head_hidden=64, epochs=400, batch_size=32)
    base.update(kw)
    return ModelConfig(**base)


@dataclass
class SearchConfig:
    """The online search (SPEC §4, NeuroShard)."""

    k: int = 3                 # beam width of the column-wise search
    n: int = 10                # per step, split candidates: the n largest and the n most costly tables
    max_length: int = 10       # at most this many column-wise steps (halvings)
    search_steps: int = 11     # caps tried by the table-wise search, evenly from cap_start to cap_end
    cap_start: float = 1.0     # dim-sum cap = scale x the mean dim sum per device
    cap_end: float = 1.5
    min_dim: int = MIN_DIM     # a column shard's dim stays a multiple of this
    column_wise: bool = True   # False: table-wise search only (no splits)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, obj: dict) -> "SearchConfig":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in obj.items() if k in names})
