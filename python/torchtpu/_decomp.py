"""Ops without a lowering rule run through PyTorch's decompositions (``torch._decomp``).

An op with a backend kernel (CPU, CUDA) but no tpu rule would otherwise raise (or, with
TORCHTPU_CPU_FALLBACK=1, round-trip through the host). When ``torch._decomp`` has a
decomposition for it, the decomposition is registered as the op's tpu kernel: it calls
ops that do have rules, so the values stay on the device (and inside Fused Eager
graphs). Every call is counted in ``metrics()["decomposed"]``; hot ops still get a
native rule, which takes precedence because only rule-less ops are registered here.
"""

from __future__ import annotations

import threading
from collections import Counter

import torch
from torch.utils._pytree import tree_map

from . import _C

_COUNTS: Counter[str] = Counter()
_LIB: torch.library.Library | None = None
_decomposed: set[str] = set()
# Ops whose decomposition reached the op itself again (prims-based references whose
# prim runs the same ATen op, e.g. gcd.out): they behave as ops without a lowering.
_circular: set[str] = set()
_active = threading.local()


class _Circular(NotImplementedError):
    pass


def _needs_decomposition(op: torch._ops.OpOverload) -> bool:
    name = op.name()
    if not name.startswith("aten::") or _C.has_lowering(name):
        return False
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    # Composite kernels already reach tpu as other ops, and explicit tpu kernels
    # (views, copies, empty) must stay; only ops that would hit the fallback qualify.
    return not any(
        has(name, key)
        for key in (
            "CompositeImplicitAutograd",
            "CompositeExplicitAutograd",
            "CompositeExplicitAutogradNonFunctional",
            "PrivateUse1",
        )
    )


def _describe(short: str, args, kwargs) -> str:
    def show(x):
        if isinstance(x, torch.Tensor):
            return f"{str(x.dtype).removeprefix('torch.')}{list(x.shape)}"
        return repr(x)

    shown = [show(a) for a in args] + [f"{k}={show(v)}" for k, v in kwargs.items()]
    return f"aten::{short}({', '.join(shown)})"


def _on_cpu(op: torch._ops.OpOverload, short: str, args, kwargs):
    """Runs the op on the CPU and writes mutated arguments back (TORCHTPU_CPU_FALLBACK=1)."""
    _C.count_fallback(short)

    def to_cpu(x):
        return x.cpu() if isinstance(x, torch.Tensor) and x.device.type == "tpu" else x

    cargs, ckwargs = tree_map(to_cpu, (args, kwargs))
    out = op(*cargs, **ckwargs)
    written = {}
    for i, a in enumerate(op._schema.arguments):
        if a.alias_info is None or not a.alias_info.is_write:
            continue
        orig, new = (args[i], cargs[i]) if i < len(args) else (kwargs[a.name], ckwargs[a.name])
        if orig.shape != new.shape:
            orig.resize_(new.shape)
        orig.copy_(new)
        written[id(new)] = orig

    device = next(
        x.device
        for x in (*args, *kwargs.values())
        if isinstance(x, torch.Tensor) and x.device.type == "tpu"
    )

    def back(x):
        if not isinstance(x, torch.Tensor):
            return x
        return written[id(x)] if id(x) in written else x.to(device)

    return tree_map(back, out)


def _kernel(op: torch._ops.OpOverload, short: str, fn):
    def run(*args, **kwargs):
        active = _active.__dict__.setdefault("ops", set())
        if short in _circular or short in active:
            _circular.add(short)
            if short in active:  # unwinds to the outermost call of this op
                raise _Circular(short)
            return _no_lowering(op, short, args, kwargs)
        active.add(short)
        try:
            _COUNTS[short] += 1
            return fn(*args, **kwargs)
        except _Circular as e:
            if str(e) != short:
                raise
            _COUNTS[short] -= 1
            return _no_lowering(op, short, args, kwargs)
        finally:
            active.discard(short)

    return run


def _no_lowering(op, short: str, args, kwargs):
    if _C.cpu_fallback_enabled():
        return _on_cpu(op, short, args, kwargs)
    raise NotImplementedError(
        f"[tpu] {_describe(short, args, kwargs)} has no tpu lowering (its decomposition "
        "runs the op itself). Set TORCHTPU_CPU_FALLBACK=1 to run unsupported ops on the "
        "CPU (slow), or report the op."
    ) from None


def decomposed_ops() -> list[str]:
    """ATen ops (``name.overload``) whose tpu kernel is a PyTorch decomposition."""
    return sorted(_decomposed - _circular)


def install() -> None:
    global _LIB
    if _LIB is not None:
        return
    from torch._decomp import decomposition_table

    _LIB = torch.library.Library("aten", "IMPL")
    for op, fn in decomposition_table.items():
        if not isinstance(op, torch._ops.OpOverload) or not _needs_decomposition(op):
            continue
        short = op.name().removeprefix("aten::")
        _LIB.impl(short, _kernel(op, short, fn), "PrivateUse1")
        _decomposed.add(short)


def counts() -> dict[str, int]:
    return {k: v for k, v in _COUNTS.items() if v}


def reset() -> None:
    _COUNTS.clear()
