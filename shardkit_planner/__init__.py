"""shardkit's own planner (``--alg shardkit``): the whole plan space (table-, column-, row-wise and
data-parallel), a cost model fitted on an oracle of this machine (or the emulated card's own model),
local search from the best of the greedy / TorchRec / given plans, and optionally the oracle itself:
measurements that correct the model for the task and choose the plan.

Modules: :mod:`.starts` (the plans the search begins from), :mod:`.costmodel` (per-device plan costs),
:mod:`.moves` (the moves, one class per kind, in two neighbourhoods), :mod:`.search` (the local and
iterated search, its work-counted budget), :mod:`.refine` (measured refinement), :mod:`.calibrate` (a
cost model of this machine fitted on measurements it takes), :mod:`.config` (its settings, the
``--shardkit-*`` flags), :mod:`.sharder` (the stages put together: the ``--alg`` factory, ``make_sharder``,
declared in the top-level ``shardkit_methods.PLANNERS``), :mod:`.bound` (a lower bound). This package imports only :mod:`shardcore`, never another method
package.
"""
