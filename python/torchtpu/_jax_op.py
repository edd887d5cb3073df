"""Custom ops written in JAX (or Pallas), called from PyTorch on the device.

``jax_op("ns::name", fn)`` defines a ``torch.library`` op. On ``tpu`` tensors it
exports ``fn`` with ``jax.export`` for the active PJRT platform, once per input
shapes, dtypes and static arguments, registers the StableHLO with the native
core, and calls it through ``torchtpu::jax_call``: the lowering rule inlines
the functions into the program being built, so in Fused Eager and under
``torch.compile`` the kernel joins the surrounding graph, and in Strict Eager it
is one cached executable like any op. Programs that hold JAX functions are
re-serialized for the plugin's StableHLO version before they compile (a JAX
newer than the plugin still works). On CPU tensors ``fn`` runs on JAX's own CPU
client. ``jax`` is imported only when the first op is defined.
"""

from __future__ import annotations

import hashlib
import inspect
import os
import re
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from . import _C

_lock = threading.Lock()
_state: dict[str, Any] = {}  # jax modules, the target version, translator installed
_names: dict[str, str] = {}  # symbol prefix -> op name, for errors at compile time

_ELEMENT = {  # torch dtype -> (jax dtype name, MLIR element type)
    torch.bool: ("bool", "i1"),
    torch.int8: ("int8", "i8"),
    torch.int16: ("int16", "i16"),
    torch.int32: ("int32", "i32"),
    torch.int64: ("int64", "i64"),
    torch.uint8: ("uint8", "ui8"),
    torch.uint16: ("uint16", "ui16"),
    torch.uint32: ("uint32", "ui32"),
    torch.uint64: ("uint64", "ui64"),
    torch.float16: ("float16", "f16"),
    torch.bfloat16: ("bfloat16", "bf16"),
    torch.float32: ("float32", "f32"),
    torch.float64: ("float64", "f64"),
    torch.complex64: ("complex64", "complex<f32>"),
    torch.complex128: ("complex128", "complex<f64>"),
}
_FROM_JAX = {jax_name: t for t, (jax_name, _) in _ELEMENT.items()}
_STATIC_TYPES = {int: "int", float: "float", bool: "bool", str: "str"}
# Custom calls that only run beside the platform they were written for.
_FOREIGN_CALLS = {
    "tpu_custom_call": "a Mosaic TPU kernel",
    "__gpu$xla.gpu.triton": "a Triton kernel",
}


def _jax() -> Any:
    """Imports jax for export only: JAX's own client stays on the host CPU, so
    defining an op never takes the accelerator (or its memory) from us."""
    with _lock:
        if "jax" in _state:
            return _state["jax"]
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        try:
            import jax
            from jax import export
            from jax._src.interpreters import mlir
            from jax._src.lib import _jax as jaxlib_ext
            from jaxlib.mlir import ir
            from jaxlib.mlir.dialects import stablehlo
        except ImportError as e:
            raise ImportError(
                "torchtpu.jax_op needs JAX: pip install 'torchtpu[jax]' (or jax and jaxlib)"
            ) from e
        _state.update(jax=jax, export=export, mlir=mlir, ir=ir, ext=jaxlib_ext, stablehlo=stablehlo)
        return jax


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text))


def _target_version() -> str:
    """The StableHLO version programs are written in for the plugin: its own
    current version, or JAX's when JAX is older."""
    _jax()
    sh = _state["stablehlo"]
    attrs = _C.platform()
    plugin = _version(attrs.get("stablehlo_current_version", ""))
    ours = _version(sh.get_current_version())
    if not plugin:
        return ".".join(map(str, ours))
    if plugin < _version(sh.get_minimum_version()):
        raise RuntimeError(
            f"the PJRT plugin reads StableHLO {'.'.join(map(str, plugin))}, older than the "
            f"oldest this JAX writes ({sh.get_minimum_version()}); install an older jax"
        )
    return ".".join(map(str, min(plugin, ours)))


