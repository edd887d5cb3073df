"""Foreach ops (``torch._foreach_*``: optimizers, gradient clipping) on tpu against
the CPU, in every eager mode. Each call is one tpu op lowered through the rule of its
per-element op, not PyTorch's loop of one op call per tensor."""

from __future__ import annotations

import pytest
import torch
import torchtpu
from conftest import assert_tpu_close, check_py
from torch.testing._internal.common_methods_invocations import (
    foreach_binary_op_db,
    foreach_other_op_db,
    foreach_pointwise_op_db,
    foreach_reduce_op_db,
    foreach_unary_op_db,
)

OPS = (
    foreach_unary_op_db
    + foreach_binary_op_db
    + foreach_pointwise_op_db
    + foreach_reduce_op_db
    + foreach_other_op_db
)
# Functions with poles or steep slopes where float32 results differ in the last bits.
LOOSE = {
    "_foreach_tan",
    "_foreach_lgamma",
    "_foreach_pow",
    "_foreach_sinh",
    "_foreach_cosh",
    "_foreach_mm",
}


def _samples(op, n: int = 4) -> list:
    torch.manual_seed(0)
    out = []
    for s in op.sample_inputs("cpu", torch.float32, num_input_tensors=[3]):
        out.append(s)
        if len(out) == n:
            break
    return out


def _to_tpu(x):
    if isinstance(x, torch.Tensor):
        return x.to("tpu")
    if isinstance(x, (list, tuple)):
        return type(x)(_to_tpu(e) for e in x)
    if isinstance(x, dict):
        return {k: _to_tpu(v) for k, v in x.items()}
    return x


def _clone(x):
    if isinstance(x, torch.Tensor):
        return x.clone()
    if isinstance(x, (list, tuple)):
        return type(x)(_clone(e) for e in x)
    return x


@pytest.mark.parametrize("op", OPS, ids=lambda o: o.name)
def test_foreach_matches_cpu(op, eager):
    tol = {"rtol": 1e-4, "atol": 1e-4} if op.name in LOOSE else {"rtol": 1e-5, "atol": 1e-5}
    tol["equal_nan"] = True
    variants = [("out", op.op)] + ([("inplace", op.inplace_variant)] if op.inplace_variant else [])
    for s in _samples(op):
        for how, fn in variants:
            cpu_in = _clone(s.input)
            tpu_in = _to_tpu(s.input)
            try:
                expected = fn(cpu_in, *s.args, **s.kwargs)
            except (RuntimeError, TypeError, ValueError, IndexError) as e:  # tpu must fail alike
                with pytest.raises(type(e)):
                    fn(tpu_in, *_to_tpu(s.args), **_to_tpu(s.kwargs))
                    torchtpu.flush()
                continue
            got = fn(tpu_in, *_to_tpu(s.args), **_to_tpu(s.kwargs))
            if how == "inplace":
                assert_tpu_close(tpu_in, cpu_in, **tol)
            else:
                assert_tpu_close(got, expected, **tol)


ONE_CALL = {
    "mul_": lambda ts, us, c: torch._foreach_mul_(ts, 0.9),
    "lerp_": lambda ts, us, c: torch._foreach_lerp_(ts, us, 0.1),
    "addcmul_": lambda ts, us, c: torch._foreach_addcmul_(ts, us, us, 0.01),
    "sqrt": lambda ts, us, c: torch._foreach_sqrt(us),
    "div_scalar_list": lambda ts, us, c: torch._foreach_div_(ts, [1.0, 2.0, 3.0, 4.0]),
    "add_": lambda ts, us, c: torch._foreach_add_(ts, 1e-8),
    "addcdiv_scalar_list": lambda ts, us, c: torch._foreach_addcdiv_(
        ts, ts, us, [0.1, 0.2, 0.3, 0.4]
    ),
    "norm": lambda ts, us, c: torch._foreach_norm(ts, 2),
    "mul_tensor": lambda ts, us, c: torch._foreach_mul_(ts, c),
}


