"""The planners of this repository the core does not hold, in the papers' column order.

The core (:mod:`shardcore.registry`) and the experiment runner read these lists; each method package
declares itself in its ``method`` module. ``SHARDKIT_METHODS=pkg1,pkg2`` in the environment replaces
``METHOD_PACKAGES``.
"""

METHOD_PACKAGES = ("autoshard", "dreamshard", "neuroshard")

# Planners not trained by a script of their own: ``--alg name`` -> its factory ("module:function", called as
# ``f(ctx, config, checkpoint, planners)``), its settings ("module:Class" of a shardcore.config.Config, whose
# fields are its flags; or the name of the planner whose settings it shares) and whether the reports count
# it among the baselines.
PLANNERS = {
    # TorchRec's planner, every sharding type it has and table-wise only (needs TorchRec; shardkit_torchrec/)
    "torchrec": {"factory": "shardkit_torchrec.torchrec_planner:make_sharder",
                 "config": "shardkit_torchrec.config:TorchRecConfig", "baseline": True},
    "torchrec-tw": {"factory": "shardkit_torchrec.torchrec_planner:make_sharder_tw", "config": "torchrec",
                    "baseline": True},
    # shardkit restricted to table-wise placement: the learned methods' reference
    "shardkit-tw": {"factory": "shardkit_planner.sharder:make_sharder_tw", "config": "shardkit"},
    "shardkit": {"factory": "shardkit_planner.sharder:make_sharder", "config": "shardkit_planner.config:ShardkitConfig"},
    # TorchRec's planner priced by the emulated H200 (needs TorchRec)
    "torchrec-emu": {"factory": "shardkit_torchrec.sharder:make_sharder", "config": "torchrec"},
}