def _translate(text: bytes) -> bytes:
    """Our program text with inlined JAX functions -> a StableHLO portable
    artifact in the plugin's version (called by the native compile step)."""
    ir, ext = _state["ir"], _state["ext"]
    target = _state["target"]
    with _state["mlir"].make_ir_context():
        module = ir.Module.parse(text.decode())
        try:
            return ext.mlir.serialize_portable_artifact(module, target, False)
        except Exception as e:
            ops = sorted({n for p, n in _names.items() if p.encode() in text})
            raise RuntimeError(
                f"{', '.join(ops) or 'a JAX op'}: cannot write the program in StableHLO "
                f"{target}, the version the PJRT plugin reads (JAX writes "
                f"{_state['stablehlo'].get_current_version()}); use a jax release as old as "
                f"the plugin or a newer plugin. ({e})"
            ) from e


def _install_translator() -> None:
    with _lock:
        if "target" in _state:
            return
    target = _target_version()
    with _lock:
        _state["target"] = target
    _C._set_source_translator(_translate)


def _platform() -> str:
    name = _C.platform()["name"].lower()
    return {"gpu": "cuda", "cuda": "cuda", "rocm": "rocm", "tpu": "tpu"}.get(name, "cpu")


class _Entry:
    """One export: the key the native core knows it by and its output types."""

    def __init__(self, key: int, outs: list[tuple[tuple[int, ...], torch.dtype]]) -> None:
        self.key = key
        self.outs = outs


def _inline_text(name: str, module_text: str) -> tuple[str, str, str]:
    """Renames the export's functions under a prefix from its content, makes them
    private and drops JAX's argument/result attributes. Returns (prefix, entry
    symbol, text of the functions, entry first)."""
    ir = _state["ir"]
    prefix = "jx" + hashlib.sha256(module_text.encode()).hexdigest()[:16] + "_"
    with _state["mlir"].make_ir_context():
        module = ir.Module.parse(module_text)
        funcs = []
        for op in module.body.operations:
            if op.operation.name != "func.func":
                raise RuntimeError(
                    f"{name}: the JAX export holds a top-level '{op.operation.name}', which "
                    "cannot be inlined (sharded or multi-device exports are not supported)"
                )
            funcs.append(op)
        for op in funcs:
            old = ir.StringAttr(op.attributes["sym_name"]).value
            ir.SymbolTable.replace_all_symbol_uses(old, prefix + old, module.operation)
            op.attributes["sym_name"] = ir.StringAttr.get(prefix + old)
            op.attributes["sym_visibility"] = ir.StringAttr.get("private")
            for attr in ("arg_attrs", "res_attrs"):
                if attr in op.attributes:
                    del op.attributes[attr]
        funcs.sort(key=lambda f: ir.StringAttr(f.attributes["sym_name"]).value != prefix + "main")
        text = "\n".join(f.operation.get_asm(enable_debug_info=False) for f in funcs)
    return prefix, prefix + "main", text


