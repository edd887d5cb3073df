"""torchtpu.jax_op: JAX and Pallas kernels called from PyTorch, against PyTorch
references, in every eager mode and under torch.compile, forward and backward."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
import torch
import torchtpu
from conftest import assert_tpu_close, check_py, tpu
from jax.experimental import pallas as pl
from torchtpu import _jax_op


def _gelu(x):
    return 0.5 * x * (1 + jnp.tanh(0.7978845608 * (x + 0.044715 * x**3)))


def _torch_gelu(x):
    return torch.nn.functional.gelu(x, approximate="tanh")


def _attn(q, k):
    return jax.nn.softmax(q @ k.T / jnp.sqrt(q.shape[-1]), axis=-1)


def _torch_attn(q, k):
    return torch.softmax(q @ k.T / q.shape[-1] ** 0.5, dim=-1)


def _two(x, idx, unused, k: int = 2, scale: float = 1.0):
    return jnp.sort(x, axis=-1)[..., -k:] * scale, jnp.take(x, idx, axis=0).sum(0)


def _axpy_kernel(x_ref, y_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0 + y_ref[...]


def _axpy(x, y):
    out = jax.ShapeDtypeStruct(x.shape, x.dtype)
    return pl.pallas_call(_axpy_kernel, out_shape=out, interpret=True)(x, y)


def _scale_kernel(g_ref, o_ref):
    o_ref[...] = g_ref[...] * 2.0


def _axpy_grad(g):
    out = jax.ShapeDtypeStruct(g.shape, g.dtype)
    return pl.pallas_call(_scale_kernel, out_shape=out, interpret=True)(g)


GELU = torchtpu.jax_op("ttest::gelu", _gelu)
ATTN = torchtpu.jax_op("ttest::attn", _attn)
TWO = torchtpu.jax_op("ttest::two", _two, static_argnames=("k", "scale"), num_outputs=2)
AXPY = torchtpu.jax_op("ttest::axpy", _axpy)
AXPY_GRAD = torchtpu.jax_op("ttest::axpy_grad", _axpy_grad, autograd=False)
AXPY.register_autograd(lambda ctx, g: (AXPY_GRAD(g), g))

# (name, op, torch reference, input shapes)
CASES = [
    ("elementwise", GELU, _torch_gelu, [(4, 7)]),
    ("matmul_softmax", ATTN, _torch_attn, [(5, 16), (6, 16)]),
    ("pallas_interpret", AXPY, lambda x, y: 2 * x + y, [(8, 128), (8, 128)]),
]


def _check(op, ref_fn, shapes, run=lambda f, *a: f(*a)):
    inputs = [torch.randn(s, requires_grad=True) for s in shapes]
    dev = [tpu(t) for t in inputs]
    ref, out = ref_fn(*inputs), run(op, *dev)
    assert_tpu_close(out, ref)
    cot = torch.randn(ref.shape)
    ref_g = torch.autograd.grad(ref, inputs, cot)
    dev_g = torch.autograd.grad(out, dev, cot.to("tpu"))
    assert_tpu_close(list(dev_g), list(ref_g))


@pytest.mark.parametrize("name,op,ref_fn,shapes", CASES, ids=[c[0] for c in CASES])
def test_eager_forward_backward(eager, name, op, ref_fn, shapes):
    _check(op, ref_fn, shapes)


@pytest.mark.parametrize("name,op,ref_fn,shapes", CASES, ids=[c[0] for c in CASES])
def test_compiled_forward_backward(name, op, ref_fn, shapes):
    torch._dynamo.reset()
    compiled = torch.compile(lambda *a: op(*a) * 1.5, backend="tpu")
    _check(op, lambda *a: ref_fn(*a) * 1.5, shapes, run=lambda _, *a: compiled(*a))


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_two_outputs_static_args_unused_and_integer_inputs(eager, compiled):
    x = torch.randn(6, 5, requires_grad=True)
    idx, unused = torch.tensor([0, 3, 3]), torch.randn(2)
    xt = tpu(x)
    torch._dynamo.reset()
    op = torch.compile(TWO.__call__, backend="tpu") if compiled else TWO
    for k, scale in ((3, 2.0), (2, 1.0)):
        top, rows = op(xt, tpu(idx), tpu(unused), k=k, scale=scale)
        ref_top = torch.sort(x, -1).values[..., -k:] * scale
        assert_tpu_close(top, ref_top)
        assert_tpu_close(rows, x[idx].sum(0))
    (g,) = torch.autograd.grad((top * top).sum() + rows.sum(), xt)
    (ref_g,) = torch.autograd.grad((ref_top * ref_top).sum() + x[idx].sum(0).sum(), x)
    assert_tpu_close(g, ref_g)


def test_bfloat16_and_cpu_tensors():
    x = torch.randn(4, 8, dtype=torch.bfloat16)
    out = GELU(tpu(x))
    assert out.dtype == torch.bfloat16
    assert_tpu_close(out, _torch_gelu(x.float()).bfloat16(), rtol=2e-2, atol=2e-2)
    # CPU tensors run through JAX's own CPU client.
    y = torch.randn(3, 5)
    torch.testing.assert_close(GELU(y), _torch_gelu(y), rtol=1e-5, atol=1e-5)


def test_fused_graph_with_a_jax_op_is_one_program():
    q, k, w = torch.randn(5, 16), torch.randn(6, 16), torch.randn(6)
    with torchtpu.eager_mode("fused"):
        torchtpu.flush()
        torchtpu.reset_metrics()
        out = (ATTN(torch.tanh(tpu(q)), tpu(k)) * tpu(w)).sum(-1)
        torchtpu.flush()
        assert torchtpu.metrics()["executions"] == 1
    assert_tpu_close(out, (_torch_attn(torch.tanh(q), k) * w).sum(-1))


def test_second_process_loads_from_the_cache(tmp_path):
    code = """
        import torch, torchtpu, jax
        op = torchtpu.jax_op("ttest::proc", lambda x, w: jax.nn.softmax(x @ w, axis=-1))
        with torchtpu.eager_mode("fused"):
            x, w = torch.randn(4, 8), torch.randn(8, 3)
            out = op(torch.tanh(x.to("tpu")), w.to("tpu")) + 1
            torch.testing.assert_close(out.cpu(), torch.softmax(torch.tanh(x) @ w, -1) + 1)
        print("compiles", torchtpu.metrics()["compiles"])
    """
    env = {"TORCHTPU_CACHE_DIR": str(tmp_path)}
    first = check_py(code, env).stdout.split()
    second = check_py(code, env).stdout.split()
    assert int(first[-1]) >= 1
    assert int(second[-1]) == 0


def test_importing_torchtpu_never_imports_jax_and_jax_stays_on_the_host():
    check_py("""
        import os, sys, torch, torchtpu
        assert "jax" not in sys.modules
        torchtpu.jax_op("ttest::lazy", lambda x: x + 1)
        import jax
        assert os.environ["JAX_PLATFORMS"] == "cpu"
        assert {d.platform for d in jax.devices()} == {"cpu"}
    """)


def test_programs_are_written_for_the_plugins_stablehlo_version(monkeypatch):
    plugin = torchtpu._C.platform()["stablehlo_current_version"]
    want = ".".join(str(int(p)) for p in plugin.strip("[]").split(","))
    ours = _jax_op._state["stablehlo"].get_current_version()
    assert _jax_op._target_version() == min(want, ours, key=_jax_op._version)
    # A version older than any JAX can write: a clear error naming it.
    text = b"module @m attributes {torchtpu.external = true} {\n  func.func public @main() {\n    return\n  }\n}\n"
    assert _jax_op._translate(text)  # the real target serializes
    monkeypatch.setitem(_jax_op._state, "target", "0.1.0")
    with pytest.raises(RuntimeError, match=r"StableHLO 0\.1\.0, the version the PJRT plugin"):
        _jax_op._translate(text)


def test_errors_name_the_op_and_what_to_do():
    inv = torchtpu.jax_op("ttest::inv", lambda x: jnp.linalg.inv(x))
    with pytest.raises(RuntimeError, match=r"ttest::inv: .*custom call 'lapack_sgetrf_ffi'"):
        inv(torch.eye(3, device="tpu"))

    def native(x):  # a compiled (not interpreted) Pallas kernel
        out = jax.ShapeDtypeStruct(x.shape, x.dtype)
        return pl.pallas_call(_scale_kernel, out_shape=out)(x)

    with pytest.raises(RuntimeError, match=r"ttest::native: .*'cpu' platform.*interpret mode"):
        torchtpu.jax_op("ttest::native", native)(torch.ones(8, 128, device="tpu"))
    no_grad = torchtpu.jax_op("ttest::axpy_nograd", _axpy)
    x = torch.randn(8, 128, device="tpu", requires_grad=True)
    out = no_grad(x, torch.randn(8, 128, device="tpu"))
    with pytest.raises(RuntimeError, match=r"ttest::axpy_nograd: JAX cannot differentiate"):
        out.sum().backward()
    with pytest.raises(ValueError, match="namespace::name"):
        torchtpu.jax_op("nonamespace", _gelu)
    with pytest.raises(TypeError, match="static argument 'k' needs"):
        torchtpu.jax_op("ttest::untyped", lambda x, k: x * k, static_argnames=("k",))
    with pytest.raises(RuntimeError, match="returned 1 outputs, defined with num_outputs=2"):
        torchtpu.jax_op("ttest::wrong_count", _gelu, num_outputs=2)(torch.ones(2, device="tpu"))


def test_decorator_form_under_compile_with_changing_sizes():
    @torchtpu.jax_op("ttest::decorated")
    def shifted(x, shift: float = 1.0):
        return jnp.tanh(x) + shift

    torch._dynamo.reset()
    compiled = torch.compile(lambda x: shifted(x) * 2, backend="tpu")
    for n in (3, 5, 7):  # dynamo marks the size dynamic; the export specializes it
        x = torch.randn(n, 4)
        assert_tpu_close(compiled(tpu(x)), (torch.tanh(x) + 1) * 2)
