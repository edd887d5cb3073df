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
  must be a tpu tensor (a replay raises when a setting the capture froze changed);
- random numbers are drawn anew on each replay, from the default generator;
- the region must not read values on the host (``.item()``, printing) or run ops on
  the CPU, and compiles happen in warm-up steps before the capture.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.utils._pytree import tree_flatten, tree_unflatten

from . import _C
from ._modes import thread_mode

__all__ = ["TPUGraph", "graph", "graph_pool_handle", "graphed", "is_current_stream_capturing"]

_hook_lock = threading.Lock()
_hook = None
_capturing = threading.local()  # .graph: the TPUGraph this thread captures into


def is_current_stream_capturing() -> bool:
    """Whether this thread is capturing a :class:`TPUGraph`."""
    return bool(_C.region_capturing())


def graph_pool_handle() -> None:
    """torch.cuda.graph_pool_handle's counterpart: tpu graphs have no memory pools, so
    there is nothing to share (``torch.tpu.graph(g, pool=...)`` ignores it)."""
    return


def _host_hyperparameters(optimizer: torch.optim.Optimizer) -> list[dict]:
    """Per param group, the settings a step reads on the host (numbers, tuples of
    them, CPU tensors' values): a capture freezes them."""

    def host_value(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return v.tolist() if v.device.type == "cpu" else None
        if isinstance(v, (bool, int, float)):
            return v
        if isinstance(v, tuple) and all(isinstance(e, (bool, int, float)) for e in v):
            return v
        return None

    out = []
    for group in optimizer.param_groups:
        values = {k: host_value(v) for k, v in group.items() if k != "params"}
        out.append({k: v for k, v in values.items() if v is not None})
    return out


def _optimizer_guard(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    g = getattr(_capturing, "graph", None)  # set exactly while this thread captures
    if g is None:
        return
    if not all(group.get("capturable", False) for group in optimizer.param_groups):
        raise RuntimeError(
            f"[tpu] {type(optimizer).__name__}.step() during a torch.tpu.graph capture needs "
            "capturable=True in every param group: without it the step count and bias "
            "corrections are host values, which a replay would repeat from the capture"
        )
    # Once per optimizer: a capture of several steps checks its settings once per replay.
    if all(o is not optimizer for o, _ in g._optimizers):
        g._optimizers.append((optimizer, _host_hyperparameters(optimizer)))


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
        # Optimizers stepped in the capture, with the host settings it froze: a
        # replay after a learning-rate scheduler changed one raises instead of
        # silently using the old value.
        self._optimizers: list = []

    def capture_begin(self) -> None:
        if self._handle:
            raise RuntimeError("[tpu] this TPUGraph already holds a capture; reset() it first")
        _install_optimizer_guard()
        self._optimizers = []
        self._mode = thread_mode("fused")
        self._mode.__enter__()
        try:
            _C.region_begin()
        except BaseException:
            self._leave()
            raise
        _capturing.graph = self

    def capture_end(self) -> None:
        self._end([])

    def _end(self, outs: list[torch.Tensor]) -> None:
        try:
            self._handle = torch.ops.torchtpu._region_end(outs)
        finally:
            self._leave()

    def _abort(self) -> None:
        try:
            _C.region_abort()
        finally:
            self._leave()

    def _leave(self) -> None:
        _capturing.graph = None
        mode, self._mode = self._mode, None
        if mode is not None:
            mode.__exit__(None, None, None)

    def pool(self) -> None:
        """No memory pool to share (see graph_pool_handle)."""
        return

    def replay(self) -> None:
        """Runs the captured program again (asynchronously, like any tpu work)."""
        self._replay()

    def _replay(self) -> list[torch.Tensor]:
        if not self._handle:
            raise RuntimeError("[tpu] TPUGraph.replay(): nothing was captured")
        for optimizer, frozen in self._optimizers:
            now = _host_hyperparameters(optimizer)
            # Only what the captured step could read: a setting added later (a
            # scheduler's initial_lr) was never frozen.
            changed = sorted({k for a, b in zip(now, frozen) for k in b if a.get(k) != b[k]})
            if changed or len(now) != len(frozen):
                raise RuntimeError(
                    f"[tpu] TPUGraph.replay(): {type(optimizer).__name__}'s {', '.join(changed) or 'param groups'} "
                    "changed since the capture, which froze the host values; keep a changing "
                    "setting in a tpu tensor (e.g. lr=torch.tensor(1e-3, device='tpu')) or capture again"
                )
        out = torch.ops.torchtpu._region_replay(self._handle)
        for optimizer, _ in self._optimizers:
            # What a call of step() marks for learning-rate schedulers (it checks the
            # order of optimizer and scheduler steps): a replay is that step.
            optimizer._opt_called = True
        return out

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

    def __init__(
        self,
        tpu_graph: TPUGraph,
        pool: Any = None,
        stream: Any = None,
        capture_error_mode: str = "global",
    ) -> None:
        # Accepted for torch.cuda.graph's signature: tpu work has one stream and no
        # memory pools, and any capture of another thread's work on the device is refused.
        self.tpu_graph = tpu_graph

    def __enter__(self) -> None:
        self.tpu_graph.capture_begin()

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if exc_type is not None:
            self.tpu_graph._abort()
        else:
            self.tpu_graph.capture_end()


class _Captured:
    """One argument signature of a graphed function: its calls so far, then its graph."""

    def __init__(self) -> None:
        self.calls = 0
        self.graph: TPUGraph | None = None
        self.static: list = []  # the flat arguments the capture ran on
        self.out_spec: Any = None
        self.out_leaves: list = []  # per output leaf: an index into the replay's tensors, or the value


def _signature(leaves: list) -> tuple:
    key = []
    for a in leaves:
        if isinstance(a, torch.Tensor):
            if a.device.type != "tpu":
                raise TypeError(
                    f"[tpu] torchtpu.graphed: tensor arguments must be on tpu (got {a.device}); "
                    "move the batch first"
                )
            key.append((tuple(a.shape), a.dtype, a.device.index))
        else:
            key.append(("value", a))  # frozen into the capture, so part of the key
    return tuple(key)


class graphed:
    """``torchtpu.graphed(fn)`` (or ``@torchtpu.graphed(warmup=2)``): a function whose
    tpu work runs as one captured program. Per signature of its arguments (tensor
    shapes, dtypes and devices; other arguments by value), the first ``warmup`` calls
    run ``fn`` as written, the next one captures it (a :class:`TPUGraph` over copies of
    the arguments) and every later call copies its tensors in and replays, returning new
    tensors, without running ``fn``'s Python: a jitted training step, as torchax's
    ``make_train_step`` or ``jax.jit``. The graph contract holds (module docstring):
    Python side effects and host values are those of the capture, optimizers must be
    ``capturable``, outputs carry no autograd history."""

    def __init__(self, fn: Callable | None = None, *, warmup: int = 2) -> None:
        self.fn = fn
        self.warmup = warmup
        self._by_signature: dict = {}
        if fn is not None:
            functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.fn is None:  # @graphed(warmup=...) decorating
            (fn,) = args
            return graphed(fn, warmup=self.warmup)
        leaves, spec = tree_flatten((args, kwargs))
        c = self._by_signature.setdefault((spec, _signature(leaves)), _Captured())
        if c.graph is not None:
            for s, a in zip(c.static, leaves):
                if isinstance(a, torch.Tensor) and a is not s:
                    s.copy_(a)
            tensors = c.graph._replay()
            return tree_unflatten([tensors[i] if t else v for t, i, v in c.out_leaves], c.out_spec)
        c.calls += 1
        if c.calls <= self.warmup:
            return self.fn(*args, **kwargs)
        static = [a.detach().clone() if isinstance(a, torch.Tensor) else a for a in leaves]
        s_args, s_kwargs = tree_unflatten(static, spec)
        g = TPUGraph()
        g.capture_begin()
        try:
            out = self.fn(*s_args, **s_kwargs)
        except BaseException:
            g._abort()
            raise
        out_leaves, c.out_spec = tree_flatten(out)
        tensors = [o for o in out_leaves if isinstance(o, torch.Tensor)]
        g._end(tensors)
        n = 0
        for o in out_leaves:
            is_tensor = isinstance(o, torch.Tensor)
            c.out_leaves.append((is_tensor, n, None if is_tensor else o))
            n += is_tensor
        c.graph, c.static = g, static
        return out
