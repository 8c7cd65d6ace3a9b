"""The method packages of this repository, in the papers' column order.

The core (:mod:`shardcore.registry`) and the experiment runner read this list; each package declares
itself in its ``method`` module. ``SHARDKIT_METHODS=pkg1,pkg2`` in the environment replaces it.
"""

METHOD_PACKAGES = ("autoshard", "dreamshard", "neuroshard")
