"""Plans as files: this project's plan JSON and TorchRec's ``ShardingPlan`` form (``plan_export``, TorchRec
imported lazily through ``torchrec_lib``), and what a plan needs per device (``memory``). TorchRec's planner
and estimators, run as planners, are declared at the top level (``shardkit_methods.PLANNERS``)."""
