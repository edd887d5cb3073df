"""``torch.compile(backend="tpu")``: Dynamo graphs run through the eager lowering rules.

aot_autograd turns each Dynamo graph into ATen forward and backward graphs. Each graph
runs on tpu tensors in Fused Eager with a cut before and after it, so its ops are
recorded through the same lowering rules as eager and become one program, found in the
shared compile cache (structural key: no StableHLO is built on a hit).

With ``options={"bounded_dynamism": True}`` a graph with symbolic sizes runs at bucket
sizes (``_bucket.py``), so a varying sequence length compiles one program per bucket.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch

from . import _C
from ._modes import thread_mode

_DECOMPOSITIONS: dict | None = None
_OPTIONS = {"bounded_dynamism", "buckets"}
_log = logging.getLogger("torchtpu.compile")
_REPORT: list[dict] = []
_GRAPH_IDS = itertools.count()


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


# --------------------------------------------------------------------------- report


def _record(event: str, graph: str, reason: str, **extra: Any) -> None:
    entry = {"event": event, "graph": graph, "reason": reason, **extra}
    _REPORT.append(entry)
    level = logging.WARNING if event == "fallback" else logging.INFO
    _log.log(level, "%s %s: %s", event, graph, reason)


def compile_report(clear: bool = False) -> list[dict]:
    """What the tpu backend compiled and why, oldest first: ``recompile`` (Dynamo
    traced a frame again; ``reason`` is its guard failure), ``program`` (a graph ran
    at sizes it had not run at: a new bucket, or exact sizes and why; ``compiles`` is
    the number of XLA programs that call obtained), ``fallback`` (a graph that
    cannot run padded, naming the op) and ``no_replay`` (a graph whose program cannot
    be launched directly on later calls, and why). Also logged to the
    ``torchtpu.compile`` logger."""
    out = list(_REPORT)
    if clear:
        _REPORT.clear()
    return out


def _dynamo_recompile_reason() -> str | None:
    """Dynamo's guard failure for the frame being compiled, when it is a recompile."""
    try:
        from torch._dynamo.utils import get_metrics_context

        # Private, so read defensively: Dynamo stores the reason there for its logs.
        return get_metrics_context()._metrics.get("recompile_reason")
    except Exception:  # noqa: BLE001
        return None


def _graph_label() -> str:
    n = next(_GRAPH_IDS)
    try:
        from torch._guards import CompileContext

        cid = CompileContext.current_compile_id()
    except Exception:  # noqa: BLE001
        cid = None
    return f"graph {n}" + (f" (frame {cid})" if cid is not None else "")


# --------------------------------------------------------------------------- running


def _run_fused(gm: Callable, args: Sequence[Any], capture: bool = False) -> tuple[Any, int]:
    """Runs the graph as one Fused Eager program; with ``capture``, also returns the
    handle of its captured program (0 when it cannot be replayed). Inside a
    torch.tpu.graph capture its ops join the region's one program instead."""
    if _C.region_capturing():
        return gm(*args), 0
    _C.flush_reason("compiled_graph")
    handle = 0
    with thread_mode("fused"):
        was = _C.set_compiled_graph(True)
        try:
            if capture:
                _C.graph_capture_begin()
            out = gm(*args)
            if capture:
                handle = _capture_end(args, out)
        finally:
            _C.set_compiled_graph(was)
        _C.flush_reason("compiled_graph")
    return out, handle


_SCALARS = (int, float, bool, type(None))


def _capture_end(args: Sequence[Any], out: Any) -> int:
    """Ends a capture (which runs the graph's program); 0 when the graph takes or
    returns what a replay cannot give: host tensors, nested outputs. A graph may
    return no tensors (an optimizer step writes its arguments)."""
    ins = [a for a in args if isinstance(a, torch.Tensor)]
    outs = out if isinstance(out, (list, tuple)) else None
    ok = (
        outs is not None
        and all(a.device.type == "tpu" for a in ins)
        and all(
            (isinstance(o, torch.Tensor) and o.device.type == "tpu") or isinstance(o, _SCALARS)
            for o in outs
        )
    )
    if not ok:  # the caller's flush runs the graph
        _C.graph_capture_refuse("the graph takes a host tensor or returns other than tpu tensors")
        return 0
    return torch.ops.torchtpu._graph_capture_end(
        ins, [o for o in outs if isinstance(o, torch.Tensor)]
    )


