"""Op conformance against PyTorch's own OpInfo database.

Every ``op_db`` entry's sample inputs run on ``tpu`` and on the CPU and the results are
compared: forward for each dtype the op supports among ``DTYPES``, backward (gradients of every
differentiable tensor input under a fixed random cotangent) for float32.  A sample that raises
``NotImplementedError`` (no tpu lowering) is rerun with ``TORCHTPU_CPU_FALLBACK=1`` to tell
"fallback" from "unsupported".

This module holds the in-process part (``run_op``); ``run.py`` drives it from worker
subprocesses so a crash or a hang only costs one op, and renders ``docs/OP_COVERAGE.md``.
"""

from __future__ import annotations

import inspect
import itertools
import math
import os
import signal
import unittest
from collections.abc import Callable

DEVICE = "tpu"
FALLBACK_ENV = "TORCHTPU_CPU_FALLBACK"

# Environment variables that change the backend's behaviour: the sweep runs with none of
# them set (the fallback one is set only around the fallback reruns).
BACKEND_ENV = (
    "TORCHTPU_CPU_FALLBACK",
    "TORCHTPU_EAGER",
    "TPU_LAUNCH_BLOCKING",
    "TORCHTPU_CHECK_NANS",
    "TORCHTPU_NUM_DEVICES",
    "TORCHTPU_DIST_TIMEOUT",
    "TORCH_DISTRIBUTED_DEBUG",
    "TORCHTPU_PJRT_PLUGIN",
    "TORCHTPU_PLATFORM",
    "TORCH_TPU_DEFER_AND_FUSE",
    "TORCHTPU_FUSED_MAX_OPS",
    "TORCHTPU_DEBUG_FUSION",
    "TORCHTPU_DUMP_FUSED",
    "TORCHTPU_FUSED_DONATE",
    "TORCHTPU_STRICT_DONATE",
    "TORCHTPU_TIERED_COMPILE",
    "TORCHTPU_TIER_UP_RUNS",
    "TORCHTPU_COMPILE_THREADS",
    "TORCHTPU_SMALL_QUICK",
    "TORCHTPU_ASYNC_COMPILE",
    "TORCHTPU_HOST_CHURN",
    "TORCHTPU_EAGER_BUCKETS",
)
# Set for every op test: the device lowerings are under test, so small integer
# ops whose shapes change run on the device, not on the host (see host_ops.h),
# and ops at changing sizes at those sizes, not bucketed (bucketed.h).
OP_TEST_ENV = {"TORCHTPU_HOST_CHURN": "0", "TORCHTPU_EAGER_BUCKETS": "0"}

DTYPE_NAMES = ("float32", "bfloat16", "float16", "int64", "int32", "bool", "complex64")
SHORT = {
    "float32": "f32",
    "bfloat16": "bf16",
    "float16": "f16",
    "int64": "i64",
    "int32": "i32",
    "bool": "bool",
    "complex64": "c64",
}

# Default caps: the first N samples per op and dtype, inputs up to MAX_NUMEL elements.
MAX_SAMPLES = 4
MAX_NUMEL = 100_000

# assert_close tolerances by the dtype of the compared tensor (rtol, atol).  float32 is
# torch.testing's default; half types follow the (1.6e-2, 1e-2).
TOLERANCES = {
    "float32": (1.3e-6, 1e-5),
    "complex64": (1.3e-6, 1e-5),
    "float64": (1e-7, 1e-7),
    "complex128": (1e-7, 1e-7),
    "bfloat16": (1.6e-2, 1e-2),
    "float16": (1.6e-2, 1e-2),
}
# Gradients go through a longer chain of ops than the forward: float32 backward uses this.
BACKWARD_F32_TOL = (1e-5, 1e-5)

