"""The method packages of this repository, in the papers' column order.

The core (:mod:`shardcore.registry`) and the experiment runner read this list; each package declares
itself in its ``method`` module. ``SHARDKIT_METHODS=pkg1,pkg2`` in the environment replaces it.
"""

METHOD_PACKAGES = ("autoshard", "dreamshard", "neuroshard")

# Planners that are not trained by a script of their own: ``--alg name`` -> "module[:function]",
# the function (default ``load_sharder``) called as ``f(None, seed=..., **kwargs)``.
PLANNER_PLUGINS = {# shardkit restricted to table-wise placement: the learned methods' reference
                   "shardkit-tw": "shardkit_planner.sharder:load_sharder_tw",
                   "shardkit": "shardkit_planner.sharder",
                   # TorchRec's planner priced by the emulated H200 (needs TorchRec; shardkit_torchrec/)
                   "torchrec-emu": "shardkit_torchrec.sharder"}