class _Replays:
    """The captured programs of one compiled graph, per size key: a later call whose
    arguments have the layout of a captured call launches that program directly
    instead of recording the graph's ops again (TORCHTPU_GRAPH_REPLAY=0 turns this
    off). A call of a new layout captures, up to LAYOUTS layouts per key (one graph
    serves every instance of a module class, each with its parameters' layout); a key
    that cannot be captured runs the graph every time."""

    LAYOUTS = 4

    def __init__(self, label: str) -> None:
        self.label = label
        self.enabled = os.environ.get("TORCHTPU_GRAPH_REPLAY", "1") != "0"
        self.by_key: dict = {}  # key -> [(handle, output template, output type)]
        self.refused: set = set()

    def run(self, gm: Callable, args: list, key: Any) -> Any:
        captured = self.by_key.setdefault(key, [])
        if _C.region_capturing():  # recorded into the region's program, never launched
            return _run_fused(gm, args)[0]
        if captured:
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            for handle, template, kind in captured:
                ok, outs = torch.ops.torchtpu._graph_replay(handle, tensors)
                if ok:
                    return kind(outs[v] if t else v for t, v in template)
        capture = self.enabled and key not in self.refused and len(captured) < self.LAYOUTS
        out, handle = _run_fused(gm, args, capture)
        if capture and not handle:
            self.refused.add(key)
            _record("no_replay", self.label, _C.graph_capture_refusal())
        elif capture:
            n = itertools.count()
            template = [(True, next(n)) if isinstance(o, torch.Tensor) else (False, o) for o in out]
            captured.append((handle, template, type(out)))
        return out

    def __del__(self) -> None:
        # At interpreter shutdown the module may be gone first.
        release = getattr(_C, "graph_release", None)
        if release is None:
            return
        for captured in self.by_key.values():
            for handle, _, _ in captured:
                release(handle)


def _symbol_values(gm: torch.fx.GraphModule) -> Callable[[Sequence[Any]], tuple]:
    """Reads the graph's symbols (as ``name=value`` pairs) from its real inputs."""
    from ._bucket_layout import _expr, _val

    sources: dict = {}
    for i, node in enumerate(n for n in gm.graph.nodes if n.op == "placeholder"):
        v = _val(node)
        if isinstance(v, torch.SymInt) and _expr(v).is_Symbol:
            sources.setdefault(str(_expr(v)), (i, None))
        elif isinstance(v, torch.Tensor):
            for d, s in enumerate(v.shape):
                if isinstance(s, torch.SymInt) and _expr(s).is_Symbol:
                    sources.setdefault(str(_expr(s)), (i, d))

    def read(args: Sequence[Any]) -> tuple:
        return tuple(
            (s, int(args[i]) if d is None else int(args[i].shape[d]))
            for s, (i, d) in sorted(sources.items())
        )

    return read


def _sizes(values: Sequence) -> str:
    return ", ".join(f"{s}={n}" for s, n in values)


def _exact(gm: torch.fx.GraphModule, label: str, why: str) -> Callable:
    """Runs the graph at the sizes it is called with: one program per distinct size."""
    _C.count_compiled_graph()
    read = _symbol_values(gm)
    seen: set = set()
    replays = _Replays(label)

    def run(args: list) -> Any:
        key = read(args)
        first = key not in seen
        if first:
            seen.add(key)
            before = _C.metrics()["compiles"]
        out = replays.run(gm, args, key)
        if first:
            reason = f"sizes {_sizes(key)} ({why})" if key else "static sizes"
            _record("program", label, reason, compiles=_C.metrics()["compiles"] - before)
        args.clear()  # boxed convention: the callee owns (and frees) the arguments
        return out

    run._boxed_call = True  # type: ignore[attr-defined]
    return run