# A representative subset (common ops of real models); `run.py --subset` and
# tests/python/test_conformance_subset.py run exactly these.
SUBSET = (
    "add",
    "sub",
    "mul",
    "div.no_rounding_mode",
    "neg",
    "abs",
    "exp",
    "log",
    "sqrt",
    "rsqrt",
    "pow",
    "tanh",
    "sigmoid",
    "clamp",
    "where",
    "masked_fill",
    "sum",
    "mean",
    "amax",
    "argmax",
    "cumsum",
    "matmul",
    "mm",
    "bmm",
    "addmm",
    "nn.functional.linear",
    "softmax",
    "log_softmax",
    "nn.functional.layer_norm",
    "nn.functional.relu",
    "nn.functional.gelu",
    "nn.functional.silu",
    "nn.functional.embedding",
    "nn.functional.cross_entropy",
    "cat",
    "stack",
    "index_select",
    "gather",
    "transpose",
    "permute",
    "reshape",
    "expand",
    "unsqueeze",
    "triu",
)


# --------------------------------------------------------------------------- loading


def signal_name(rc: int) -> str:
    """How a child process ended, from its return code."""
    if rc < 0:
        try:
            return signal.Signals(-rc).name
        except ValueError:
            return f"signal {-rc}"
    return f"exit status {rc}"


def op_key(op) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def load_ops() -> tuple[dict, dict]:
    """(ops, excluded): ``op_db`` entries by key, and the excluded ones with the reason."""
    import torch
    from torch.testing._internal.common_methods_invocations import op_db

    ours = {getattr(torch, d) for d in DTYPE_NAMES}
    ops, excluded = {}, {}
    for op in op_db:
        key = op_key(op)
        dtypes = op.supported_dtypes("cpu")
        if "sparse" in op.name:
            excluded[key] = "sparse"
        elif "quantized" in op.name:
            excluded[key] = "quantized"
        elif not dtypes:
            excluded[key] = "no CPU kernel (CUDA-only entry)"
        elif op.name.startswith("jiterator_"):
            excluded[key] = "CUDA-only (jiterator)"
        elif key == "as_strided.partial_views":
            # Views into a larger base storage: a device copy of the view does not keep the
            # base, so the strides point outside it (an expected failure of test_compare_cpu).
            excluded[key] = "storage-layout dependent (expected failure of test_compare_cpu)"
        elif not dtypes & ours:
            excluded[key] = (
                "no tested dtype (" + ", ".join(sorted(str(d)[6:] for d in dtypes)) + ")"
            )
        else:
            ops[key] = op
    return ops, excluded


# Random ops op_db does not mark as such for test_compare_cpu (their samples draw values).
RANDOM_OPS = {
    "normal",
    "bernoulli",
    "multinomial",
    "uniform",
    "rand",
    "randn",
    "randint",
    "randperm",
    "nn.functional.alpha_dropout",
}

# Ops whose tensor arguments (besides the input) must stay on the CPU.
CPU_ARGS_OPS = {"tensor_split"}


def tolerance_overrides(op) -> dict:
    """{dtype name: (rtol, atol)}: the loosest toleranceOverride PyTorch's own TestCommon
    tests apply to this op on the CPU (or any device), e.g. addbmm float32 1.3e-5."""
    out: dict[str, tuple[float, float]] = {}
    for info in op.decorators:
        if getattr(info, "cls_name", None) != "TestCommon":
            continue
        if getattr(info, "device_type", None) not in (None, "cpu"):
            continue
        if "mps" in (getattr(info, "test_name", "") or ""):
            continue
        for dec in getattr(info, "decorators", ()):
            for dtype, t in (getattr(dec, "d", None) or {}).items():
                name = str(dtype).replace("torch.", "")
                r, a = out.get(name, (0.0, 0.0))
                out[name] = (max(r, t.rtol), max(a, t.atol))
    return out


def _unchecked_values_reason(op) -> str | None:
    """PyTorch's own CPU-vs-device test (TestCommon.test_compare_cpu) skips ops whose values
    are random, uninitialised or undefined; for those only shape, dtype and device are
    compared.  Returns the reason, or None when values are compared."""
    if op.name.startswith(("empty", "new_empty")):
        return "uninitialised memory"
    for info in op.decorators:
        if getattr(info, "test_name", None) != "test_compare_cpu":
            continue
        if getattr(info, "device_type", None) not in (None, "cpu", DEVICE):
            continue
        for dec in getattr(info, "decorators", ()):
            try:
                reason = inspect.getclosurevars(dec).nonlocals.get("reason")
            except (TypeError, ValueError):
                reason = None
            if isinstance(reason, str) and ("non-deterministic" in reason or "undefined" in reason):
                if "dropout_p > 0" in reason:
                    return None  # checked per sample (see _sample_is_random)
                return reason
    if op.name in RANDOM_OPS:
        return "output is non-deterministic"
    return None


