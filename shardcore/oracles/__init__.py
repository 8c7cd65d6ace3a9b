"""The cost oracles' wing: what a plan costs. ``factory`` builds the one ``--oracle`` names,
``setting`` names what a cost depends on, ``cache`` is the measurement cache as a layer around an
oracle, ``commmodel`` prices the exchanges; ``emulated/`` and ``measured/`` are the two oracles.
The contract they implement lives in the core (:mod:`shardcore.types`)."""
