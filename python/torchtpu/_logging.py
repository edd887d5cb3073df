"""TorchTPU's Python logs, switched on like PyTorch's own.

Everything logs under the ``torchtpu`` logger (``torchtpu.compile``: why torch.compile
graphs were compiled or fell back; ``torchtpu``: eager mode switches at DEBUG and, at
exit, a summary of compiles, cache hits, host syncs and the ops that ran through a
decomposition or on the CPU). ``TORCH_LOGS=torchtpu`` shows INFO and up,
``TORCH_LOGS=+torchtpu`` DEBUG too, and ``torch._logging.set_logs(modules={"torchtpu":
logging.DEBUG})`` does the same from code. The native core does not log here: its
per-graph Fused Eager report is ``TORCHTPU_DEBUG_FUSION=1`` (stderr).
"""

from __future__ import annotations

import atexit
import logging

import torch

log = logging.getLogger("torchtpu")


def _summary() -> None:
    if not log.isEnabledFor(logging.INFO):
        return
    from . import _C
    from ._metrics import metrics

    if not _C._runtime_started():
        return
    m = metrics()
    log.info(
        "summary: %d ops, %d executions, %d compiles (%.2f s), %d cache hits, %d host syncs",
        m["ops"],
        m["executions"],
        m["compiles"],
        m["compile_seconds"],
        m["cache_hits"],
        m["host_syncs"],
    )
    for kind in ("fallback", "decomposed"):
        ops = m[f"{kind}_ops"]
        if ops:
            shown = ", ".join(f"aten::{k} x{v}" for k, v in sorted(ops.items()))
            log.info("%s ops: %s", "CPU fallback" if kind == "fallback" else kind, shown)


def install() -> None:
    # TORCH_LOGS also finds "torchtpu" as an importable module; registering the
    # name makes it a known log of torch._logging either way.
    register = getattr(getattr(torch._logging, "_internal", None), "register_log", None)
    if register is not None:
        register("torchtpu", "torchtpu")
    atexit.register(_summary)
