"""``torch.compile(backend="tpu")``: Dynamo graphs run through the eager lowering rules.

aot_autograd turns each Dynamo graph into ATen forward and backward graphs. Each graph
runs on tpu tensors in Fused Eager with a cut before and after it, so its ops are
recorded through the same lowering rules as eager and become one program, found in the
shared compile cache (structural key: no StableHLO is built on a hit).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from . import _C
from ._modes import eager_mode

_DECOMPOSITIONS: dict | None = None


def _decompositions() -> dict:
    """Core ATen decompositions, except for ops that have a native rule (hot ops keep
    their one-program lowering, and RNG ops keep eager's random streams)."""
    global _DECOMPOSITIONS
    if _DECOMPOSITIONS is None:
        from torch._decomp import core_aten_decompositions

        lowered = set(_C.lowered_ops())
        table = {}
        for op, fn in core_aten_decompositions().items():
            name = op.name() if hasattr(op, "name") else str(op)
            short = name.removeprefix("aten::")
            base = short.split(".")[0]
            overload = short if "." in short else base
            if overload in lowered or (overload.endswith(".default") and base in lowered):
                continue
            table[op] = fn
        _DECOMPOSITIONS = table
    return _DECOMPOSITIONS


def _run_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable:
    """One ATen graph -> a boxed callable that runs it as one tpu program."""
    _C.count_compiled_graph()

    def run(args: list) -> Any:
        _C.flush_reason("compiled_graph")
        with eager_mode("fused"):
            out = gm(*args)
            _C.flush_reason("compiled_graph")
        args.clear()  # boxed convention: the callee owns (and frees) the arguments
        return out

    run._boxed_call = True  # type: ignore[attr-defined]
    return run


def tpu_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **kwargs: Any):
    """The ``"tpu"`` Dynamo backend (also registered as ``"torchtpu"``)."""
    from torch._dynamo.backends.common import aot_autograd

    options = kwargs.get("options") or {}
    if options:
        # Bounded dynamism (padding dynamic sizes to buckets) is not built yet.
        raise ValueError(
            f"torch.compile(backend='tpu') does not support options {sorted(options)} yet"
        )
    backend = aot_autograd(
        fw_compiler=_run_graph,
        bw_compiler=_run_graph,
        decompositions=_decompositions(),
        keep_inference_input_mutations=True,
    )
    return backend(gm, example_inputs)
