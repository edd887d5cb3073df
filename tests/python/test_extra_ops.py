"""glu, prelu, hard/soft shrink, reducing scatters and embedding_bag on tpu
against PyTorch CPU: forward values and gradients, in strict and debug modes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_tpu_close, check_against_cpu, lasting_library

# torch warns that index_reduce is beta and scatter(reduce=) deprecated.
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _f(*shape):
    """A float leaf that takes part in the gradient check."""
    return torch.randn(*shape).requires_grad_(True)


def _i(values, d):
    return torch.tensor(values, device=d)


# Index tensors with repeats and an untouched target row (CPU rejects negatives).
_IDX = [[0, 1, 0, 2, 1, 0], [3, 3, 1, 0, 2, 2]]  # dim 0 of a [4, 6] self
_IDX_T = [[0, 2], [1, 1], [3, 0]]  # dim 1 of a [3, 4] self

# name -> (fn(device, *inputs), make() -> inputs as CPU tensors)
CASES = {
    "glu_last": (lambda d, x: F.glu(x, -1), lambda: [_f(4, 6)]),
    "glu_dim0": (lambda d, x: F.glu(x, 0), lambda: [_f(4, 3, 2)]),
    "prelu_shared": (
        lambda d, x, w: F.prelu(x, w),
        lambda: [_f(3, 4), torch.tensor([0.25]).requires_grad_(True)],
    ),
    "prelu_channels": (
        lambda d, x, w: F.prelu(x, w),
        lambda: [_f(2, 3, 5), torch.rand(3).requires_grad_(True)],
    ),
    "hardshrink": (lambda d, x: F.hardshrink(x, 0.5), lambda: [_f(4, 6)]),
    "gcd_lcm": (
        lambda d, x, y: torch.stack([torch.gcd(x, y), torch.lcm(x, y)]),
        lambda: [torch.tensor([12, -18, 7, 0, 0, 1071]), torch.tensor([8, 12, -3, 5, 0, 462])],
    ),
    # a 0-dim `other` (the loop carries both operands at the broadcast shape)
    "gcd_lcm_0dim_int32": (
        lambda d, x, y: torch.stack([torch.gcd(x, y), torch.lcm(x, y)]),
        lambda: [
            torch.tensor([12, -18, 7, 0, 1071], dtype=torch.int32),
            torch.tensor(6, dtype=torch.int32),
        ],
    ),
    # shift amounts past the width give 0 (left) or the sign fill (right)
    "left_shift": (
        lambda d, x, y: torch.bitwise_left_shift(x, y) + (x << 3),
        lambda: [torch.tensor([1, -8, 5, 7, 100, -1]), torch.tensor([0, 1, 3, 9, 63, 70])],
    ),
    "right_shift_int32": (
        lambda d, x, y: torch.bitwise_right_shift(x, y) + (x >> 1),
        lambda: [
            torch.tensor([1, -8, 5, 7, 100, -1], dtype=torch.int32),
            torch.tensor([0, 1, 3, 9, 31, 40], dtype=torch.int32),
        ],
    ),
    "right_shift_uint8": (
        lambda d, x, y: x >> y,
        lambda: [torch.tensor([255, 128, 5], dtype=torch.uint8), torch.tensor([1, 7, 9]).byte()],
    ),
    # nn.utils.weight_norm's op on devices other than the CPU
    "weight_norm_dim0": (
        lambda d, v, g: torch._weight_norm(v, g, 0),
        lambda: [_f(6, 5), (torch.rand(6, 1) + 0.5).requires_grad_(True)],
    ),
    "weight_norm_last": (
        lambda d, v, g: torch._weight_norm(v, g, 2),
        lambda: [_f(3, 4, 5), (torch.rand(1, 1, 5) + 0.5).requires_grad_(True)],
    ),
    "softshrink": (lambda d, x: F.softshrink(x, 0.7), lambda: [_f(4, 6)]),
    "scatter_add_reduce": (
        lambda d, x, s: x.scatter(0, _i(_IDX, d), s, reduce="add"),
        lambda: [torch.randn(4, 6), torch.randn(2, 6)],
    ),
    "scatter_multiply_reduce": (
        lambda d, x, s: x.scatter(0, _i(_IDX, d), s, reduce="multiply"),
        lambda: [torch.randn(4, 6), torch.randn(2, 6)],
    ),
    "scatter_value_add": (
        lambda d, x: x.scatter(1, _i(_IDX_T, d), 1.5, reduce="add"),
        lambda: [torch.randn(3, 4)],
    ),
    "scatter_value_multiply": (
        lambda d, x: x.scatter(1, _i(_IDX_T, d), -2.0, reduce="multiply"),
        lambda: [torch.randn(3, 4)],
    ),
    "scatter_reduce_int_mean": (
        lambda d, x, s: x.scatter_reduce(0, _i(_IDX, d), s, "mean", include_self=True),
        lambda: [torch.randint(-9, 9, (4, 6)), torch.randint(-9, 9, (2, 6))],
    ),
    "scatter_reduce_int_amax": (
        lambda d, x, s: x.scatter_reduce(0, _i(_IDX, d), s, "amax", include_self=False),
        lambda: [torch.randint(-9, 9, (4, 6)), torch.randint(-9, 9, (2, 6))],
    ),
}

for _red in ["sum", "prod", "mean", "amax", "amin"]:
    for _inc in [True, False]:
        _tag = f"{_red}_{'self' if _inc else 'noself'}"
        CASES[f"scatter_reduce_{_tag}"] = (
            lambda d, x, s, r=_red, i=_inc: x.scatter_reduce(0, _i(_IDX, d), s, r, include_self=i),
            lambda: [_f(4, 6), _f(2, 6)],
        )
        CASES[f"scatter_reduce_dim1_{_tag}"] = (
            lambda d, x, s, r=_red, i=_inc: x.scatter_reduce(
                -1, _i(_IDX_T, d), s, r, include_self=i
            ),
            lambda: [_f(3, 4), _f(3, 2)],
        )
        if _red != "sum":
            CASES[f"index_reduce_{_tag}"] = (
                lambda d, x, s, r=_red, i=_inc: x.index_reduce(
                    1, _i([2, 0, 2], d), s, r, include_self=i
                ),
                lambda: [_f(3, 4), _f(3, 3)],
            )

# Bags [0:4], [4:4] (empty), [4:8] over 10 rows; index 2 is in both bags.
_EB_IDX = [1, 2, 4, 5, 4, 3, 2, 9]
_EB_OFF = [0, 4, 4]
for _mode in ["sum", "mean", "max"]:
    CASES[f"embedding_bag_{_mode}"] = (
        lambda d, w, m=_mode: F.embedding_bag(_i(_EB_IDX, d), w, _i(_EB_OFF, d), mode=m),
        lambda: [_f(10, 3)],
    )
    CASES[f"embedding_bag_{_mode}_padding"] = (
        lambda d, w, m=_mode: F.embedding_bag(
            _i(_EB_IDX, d), w, _i(_EB_OFF, d), mode=m, padding_idx=2
        ),
        lambda: [_f(10, 3)],
    )
    CASES[f"embedding_bag_{_mode}_last_offset"] = (
        lambda d, w, m=_mode: F.embedding_bag(
            _i(_EB_IDX, d), w, _i([0, 3, 8], d), mode=m, include_last_offset=True
        ),
        lambda: [_f(10, 3)],
    )
    CASES[f"embedding_bag_{_mode}_2d"] = (
        lambda d, w, m=_mode: F.embedding_bag(_i(_EB_IDX, d).view(2, 4), w, mode=m),
        lambda: [_f(10, 3)],
    )
CASES["embedding_bag_per_sample_weights"] = (
    lambda d, w, p: F.embedding_bag(
        _i(_EB_IDX, d), w, _i(_EB_OFF, d), mode="sum", per_sample_weights=p
    ),
    lambda: [_f(10, 3), torch.rand(8).requires_grad_(True)],
)

CASES["bincount"] = (lambda d, x: torch.bincount(x), lambda: [torch.tensor([1, 3, 3, 0, 7])])
CASES["bincount_weights_minlength"] = (
    lambda d, x, w: torch.bincount(x, w, minlength=10),
    lambda: [torch.tensor([1, 3, 3, 0, 7]), torch.rand(5)],
)
CASES["bincount_empty"] = (
    lambda d, x: torch.bincount(x, minlength=3),
    lambda: [torch.tensor([], dtype=torch.long)],
)


def _renormed(d, w, p):
    """embedding(max_norm=) renormalizes the looked-up rows of the weight in place."""
    w = w.detach().clone() * 3
    F.embedding(_i([[1, 2], [2, 7]], d), w, max_norm=1.5, norm_type=p)
    return w


for _p in (1.0, 2.0, 3.0):
    CASES[f"embedding_renorm_p{_p:g}"] = (
        lambda d, w, p=_p: _renormed(d, w, p),
        lambda: [torch.randn(10, 4)],
    )
# CTC: padded and concatenated targets, int and tensor lengths, an impossible sample
# (target longer than its input: inf, or 0 with zero_infinity).
_CTC_T = [[1, 2, 2, 3], [4, 1, 0, 0], [5, 5, 2, 0]]
_CTC_IL, _CTC_TL = [12, 10, 7], [4, 2, 3]
CASES["ctc_loss_mean"] = (
    lambda d, x: F.ctc_loss(F.log_softmax(x, -1), _i(_CTC_T, d), _CTC_IL, _CTC_TL),
    lambda: [_f(12, 3, 6)],
)
CASES["ctc_loss_concat_tensor_lengths_sum"] = (
    lambda d, lp: F.ctc_loss(
        lp, _i([1, 2, 2, 3, 4, 1, 5, 5, 2], d), _i(_CTC_IL, d), _i(_CTC_TL, d), reduction="sum"
    ),
    lambda: [F.log_softmax(torch.randn(12, 3, 6), -1).requires_grad_(True)],
)
CASES["ctc_loss_zero_infinity_none"] = (
    lambda d, x: F.ctc_loss(
        F.log_softmax(x, -1),
        _i(_CTC_T, d),
        [12, 10, 2],
        _CTC_TL,
        reduction="none",
        zero_infinity=True,
    ),
    lambda: [_f(12, 3, 6)],
)
# Every target empty: only the blank path (the extended sequence is one blank long).
CASES["ctc_loss_empty_targets_none"] = (
    lambda d, x: F.ctc_loss(
        F.log_softmax(x, -1), _i([[0], [0]], d), [5, 3], [0, 0], reduction="none"
    ),
    lambda: [_f(5, 2, 4)],
)
# hash_tensor: XOR of the bits (floats as float64, integers as int64).
CASES["hash_tensor_float"] = (
    lambda d, x: torch.ops.aten.hash_tensor(x, [1], keepdim=True),
    lambda: [torch.randn(3, 4)],
)
CASES["hash_tensor_int_all"] = (
    lambda d, x: torch.ops.aten.hash_tensor(x),
    lambda: [torch.randint(-100, 100, (2, 5), dtype=torch.int32)],
)
CASES["hash_tensor_bool"] = (
    lambda d, x: torch.ops.aten.hash_tensor(x, [0]),
    lambda: [torch.rand(4, 3) > 0.5],
)
# mm.dtype family (bf16 in, f32 out) has no CPU kernel: the reference is the f32 product.
CASES["mm_dtype"] = (
    lambda d, a, b: (
        torch.ops.aten.mm.dtype(a, b, torch.float32) if d == "tpu" else a.float() @ b.float()
    ),
    lambda: [torch.randn(4, 5).bfloat16(), torch.randn(5, 3).bfloat16()],
)
CASES["bmm_dtype"] = (
    lambda d, a, b: (
        torch.ops.aten.bmm.dtype(a, b, torch.float32) if d == "tpu" else a.float() @ b.float()
    ),
    lambda: [torch.randn(2, 4, 5).bfloat16(), torch.randn(2, 5, 3).bfloat16()],
)
CASES["addmm_dtype"] = (
    lambda d, c, a, b: (
        torch.ops.aten.addmm.dtype(c, a, b, torch.float32, beta=0.5, alpha=2)
        if d == "tpu"
        else 0.5 * c + 2 * (a.float() @ b.float())
    ),
    lambda: [torch.randn(4, 3), torch.randn(4, 5).bfloat16(), torch.randn(5, 3).bfloat16()],
)


@pytest.mark.parametrize("name", sorted(CASES))
def test_extra_op(name, eager):
    fn, make = CASES[name]
    check_against_cpu(fn, make())


@pytest.mark.parametrize("mode", [0, 1, 2])
def test_embedding_bag_aux_outputs(mode, eager):
    """offset2bag, bag_size and max_indices match CPU where CPU fills them
    (sum leaves bag_size/max_indices unset; mean's max_indices is empty in the
    meta kernel but not on CPU)."""
    w = torch.randn(10, 3)
    args = (torch.tensor(_EB_IDX), torch.tensor(_EB_OFF), False, mode, False, None, False, 2)
    ref = torch.ops.aten._embedding_bag(w, *args)
    dev_args = [a.to("tpu") if isinstance(a, torch.Tensor) else a for a in args]
    out = torch.ops.aten._embedding_bag(w.to("tpu"), *dev_args)
    assert_tpu_close(out[0], ref[0])
    assert_tpu_close(out[1], ref[1])
    if mode != 0:
        assert_tpu_close(out[2], ref[2])
    if mode == 2:
        assert_tpu_close(out[3], ref[3])


def test_inplace_and_out_variants(eager):
    x, s = torch.randn(4, 6), torch.randn(2, 6)
    idx = torch.tensor(_IDX)
    # src wider than the index: only its index-shaped corner is read.
    s = torch.randn(2, 7)
    ref = x.clone().scatter_reduce_(0, idx, s, "amax", include_self=False)
    out = x.to("tpu").scatter_reduce_(0, idx.to("tpu"), s.to("tpu"), "amax", include_self=False)
    assert_tpu_close(out, ref)
    ref = x.clone().scatter_(0, idx, s, reduce="multiply")
    out = x.to("tpu").scatter_(0, idx.to("tpu"), s.to("tpu"), reduce="multiply")
    assert_tpu_close(out, ref)
    ref = torch.empty(4, 3)
    torch._C._nn.glu(x, 1, out=ref)
    out = torch.empty(4, 3, device="tpu")
    torch._C._nn.glu(x.to("tpu"), 1, out=out)
    assert_tpu_close(out, ref)
    ref = F.softshrink(x, 0.3)
    out = torch.empty(4, 6, device="tpu")
    torch._C._nn.softshrink(x.to("tpu"), 0.3, out=out)
    assert_tpu_close(out, ref)
    # mode(out=): PyTorch's composite kernel for it rejects devices other than
    # CPU, CUDA and XPU.
    m = torch.tensor([[1.0, 2, 2, 3], [4, 4, 1, 1], [0, 5, 5, 0]])
    ref = torch.mode(m, 1, keepdim=True)
    vals, idx = torch.empty(0, device="tpu"), torch.empty(0, dtype=torch.long, device="tpu")
    got = torch.mode(m.to("tpu"), 1, keepdim=True, out=(vals, idx))
    assert got.values is vals and got.indices is idx
    assert_tpu_close(vals, ref.values)
    assert_tpu_close(idx, ref.indices)


def test_out_overloads_without_meta_kernels(eager):
    # geqrf.a, _logcumsumexp.out and histogram.bin_ct_out have no meta kernel: their
    # out tensors take the sizes of their functional overloads' results.
    a, x = torch.randn(5, 4), torch.randn(5, 6)
    outs = (torch.empty(0, device="tpu"), torch.empty(0, device="tpu"))
    got = torch.geqrf(a.to("tpu"), out=outs)
    assert got[0] is outs[0] and got[1] is outs[1]
    for g, r in zip(outs, torch.geqrf(a)):
        assert_tpu_close(g, r)
    out = torch.full((5, 6), 7.0, device="tpu")
    torch.logcumsumexp(x.to("tpu"), 0, out=out)
    assert_tpu_close(out, torch.logcumsumexp(x, 0))
    for inp in (x, torch.empty(5, 0)):  # an empty input's bins span [0, 1]
        outs = (torch.empty(0, device="tpu"), torch.empty(0, device="tpu"))
        torch.histogram(inp.to("tpu"), 3, out=outs)
        for g, r in zip(outs, torch.histogram(inp, 3)):
            assert_tpu_close(g, r)


_NAN_OPS = {
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "clamp_min_tensor": lambda a, b: a.clamp(min=b),
    "clamp_max_tensor": lambda a, b: a.clamp(max=b),
    "clamp_scalars": lambda a, b: a.clamp(-0.5, 0.5),
    "hardtanh": lambda a, b: F.hardtanh(a),
    "hardshrink": lambda a, b: F.hardshrink(a, 0.5),
    "softshrink": lambda a, b: F.softshrink(a, 0.5),
    "hardshrink_grad": lambda a, b: torch.autograd.grad(
        F.hardshrink(a.requires_grad_(), 0.5).sum(), a
    )[0],
    "igamma": lambda a, b: torch.special.gammainc(a.abs() + 0.1, b.abs()),
    "igammac": lambda a, b: torch.special.gammaincc(a.abs() + 0.1, b.abs()),
}


@pytest.mark.parametrize("name", sorted(_NAN_OPS))
def test_nan_propagates(name, eager):
    # A NaN in either operand gives NaN, as on the CPU (XLA:CPU's fast min/max
    # would return the other operand; a shrink's |x| <= lambda test is false for NaN).
    nan = float("nan")
    a = torch.tensor([1.0, nan, 3.0, nan, -2.0])
    b = torch.tensor([nan, 2.0, 1.0, nan, 0.0])
    got = _NAN_OPS[name](a.to("tpu"), b.to("tpu")).cpu()
    torch.testing.assert_close(got, _NAN_OPS[name](a, b), equal_nan=True)


def test_cross_entropy_with_every_target_ignored(eager):
    # The mean over no targets is NaN (0 / 0), and the gradient is zero, as on the CPU.
    x = torch.randn(4, 5, requires_grad=True)
    t = torch.full((4,), -100)
    xt = x.detach().to("tpu").requires_grad_(True)
    loss, loss_t = F.cross_entropy(x, t), F.cross_entropy(xt, t.to("tpu"))
    loss.backward()
    loss_t.backward()
    torch.testing.assert_close(loss_t.cpu(), loss, equal_nan=True)
    assert_tpu_close(xt.grad, x.grad)


def test_addmm_dtype_meta_matches_torch():
    # The Meta kernel that replaces a failing shipped one (torch 2.11's) gives what a
    # working torch's gives, and rejects what it rejects.
    from torchtpu import _meta

    aten = torch.ops.aten
    m = lambda *s, dt=torch.bfloat16: torch.empty(*s, dtype=dt, device="meta")
    for c in (m(4, 3, dt=torch.float32), m(3, dt=torch.float32), m(1, 1, dt=torch.float32)):
        ours = _meta._addmm_dtype(c, m(4, 5), m(5, 3), torch.float32, beta=0.5)
        theirs = aten.addmm.dtype(c, m(4, 5), m(5, 3), torch.float32, beta=0.5)
        assert (ours.shape, ours.stride(), ours.dtype) == (
            theirs.shape,
            theirs.stride(),
            theirs.dtype,
        )
    for bad in ((m(4, 3), m(4, 5), m(4, 3)), (m(2, 3), m(4, 5), m(5, 3))):
        for kernel in (_meta._addmm_dtype, aten.addmm.dtype):
            with pytest.raises(RuntimeError):
                kernel(*bad, torch.float32)


def test_meta_kernels_replace_only_failing_ones():
    from torchtpu import _meta

    lib = lasting_library("torchtpu_meta_repl", "DEF")
    lib.define("broken(Tensor x) -> Tensor")
    lib.define("works(Tensor x) -> Tensor")

    def broken(x):
        raise TypeError("shipped meta kernel fails")

    lib.impl("broken", broken, "Meta")
    lib.impl("works", torch.empty_like, "Meta")
    ops = torch.ops.torchtpu_meta_repl
    x = torch.empty(3, 4, device="meta")
    with pytest.raises(TypeError):
        ops.broken(x)
    names = [f"torchtpu_meta_repl::{n}" for n in ("broken", "works")]
    kernels = {name: lambda t: t.new_empty(t.shape[::-1]) for name in names}
    probes = {name: lambda n=n: getattr(ops, n)(x) for name, n in zip(names, ("broken", "works"))}
    impl = lasting_library("torchtpu_meta_repl", "IMPL")
    assert _meta.register_missing(impl, kernels, probes) == ["torchtpu_meta_repl::broken"]
    assert ops.broken(x).shape == (4, 3) and ops.works(x).shape == (3, 4)