def _padded(plan: Any, gm: torch.fx.GraphModule, buckets: Any, label: str) -> Callable:
    """Runs the planned graph at bucket sizes (exact sizes where no bucket fits)."""
    from ._bucket_layout import Ctx

    _C.count_compiled_graph()
    seen: set = set()

    def run(args: list) -> Any:
        ns = plan.read_ns(args)
        bs, why = buckets.choose(ns)
        real = tuple(sorted((str(s), n) for s, n in ns.items()))
        key = ("bucket", tuple(sorted((str(s), b) for s, b in bs.items()))) if bs else real
        first = key not in seen
        if first:
            seen.add(key)
            before = _C.metrics()["compiles"]
        if bs is None:
            out = _run_fused(gm, args)[0]
        else:
            padded = plan.prepare(args, ns, bs)
            out = _run_fused(plan.gm, [*padded, Ctx(ns, bs, plan.device)])[0]
            out = plan.finish(out, ns, bs)
        if first:
            if bs is None:
                reason = f"exact sizes {_sizes(real)}: {why}"
            else:
                reason = "new bucket " + ", ".join(
                    f"{s}={bs[s]} for {s}={n}" for s, n in sorted(ns.items(), key=str)
                )
            _record("program", label, reason, compiles=_C.metrics()["compiles"] - before)
        args.clear()
        return out

    run._boxed_call = True  # type: ignore[attr-defined]
    return run


