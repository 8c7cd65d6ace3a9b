"""NeuroShard (MLSys 2023): pre-trained neural cost models plus an online search.

Modules: ``config`` (every default), ``collect`` (random shards and all-to-alls measured on the
hardware oracle, written as CSV), ``models`` (the compute, forward- and backward-communication
cost models, their training and checkpoints), ``simulator`` (a plan's cost from the three models),
``search`` (table-wise greedy grid search and column-wise beam search), ``sharder``
(:class:`NeuroShardSharder` and ``load_sharder`` for ``--alg neuroshard``), ``cli`` (shared flags).
"""