def _sample_is_random(op, sample) -> bool:
    if op.name == "nn.functional.scaled_dot_product_attention":
        p = sample.kwargs.get("dropout_p", 0.0)
        return bool(p) and p > 0
    return False


# --------------------------------------------------------------------------- helpers


def _tree_map(fn, tree):
    import torch.utils._pytree as pytree

    return pytree.tree_map(fn, tree)


def _leaves(tree) -> list:
    import torch.utils._pytree as pytree

    return pytree.tree_leaves(tree)


def _to_device(x):
    import torch

    if isinstance(x, torch.Tensor):
        t = x.detach().to(DEVICE)
        return t.requires_grad_(x.requires_grad) if x.requires_grad else t
    if isinstance(x, torch.device) and x.type == "cpu":
        return torch.device(DEVICE)
    if isinstance(x, str) and x == "cpu":
        return DEVICE
    return x


def _move_args(op, args):
    if op.name in CPU_ARGS_OPS:
        return _tree_map(lambda x: x if hasattr(x, "device") else _to_device(x), args)
    return _tree_map(_to_device, args)


def _detach_leaf(x):
    import torch

    if isinstance(x, torch.Tensor):
        return x.detach().requires_grad_(x.requires_grad) if x.requires_grad else x
    return x


def _move_kwargs(kwargs: dict) -> dict:
    out = _tree_map(_to_device, kwargs)
    if out.get("device") == "cpu":
        out["device"] = DEVICE
    return out


def _numel(sample) -> int:
    import torch

    leaves = _leaves((sample.input, sample.args, sample.kwargs))
    return sum(t.numel() for t in leaves if isinstance(t, torch.Tensor))


def _one_line(text: str, limit: int = 150) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _describe_error(e: BaseException) -> str:
    msg = str(e)
    if isinstance(e, AssertionError):
        keep = [
            ln.strip()
            for ln in msg.splitlines()
            if ln.strip().startswith(("Mismatched", "Greatest", "The values", "mismatch"))
        ]
        first = msg.strip().splitlines()[0] if msg.strip() else "assertion failed"
        msg = "; ".join(keep[:2]) if keep else first
        return _one_line("mismatch: " + msg, 400)
    msg = msg.split("Exception raised from")[0]
    if "[tpu]" in msg:
        # The backend's own message (it may span lines when it prints a tensor argument).
        line = msg[msg.index("[tpu]") :]
    else:
        lines = [ln for ln in msg.splitlines() if ln.strip()]
        line = lines[0] if lines else ""
    return _one_line(f"{type(e).__name__}: {line}", 400)


def _tolerance(dtype, backward: bool, overrides: dict | None = None) -> tuple[float, float]:
    name = str(dtype).replace("torch.", "")
    rtol, atol = TOLERANCES.get(name, (0.0, 0.0))
    if backward and name == "float32":
        rtol, atol = BACKWARD_F32_TOL
    if overrides and name in overrides:
        rtol, atol = max(rtol, overrides[name][0]), max(atol, overrides[name][1])
    return rtol, atol


class Mismatch(AssertionError):
    """A tpu result that differs from the CPU's."""


