"""The experiment runner and the planning benchmark, outside the core.

``tools/run_experiments.py`` and ``tools/bench_planning.py`` are their command lines. Modules, by job:

- :mod:`experiments.config`: labels, task sets, scales and :class:`~experiments.config.ExperimentConfig`;
- :mod:`experiments.facts`: the machine, the software versions, the date (for ``summary.json``);
- :mod:`experiments.procs`: supervised subprocesses (logged, time-limited, stopped with their children);
- :mod:`experiments.training`: training or loading the learned methods, as their packages declare
  it in the method registry (:mod:`shardcore.registry`); no module here names a method;
- :mod:`experiments.pipeline`: tasks → training → one evaluator session per task set → outputs;
- :mod:`experiments.output`: ``measurements.csv``, ``results.md``, ``summary.json`` and the plots, all
  rendered from one :class:`shardcore.evaluation.report.SetSummary` per task set;
- :mod:`experiments.planning`: planning time and memory as tables and devices grow.

Everything here may import :mod:`shardcore`; nothing in :mod:`shardcore` imports this package.
"""
