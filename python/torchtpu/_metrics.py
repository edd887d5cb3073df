"""Counters of the native runtime."""

from __future__ import annotations

from . import _C, _decomp


def metrics() -> dict:
    """Counters: ops dispatched, executions, compiles, cache hits, CPU fallbacks and
    decomposed calls (and which ops), host syncs, bytes moved each way, compile seconds,
    and meta kernel runs (`meta_calls`: call signatures whose output metadata was not
    known yet)."""
    m = _C.metrics()
    m["decomposed_ops"] = _decomp.counts()
    m["decomposed"] = sum(m["decomposed_ops"].values())
    return m


def reset_metrics() -> None:
    _C.reset_metrics()
    _decomp.reset()


def metrics_report() -> str:
    """Prints and returns a human-readable metrics table."""
    m = metrics()
    per_op = {kind: m.pop(f"{kind}_ops") for kind in ("fallback", "decomposed")}
    lines = [f"{k:>18}: {v}" for k, v in m.items()]
    for kind, ops in per_op.items():
        for name, count in sorted(ops.items()):
            lines.append(f"{kind:>18}: aten::{name} x{count}")
    report = "\n".join(lines)
    print(report)
    return report
