"""scaled_dot_product_attention as one fused op (torchtpu::attention and its backward)
against PyTorch CPU's math path: values and gradients in every eager mode, the cases
that keep the math path, and torch.compile."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import torchtpu
from conftest import assert_tpu_close, check_against_cpu, lasting_library, run_py
from torch.nn.attention import SDPBackend, sdpa_kernel

FUSED = "ScaledDotProductFusedAttentionOverrideableBackward0"


def _f(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype).requires_grad_(True)


def _sdpa(d, q, k, v, mask=None, **kw):
    """SDPA on device d; on tpu, also checks that the fused op ran."""
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kw)
    if d == "tpu":
        assert out.grad_fn.name() == FUSED, out.grad_fn.name()
    return out


def _bool_mask(t, s):
    m = torch.rand(t, s) > 0.4
    m[1] = False  # a row with every key masked: zeros, as the math path's safe softmax
    return m


# name -> (fn(device, *leaves), make() -> CPU leaves). Head dims differ between cases:
# the fused op serves a structure's first few sizes only (aten/attention.cpp).
CASES = {
    "plain": (_sdpa, lambda: [_f(2, 3, 5, 8), _f(2, 3, 7, 8), _f(2, 3, 7, 4)]),
    "causal_square": (
        lambda d, q, k, v: _sdpa(d, q, k, v, is_causal=True),
        lambda: [_f(2, 2, 6, 12), _f(2, 2, 6, 12), _f(2, 2, 6, 12)],
    ),
    # top-left aligned, as PyTorch's math path
    "causal_more_keys": (
        lambda d, q, k, v: _sdpa(d, q, k, v, is_causal=True),
        lambda: [_f(1, 2, 3, 20), _f(1, 2, 5, 20), _f(1, 2, 5, 20)],
    ),
    "scale": (
        lambda d, q, k, v: _sdpa(d, q, k, v, scale=0.3),
        lambda: [_f(2, 2, 4, 16), _f(2, 2, 4, 16), _f(2, 2, 4, 16)],
    ),
    "bool_mask_broadcast": (
        lambda d, q, k, v, m: _sdpa(d, q, k, v, m),
        lambda: [_f(2, 3, 4, 24), _f(2, 3, 6, 24), _f(2, 3, 6, 24), _bool_mask(4, 6)],
    ),
    "float_mask_per_batch": (
        lambda d, q, k, v, m: _sdpa(d, q, k, v, m),
        lambda: [_f(2, 2, 4, 28), _f(2, 2, 5, 28), _f(2, 2, 5, 28), torch.randn(2, 1, 4, 5)],
    ),
    # one query row: a decoding step
    "one_query_row": (_sdpa, lambda: [_f(1, 2, 1, 40), _f(1, 2, 9, 40), _f(1, 2, 9, 40)]),
    # [B, T, H, E] projections viewed as [B, H, T, E], as attention layers do
    "non_contiguous": (
        lambda d, q, k, v: _sdpa(d, q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)),
        lambda: [_f(2, 5, 3, 32), _f(2, 6, 3, 32), _f(2, 6, 3, 32)],
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_attention_matches_cpu(name, eager):
    fn, make = CASES[name]
    check_against_cpu(fn, make())


def test_bfloat16_at_least_as_accurate_as_cpu(eager):
    # Scores and probabilities stay in float32 (the CPU's math path rounds them to
    # bfloat16): against a float32 reference, the tpu's error is at most the CPU's.
    leaves = [_f(2, 2, 8, 36, dtype=torch.bfloat16) for _ in range(3)]
    grad = torch.randn(2, 2, 8, 36, dtype=torch.bfloat16)

    def run(d, dtype):
        xs = [x.detach().to(d, dtype).requires_grad_() for x in leaves]
        out = F.scaled_dot_product_attention(*xs, is_causal=True)
        return [out, *torch.autograd.grad(out, xs, grad.to(d, dtype))]

    ref = run("cpu", torch.float32)
    cpu, tpu = run("cpu", torch.bfloat16), run("tpu", torch.bfloat16)
    assert tpu[0].dtype == torch.bfloat16
    for r, c, t in zip(ref, cpu, tpu):
        err_cpu = (c.float() - r).abs().max().item()
        err_tpu = (t.cpu().float() - r).abs().max().item()
        assert err_tpu <= err_cpu * 1.05 + 1e-3, (err_tpu, err_cpu)


def _math_path(q, k, v, **kw):
    qt, kt, vt = (x.to("tpu").requires_grad_() for x in (q, k, v))
    out = F.scaled_dot_product_attention(qt, kt, vt, **kw)
    assert out.grad_fn.name() != FUSED
    assert_tpu_close(out, F.scaled_dot_product_attention(q, k, v, **kw))


def test_math_path_where_the_fused_op_does_not_fit():
    r = torch.randn
    # grouped-query attention
    _math_path(r(1, 4, 3, 40), r(1, 2, 3, 40), r(1, 2, 3, 40), enable_gqa=True)
    # dropout keeps the math path's random stream
    q = r(1, 2, 3, 40)
    qt = q.to("tpu").requires_grad_()
    out = F.scaled_dot_product_attention(qt, qt, qt, dropout_p=0.5)
    assert out.grad_fn.name() != FUSED
    # a 3-d input and float64
    _math_path(r(2, 3, 40), r(2, 3, 40), r(2, 3, 40))
    _math_path(*(r(1, 2, 3, 40, dtype=torch.float64) for _ in range(3)))
    # the user's choice of kernel
    with sdpa_kernel([SDPBackend.MATH]):
        _math_path(r(1, 2, 3, 44), r(1, 2, 3, 44), r(1, 2, 3, 44))


def test_sizes_that_keep_changing_take_the_math_path_with_gradients():
    # With gradients, the first four sizes of a structure take the fused op, later
    # new ones the math path (its ops run bucketed; the fused backward does not); a
    # size seen before stays fused.
    def fused(t):
        q = torch.randn(1, 2, t, 48, device="tpu", requires_grad=True)
        return F.scaled_dot_product_attention(q, q, q, is_causal=True).grad_fn.name() == FUSED

    assert [fused(t) for t in (2, 3, 4, 5, 6, 7, 3)] == [True] * 4 + [False, False, True]
    # Without them every size takes it (the forward runs bucketed where sizes keep
    # changing: test_eager_buckets.py).
    for t in (8, 9, 10, 11, 12, 13):
        q = torch.randn(1, 2, t, 48, device="tpu")
        before = torchtpu.metrics()["programs_by_op"].get("torchtpu::attention", 0)
        with torch.no_grad():
            F.scaled_dot_product_attention(q, q, q, is_causal=True).cpu()
        assert torchtpu.metrics()["programs_by_op"].get("torchtpu::attention", 0) == before + 1


def test_switch_off_by_environment():
    r = run_py(
        """
        import torch, torchtpu, torch.nn.functional as F
        q = torch.randn(1, 2, 3, 8, device="tpu", requires_grad=True)
        print(F.scaled_dot_product_attention(q, q, q).grad_fn.name())
        """,
        env={"TORCHTPU_FUSED_ATTENTION": "0"},
    )
    assert r.returncode == 0, r.stderr
    assert FUSED not in r.stdout and "Backward" in r.stdout


def test_compiled_attention(fresh_dynamo):
    # torch.compile traces SDPA through the same choice (on fake tensors).
    def f(x, w):
        h = (x @ w).view(2, 6, 4, 13).transpose(1, 2)
        return F.scaled_dot_product_attention(h, h, h, is_causal=True).sum(1)

    x, w = torch.randn(2, 6, 52), (torch.randn(52, 52) / 8).requires_grad_()
    wt = w.detach().to("tpu").requires_grad_()
    g = torch.compile(f, backend="tpu")
    torchtpu.compile_report(clear=True)
    for _ in range(3):  # the later calls replay the captured programs
        wt.grad = w.grad = None
        got, ref = g(x.to("tpu"), wt), f(x, w)
        assert_tpu_close(got, ref)
        got.sum().backward()
        ref.sum().backward()
        assert_tpu_close(wt.grad, w.grad)
    # Every output the fused op gives comes from its program (the Philox zeros
    # too), so both graphs can be replayed.
    assert not [e for e in torchtpu.compile_report() if e["event"] == "no_replay"]


def test_cudnn_calls_reach_the_compiler():
    # TORCHTPU_CUDNN_ATTENTION=2 emits XLA:GPU's cuDNN attention calls on any platform:
    # XLA:CPU parses the program, then names the call it has no kernel for.
    r = run_py(
        """
        import torch, torchtpu, torch.nn.functional as F
        q = torch.randn(1, 2, 8, 16, dtype=torch.bfloat16, device="tpu")
        lse, order = torch.zeros(1, 2, 8, device="tpu"), [0, 1, 2, 3]
        for f in (
            lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True),
            lambda: torch.ops.torchtpu.attention_backward(
                q, q, q, q, None, q, lse, True, 0.25, order, order, order, True
            )[0],
        ):
            try:
                f().cpu()
            except RuntimeError as e:
                print(str(e).splitlines()[0])
        """,
        env={"TORCHTPU_CUDNN_ATTENTION": "2"},
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 2, r.stdout
    assert "__cudnn$fmhaSoftmax " in lines[0] and "__cudnn$fmhaSoftmaxBackward " in lines[1], lines


def test_cudnn_opt_in_applies_to_gpus_only():
    r = run_py(
        """
        import torch, torchtpu, torch.nn.functional as F
        q = torch.randn(1, 2, 8, 16, dtype=torch.bfloat16)
        out = F.scaled_dot_product_attention(q.to("tpu"), q.to("tpu"), q.to("tpu"))
        ref = F.scaled_dot_product_attention(q.float(), q.float(), q.float())
        print((out.cpu().float() - ref).abs().max().item() < 0.02)
        """,
        env={"TORCHTPU_CUDNN_ATTENTION": "1"},
    )
    assert r.returncode == 0 and r.stdout.split() == ["True"], r.stdout + r.stderr


def test_backward_meta_matches_the_kernel():
    # torch.compile traces the backward on fake tensors; our fallback Meta kernel (for
    # torch builds without one) must give what the tpu kernel returns.
    from torchtpu import _meta

    aten = torch.ops.aten
    q, k, v = (torch.randn(2, 7, 3, 16).transpose(1, 2).to("tpu") for _ in range(3))
    fwd = aten._scaled_dot_product_fused_attention_overrideable(q, k, v, is_causal=True)
    out, lse, seed, offset = fwd[0], fwd[1], fwd[6], fwd[7]
    args = (torch.randn_like(out), q, k, v, None)
    rest = (out, lse, None, None, 7, 7, 0.0, True, seed, offset)
    for mask in ([True, True, True, False], [True, False, True, False]):
        got = aten._scaled_dot_product_fused_attention_overrideable_backward(*args, mask, *rest)
        meta = _meta._attention_backward(
            *(t.to("meta") if isinstance(t, torch.Tensor) else t for t in (*args, mask, *rest))
        )
        assert len(got) == len(meta) == 4
        for g, m in zip(got, meta):
            assert (g is None) == (m is None), (mask, g, m)
            if g is not None:
                assert (g.shape, g.stride(), g.dtype) == (m.shape, m.stride(), m.dtype)


def test_meta_kernels_fill_only_what_torch_lacks():
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torchtpu import _meta

    # An op shaped like torch 2.11's overrideable backward: a default kernel that raises
    # and no Meta kernel, so tracing it on fake tensors fails until one is registered.
    lib = lasting_library("torchtpu_meta_test", "DEF")
    lib.define("bwd(Tensor x) -> Tensor")

    def refuse(x):
        raise RuntimeError("bwd not implemented")

    lib.impl("bwd", refuse, "CompositeExplicitAutograd")
    op = torch.ops.torchtpu_meta_test.bwd.default
    with FakeTensorMode() as mode:
        x = mode.from_tensor(torch.randn(3, 4).t())
        with pytest.raises(Exception, match="not implemented"):
            op(x)
    impl = lasting_library("torchtpu_meta_test", "IMPL")
    kernels = {"torchtpu_meta_test::bwd": torch.empty_like, "aten::add.Tensor": torch.add}
    assert _meta.register_missing(impl, kernels) == ["torchtpu_meta_test::bwd"]
    with FakeTensorMode() as mode:
        y = op(mode.from_tensor(torch.randn(3, 4).t()))
        assert y.shape == (4, 3) and y.stride() == (1, 4)
