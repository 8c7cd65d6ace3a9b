import os
import runpy

from setuptools import find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))
# the console commands (shardkit-eval, shardkit-plan, ...): shardkit_scripts.py lists them (stdlib only)
SCRIPTS = runpy.run_path(os.path.join(HERE, "shardkit_scripts.py"))

setup(
    name="shardkit",
    version="0.1.0",
    description="Embedding-table sharding: AutoShard, DreamShard and NeuroShard on one shared core",
    packages=find_packages(include=["shardcore", "shardcore.*", "experiments", "experiments.*",
                                    "autoshard", "autoshard.*", "dreamshard", "dreamshard.*",
                                    "neuroshard", "neuroshard.*", "shardkit_planner", "shardkit_planner.*",
                                    "shardkit_torchrec", "shardkit_torchrec.*", "tools"]),
    # the list of method packages (shardcore.registry reads it), the console commands' module and the
    # top-level scripts they run (each still runs as `python <script>.py`)
    py_modules=["shardkit_methods", "shardkit_scripts"]
    + [m for m in SCRIPTS["SCRIPTS"] if "." not in m],
    entry_points={"console_scripts": SCRIPTS["console_scripts"]()},
    python_requires=">=3.10",
    install_requires=["torch==2.13.0", "numpy", "pandas", "tqdm", "matplotlib", "highspy==1.16.0"],
    extras_require={
        "cpu": ["fbgemm-gpu-cpu==1.8.0"],
        "test": ["pytest"],
        # then: pip install --no-deps torchrec==1.8.0 (its own requirements pull the CUDA fbgemm-gpu,
        # which would replace fbgemm-gpu-cpu); these are the small pure-Python packages it needs.
        "torchrec": ["tensordict==0.15.3", "pyre-extensions==0.0.32"],
    },
)