class JaxOp:
    """A ``torch.library`` custom op backed by a JAX function; call it like the
    function (tensors positionally, static arguments by name or position)."""

    def __init__(
        self,
        qualname: str,
        fn: Callable,
        static_argnames: Sequence[str],
        num_outputs: int,
        autograd: bool,
    ) -> None:
        if "::" not in qualname:
            raise ValueError(f"jax_op name '{qualname}' must be 'namespace::name'")
        _jax()
        self.qualname, self.fn, self.num_outputs = qualname, fn, num_outputs
        params = list(inspect.signature(fn).parameters.values())
        if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
            raise TypeError(f"{qualname}: *args/**kwargs cannot be typed; name each argument")
        unknown = set(static_argnames) - {p.name for p in params}
        if unknown:
            raise TypeError(f"{qualname}: static_argnames {sorted(unknown)} are not arguments")
        # Static: named, or typed/defaulted as a Python int, float, bool or str.
        static = set(static_argnames) | {p.name for p in params if _static_kind(p)}
        self.tensor_names = [p.name for p in params if p.name not in static]
        self.static = [p for p in params if p.name in static]
        self._entries: dict[tuple, _Entry] = {}
        self._op = torch.library.custom_op(
            qualname, mutates_args=(), schema=self._schema(num_outputs)
        )(self._impl)
        self._op.register_fake(self._fake)
        self.vjp_op = None
        if autograd and num_outputs >= 1:
            self._register_vjp()

    # ---- schema and arguments
    def _schema(self, num_outputs: int) -> str:
        args = [f"Tensor {n}" for n in self.tensor_names]
        for p in self.static:
            kind = _static_kind(p)
            if kind is None:
                raise TypeError(
                    f"{self.qualname}: static argument '{p.name}' needs an int, float, bool or "
                    "str annotation or default"
                )
            default = "" if p.default is p.empty else "=" + _default_text(p.default)
            args.append(f"{kind} {p.name}{default}")
        if num_outputs == 0:
            rets = "Tensor[]"
        elif num_outputs == 1:
            rets = "Tensor"
        else:
            rets = "(" + ", ".join(["Tensor"] * num_outputs) + ")"
        return "(" + ", ".join(args) + ") -> " + rets

    def _split(self, args: tuple) -> tuple[list[torch.Tensor], tuple]:
        n = len(self.tensor_names)
        return list(args[:n]), tuple(args[n:])

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._op(*args, **kwargs)

    def register_autograd(self, backward: Callable, setup_context: Callable | None = None) -> None:
        """Replaces the derived backward (see torch.library.register_autograd)."""
        self._op.register_autograd(backward, setup_context=setup_context)

    # ---- export
    def _closed(self, statics: tuple) -> Callable:
        names = [p.name for p in self.static]
        kw = dict(zip(names, statics))
        fn = self.fn
        return lambda *tensors: fn(**dict(zip(self.tensor_names, tensors)), **kw)

    def _entry(self, tensors: list[torch.Tensor], statics: tuple) -> _Entry:
        # A symbolic size (torch.compile's dynamic shapes) is specialized here:
        # an export has static shapes, so each size is its own program.
        inputs = tuple((tuple(int(d) for d in t.shape), t.dtype) for t in tensors)
        entry = self._entries.get((inputs, statics))
        if entry is None:
            entry = self._export(inputs, statics)
            self._entries[(inputs, statics)] = entry
        return entry

    def _export(self, inputs: tuple, statics: tuple) -> _Entry:
        """Exports for (shape, dtype) inputs and registers the result natively."""
        jax, export = _state["jax"], _state["export"]
        _install_translator()
        for _, dtype in inputs:
            if dtype not in _ELEMENT:
                raise TypeError(f"{self.qualname}: no JAX dtype for {dtype}")
        specs = [jax.ShapeDtypeStruct(shape, _ELEMENT[dtype][0]) for shape, dtype in inputs]
        platform = _platform()
        try:
            with jax.enable_x64(True):
                exported = export.export(
                    jax.jit(self._closed(statics), keep_unused=True), platforms=[platform]
                )(*specs)
        except Exception as e:
            shapes = ", ".join(f"{shape} {dtype}" for shape, dtype in inputs)
            raise RuntimeError(
                f"{self.qualname}: JAX could not export it for the '{platform}' platform "
                f"with inputs {shapes}: {e}"
            ) from e
        if exported.ordered_effects or exported.unordered_effects:
            raise RuntimeError(f"{self.qualname}: JAX functions with side effects cannot run here")
        outs = [(tuple(a.shape), _FROM_JAX.get(str(a.dtype))) for a in exported.out_avals]
        for shape, dtype in outs:
            if dtype is None:
                raise TypeError(f"{self.qualname}: an output has a dtype torch lacks")
        if self.num_outputs and len(outs) != self.num_outputs:
            raise RuntimeError(
                f"{self.qualname}: returned {len(outs)} outputs, defined with "
                f"num_outputs={self.num_outputs}"
            )
        text = exported.mlir_module()
        calls = set(re.findall(r'custom_call @([\w$.]+)|call_target_name = "([^"]+)"', text))
        targets = sorted({a or b for a, b in calls})
        if platform == "cpu" and targets:
            what = "; ".join(
                f"'{t}' ({_FOREIGN_CALLS.get(t, 'a JAX runtime kernel')})" for t in targets
            )
            raise RuntimeError(
                f"{self.qualname}: the exported program calls custom call {what}, which the "
                "XLA:CPU PJRT plugin cannot run. Pallas kernels run on CPU with "
                "pallas_call(..., interpret=True); jnp.linalg routines call LAPACK through "
                "JAX's own runtime: use torch for those."
            )
        prefix, callee, body = _inline_text(self.qualname, text)
        key = int.from_bytes(hashlib.sha256(body.encode()).digest()[:8], "little") >> 1
        _names[prefix] = self.qualname
        _C._register_external(
            key,
            self.qualname,
            callee,
            body,
            [(_ELEMENT[dtype][1], list(shape)) for shape, dtype in inputs],
            [(_ELEMENT[d][1], list(s)) for s, d in outs],
        )
        return _Entry(key, outs)

    # ---- kernels
    def _wrap(self, outs: list[torch.Tensor]) -> Any:
        if self.num_outputs == 0:
            return list(outs)
        return outs[0] if self.num_outputs == 1 else tuple(outs)

    def _impl(self, *args: Any) -> Any:
        tensors, statics = self._split(args)
        if tensors and tensors[0].device.type == "cpu":
            return self._wrap(self._run_on_host(tensors, statics))
        entry = self._entry(tensors, statics)
        return self._wrap(list(torch.ops.torchtpu.jax_call(tensors, entry.key)))

    def _run_on_host(self, tensors: list[torch.Tensor], statics: tuple) -> list[torch.Tensor]:
        jax = _state["jax"]
        import numpy as np

        with jax.enable_x64(True):
            arrays = [_to_jax(t) for t in tensors]
            outs = jax.jit(self._closed(statics))(*arrays)
        leaves = jax.tree_util.tree_leaves(outs)
        return [_from_jax(np.asarray(x), x.dtype) for x in leaves]

    def _fake(self, *args: Any) -> Any:
        tensors, statics = self._split(args)
        entry = self._entry(tensors, statics)
        device = tensors[0].device if tensors else torch.device("tpu")
        return self._wrap([torch.empty(s, dtype=d, device=device) for s, d in entry.outs])

    # ---- backward derived with jax.vjp
    def _register_vjp(self) -> None:
        n_out = self.num_outputs
        fwd = self.fn
        tensor_names, static_names = self.tensor_names, [p.name for p in self.static]

        def vjp_fn(**kw: Any) -> list:
            jax = _state["jax"]
            primals = [kw.pop(n) for n in tensor_names]
            cts = [kw.pop(f"grad_{k}") for k in range(n_out)]
            diff = [i for i, p in enumerate(primals) if _differentiable(p.dtype)]

            def f(*d: Any) -> Any:
                full = list(primals)
                for i, v in zip(diff, d):
                    full[i] = v
                return fwd(**dict(zip(tensor_names, full)), **kw)

            try:
                out, pull = jax.vjp(f, *[primals[i] for i in diff])
            except Exception as e:
                raise RuntimeError(
                    f"{self.qualname}: JAX cannot differentiate this function ({e}); give the "
                    "op a backward with op.register_autograd(...) (e.g. another jax_op), or "
                    "define it with autograd=False"
                ) from e
            leaves, tree = jax.tree_util.tree_flatten(out)
            cts = [c if _differentiable(o.dtype) else _float0_zeros(o) for c, o in zip(cts, leaves)]
            return list(pull(jax.tree_util.tree_unflatten(tree, cts)))

        params = [
            inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in tensor_names
        ]
        params += [
            inspect.Parameter(f"grad_{k}", inspect.Parameter.POSITIONAL_OR_KEYWORD)
            for k in range(n_out)
        ]
        params += [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in self.static]
        vjp_fn.__signature__ = inspect.Signature(params)
        self.vjp_op = JaxOp(self.qualname + "_vjp", vjp_fn, static_names, 0, autograd=False)

        def setup_context(ctx: Any, inputs: tuple, output: Any) -> None:
            tensors, statics = self._split(inputs)
            ctx.save_for_backward(*tensors)
            ctx.statics = statics

        def backward(ctx: Any, *grads: Any) -> tuple:
            tensors = list(ctx.saved_tensors)
            outs = self._entry(tensors, ctx.statics).outs
            grads = [
                g if g is not None else torch.zeros(s, dtype=d, device=tensors[0].device)
                for g, (s, d) in zip(grads, outs)
            ]
            res = self.vjp_op(*tensors, *grads, **dict(zip(static_names, ctx.statics)))
            it = iter(res)
            per_input = [next(it) if _differentiable(t.dtype) else None for t in tensors]
            return (*per_input, *([None] * len(ctx.statics)))

        self._op.register_autograd(backward, setup_context=setup_context)