@pytest.mark.parametrize("name", list(ONE_CALL))
def test_optimizer_foreach_ops_are_one_call(name):
    """The foreach ops of AdamW and clip_grad_norm_ run as one tpu op each."""
    ts = [torch.randn(5, 3, device="tpu") for _ in range(4)]
    us = [t.abs() + 1 for t in ts]
    c = torch.tensor(0.5, device="tpu")
    before = torchtpu.metrics()["ops"]
    ONE_CALL[name](ts, us, c)
    assert torchtpu.metrics()["ops"] - before == 1


def test_scalar_lists_are_runtime_inputs(eager):
    """Adam's per-parameter bias corrections change every step: a Scalar[] is passed
    to the program, never baked into it."""
    ts = [torch.randn(6, device="tpu") for _ in range(3)]
    ref = [t.cpu() for t in ts]
    compiles = None
    for step in range(1, 5):
        scalars = [1.0 / step, 2.0 / step, 3.0 / step]
        torch._foreach_div_(ts, scalars)
        torch._foreach_div_(ref, scalars)
        torchtpu.flush()
        if step == 2:
            compiles = torchtpu.metrics()["compiles"]
    assert torchtpu.metrics()["compiles"] == compiles
    assert_tpu_close(ts, ref)


OUT_VARIANTS = {
    "add.List_out": (
        lambda a, b, out: torch.ops.aten._foreach_add.List_out(a, b, alpha=2.0, out=out)
    ),
    "mul.Scalar_out": (lambda a, b, out: torch.ops.aten._foreach_mul.Scalar_out(a, 0.5, out=out)),
    "div.ScalarList_out": (
        lambda a, b, out: torch.ops.aten._foreach_div.ScalarList_out(a, [2.0, 4.0, 8.0], out=out)
    ),
    "lerp.Scalar_out": (
        lambda a, b, out: torch.ops.aten._foreach_lerp.Scalar_out(a, b, 0.3, out=out)
    ),
}


@pytest.mark.parametrize("name", list(OUT_VARIANTS))
def test_out_variants_write_their_lists(name, eager):
    g = torch.Generator().manual_seed(0)
    a = [torch.randn(4, 3, generator=g) for _ in range(3)]
    b = [torch.randn(4, 3, generator=g) for _ in range(3)]
    out_cpu = [torch.empty(4, 3) for _ in range(3)]
    out_tpu = [t.to("tpu") for t in out_cpu]
    OUT_VARIANTS[name](a, b, out_cpu)
    OUT_VARIANTS[name](_to_tpu(a), _to_tpu(b), out_tpu)
    assert_tpu_close(out_tpu, out_cpu)


def test_pointwise_elements_update_their_storage_as_is(tmp_path):
    """A pointwise foreach op reads and writes each multi-dim element as its
    storage's own rank-1 value: XLA:CPU copies a donated input that a fusion
    updates through a reshape."""
    check_py(
        """
        import torch, torchtpu
        torchtpu.eager_mode("fused")
        # 512 KiB each: smaller elements keep their shape (the copy costs less).
        a = [torch.randn(256, 512, device="tpu"), torch.randn(64, 64, 32, device="tpu")]
        b = [torch.randn(256, 512, device="tpu"), torch.randn(64, 64, 32, device="tpu")]
        want = [x.cpu() + 0.1 * (y.cpu() - x.cpu()) for x, y in zip(a, b)]
        torchtpu.flush()
        torch._foreach_lerp_(a, b, 0.1)
        torchtpu.flush()
        for x, w in zip(a, want):
            torch.testing.assert_close(x.cpu(), w)
        """,
        env={"TORCHTPU_DUMP_FUSED": str(tmp_path), "TORCHTPU_CACHE_DIR": "off"},
    )
    last = max(tmp_path.glob("*.mlir")).read_text()
    assert '"stablehlo.subtract"(%arg2, %arg0) : (tensor<131072xf32>' in last, last[-3000:]
    for shape in ("256x512xf32", "64x64x32xf32"):
        math = [ln for ln in last.splitlines() if "stablehlo.reshape" not in ln and shape in ln]
        assert not math, math
