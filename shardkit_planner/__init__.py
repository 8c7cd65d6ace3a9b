"""shardkit's own planner (``--alg shardkit``): the whole plan space (table-, column-, row-wise and
data-parallel), a cost model fitted on an oracle of this machine (or the emulated card's own model),
local search from the best of the greedy / TorchRec / given plans, and optionally the oracle itself:
measurements that correct the model for the task and choose the plan.

Modules: :mod:`.costmodel` (per-device plan costs), :mod:`.search` (the moves and the local search),
:mod:`.refine` (measured refinement),
:mod:`.sharder` (the ``--alg`` entry point, ``load_sharder``, declared in the top-level
``shardkit_methods.PLANNER_PLUGINS``). This package imports only :mod:`shardcore`, never another method
package.
"""
