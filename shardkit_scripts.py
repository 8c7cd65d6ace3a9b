"""The console commands (setup.py's entry points): ``shardkit-<script>`` runs a user-facing script's
``main`` exactly as ``python <script>.py`` does (its one-line errors and exit codes included), e.g.
``shardkit-eval --alg size_greedy ...`` = ``python eval.py --alg size_greedy ...`` and
``shardkit-run-experiments`` = ``python tools/run_experiments.py``.

This module imports nothing beyond the standard library until a command runs (setup.py reads
:func:`console_scripts` from it).
"""

from __future__ import annotations

import importlib

# the script modules with a console command: the top-level scripts, then the user-facing tools
SCRIPTS = ("eval", "eval_simulator", "plan",
           "train_autoshard", "train_dreamshard", "train_neuroshard", "train_compute_cost_model",
           "train_comm_cost_model", "collect_compute_cost_data", "collect_comm_cost_data", "run_autoshard",
           "tools.run_experiments", "tools.gen_dlrm_data", "tools.gen_tasks", "tools.bench_planning",
           "tools.train_anchors", "tools.gpu_check", "tools.fit_shardkit_model", "tools.calibrate")


def command(module: str) -> str:
    """``tools.run_experiments`` -> ``shardkit-run-experiments``."""
    return "shardkit-" + module.rsplit(".", 1)[-1].replace("_", "-")


def function(module: str) -> str:
    """The name of this module's function that runs ``module`` (the entry point's target)."""
    return module.rsplit(".", 1)[-1] + "_cli"


def run(module: str) -> None:
    """Run ``module``'s ``main`` on the command line's arguments (:func:`shardcore.cli.common.run_main`)."""
    from shardcore.cli.common import run_main

    run_main(importlib.import_module(module).main)


def _runner(module: str):
    def entry() -> None:
        run(module)

    entry.__name__ = entry.__qualname__ = function(module)
    entry.__doc__ = f"``{command(module)}``: ``{module}``'s main."
    return entry


for _module in SCRIPTS:
    globals()[function(_module)] = _runner(_module)


def console_scripts() -> list[str]:
    """setup.py's ``console_scripts`` entry points."""
    return [f"{command(m)} = shardkit_scripts:{function(m)}" for m in SCRIPTS]