def compare(
    actual, expected, *, backward: bool = False, values: bool = True, tol: dict | None = None
) -> None:
    """Raises AssertionError unless the tpu result ``actual`` matches the CPU ``expected``:
    same structure, tensors on tpu with the same dtype and shape and (when ``values``) close
    values (tolerance by dtype, loosened by ``tol`` {dtype name: (rtol, atol)}, NaNs equal).
    ``None`` gradients equal zeros."""
    import torch

    exp_leaves, act_leaves = _leaves(expected), _leaves(actual)
    if len(exp_leaves) != len(act_leaves):
        raise AssertionError(f"mismatch: {len(act_leaves)} outputs, expected {len(exp_leaves)}")
    for i, (a, e) in enumerate(zip(act_leaves, exp_leaves)):
        if backward and (a is None) != (e is None):
            a = torch.zeros_like(e) if a is None else a
            e = torch.zeros_like(a, device="cpu") if e is None else e
        if isinstance(e, torch.Tensor):
            if not isinstance(a, torch.Tensor):
                raise Mismatch(f"mismatch: output {i} is {type(a).__name__}, expected a tensor")
            if a.device.type != DEVICE:
                raise AssertionError(f"mismatch: output {i} is on {a.device}, expected {DEVICE}")
            a = a.detach().cpu()
            e = e.detach()
            if a.dtype != e.dtype or a.shape != e.shape:
                raise AssertionError(
                    f"mismatch: output {i} is {a.dtype}{list(a.shape)}, "
                    f"expected {e.dtype}{list(e.shape)}"
                )
            if values:
                rtol, atol = _tolerance(e.dtype, backward, tol)
                torch.testing.assert_close(
                    a, e, rtol=rtol, atol=atol, equal_nan=True, check_stride=False
                )
        elif isinstance(e, float) and values:
            if not isinstance(a, (float, int)) or not (
                a == e or abs(a - e) <= 1e-5 + 1e-5 * abs(e) or (math.isnan(a) and math.isnan(e))
            ):
                raise AssertionError(f"mismatch: output {i} is {a!r}, expected {e!r}")
        elif values and a != e and not isinstance(e, float):
            raise AssertionError(f"mismatch: output {i} is {a!r}, expected {e!r}")


def _metrics() -> dict:
    import torchtpu

    return torchtpu.metrics()


def _delta(before: dict, after: dict, kind: str = "fallback") -> tuple[int, dict]:
    """Calls (and calls per op) of kind "fallback" or "decomposed" between two metrics."""
    ops = {}
    for name, n in after[f"{kind}_ops"].items():
        d = n - before[f"{kind}_ops"].get(name, 0)
        if d:
            ops[name] = d
    return sum(ops.values()), ops


class _Fallback:
    """Sets TORCHTPU_CPU_FALLBACK=1 for the block (the backend reads it at every op)."""

    def __enter__(self):
        os.environ[FALLBACK_ENV] = "1"

    def __exit__(self, *exc):
        os.environ.pop(FALLBACK_ENV, None)


# --------------------------------------------------------------------------- samples


def _samples(op, dtype, requires_grad: bool, cap: int, max_numel: int) -> tuple[list, int]:
    """The first ``cap`` samples with at most ``max_numel`` input elements, and how many
    larger ones were skipped on the way."""
    import torch

    torch.manual_seed(0)
    out, large = [], 0
    gen = op.sample_inputs("cpu", dtype, requires_grad=requires_grad)
    for sample in itertools.islice(gen, cap * 8):
        if _numel(sample) > max_numel:
            large += 1
            continue
        out.append(sample)
        if len(out) >= cap:
            break
    return out, large


class CpuError(Exception):
    """The CPU reference itself raised: the sample is not counted."""


def _forward(op, sample, values: bool) -> bool:
    """Runs one sample on CPU and tpu and compares (raises on failure)."""
    import torch

    torch.manual_seed(0)
    try:
        expected = op(sample.input, *sample.args, **sample.kwargs)
    except Exception as e:
        raise CpuError(str(e)) from e
    inp = _tree_map(_to_device, sample.input)
    args = _move_args(op, sample.args)
    kwargs = _move_kwargs(sample.kwargs)
    torch.manual_seed(0)
    actual = op(inp, *args, **kwargs)
    values = values and not _sample_is_random(op, sample)
    compare(actual, expected, values=values, tol=tolerance_overrides(op))
    return True


def _grads(op, sample, to_dev: bool, cotangent_seed: int):
    """(outputs, gradients) of the sample's differentiable inputs under a fixed random
    cotangent, on the CPU or (``to_dev``) on tpu.  None when nothing is differentiable."""
    import torch

    conv = _to_device if to_dev else _detach_leaf
    inp = _tree_map(conv, sample.input)
    args = _move_args(op, sample.args) if to_dev else _tree_map(conv, sample.args)
    kwargs = _move_kwargs(sample.kwargs) if to_dev else _tree_map(conv, sample.kwargs)
    leaves = [
        t for t in _leaves((inp, args, kwargs)) if isinstance(t, torch.Tensor) and t.requires_grad
    ]
    if not leaves:
        return None
    torch.manual_seed(0)
    out = op(inp, *args, **kwargs)
    out = sample.output_process_fn_grad(out)
    outs = [
        t
        for t in _leaves(out)
        if isinstance(t, torch.Tensor)
        and t.requires_grad
        and (t.dtype.is_floating_point or t.dtype.is_complex)
    ]
    if not outs:
        return None
    g = torch.Generator().manual_seed(cotangent_seed)
    cots = [torch.randn(o.shape, generator=g, dtype=o.dtype) for o in outs]
    if to_dev:
        cots = [c.to(DEVICE) for c in cots]
    grads = torch.autograd.grad(outs, leaves, cots, allow_unused=True)
    return outs, list(grads)


