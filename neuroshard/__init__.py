"""NeuroShard (MLSys 2023): pre-trained neural cost models plus an online search.

Modules: ``config`` (every default), ``collect`` (random shards and all-to-alls measured on the
hardware oracle, written as CSV), the compute, forward- and backward-communication cost models split
by job: ``networks`` (the PyTorch networks and their input features), ``numpy_nets`` (the networks'
fast NumPy copy the search scores plans with), ``checkpoints`` (the trained models: network,
standardisation and target scale, saved and loaded), ``fitting`` (their training); ``simulator`` (a
plan's cost from the three models),
``search`` (table-wise greedy grid search and column-wise beam search), ``sharder``
(:class:`NeuroShardSharder` and the registry's factory ``make_sharder`` for ``--alg neuroshard``), ``cli``
(shared flags).
"""
