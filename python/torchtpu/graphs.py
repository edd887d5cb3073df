"""Graph capture and replay, shaped like ``torch.cuda.CUDAGraph`` and ``torch.cuda.graph``.

Everything a region records on the current tpu device (in Fused Eager, whatever the
mode outside) becomes one program. ``replay()`` launches that program again on the
current values of the tensors it read and writes its results into the tensors it
wrote, without running the region's Python, its autograd graph or its dispatch: a
training step's host work becomes one launch. The contract is CUDA graphs':

- tensors the region reads and writes are static: feed new data by ``copy_`` into the
  tensors the region read (the graph keeps them alive), read results from the tensors
  it wrote (those that are still alive when it replays);
- Python scalars and CPU tensors are those of the capture: optimizers need
  ``capturable=True`` (their step counts and bias corrections stay on the device;
  stepping one without it during a capture raises), and a learning rate that changes
  must be a tensor;
- random numbers are drawn anew on each replay, from the default generator;
- the region must not read values on the host (``.item()``, printing) or run ops on
  the CPU, and compiles happen in warm-up steps before the capture.
"""

from __future__ import annotations

import threading
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from . import _C
from ._modes import thread_mode

__all__ = ["TPUGraph", "graph", "is_current_stream_capturing"]

_hook_lock = threading.Lock()
_hook = None


def is_current_stream_capturing() -> bool:
    """Whether this thread is capturing a :class:`TPUGraph`."""
    return bool(_C.region_capturing())


def _optimizer_guard(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    if not _C.region_capturing():
        return
    if not all(group.get("capturable", False) for group in optimizer.param_groups):
        raise RuntimeError(
            f"[tpu] {type(optimizer).__name__}.step() during a torch.tpu.graph capture needs "
            "capturable=True in every param group: without it the step count and bias "
            "corrections are host values, which a replay would repeat from the capture"
        )


def _install_optimizer_guard() -> None:
    global _hook
    with _hook_lock:
        if _hook is None:
            _hook = register_optimizer_step_pre_hook(_optimizer_guard)


class TPUGraph:
    """A captured region of tpu work (see the module's docstring)."""

    def __init__(self) -> None:
        self._handle = 0
        self._mode: thread_mode | None = None

    def capture_begin(self) -> None:
        if self._handle:
            raise RuntimeError("[tpu] this TPUGraph already holds a capture; reset() it first")
        _install_optimizer_guard()
        self._mode = thread_mode("fused")
        self._mode.__enter__()
        try:
            _C.region_begin()
        except BaseException:
            self._leave()
            raise

    def capture_end(self) -> None:
        try:
            self._handle = _C.region_end()
        finally:
            self._leave()

    def _abort(self) -> None:
        try:
            _C.region_abort()
        finally:
            self._leave()

    def _leave(self) -> None:
        mode, self._mode = self._mode, None
        if mode is not None:
            mode.__exit__(None, None, None)

    def replay(self) -> None:
        """Runs the captured program again (asynchronously, like any tpu work)."""
        if not self._handle:
            raise RuntimeError("[tpu] TPUGraph.replay(): nothing was captured")
        _C.region_replay(self._handle)

    def reset(self) -> None:
        """Frees the captured program and the tensors it kept alive."""
        if self._handle:
            _C.region_release(self._handle)
            self._handle = 0

    def __del__(self) -> None:
        release = getattr(_C, "region_release", None)  # gone at interpreter exit
        if self._handle and release is not None:
            release(self._handle)


class graph:
    """``with torch.tpu.graph(g):`` captures the block into ``g`` (its work runs once,
    as recorded). An exception inside the block ends the capture without capturing."""

    def __init__(self, tpu_graph: TPUGraph, pool: Any = None, stream: Any = None) -> None:
        # pool and stream are accepted for torch.cuda.graph's signature: tpu work has
        # one stream and no memory pools.
        self.tpu_graph = tpu_graph

    def __enter__(self) -> None:
        self.tpu_graph.capture_begin()

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if exc_type is not None:
            self.tpu_graph._abort()
        else:
            self.tpu_graph.capture_end()