class _Bounded:
    """Compilers for the graphs of one Dynamo graph under bounded dynamism. The forward
    and backward graphs are planned together when aot_autograd partitions them, so
    both pad (saved activations stay padded between them) or neither does."""

    def __init__(self, label: str, buckets: list[int] | None) -> None:
        self.label = label
        self.bucket_list = buckets
        self.exact_why: str | None = None
        self.saved: dict | None = None
        self.user_layouts: list = []
        self.n_saved = 0
        self.buckets = None

    def _buckets(self, gm: torch.fx.GraphModule, syms: set) -> Any:
        from ._bucket import Buckets, shape_env_of

        if self.buckets is None:
            self.buckets = Buckets(self.bucket_list, shape_env_of(gm.graph), syms)
        return self.buckets

    def _fallback(self, why: str) -> None:
        self.exact_why = why
        _record("fallback", self.label, f"runs at exact sizes: {why}")

    def partition(self, joint: Any, joint_inputs: Any, **kwargs: Any) -> Any:
        from torch._functorch.partitioners import default_partition

        from ._bucket import graph_symbols
        from ._bucket_layout import Unsupported

        fw, bw = default_partition(joint, joint_inputs, **kwargs)
        syms = graph_symbols(fw.graph)
        if not syms:
            return fw, bw
        saved = [
            n.name
            for n in bw.graph.nodes
            if n.op == "placeholder" and not n.name.startswith("tangents")
        ]
        self.n_saved = len(saved)
        try:
            fw_plan = self._plan(fw, syms, None)
            if set(saved) - set(fw_plan.saved_layouts):
                raise Unsupported("saved values do not match the forward outputs")
            self.saved = fw_plan.saved_layouts
            self.user_layouts = fw_plan.user_layouts
            self._plan(bw, syms, self.saved)
        except Unsupported as e:
            self._fallback(str(e))
        return fw, bw

    def _plan(self, gm: torch.fx.GraphModule, syms: set, saved: dict | None) -> Any:
        from ._bucket import GraphPlan, input_layouts

        names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
        if saved is None:  # forward or inference: every input is the caller's
            return GraphPlan(gm, syms, input_layouts(gm.graph, syms), set(names), self.n_saved)
        pad = {n for n in names if n.startswith("tangents")}
        given = input_layouts(gm.graph, syms, saved, self.user_layouts)
        return GraphPlan(gm, syms, given, pad, 0)

    def _compile(self, gm: torch.fx.GraphModule, kind: str) -> Callable:
        from ._bucket import graph_symbols
        from ._bucket_layout import Unsupported

        label = f"{self.label} {kind}"
        syms = graph_symbols(gm.graph)
        if not syms:
            return _exact(gm, label, "static sizes")
        if self.exact_why is not None:
            return _exact(gm, label, self.exact_why)
        try:
            plan = self._plan(gm, syms, self.saved if kind == "backward" else None)
        except Unsupported as e:
            if kind == "backward":  # the forward already pads: cannot switch now
                raise RuntimeError(f"[tpu] bounded dynamism: {e}") from None
            self._fallback(str(e))
            return _exact(gm, label, self.exact_why)
        return _padded(plan, gm, self._buckets(gm, syms), label)

    def forward(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable:
        return self._compile(gm, "forward")

    def backward(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable:
        return self._compile(gm, "backward")

    def inference(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable:
        self.n_saved = 0
        return self._compile(gm, "inference")


def _exact_compiler(gm: torch.fx.GraphModule, example_inputs: Any, label: str) -> Callable:
    return _exact(gm, label, "exact sizes")


def _parse_options(options: dict | None) -> dict:
    options = dict(options or {})
    unknown = sorted(set(options) - _OPTIONS)
    if unknown:
        raise ValueError(
            f"torch.compile(backend='tpu'): unknown options {unknown}; "
            f"known options are {sorted(_OPTIONS)}"
        )
    bounded = options.get("bounded_dynamism", False)
    if not isinstance(bounded, bool):
        raise TypeError("torch.compile(backend='tpu'): 'bounded_dynamism' must be a bool")
    buckets = options.get("buckets")
    if buckets is not None:
        if not bounded:
            raise ValueError("torch.compile(backend='tpu'): 'buckets' needs bounded_dynamism")
        if not buckets or not all(isinstance(b, int) and b > 0 for b in buckets):
            raise ValueError(
                "torch.compile(backend='tpu'): 'buckets' must be a list of positive ints"
            )
        buckets = sorted(set(buckets))
    return {"bounded_dynamism": bounded, "buckets": buckets}


def tpu_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **kwargs: Any):
    """The ``"tpu"`` Dynamo backend (also registered as ``"torchtpu"``)."""
    from torch._dynamo.backends.common import aot_autograd

    options = _parse_options(kwargs.get("options"))
    label = _graph_label()
    reason = _dynamo_recompile_reason()
    if reason:
        _record("recompile", label, reason)
    if options["bounded_dynamism"]:
        bounded = _Bounded(label, options["buckets"])
        compilers = {
            "fw_compiler": bounded.forward,
            "bw_compiler": bounded.backward,
            "inference_compiler": bounded.inference,
            "partition_fn": bounded.partition,
        }
    else:
        compilers = {
            f"{kind}_compiler": functools.partial(_exact_compiler, label=f"{label} {name}")
            for kind, name in (("fw", "forward"), ("bw", "backward"), ("inference", "inference"))
        }
    # The decompositions serve the tpu lowering; a graph of CPU tensors keeps PyTorch's
    # own ops (some core decompositions of CPU-only kernels, e.g. of CPU attention's
    # backward, give wrong gradients when run on the CPU).
    on_tpu = any(isinstance(a, torch.Tensor) and a.device.type == "tpu" for a in example_inputs)
    backend = aot_autograd(
        **compilers,
        decompositions=_decompositions() if on_tpu else {},
        keep_inference_input_mutations=True,
    )
    return backend(gm, example_inputs)


def install_backend() -> None:
    """Names the backend to Dynamo when no installed distribution does: a source tree
    on PYTHONPATH has no entry point, and ``backend="tpu"`` would be unknown."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        eps = distribution("torchtpu").entry_points
        if any(ep.group == "torch_dynamo_backends" and ep.name == "tpu" for ep in eps):
            return
    except PackageNotFoundError:
        pass
    from torch._dynamo.backends.registry import _BACKENDS, register_backend

    for name in ("tpu", "torchtpu"):
        if name not in _BACKENDS:
            register_backend(tpu_backend, name=name)
