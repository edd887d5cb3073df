"""Counters of the native runtime."""

from __future__ import annotations

from . import _C


def metrics() -> dict:
    """Counters: ops dispatched, executions, compiles, cache hits, CPU fallbacks (and which
    ops), host syncs, bytes moved each way, compile seconds."""
    return _C.metrics()


def reset_metrics() -> None:
    _C.reset_metrics()


def metrics_report() -> str:
    """Prints and returns a human-readable metrics table."""
    m = metrics()
    fallback_ops = m.pop("fallback_ops")
    lines = [f"{k:>18}: {v}" for k, v in m.items()]
    for name, count in sorted(fallback_ops.items()):
        lines.append(f"{'fallback':>18}: aten::{name} x{count}")
    report = "\n".join(lines)
    print(report)
    return report
