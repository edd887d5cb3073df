"""Hardware advisor: runs a model, a training step or a whole script on the tpu device and
reports, per layer, what costs efficiency on a chosen chip.

    report = torchtpu.advise(model, (x,), target="v5e")     # or step_fn=..., train=True
    print(report)
    python -m torchtpu.advise --target v6e train.py --lr 3e-4

It watches every ATen op (a ``TorchDispatchMode``), which module called it (global module
hooks; backward ops take the layer of the forward op that made their autograd node), and
the runtime's counters (programs built per op, CPU fallbacks, host syncs, compile time).
Matmul findings are estimates from the chip facts in ``CHIPS``; compile, sync and fallback
findings are measured on the platform the run used.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import runpy
import sys
import time
import types
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Self

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from . import _C

# ---- chip facts: one table, each entry with its public sources


@dataclass(frozen=True)
class Chip:
    name: str
    kind: str  # "tpu", "gpu" or "cpu"
    # Matrix-unit width: K and N of a matmul are padded to a multiple of it. TPUs count
    # elements (the MXU's side); GPUs and CPUs count bytes (alignment, vector width).
    unit: int
    unit_in_bytes: bool
    rows: int  # granularity of M, the streamed dim (TPU: 8 sublanes)
    bf16_tflops: float | None  # dense peak
    # float32 matmuls at the DEFAULT precision the tpu lowering asks for: one bfloat16
    # pass on TPUs, TF32 tensor cores on Hopper.
    f32_tflops: float | None
    hbm_gb: float | None
    hbm_gbps: float | None
    sources: tuple[str, ...]

    def width(self, dtype: torch.dtype) -> int:
        if not self.unit_in_bytes:
            return self.unit
        return max(1, self.unit // dtype.itemsize)

    def rate(self, dtype: torch.dtype) -> float:
        fast = dtype in (torch.bfloat16, torch.float16)
        r = self.bf16_tflops if fast else self.f32_tflops
        return r or 1.0


_TPU_DOCS = "https://cloud.google.com/tpu/docs"
_TPU_ARCH = f"{_TPU_DOCS}/system-architecture-tpu-vm (MXU: 128 x 128)"
_TPU_BF16 = f"{_TPU_DOCS}/bfloat16 (float32 matmuls multiply in bfloat16 by default)"
_JAX_INFO = (
    "https://github.com/jax-ml/jax/blob/main/jax/_src/tpu_info.py (8 sublanes, MXU 256 from v6)"
)
_NV_GEMM = (
    "https://docs.nvidia.com/deeplearning/performance/dl-performance-matrix-multiplication/"
    " (M, N, K aligned to 16 bytes, best at 128 bytes)"
)
_JAX_PREC = "https://docs.jax.dev/en/latest/201/precision.html (DEFAULT f32 dots: TF32 on GPUs)"


def _host_vector_bytes() -> int:
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return 16
    return 64 if "avx512f" in flags else 32 if "avx2" in flags else 16


def _tpu(name: str, unit: int, tflops: float, gb: float, gbps: float, *src: str) -> Chip:
    # float32 matmuls at DEFAULT precision: one bfloat16 pass, the bfloat16 rate.
    return Chip(name, "tpu", unit, False, 8, tflops, tflops, gb, gbps, (*src, _TPU_BF16, _JAX_INFO))


def _hopper(name: str, gb: float, gbps: float, src: str) -> Chip:
    # Dense rates: the datasheets' BF16 1979 and TF32 989 TFLOP/s assume 2:4 sparsity.
    return Chip(name, "gpu", 128, True, 128, 989, 494.5, gb, gbps, (src, _NV_GEMM, _JAX_PREC))


_INTEL = "https://www.intel.com/content/www/us/en/docs/intrinsics-guide/"

# fmt: off
CHIPS: dict[str, Chip] = {
    "v5e": _tpu("TPU v5e", 128, 197, 16, 819,
                f"{_TPU_DOCS}/v5e (197 TFLOP/s, 16 GB, 819 GB/s)", _TPU_ARCH),
    "v5p": _tpu("TPU v5p", 128, 459, 95, 2765,
                f"{_TPU_DOCS}/v5p (459 TFLOP/s, 95 GB, 2765 GB/s)", _TPU_ARCH),
    "v6e": _tpu("TPU v6e", 256, 918, 32, 1638,
                f"{_TPU_DOCS}/v6e (two 256x256 MXUs, 918 TFLOP/s, 32 GB, 1638 GB/s)"),
    "v7": _tpu("TPU7x (Ironwood)", 256, 2307, 192, 7380,
               f"{_TPU_DOCS}/tpu7x (2307 TFLOP/s, 192 GiB, 7380 GB/s)"),
    "h100": _hopper("NVIDIA H100 SXM", 80, 3350,
                    "https://www.nvidia.com/en-us/data-center/h100/ (80 GB, 3.35 TB/s)"),
    "h200": _hopper("NVIDIA H200 SXM", 141, 4800,
                    "https://www.nvidia.com/en-us/data-center/h200/ (141 GB, 4.8 TB/s)"),
    # XLA:CPU: no matrix unit; matmuls vectorize over the SIMD width (AVX2 32 bytes,
    # AVX-512 64 bytes; this host's /proc/cpuinfo) and bfloat16 is not faster there.
    "cpu": Chip("host CPU (XLA:CPU)", "cpu", _host_vector_bytes(), True, 1, None, None, None,
                None, (f"{_INTEL} (AVX2 256-bit, AVX-512 512-bit registers)",)),
}
# fmt: on

_ALIASES = {"trillium": "v6e", "ironwood": "v7", "7x": "v7", "tpu7x": "v7", "v7x": "v7"}


def chip(target: str | None = None) -> Chip:
    """The chip entry for ``target`` (``"v5e"``, ``"v5p"``, ``"v6e"``, ``"v7"``, ``"h100"``,
    ``"h200"``, ``"cpu"``; ``None`` or ``"current"``: the platform torchtpu runs on)."""
    if target is None or target == "current":
        platform = _C.platform()["name"].lower()
        if platform in ("cpu", "host"):
            return CHIPS["cpu"]
        raise ValueError(
            f"[advise] the current platform is {platform!r}, whose chip generation torchtpu "
            f"cannot read; pass target= one of {sorted(CHIPS)}"
        )
    key = target.lower().replace(" ", "").replace("-", "").replace("_", "")
    key = key.removeprefix("tpu") if key not in _ALIASES else key
    key = _ALIASES.get(key, key)
    if key not in CHIPS:
        raise ValueError(f"[advise] unknown target {target!r}; expected one of {sorted(CHIPS)}")
    return CHIPS[key]


# ---- report


@dataclass
class Finding:
    kind: str  # head_dim, matmul_dim, rows, float32, recompile, kv_cache, fallback, host_sync
    layers: list[str]
    what: str
    waste: float | None  # fraction, of `basis`
    basis: str
    fix: str

    @property
    def layer(self) -> str:
        return ", ".join(self.layers)

    def __str__(self) -> str:
        w = "   n/a" if self.waste is None else f"{100 * self.waste:5.1f}%"
        return f"{w}  [{self.layer}]  {self.what}\n        basis: {self.basis}\n        fix: {self.fix}"


@dataclass
class Report:
    chip: Chip
    steps: int
    step_kind: str
    summary: list[str]
    findings: list[Finding] = field(default_factory=list)

    def __str__(self) -> str:
        c = self.chip
        head = (
            f"torchtpu advisor: target {c.name} (matrix unit {c.unit}"
            f"{' bytes' if c.unit_in_bytes else ' wide'}"
            + (f", {c.bf16_tflops:g} bf16 TFLOP/s" if c.bf16_tflops else "")
            + (f", {c.hbm_gb:g} GB HBM" if c.hbm_gb else "")
            + ")"
        )
        lines = [head, f"steps observed: {self.steps} ({self.step_kind})", *self.summary]
        if not self.findings:
            lines.append("no findings")
        for i, f in enumerate(self.findings, 1):
            lines.append(f"{i:2d}. {f}")
        lines.append("chip facts: " + "; ".join(c.sources))
        return "\n".join(lines)


# ---- observation


_EST = "of estimated matmul time"
_LAYER = "torchtpu_advise_layer"
_OUTSIDE = "(outside modules)"
_MATMULS = {"mm", "addmm", "bmm", "baddbmm"}
_HERE = os.path.dirname(os.path.abspath(__file__))
_TORCH = os.path.dirname(os.path.abspath(torch.__file__))


@dataclass
class _Op:
    name: str  # "aten.add.Tensor"
    shapes: tuple
    layer: str
    seconds: float
    where: str | None = None  # Python line of a host sync


@dataclass
class _Mm:
    layer: str
    m: int
    k: int
    n: int
    times: int  # batch x groups x kernel positions
    dtype: torch.dtype
    backward: bool = False

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.k * self.n * self.times


@dataclass
class _Snap:
    pos: int
    t: float
    programs: dict
    syncs: int
    fallbacks: dict
    compile_s: float


def _tensors(x: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten(x)[0] if isinstance(t, torch.Tensor)]


def _user_line() -> str | None:
    f = sys._getframe(2)
    while f is not None:
        fn = os.path.abspath(f.f_code.co_filename)
        if not fn.startswith((_TORCH, _HERE)) and "<frozen" not in fn:
            return f"{fn}:{f.f_lineno}"
        f = f.f_back
    return None


class _Dispatch(TorchDispatchMode):
    def __init__(self, adv: Advisor) -> None:
        super().__init__()
        self.adv = adv

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        t0 = time.perf_counter()
        out = func(*args, **kwargs)
        self.adv._record(func, args, kwargs, out, time.perf_counter() - t0)
        return out


class _Functions(TorchFunctionMode):
    def __init__(self, adv: Advisor) -> None:
        super().__init__()
        self.adv = adv

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.nn.functional.scaled_dot_product_attention:
            self.adv._attention(args, kwargs)
        out = func(*args, **kwargs)
        if torch.is_grad_enabled():
            self.adv._label_graph(out)
        return out


class Advisor:
    """Watches what runs while active (a context manager); ``report()`` says what costs
    efficiency on ``target``. Steps are the calls of ``mark_step()`` when any, else the
    optimizer's steps when any, else the calls of the largest top-level module."""

    def __init__(self, target: str | None = None) -> None:
        self.chip = chip(target)
        self.ops: list[_Op] = []
        self.mms: list[_Mm] = []
        self.stack: list[str] = []
        self.names: dict[int, dict[int, str]] = {}  # root id -> module id -> name
        self.modules: dict[str, torch.nn.Module] = {}
        self.rows: dict[str, set[int]] = defaultdict(set)  # layer -> forward matmul rows
        self.keys: dict[str, set[int]] = defaultdict(set)  # layer -> padded key lengths
        self.attn: dict[str, tuple[int, int, int]] = {}  # layer -> (heads, head dim, v dim)
        self.bounds: dict[Any, list[_Snap]] = defaultdict(list)
        self.roots: dict[int, torch.nn.Module] = {}
        self._handles: list[Any] = []
        self._modes: list[Any] = []

    # -- lifecycle
    def __enter__(self) -> Self:
        mod = torch.nn.modules.module
        self._handles = [
            mod.register_module_forward_pre_hook(self._pre),
            mod.register_module_forward_hook(self._post, always_call=True),
            register_optimizer_step_post_hook(self._opt_step),
        ]
        self.start = self._snap()
        self._modes = [_Functions(self), _Dispatch(self)]
        for m in self._modes:
            m.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        for m in reversed(self._modes):
            m.__exit__(None, None, None)
        for h in self._handles:
            h.remove()
        syncs = _C.metrics()["host_syncs"]
        torch.tpu.synchronize()  # the last step's time includes its device work
        self.end = self._snap()
        self.end.syncs = syncs

    def mark_step(self) -> None:
        """Starts a step. Runs what Fused Eager recorded first, so each step's programs
        are counted in that step."""
        _C.flush()
        self.bounds["explicit"].append(self._snap())

    def _snap(self) -> _Snap:
        m = _C.metrics()
        return _Snap(
            len(self.ops),
            time.perf_counter(),
            dict(m["programs_by_op"]),
            m["host_syncs"],
            dict(m["fallback_ops"]),
            m["compile_seconds"],
        )

    # -- layers
    def _pre(self, module: torch.nn.Module, args: Any) -> None:
        if not self.stack:
            rid = id(module)
            if rid not in self.names:
                self.names[rid] = {id(m): n for n, m in module.named_modules()}
                self.roots[rid] = module
            self.bounds[("forward", rid)].append(self._snap())
            self._root = rid
        self.stack.append(self.names[self._root].get(id(module)) or type(module).__name__)
        self.modules.setdefault(self.stack[-1], module)

    def _post(self, module: torch.nn.Module, args: Any, out: Any) -> None:
        if self.stack:
            self.stack.pop()

    def _opt_step(self, opt: Any, args: Any, kwargs: Any) -> None:
        self.bounds["optimizer"].append(self._snap())

    def _layer(self) -> str:
        if self.stack:
            return self.stack[-1]
        node = torch._C._current_autograd_node()
        if node is not None:
            return node.metadata.get(_LAYER, _OUTSIDE)
        return _OUTSIDE

    def _label_graph(self, out: Any) -> None:
        # Backward ops run the autograd nodes their forward call made: give those nodes
        # the layer, walking back to nodes an earlier call labeled.
        if not self.stack:
            return
        todo = [t.grad_fn for t in _tensors(out) if t.grad_fn is not None]
        budget = 4096
        while todo and budget:
            node = todo.pop()
            if node is None or _LAYER in node.metadata:
                continue
            node.metadata[_LAYER] = self.stack[-1]
            budget -= 1
            todo.extend(n for n, _ in node.next_functions)

    def _attention(self, args: Sequence[Any], kwargs: dict) -> None:
        q = args[0] if args else kwargs.get("query")
        v = args[2] if len(args) > 2 else kwargs.get("value")
        if isinstance(q, torch.Tensor) and q.dim() >= 3 and isinstance(v, torch.Tensor):
            self.attn[self._layer()] = (q.shape[-3], q.shape[-1], v.shape[-1])

    # -- ops
    def _record(self, func, args, kwargs, out, seconds: float) -> None:
        name = str(func)  # "aten.add.Tensor"
        ins = _tensors(args)
        shapes = tuple(tuple(t.shape) for t in ins[:4])
        layer = self._layer()
        op = _Op(name, shapes, layer, seconds)
        base = name.split(".")[1] if name.startswith("aten.") else name
        if base in ("_local_scalar_dense", "_to_copy", "copy_") and self._syncs(base, ins, kwargs):
            op.where = _user_line()
        if any(t.device.type == "tpu" for t in ins):
            mms = self._matmuls(base, args, out, layer)
            self.mms += mms
            for mm in mms:
                mm.backward = not self.stack and layer != _OUTSIDE
                if self.stack:  # forward rows: what weight gradients contract over
                    self.rows[layer].add(mm.m)
        self.ops.append(op)

    @staticmethod
    def _syncs(base: str, ins: list[torch.Tensor], kwargs: dict) -> bool:
        if base == "_local_scalar_dense":
            return bool(ins) and ins[0].device.type == "tpu"
        if base == "_to_copy":
            dev = kwargs.get("device")
            return (
                bool(ins)
                and ins[0].device.type == "tpu"
                and dev is not None
                and (torch.device(dev).type == "cpu")
            )
        return len(ins) >= 2 and ins[0].device.type == "cpu" and ins[1].device.type == "tpu"

    def _matmuls(self, base: str, args, out, layer: str) -> list[_Mm]:
        base = base.rstrip("_")
        if base in _MATMULS:
            a, b = (args[1], args[2]) if base in ("addmm", "baddbmm") else args[:2]
            if a.dim() == 2:
                return [_Mm(layer, a.shape[0], a.shape[1], b.shape[1], 1, a.dtype)]
            return [_Mm(layer, a.shape[1], a.shape[2], b.shape[2], a.shape[0], a.dtype)]
        if base == "convolution" or base == "convolution_backward":
            x, w = (args[0], args[1]) if base == "convolution" else (args[1], args[2])
            res = out if base == "convolution" else args[0]  # grad_output has out's shape
            groups = args[8] if base == "convolution" else args[9]
            cout, cin_g = w.shape[0], w.shape[1]
            rows = res.shape[0] * math.prod(res.shape[2:])
            times = groups * math.prod(w.shape[2:]) * (1 if base == "convolution" else 2)
            return [_Mm(layer, rows, cin_g, cout // groups, times, x.dtype)]
        if base.startswith("_scaled_dot_product") and not base.endswith("backward"):
            q, k, v = args[:3]
            bh = math.prod(q.shape[:-2])
            return [
                _Mm(layer, q.shape[-2], q.shape[-1], k.shape[-2], bh, q.dtype),
                _Mm(layer, q.shape[-2], k.shape[-2], v.shape[-1], bh, q.dtype),
            ]
        return []

    # -- analysis
    def _steps(self) -> tuple[list[tuple[_Snap, _Snap]], str]:
        if self.bounds.get("explicit"):
            b = self.bounds["explicit"]
            return list(zip(b, b[1:] + [self.end])), "advise() steps"
        if self.bounds.get("optimizer"):
            b = [self.start, *self.bounds["optimizer"]]
            return list(itertools.pairwise(b)), "optimizer steps"
        fwd = [(k, v) for k, v in self.bounds.items() if isinstance(k, tuple)]
        if not fwd:
            return [(self.start, self.end)], "whole run"
        (_, rid), b = max(
            fwd,
            key=lambda kv: (sum(p.numel() for p in self.roots[kv[0][1]].parameters()), len(kv[1])),
        )
        return list(zip(b, b[1:] + [self.end])), f"calls of {type(self.roots[rid]).__name__}"

    def report(self, target: str | None = None) -> Report:
        """The findings, sorted by estimated waste; ``target`` rates the same run for
        another chip."""
        if target is not None:
            keep, self.chip = self.chip, chip(target)
            try:
                return self.report()
            finally:
                self.chip = keep
        steps, kind = self._steps()
        wall = sum(e.t - s.t for s, e in steps) or 1e-9
        findings: list[Finding] = []
        summary = self._matmul_findings(findings, len(steps))
        self._recompile_findings(findings, steps, wall)
        self._sync_findings(findings, steps, wall)
        self._fallback_findings(findings, wall)
        syncs = (self.end.syncs - self.start.syncs) / max(1, len(steps))
        summary.append(
            f"host syncs per step: {syncs:g}; wall time per step "
            f"{1e3 * wall / len(steps):.1f} ms on {_C.platform()['name']}"
        )
        findings.sort(key=lambda f: -1.0 if f.waste is None else f.waste, reverse=True)
        return Report(self.chip, len(steps), kind, summary, _merge(findings))

    def _matmul_findings(self, out: list[Finding], nsteps: int) -> list[str]:
        c = self.chip
        total = 0.0  # matrix-unit time, arbitrary units (padded FLOPs / rate)
        real = 0.0
        by_dim: dict[tuple[str, str, int, int], float] = defaultdict(float)
        f32_gain = 0.0
        f32_bytes = all_bytes = 0.0
        f32_layers: dict[str, float] = defaultdict(float)
        for mm in self.mms:
            w, rate = c.width(mm.dtype), c.rate(mm.dtype)
            dims = [
                ("rows", mm.m, _pad(mm.m, c.rows)),
                ("k", mm.k, _pad(mm.k, w)),
                ("n", mm.n, _pad(mm.n, w)),
            ]
            padded = 2.0 * mm.times * math.prod(p for _, _, p in dims)
            t = padded / rate
            total += t
            real += mm.flops / rate
            logs = [(self._role(mm, r, d), d, p, math.log(p / d)) for r, d, p in dims if p > d]
            spent = t - mm.flops / rate
            norm = sum(lg for *_, lg in logs)
            for role, d, p, lg in logs:
                if role == "keys":  # one finding for all key lengths of a layer
                    d = p = 0
                by_dim[(mm.layer, role, d, p)] += spent * lg / norm
            nbytes = mm.times * (mm.m * mm.k + mm.k * mm.n) * mm.dtype.itemsize
            all_bytes += nbytes
            if mm.dtype == torch.float32:
                f32_bytes += nbytes
                f32_layers[mm.layer] += mm.flops
                f32_gain += t - padded / c.rate(torch.bfloat16)
        if not self.mms:
            return ["no matmuls observed on the tpu device"]
        for (layer, role, d, p), spent in by_dim.items():
            if spent / total >= 0.005:
                out.append(self._dim_finding(layer, role, d, p, spent / total))
        if f32_bytes and c.kind != "cpu":
            top = sorted(f32_layers, key=f32_layers.get, reverse=True)
            share = sum(f32_layers.values()) / (sum(mm.flops for mm in self.mms) or 1)
            if f32_gain > 0:
                waste, basis = f32_gain / total, _EST
            else:
                waste, basis = f32_bytes / 2 / all_bytes, "of matmul operand bytes (HBM traffic)"
            what = (
                f"{100 * share:.0f}% of matmul FLOPs run in float32 on a chip whose matrix unit "
                "multiplies bfloat16 (float32 operands move twice the bytes"
                + (", TF32 runs at half the bfloat16 rate)" if c.kind == "gpu" else ")")
            )
            fix = (
                "run the step under torch.autocast('tpu', dtype=torch.bfloat16) (or keep "
                "weights in bfloat16: model.to(torch.bfloat16))"
            )
            layers = top[:3] + (["..."] if len(top) > 3 else [])
            out.append(Finding("float32", layers, what, waste, basis, fix))
        flops = sum(mm.flops for mm in self.mms) / max(1, nsteps)
        use = (
            f"matmul work per step: {flops / 1e9:.3g} GFLOP; estimated matrix-unit use "
            f"{100 * real / total:.0f}% (padding to {c.unit}"
            f"{' bytes' if c.unit_in_bytes else ''} in K and N, {c.rows} in M)"
        )
        return [use]

    def _role(self, mm: _Mm, role: str, d: int) -> str:
        if role == "rows":
            return role
        if mm.layer in self.attn:
            if d in self.attn[mm.layer][1:]:
                return role
            self.keys[mm.layer].add(d)  # or query lengths, in the backward pass
            return "keys"
        if mm.backward and d in self.rows.get(mm.layer, ()):
            return "grad_rows"
        return role

    def _dim_finding(self, layer: str, role: str, d: int, p: int, waste: float) -> Finding:
        c = self.chip
        unit = f"{c.unit}-byte alignment" if c.unit_in_bytes else f"{c.unit}-wide matrix unit"
        mod = self.modules.get(layer)
        m = c.width(torch.bfloat16)  # a multiple of it suits float32 too
        to = _pad(d, m)
        kind, what = "matmul_dim", f"matmul dim {d} is not a multiple of the {unit} (padded to {p})"
        fix = f"make that dimension a multiple of {m} ({to})"
        if role == "rows":
            kind, what = "rows", f"matmul rows (batch x sequence) {d} are padded to {p}"
            fix = f"use a batch x sequence length that is a multiple of {c.rows}"
        elif role == "grad_rows":
            kind = "rows"
            what = f"batch x sequence {d} is the contraction dim of the weight gradient "
            what += f"(padded to {p} on the {unit})"
            fix = f"use more tokens per step (batch x sequence a multiple of {m}: {to})"
        elif role == "keys":
            keys = sorted(self.keys[layer])
            span = f"{keys[0]}" if len(keys) == 1 else f"{keys[0]}..{keys[-1]}"
            what = f"attention key lengths {span} are not multiples of the {unit}"
            fix = (
                f"pad the keys (or a static KV cache's max_len) to a multiple of {m} and "
                "mask the padding"
            )
        elif layer in self.attn and d in self.attn[layer][1:]:
            heads, e, _ = self.attn[layer]
            kind, model = "head_dim", heads * e
            what = f"attention head dim {d} is {'below' if d < p else 'not a multiple of'} the "
            what += f"{unit}: padded to {p} in QK^T and PV"
            fix = f"use head_dim {p}"
            if model % p == 0:
                fix += f" (n_heads {model // p} instead of {heads} at d_model {model})"
            if p > 128 > d:
                fix += f"; head_dim 128 pads less ({100 * (1 - d / p):.0f}% -> 50%)"
        elif isinstance(mod, torch.nn.Linear) and d in (mod.in_features, mod.out_features):
            which = "out_features" if d == mod.out_features else "in_features"
            what = f"Linear {which} {d} is not a multiple of the {unit} (padded to {p})"
            fix = f"make {which} a multiple of {m}: {to}"
            if which == "out_features" and self._is_vocab(d):
                fix = f"pad the vocabulary to {to}, a multiple of {m} (the extra ids unused)"
        elif isinstance(mod, torch.nn.modules.conv._ConvNd):
            what = f"convolution channels {d} are padded to {p} on the {unit}"
            fix = f"use channel counts that are multiples of {m} ({to})"
        return Finding(kind, [layer], what, waste, _EST, fix)

    def _is_vocab(self, d: int) -> bool:
        return any(
            isinstance(m, torch.nn.Embedding) and m.num_embeddings == d
            for root in self.roots.values()
            for m in root.modules()
        )

    def _step_ops(self, steps) -> list[dict[tuple[str, int], _Op]]:
        # Per step: (op, how many times seen so far in the step) -> the call.
        res = []
        for s, e in steps:
            seen: dict[str, int] = defaultdict(int)
            calls = {}
            for op in self.ops[s.pos : e.pos]:
                calls[(op.name, seen[op.name])] = op
                seen[op.name] += 1
            res.append(calls)
        return res

    def _recompile_findings(self, out: list[Finding], steps, wall: float) -> None:
        if len(steps) < 2:
            return
        later = steps[1:]
        new: dict[str, int] = defaultdict(int)  # op -> later steps that built programs
        built: dict[str, int] = defaultdict(int)
        for s, e in later:
            for what, n in e.programs.items():
                d = n - s.programs.get(what, 0)
                if d > 0:
                    new[what] += 1
                    built[what] += d
        # An op first met after the first step boundary builds its programs once: only
        # programs built in two or more later steps are recompiles.
        new = {w: n for w, n in new.items() if n >= min(2, len(later))}
        if not new:
            return
        compile_s = sum(e.compile_s - s.compile_s for s, e in later)
        later_wall = sum(e.t - s.t for s, e in later) or 1e-9
        changes = self._shape_changes(steps)
        kv = self._kv_cache(out, changes, compile_s / later_wall if compile_s else None)
        total_built = sum(built.values())
        ranked = sorted(new, key=lambda w: (new[w], built[w]), reverse=True)
        for what in ranked[:6]:
            base = what.split(" ")[0] if what.startswith("fused") else what.split(".")[0]
            ch = [c for c in changes if base == "fused" or _base(c[0]) == base.rstrip("_")]
            every = new[what] == len(later)
            detail = "; ".join(f"{c[0]} input {c[1]} dim {c[2]}: {_seq(c[4])}" for c in ch[:2])
            if not detail and changes:
                c = changes[0]
                detail = (
                    f"first changing op {c[0]} in {c[3]}: input {c[1]} dim {c[2]}: {_seq(c[4])}"
                )
            layers = sorted({c[3] for c in ch[:2]}) or [changes[0][3] if changes else _OUTSIDE]
            waste = compile_s * built[what] / total_built / later_wall if compile_s else None
            when = "every step" if every else f"{new[what]} of {len(later)} later steps"
            desc = f"aten::{what} built a new program in {when} ({built[what]} after the first "
            desc += "step): shapes change" + (f" ({detail})" if detail else "")
            fix = (
                "a static KV cache (see that finding)"
                if kv
                else (
                    "keep shapes fixed from step to step: pad the changing dim to a few bucket "
                    "sizes and mask, or torch.compile(model, backend='tpu', "
                    "options={'bounded_dynamism': True})"
                )
            )
            out.append(Finding("recompile", layers, desc, waste, _compiling(waste), fix))

    def _shape_changes(self, steps) -> list[tuple[str, int, int, str, list[int]]]:
        per_step = self._step_ops(steps)
        first: dict[tuple, tuple[str, int, int, str, list[int]]] = {}
        for prev, cur in itertools.pairwise(per_step):
            for key, op in cur.items():
                old = prev.get(key)
                if old is None or old.shapes == op.shapes:
                    continue
                for i, (a, b) in enumerate(zip(old.shapes, op.shapes)):
                    for d, (x, y) in enumerate(zip(a, b)):
                        if x != y:
                            rec = first.setdefault((key, i, d), (op.name, i, d, op.layer, [x]))
                            rec[4].append(y)
        return list(first.values())

    def _kv_cache(self, out: list[Finding], changes, waste: float | None) -> str | None:
        grows = [
            c
            for c in changes
            if _base(c[0]) == "cat"
            and len(c[4]) >= 3
            and len({b - a for a, b in itertools.pairwise(c[4])}) == 1
            and c[4][1] > c[4][0]
        ]
        if not grows:
            return None
        layers = sorted({c[3] for c in grows})
        c = grows[0]
        fix = (
            "use a static KV cache: preallocate [batch, heads, max_len, head_dim] once and "
            "write each step's keys/values at their position (index_copy_ or slice "
            "assignment) with an attention mask; with Hugging Face generate(): "
            "cache_implementation='static'"
        )
        what = (
            f"generation with a growing KV cache: aten::cat grows input {c[1]} dim {c[2]} by "
            f"{c[4][1] - c[4][0]} every step ({_seq(c[4])}), so every op that reads the cache "
            "compiles a new program each step"
        )
        out.append(Finding("kv_cache", layers, what, waste, _compiling(waste), fix))
        return fix

    def _sync_findings(self, out: list[Finding], steps, wall: float) -> None:
        if len(steps) < 2:
            return
        where: dict[str, list[Any]] = defaultdict(lambda: [set(), 0.0, set()])
        for i, (s, e) in enumerate(steps):
            for op in self.ops[s.pos : e.pos]:
                if op.where:
                    w = where[op.where]
                    w[0].add(i)
                    w[1] += op.seconds
                    w[2].add(".item()" if "_local_scalar_dense" in op.name else ".cpu()")
        for line, (hit, secs, how) in where.items():
            if len(hit) < len(steps) - 1:
                continue
            what = (
                f"host sync inside the loop ({'/'.join(sorted(how))} every step): the host "
                "waits for the device and cannot queue the next step meanwhile"
            )
            fix = (
                "move it out of the loop: keep values on the device (accumulate losses in a "
                "tensor) and read them every N steps or after the loop"
            )
            layers = [os.path.relpath(line) if not line.startswith("<") else line]
            basis = "of step time the host waited there (measured)"
            out.append(Finding("host_sync", layers, what, secs / wall, basis, fix))

    def _fallback_findings(self, out: list[Finding], wall: float) -> None:
        for name, n in self.end.fallbacks.items():
            d = n - self.start.fallbacks.get(name, 0)
            if d <= 0:
                continue
            calls = [op for op in self.ops if _base(op.name) == name.split(".")[0]]
            secs = sum(op.seconds for op in calls)
            layers = sorted({op.layer for op in calls}) or [_OUTSIDE]
            what = (
                f"aten::{name} ran on the CPU {d} times (no tpu lowering; its inputs are copied "
                "to the host and back, and fused graphs are cut there)"
            )
            fix = (
                f"add a lowering rule for aten::{name} (csrc/lower, see docs/ARCHITECTURE.md) "
                "or replace the op with ops that have one"
            )
            basis = "of run time inside the op (measured)"
            out.append(
                Finding("fallback", layers, what, secs / wall if calls else None, basis, fix)
            )


def _compiling(waste: float | None) -> str:
    if waste is None:
        return "compile time not measured (programs came from the compile cache)"
    return "of step time spent compiling (measured)"


def _pad(d: int, w: int) -> int:
    return max(w, -(-d // w) * w) if d else 0


def _base(name: str) -> str:
    parts = name.split(".")
    b = parts[1] if parts[0] == "aten" and len(parts) > 1 else parts[0]
    return b.rstrip("_")


def _seq(vals: list[int]) -> str:
    return " -> ".join(map(str, vals[:4])) + (" -> ..." if len(vals) > 4 else "")


def _merge(findings: list[Finding]) -> list[Finding]:
    # Identical findings of several layers (every block's attention) become one.
    merged: dict[tuple, Finding] = {}
    for f in findings:
        key = (f.kind, f.what, f.fix, f.basis)
        if key in merged:
            m = merged[key]
            m.layers = sorted({*m.layers, *f.layers})
            m.waste = None if m.waste is None or f.waste is None else m.waste + f.waste
        else:
            merged[key] = Finding(f.kind, list(f.layers), f.what, f.waste, f.basis, f.fix)
    res = list(merged.values())
    res.sort(key=lambda f: -1.0 if f.waste is None else f.waste, reverse=True)
    return res


# ---- entry points


def _to_tpu(x: Any) -> Any:
    return tree_map(lambda t: t.to("tpu") if isinstance(t, torch.Tensor) else t, x)


def advise(
    model: torch.nn.Module | None = None,
    example_inputs: Any = (),
    target: str | None = None,
    *,
    steps: int = 3,
    train: bool = False,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    step_fn: Callable[[int], Any] | None = None,
) -> Report:
    """Runs ``steps`` steps on the tpu device with the advisor watching and returns its
    report (``print(report)``; ``report.findings`` sorted by estimated waste).

    A step is ``model(*example_inputs)`` (the model and inputs are moved to ``"tpu"``;
    ``example_inputs`` may be a callable ``step -> inputs`` for inputs that change), with
    ``train=True`` also a backward pass of ``loss_fn(output)`` (default: the output's
    mean), or ``step_fn(step)`` when given (a training step, a generation loop, ...).
    ``target``: ``"v5e"``, ``"v5p"``, ``"v6e"``, ``"v7"``, ``"h100"``, ``"h200"``,
    ``"cpu"``, or ``None`` for the current platform."""
    if step_fn is None:
        if model is None:
            raise ValueError("[advise] pass a model (with example_inputs) or step_fn")
        model.to("tpu")

        def step_fn(i: int) -> Any:
            inputs = example_inputs(i) if callable(example_inputs) else example_inputs
            inputs = _to_tpu(inputs if isinstance(inputs, tuple | list) else (inputs,))
            with torch.set_grad_enabled(train):
                out = model(*inputs)
                if train:
                    loss = loss_fn(out) if loss_fn else _tensors(out)[0].float().mean()
                    loss.backward()
                    model.zero_grad(set_to_none=True)
            return out

    adv = Advisor(target)
    with adv:
        for i in range(steps):
            adv.mark_step()
            step_fn(i)
    return adv.report()


class _CallableModule(types.ModuleType):
    # ``torchtpu.advise`` is this module once imported; calling it calls advise().
    def __call__(self, *args: Any, **kwargs: Any) -> Report:
        return advise(*args, **kwargs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m torchtpu.advise",
        description="Run a script with the hardware advisor watching, then print its report.",
    )
    ap.add_argument("--target", default=None, help=f"one of {sorted(CHIPS)} (default: current)")
    ap.add_argument("script")
    ap.add_argument("args", nargs=argparse.REMAINDER)
    ns = ap.parse_args(argv)
    adv = Advisor(ns.target)
    sys.argv = [ns.script, *ns.args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(ns.script)))
    code = 0
    with adv:
        try:
            runpy.run_path(ns.script, run_name="__main__")
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    print(adv.report())
    return code


if __name__ == "__main__":
    sys.exit(main())
else:
    sys.modules[__name__].__class__ = _CallableModule