def _static_kind(p: inspect.Parameter) -> str | None:
    ann = p.annotation
    if isinstance(ann, str):  # `from __future__ import annotations`
        ann = {"int": int, "float": float, "bool": bool, "str": str}.get(ann)
    if ann in _STATIC_TYPES:
        return _STATIC_TYPES[ann]
    return _STATIC_TYPES.get(type(p.default)) if p.default is not p.empty else None


def _differentiable(dtype: Any) -> bool:
    name = str(dtype).replace("torch.", "")
    return name.startswith(("float", "bfloat", "complex"))


def _float0_zeros(x: Any) -> Any:
    import numpy as np

    return np.zeros(x.shape, dtype=_state["jax"].dtypes.float0)


def _to_jax(t: torch.Tensor) -> Any:
    jnp = _state["jax"].numpy
    if t.dtype == torch.bfloat16:
        return jnp.asarray(t.detach().float().numpy()).astype(jnp.bfloat16)
    return jnp.asarray(t.detach().resolve_conj().numpy())


def _from_jax(a: Any, dtype: Any) -> torch.Tensor:
    if str(dtype) == "bfloat16":
        return torch.from_numpy(a.astype("float32")).to(torch.bfloat16)
    return torch.from_numpy(a.copy())


def _default_text(v: Any) -> str:
    if isinstance(v, bool):
        return "True" if v else "False"
    if isinstance(v, str):
        return '"' + v + '"'
    return repr(v)


def jax_op(
    name: str,
    fn: Callable | None = None,
    *,
    static_argnames: Sequence[str] = (),
    num_outputs: int = 1,
    autograd: bool = True,
) -> Any:
    """Defines the PyTorch op ``name`` ("namespace::op") from the JAX function
    ``fn``. Tensor arguments come first; the others are static (int, float, bool
    or str: part of the op's key, baked into the program): those named in
    ``static_argnames`` and those annotated or defaulted with such a type.
    ``num_outputs`` > 1 returns a tuple. With ``autograd`` the backward is a
    second op derived with ``jax.vjp``; ``op.register_autograd`` replaces it.
    Without ``fn``, returns a decorator."""
    if fn is None:
        return lambda f: JaxOp(name, f, static_argnames, num_outputs, autograd)
    return JaxOp(name, fn, static_argnames, num_outputs, autograd)