def _backward(op, sample, values: bool) -> bool:
    """Compares tpu and CPU gradients of one sample; False when the sample has nothing to
    differentiate (not counted)."""
    try:
        expected = _grads(op, sample, False, 1234)
    except Exception as e:
        raise CpuError(str(e)) from e
    if expected is None:
        return False
    actual = _grads(op, sample, True, 1234)
    if actual is None:
        raise Mismatch("mismatch: no differentiable output on tpu")
    values = values and not _sample_is_random(op, sample)
    tol = tolerance_overrides(op)
    compare(actual[0], expected[0], values=values, tol=tol)
    compare(actual[1], expected[1], backward=True, values=values, tol=tol)
    return True


# --------------------------------------------------------------------------- one op


def _new_phase() -> dict:
    return {
        "total": 0,
        "passed": 0,  # native (no fallback) and matching the CPU
        "fallback_passed": 0,  # NotImplemented natively, matching with the CPU fallback
        "unsupported": 0,  # NotImplemented natively and failing even with the fallback
        "mismatch": 0,
        "error": 0,
        "large_skipped": 0,
        "first_failure": None,
    }


def _run_phase(op, dtype_name, backward, cap, max_numel, values, stage, fallback_ops) -> dict:
    import torch

    dtype = getattr(torch, dtype_name)
    rec = _new_phase()
    tag = ("bwd " if backward else "fwd ") + SHORT[dtype_name]
    try:
        samples, rec["large_skipped"] = _samples(op, dtype, backward, cap, max_numel)
    except unittest.SkipTest:
        return rec
    except Exception as e:  # noqa: BLE001 - a broken sample generator is a result too
        rec["error_samples"] = _describe_error(e)
        return rec
    run = _backward if backward else _forward

    def fail(kind, i, e):
        rec[kind] += 1
        if rec["first_failure"] is None:
            rec["first_failure"] = f"{tag} #{i}: {_describe_error(e)}"

    for i, sample in enumerate(samples):
        stage(f"{tag} sample {i}")
        before = _metrics()
        try:
            counted = run(op, sample, values)
        except NotImplementedError as e:
            rec["total"] += 1
            native_error = e
        except AssertionError as e:
            rec["total"] += 1
            fail("mismatch", i, e)
            continue
        except (unittest.SkipTest, CpuError):
            rec["cpu_skipped"] = rec.get("cpu_skipped", 0) + 1
            continue
        except Exception as e:  # noqa: BLE001
            rec["total"] += 1
            fail("error", i, e)
            continue
        else:
            if counted is False:
                continue
            rec["total"] += 1
            after = _metrics()
            fb, _ = _delta(before, after)
            if fb:  # the fallback ran although it was off: not native
                fail("error", i, RuntimeError(f"{fb} CPU fallback(s) with the fallback off"))
            else:
                rec["passed"] += 1
                # on the device, through a torch._decomp decomposition of a rule-less op
                if _delta(before, after, "decomposed")[0]:
                    rec["decomposed"] = rec.get("decomposed", 0) + 1
            continue
        # NotImplemented natively: rerun with the CPU fallback on.
        before = _metrics()
        try:
            with _Fallback():
                run(op, sample, values)
        except NotImplementedError as e:
            fail("unsupported", i, native_error)
            rec.setdefault("fallback_failure", f"{tag} #{i}: {_describe_error(e)}")
        except Exception as e:  # noqa: BLE001 - ran through the fallback, but wrong
            rec["fallback_failed"] = rec.get("fallback_failed", 0) + 1
            fail("mismatch" if isinstance(e, AssertionError) else "error", i, native_error)
            rec.setdefault("fallback_failure", f"{tag} #{i}: {_describe_error(e)}")
        else:
            rec["fallback_passed"] += 1
            if rec["first_failure"] is None:
                rec["first_failure"] = f"{tag} #{i}: {_describe_error(native_error)}"
        _, ops = _delta(before, _metrics())
        for name, n in ops.items():
            fallback_ops[name] = fallback_ops.get(name, 0) + n
    return rec


