#!/usr/bin/env python3
"""AutoShard's original command, ``python run_autoshard.py``: train_autoshard.py with AutoShard's
device semantics and defaults (see ``python train_autoshard.py --help`` for every flag).

In AutoShard's run_autoshard.py a plan had ``--ndevices`` devices (default 8) and ``--gpu-devices``
(default 0,..,7) named the GPUs its actors measured on. Here likewise:

  python run_autoshard.py --ndevices 8 --gpu-devices 0,1,2,3 --max-memory 7   # 8 devices measured on GPUs 0-3
  python run_autoshard.py --ndevices 4 --max-memory 5                          # 4 devices (logical on a CPU)

``--gpu-devices`` without ``--ndevices`` is refused (it would mean a different device count than in
AutoShard); with neither, plans have 8 devices as AutoShard's default. ``--max-memory`` defaults to
AutoShard's 7 GB. Everything else, outputs included, is train_autoshard.py's: the checkpoint goes to
<savedir>/<xpid>/model.pt (models/autoshard/default/ unless --savedir/--xpid say otherwise).
"""

import sys


import train_autoshard
from shardcore.cli.common import run_main
from shardcore.errors import ShardError

AUTOSHARD_NDEVICES = 8
AUTOSHARD_MAX_MEMORY = "7"


def _given(argv, *names) -> bool:
    return any(a == n or a.startswith(n + "=") for a in argv for n in names)


def autoshard_argv(argv) -> list:
    """train_autoshard.py's arguments for AutoShard's command line ``argv``."""
    argv = list(argv)
    if _given(argv, "-h", "--help"):
        return argv
    gpus = _given(argv, "--gpu-devices", "--gpu_devices")
    ndev = _given(argv, "--ndevices")
    if gpus and not ndev:
        raise ShardError("run_autoshard.py follows AutoShard: --gpu-devices names the GPUs the plans are measured "
                         f"on and a plan has --ndevices devices (AutoShard's default {AUTOSHARD_NDEVICES}): give "
                         "--ndevices N as well, or use train_autoshard.py --gpu-devices IDS (one device per GPU)")
    extra = []
    if not gpus and not ndev:
        extra += ["--ndevices", str(AUTOSHARD_NDEVICES)]
    if not _given(argv, "--max-memory", "--max_mem"):
        extra += ["--max-memory", AUTOSHARD_MAX_MEMORY]
    return extra + argv


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if _given(argv, "-h", "--help"):
        print(__doc__)
    return train_autoshard.main(autoshard_argv(argv))


if __name__ == "__main__":
    run_main(main)
