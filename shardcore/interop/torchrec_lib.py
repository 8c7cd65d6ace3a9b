"""TorchRec, imported lazily: the one place that says how to install it when it is missing, and the
weights' precision as TorchRec's data type. The plan files (:mod:`shardcore.interop.plan_export`) and the
TorchRec planners declared at the top level import TorchRec through it."""

from __future__ import annotations

from shardcore.errors import ShardError

INSTALL_HINT = (
    "TorchRec is not installed: run `pip install -e .[torchrec]` (on a CPU-only machine "
    "`pip install -e .[cpu,torchrec]`), then `pip install --no-deps torchrec==1.8.0` (--no-deps because "
    "torchrec's own requirements name the CUDA fbgemm-gpu package, which breaks fbgemm-gpu-cpu; the "
    "extra installs what it really needs: tensordict==0.15.3 and pyre-extensions==0.0.32)")


def require_torchrec():
    """Import what a TorchRec planner needs, or raise :class:`ShardError` with the install recipe."""
    try:
        import torchrec  # noqa: F401
        from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder  # noqa: F401
        from torchrec.distributed.planner import EmbeddingShardingPlanner  # noqa: F401
    except Exception as exc:  # ImportError, OSError, or a RuntimeError of an FBGEMM build lacking an operator
        text = str(exc).strip()
        detail = text.splitlines()[0] if text else type(exc).__name__
        raise ShardError(f"{INSTALL_HINT} [import failed: {detail}]") from None
    import torchrec as _tr

    return _tr


def torchrec_available() -> bool:
    try:
        require_torchrec()
    except ShardError:
        return False
    return True


def data_type(precision: str):
    """TorchRec's ``DataType`` of the weights' precision."""
    from torchrec.modules.embedding_configs import DataType

    try:
        return {"fp16": DataType.FP16, "fp32": DataType.FP32}[precision]
    except KeyError:
        raise ShardError(f"unknown weights precision {precision!r}: choose fp16 or fp32") from None