def plan(op, dtypes: tuple[str, ...] = DTYPE_NAMES, backward: bool = True) -> list[str]:
    """The phases an op gets: "fwd <dtype>" for every dtype of ``dtypes`` it supports on the
    CPU, then "bwd float32" when it supports autograd and float32."""
    import torch

    supported = op.supported_dtypes("cpu")
    keys = [f"fwd {d}" for d in dtypes if getattr(torch, d) in supported]
    if backward and op.supports_autograd and torch.float32 in supported:
        keys.append("bwd float32")
    return keys


def run_op(
    op,
    dtypes: tuple[str, ...] = DTYPE_NAMES,
    backward: bool = True,
    cap: int = MAX_SAMPLES,
    max_numel: int = MAX_NUMEL,
    emit: Callable[[dict], None] = lambda msg: None,
) -> dict:
    """Runs one OpInfo: forward for every supported dtype in ``dtypes``, float32 backward
    when the op supports autograd.  ``emit`` gets progress events ("start", "stage",
    "phase") so a driver keeps partial results if the process dies.  Returns
    {"supported": [...], "phases": {"fwd float32": {...}, ...}, "fallback_ops": {...},
    "values_unchecked": reason or None}."""
    unchecked = _unchecked_values_reason(op)
    keys = plan(op, dtypes, backward)
    result = {
        "supported": keys,
        "phases": {},
        "fallback_ops": {},
        "values_unchecked": unchecked,
    }
    emit({"event": "start", "supported": keys, "values_unchecked": unchecked})
    for key in keys:
        kind, dtype_name = key.split()
        rec = _run_phase(
            op,
            dtype_name,
            kind == "bwd",
            cap,
            max_numel,
            unchecked is None,
            lambda s: emit({"event": "stage", "stage": s}),
            result["fallback_ops"],
        )
        result["phases"][key] = rec
        emit({"event": "phase", "key": key, "rec": rec, "fallback_ops": result["fallback_ops"]})
    os.environ.pop(FALLBACK_ENV, None)
    return result


# --------------------------------------------------------------------------- classification


def classify(rec: dict) -> str:
    """The op's status from a run record:

    - crash / timeout: the worker died or ran out of time (set by the driver);
    - no-samples: no sample ran (none generated, or all too large);
    - unsupported: a sample raised NotImplementedError, with the CPU fallback too;
    - fallback: a sample raised NotImplementedError and ran with the CPU fallback;
    - error: no fallback needed, but every forward sample of the primary dtype raised;
    - decomposed: everything ran on the device, some of it through ``torch._decomp``
      decompositions of ops without a rule;
    - native: everything ran on the device (samples may still mismatch: see the counts).
    """
    if rec.get("status") in ("crash", "timeout"):
        return rec["status"]
    phases = rec.get("phases", {})
    if not any(p["total"] for p in phases.values()):
        return "no-samples"
    if any(p["unsupported"] for p in phases.values()):
        return "unsupported"
    if any(p["fallback_passed"] or p.get("fallback_failed") for p in phases.values()):
        return "fallback"
    prim = phases.get(f"fwd {primary_dtype(rec)}")
    if prim and prim["total"] and prim["error"] == prim["total"]:
        return "error"
    if any(p.get("decomposed") for p in phases.values()):
        return "decomposed"
    return "native"


def primary_dtype(rec: dict) -> str | None:
    """float32 when the op supports it, else its first supported dtype among DTYPE_NAMES."""
    for d in DTYPE_NAMES:
        if f"fwd {d}" in rec.get("supported", []):
            return d
    return None


def phase_ok(p: dict | None) -> bool:
    """Every sample ran natively and matched (and there was at least one)."""
    return bool(p) and p["total"] > 0 and p["passed"] == p["total"]
