"""shardkit's settings (``--shardkit-<field>``): a module of its own, light to import, so that every script
builds its flags without loading the planner."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from shardcore.argtypes import name_list, nonnegative_float, nonnegative_int, positive_float, positive_int
from shardcore.config import Config, param
from shardcore.planning import MEASURED, landscape_arg

MEASURED_REFINE = 4         # plan measurements per task where the oracle measures hardware (refine.py)
DEFAULT_WORK = 60_000      # work units per task (search.WorkBudget): see ShardkitConfig.work


@dataclass
class ShardkitConfig(Config):
    """shardkit's own settings, stated once: ``eval.py``, ``eval_simulator.py`` and ``plan.py`` get
    ``--shardkit-<field>`` flags from these fields (through :func:`shardcore.cli.algorithms.add_planner_args`;
    ``refine`` and ``calibrate`` only where plans are measured)."""

    flag_prefix: ClassVar[str] = "shardkit-"

    work: int = param(DEFAULT_WORK, "shardkit's search budget per task, counted in work: about one unit per candidate "
                      "move priced, more for moves that change many devices' pieces (default {default}: a few "
                      "seconds on a 2-core CPU, from 50 tables on 4 devices to 856 on 128); counted, not timed, so "
                      "the same task gives the same plan on an idle or a busy machine; measured refinement's rounds "
                      "each get it again",
                      type=positive_int, metavar="N", cli_default=None)
    time: float = param(60.0, "an outer wall-clock cap on shardkit's planning per task in seconds (default {default}): "
                        "its starts are always made; a search cut short by it is recorded (shardkit_stopped: time "
                        "cap), and only then does the plan depend on the machine's speed", type=positive_float,
                        metavar="S", cli_default=None)
    model: str | None = param(None, "shardkit's cost model file (default: models/shardkit/cpu_cost_model.json for the "
                              "measured oracle, the emulator's own for emulated:h200)", type=str, metavar="JSON")
    starts: tuple = param(("model_greedy", "hybrid_greedy", "replicate_greedy", "split_greedy", "size_lookup_greedy",
                           "lookup_greedy", "size_greedy", "dim_greedy"),
                          "comma-separated plans shardkit starts from: model_greedy, hybrid_greedy (the heaviest "
                          "tables row-wise over every device, small tables data-parallel, the rest by the model, "
                          "where those types are allowed), replicate_greedy (small tables data-parallel), "
                          "split_greedy (the tables too large for one device split by cost: every column count, "
                          "row-wise, grid), the greedy baselines, torchrec, neuroshard or other --alg names / "
                          "checkpoints (default model_greedy, hybrid_greedy, replicate_greedy, split_greedy and "
                          "the four greedy baselines)",
                          type=name_list, metavar="ALGS",
                          cli_default=None)
    types: tuple | None = param(None, "sharding types shardkit's plans may use: tw, cw, rw, dp, grid (table-wise "
                                "is always allowed; default all five for emulated:h200, grid only where there are "
                                "hosts; tw,cw,rw for the measured oracle, whose data-parallel all-reduce its exchange "
                                "model is not fitted on); honoured exactly: a start using another type is skipped, and "
                                "a task that needs one (a table larger than a device) is refused naming it",
                                type=name_list, metavar="TYPES")
    kicks: int | None = param(None, "at most N kicks of the iterated local search that follows the starts' searches "
                              "(default: as many as the work budget allows, ending after 40 in a row without a gain); "
                              "0: the starts' local optima only", type=nonnegative_int, metavar="N")
    robust: bool = param(True, "minimise the cost model's slowest device (a point estimate) instead of the default, "
                         "which plans for the machine rather than the model: the expected slowest device with each "
                         "device's compute off by a draw of the model's own cross-validated error (where the model "
                         "knows it: the emulated landscapes)", flags=("--point-estimate",), action="store_false")
    refine: int | None = param(None, "up to K plan measurements per task on the oracle (through its cache): the best "
                               "candidate by the cost model, corrected by every measurement so far, is measured and "
                               "the search runs again under the corrected model; the fastest measured plan is kept "
                               "and measured once more, afresh, for the reported cost. Default "
                               f"{MEASURED_REFINE} on the measured oracle (a fitted CPU model is off by 10-20%% per "
                               "device, as much as good plans differ), 0 on an emulated one (whose judge shardkit "
                               "must not query); 0 keeps the cost model's choice. Recorded per task: "
                               "shardkit_measurements, shardkit_measured_ms, shardkit_model_choice_ms",
                               type=nonnegative_int, metavar="K", group="measuring")
    # ^ measuring for a cost model of this machine happens once (then the cache answers)
    calibrate: float = param(300.0, "on the measured oracle without a fitted cost model "
                             "(models/shardkit/cpu_cost_model.json, --shardkit-model) and too few measurements in the "
                             "cache to fit one: seconds shardkit may spend measuring plans and shards of the tables "
                             "outside the evaluated tasks to fit it (through the cache, so once per machine and "
                             "dataset; default {default}; 0: never measure, stop with the command that does)",
                             type=nonnegative_float, metavar="S", cli_default=None, group="measuring")

    oracle: str | None = param(None, "the landscape shardkit plans for (default: the oracle that judges the plans, "
                               "else emulated:h200): emulated:h200 (the emulator's model, needs nothing else), "
                               "emulated:CARD.json (a calibrated card's model, tools/calibrate.py) or "
                               "measured (this machine's fitted model, models/shardkit/cpu_cost_model.json or "
                               "--shardkit-model)", type=landscape_arg, metavar="NAME")

    def refine_k(self, landscape: str) -> int:
        """Plan measurements per task on ``landscape``: ``refine``, or where it is None
        :data:`MEASURED_REFINE` on the measured oracle and 0 on an emulated one."""
        if self.refine is None:
            return MEASURED_REFINE if landscape == MEASURED else 0
        return int(self.refine)




CONFIG = ShardkitConfig()      # the defaults
