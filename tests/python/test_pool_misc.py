"""3-d and adaptive max pooling, max_unpool, batch-norm variants, eigh/SVD
based ops and assorted ops (channel_shuffle, renorm, cummax/cummin,
nanmedian, unfold's backward, im2col/col2im, histc, logcumsumexp) on tpu
against PyTorch CPU: values and gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_tpu_close

TOL = {"rtol": 1e-4, "atol": 1e-4}


nan, inf = float("nan"), float("inf")


def _f(*shape):
    return torch.randn(*shape).requires_grad_(True)


def _spd(n):
    a = torch.randn(n, n)
    return (a @ a.T + torch.eye(n)).requires_grad_(True)


# name -> (fn(*inputs), make() -> CPU inputs)
CASES = {
    "max_pool3d": (
        lambda x: F.max_pool3d(x, 2, stride=(1, 2, 2), padding=1),
        lambda: [_f(1, 2, 4, 5, 6)],
    ),
    "max_pool3d_indices": (
        lambda x: F.max_pool3d(x, 3, stride=2, return_indices=True)[1],
        lambda: [torch.randn(2, 1, 5, 6, 7)],
    ),
    "avg_pool3d": (
        lambda x: F.avg_pool3d(x, 2, stride=1, padding=1, count_include_pad=False),
        lambda: [_f(2, 3, 3, 4, 4)],
    ),
    "avg_pool3d_ceil": (
        lambda x: F.avg_pool3d(x, 3, stride=2, ceil_mode=True),
        lambda: [_f(1, 2, 5, 6, 7)],
    ),
    "adaptive_avg_pool3d": (
        lambda x: F.adaptive_avg_pool3d(x, (2, 3, 4)),
        lambda: [_f(2, 3, 5, 7, 6)],
    ),
    "adaptive_max_pool2d": (
        lambda x: F.adaptive_max_pool2d(x, (3, 2), return_indices=True),
        lambda: [_f(2, 3, 7, 5)],
    ),
    "adaptive_max_pool3d": (
        lambda x: F.adaptive_max_pool3d(x, (2, 3, 2)),
        lambda: [_f(1, 2, 5, 6, 4)],
    ),
    "adaptive_max_pool1d": (lambda x: F.adaptive_max_pool1d(x, 3), lambda: [_f(2, 3, 8)]),
    "max_unpool2d": (
        lambda x: F.max_unpool2d(*F.max_pool2d(x, 2, return_indices=True), 2),
        lambda: [_f(2, 3, 4, 6)],
    ),
    "max_unpool3d": (
        lambda x: F.max_unpool3d(*F.max_pool3d(x, 2, return_indices=True), 2),
        lambda: [_f(1, 2, 4, 4, 6)],
    ),
    "batch_norm_train": (
        lambda x, w, b: F.batch_norm(
            x, torch.zeros(3, device=x.device), torch.ones(3, device=x.device), w, b, True
        ),
        lambda: [_f(4, 3, 5), _f(3), _f(3)],
    ),
    "channel_shuffle": (lambda x: F.channel_shuffle(x, 3), lambda: [_f(2, 6, 3, 2)]),
    "renorm": (lambda x: torch.renorm(x, 2, 1, 0.8), lambda: [_f(3, 4, 5)]),
    "renorm_inf": (lambda x: torch.renorm(x, float("inf"), 0, 0.5), lambda: [_f(3, 4)]),
    "cummax": (lambda x: torch.cummax(x, 1), lambda: [_f(3, 6, 2)]),
    "cummin_ties": (lambda x: torch.cummin(x.round(), 0), lambda: [_f(7, 3)]),
    # a running extreme equal to the dtype's identity (INT_MIN, False, -inf) keeps
    # the index of the element that set it
    "cummax_int32": (
        lambda x: torch.cummax(x, 1),
        lambda: [torch.tensor([[-(2**31), -(2**31), 5, 7, -3]], dtype=torch.int32)],
    ),
    "cummin_int32_wide": (
        lambda x: torch.cummin(x, 0),
        lambda: [torch.randint(-(2**31), 2**31 - 1, (6, 3), dtype=torch.int32)],
    ),
    "cummax_bool": (
        lambda x: torch.cummax(x, 0),
        lambda: [torch.tensor([False, False, True, False, True])],
    ),
    "cummin_bool": (
        lambda x: torch.cummin(x, 0),
        lambda: [torch.tensor([True, True, False, True, False])],
    ),
    # NaN sticks from its first position with the last NaN's index; ties keep the last.
    "cummax_cummin_nan_ties": (
        lambda x: (*torch.cummax(x, 1), *torch.cummin(x, 1)),
        lambda: [torch.tensor([[1, nan, 2, 2, nan, 0], [3, 3, -inf, 3, -0.0, 0.0]])],
    ),
    "cummax_neg_inf": (
        lambda x: torch.cummax(x, 0),
        lambda: [torch.tensor([float("-inf"), float("-inf"), 1.0, float("-inf")])],
    ),
    "nanmedian": (
        lambda x: torch.nanmedian(torch.where(x > 1, float("nan"), x), dim=1),
        lambda: [_f(4, 7)],
    ),
    "nanmedian_all": (
        lambda x: torch.nanmedian(torch.where(x > 1, float("nan"), x)),
        lambda: [_f(4, 7)],
    ),
    "unfold": (lambda x: x.unfold(1, 3, 2), lambda: [_f(2, 8, 3)]),
    "im2col": (
        lambda x: F.unfold(x, (2, 3), dilation=(1, 2), padding=1, stride=(2, 1)),
        lambda: [_f(2, 3, 6, 7)],
    ),
    "col2im": (lambda x: F.fold(x, (5, 6), (2, 2), padding=1, stride=2), lambda: [_f(2, 12, 12)]),
    "logcumsumexp": (lambda x: torch.logcumsumexp(x, 1), lambda: [_f(3, 5)]),
    "histc": (lambda x: torch.histc(x, 7, -1.5, 2.0), lambda: [torch.randn(50)]),
    "histc_auto_range": (lambda x: torch.histc(x, 5), lambda: [torch.randn(40)]),
    "cdist_p2": (lambda a, b: torch.cdist(a, b), lambda: [_f(2, 4, 3), _f(2, 5, 3)]),
    "cdist_p1": (lambda a, b: torch.cdist(a, b, p=1), lambda: [_f(4, 3), _f(5, 3)]),
    "cdist_pinf": (lambda a, b: torch.cdist(a, b, p=float("inf")), lambda: [_f(4, 3), _f(5, 3)]),
    "cdist_p_half": (lambda a, b: torch.cdist(a, b, p=0.5), lambda: [_f(3, 2), _f(4, 2)]),
    # batch dims of different ranks broadcast: [1] with [2, 3] gives [2, 3]
    "cdist_p1_batch_broadcast": (
        lambda a, b: torch.cdist(a, b, p=1),
        lambda: [_f(1, 4, 3), _f(2, 3, 5, 3)],
    ),
    "cdist_p2_batch_broadcast": (
        lambda a, b: torch.cdist(a, b),
        lambda: [_f(3, 1, 4, 2), _f(2, 5, 2)],
    ),
    "pdist": (lambda x: F.pdist(x), lambda: [_f(5, 3)]),
    "pdist_p3": (lambda x: F.pdist(x, p=3), lambda: [_f(4, 2)]),
    "isin": (
        lambda x: torch.isin(x, torch.arange(0, 6, 2, device=x.device)),
        lambda: [torch.randint(0, 8, (3, 5))],
    ),
    "isin_invert": (lambda x: torch.isin(x, 3, invert=True), lambda: [torch.randint(0, 5, (7,))]),
    "multi_margin_p2_weight": (
        lambda x, w: F.multi_margin_loss(
            x, torch.tensor([0, 3, 1, 3], device=x.device), p=2, margin=0.7, weight=w
        ),
        lambda: [_f(4, 5), torch.rand(5)],
    ),
    "multi_margin_none": (
        lambda x: F.multi_margin_loss(
            x, torch.tensor([2, 0, 1], device=x.device), reduction="none"
        ),
        lambda: [_f(3, 4)],
    ),
    # 1-D input, reduction="none": 0-dim on the CPU with a 0-dim target (multi_margin)
    # or a 1-D one (multilabel_margin); PyTorch's meta kernels give [1].
    "multi_margin_none_1d": (
        lambda x: F.multi_margin_loss(x, torch.tensor(2, device=x.device), reduction="none"),
        lambda: [_f(5)],
    ),
    "multi_margin_none_1d_target_1d": (
        lambda x: F.multi_margin_loss(x, torch.tensor([2], device=x.device), reduction="none"),
        lambda: [_f(5)],
    ),
    "multilabel_margin_none_1d": (
        lambda x: F.multilabel_margin_loss(
            x, torch.tensor([2, 4, -1, 0, 1], device=x.device), reduction="none"
        ),
        lambda: [_f(5)],
    ),
    "multilabel_margin": (
        lambda x: F.multilabel_margin_loss(
            x, torch.tensor([[3, 0, -1, 1], [1, 2, 3, -1], [-1, 0, 0, 0]], device=x.device)
        ),
        lambda: [_f(3, 4)],
    ),
    "multilabel_margin_sum_1d": (
        lambda x: F.multilabel_margin_loss(
            x, torch.tensor([2, 4, -1, 0, 1], device=x.device), reduction="sum"
        ),
        lambda: [_f(5)],
    ),
    "fractional_max_pool2d": (
        lambda x: torch.ops.aten.fractional_max_pool2d(
            x, [2, 3], [3, 2], torch.tensor([[[0.3, 0.7], [0.9, 0.1]]], device=x.device)
        ),
        lambda: [_f(1, 2, 7, 6)],
    ),
    "fractional_max_pool3d": (
        lambda x: torch.ops.aten.fractional_max_pool3d(
            x, [2, 2, 2], [2, 3, 2], torch.tensor([[[0.3, 0.7, 0.5]]], device=x.device)
        ),
        lambda: [_f(1, 1, 5, 6, 5)],
    ),
    "segment_reduce_max_initial": (
        lambda x: torch.segment_reduce(
            x, "max", lengths=torch.tensor([0, 2, 3, 1], device=x.device), initial=0.5
        ),
        lambda: [_f(6, 2)],
    ),
    "segment_reduce_mean_offsets": (
        lambda x: torch.segment_reduce(
            x, "mean", offsets=torch.tensor([0, 1, 1, 4], device=x.device), axis=0
        ),
        lambda: [_f(4)],
    ),
    "segment_reduce_prod": (
        lambda x: torch.segment_reduce(x, "prod", lengths=torch.tensor([3, 2], device=x.device)),
        lambda: [_f(5)],
    ),
    "mode_distinct": (lambda x: torch.mode(x, 1), lambda: [torch.randn(3, 6, 2)]),
    "mode_ties_values": (
        lambda x: torch.mode(x, -1).values,
        lambda: [torch.randint(0, 3, (4, 7)).float()],
    ),
    "matrix_exp": (lambda a: torch.linalg.matrix_exp(a), lambda: [_f(2, 4, 4)]),
    "searchsorted_sorter": (
        lambda s, v: torch.searchsorted(s, v, sorter=torch.argsort(s)),
        lambda: [torch.randn(7), torch.randn(3, 4)],
    ),
    # torch's binary search step for step: a NaN value lands past every entry, a
    # NaN entry sends the search right; duplicates, batched rows, both sides.
    "searchsorted_nan_dups": (
        lambda s, v: (
            torch.searchsorted(s, v),
            torch.searchsorted(s, v, right=True),
            torch.bucketize(v, s[0, 0], out_int32=True),
        ),
        lambda: [
            torch.tensor([[[-1.0, 0.5, 0.5, 2.0, 3.0, nan], [0, 0, 0, 1, 1, inf]]]),
            torch.tensor([[[2.5, 0.5, nan, -inf, 4.0], [0.0, 1.0, nan, 7.0, -1.0]]]),
        ],
    ),
    "searchsorted_long_rows": (
        lambda s, v: torch.searchsorted(s, v, side="right"),
        lambda: [torch.sort(torch.randint(-50, 50, (3, 300)).float(), -1)[0], _f(3, 40) * 30],
    ),
    "histogram": (lambda x: torch.histogram(x, 6), lambda: [torch.randn(40)]),
    "histogram_range_density_weight": (
        lambda x, w: torch.histogram(x, 5, range=(-1.0, 1.5), weight=w, density=True),
        lambda: [torch.randn(30), torch.rand(30)],
    ),
    "histogram_edges": (
        lambda x: torch.histogram(x, torch.tensor([-2.0, -0.5, 0.0, 0.3, 2.0], device=x.device)),
        lambda: [torch.randn(25)],
    ),
    "histogramdd": (lambda x: tuple(torch.histogramdd(x, [3, 4, 2])), lambda: [torch.randn(40, 3)]),
    "histogramdd_range_density_weight": (
        lambda x, w: tuple(
            torch.histogramdd(x, [2, 3], range=[-1.0, 1.0, -2.0, 0.5], weight=w, density=True)
        ),
        lambda: [torch.randn(5, 6, 2), torch.rand(5, 6)],
    ),
    "histogramdd_edges": (
        lambda x: tuple(
            torch.histogramdd(
                x,
                [
                    torch.tensor([-3.0, 0.0, 0.5, 3.0], device=x.device),
                    torch.tensor([-1.0, 1.0], device=x.device),
                ],
            )
        ),
        lambda: [torch.randn(30, 2)],
    ),
    "eigvalsh": (lambda a: torch.linalg.eigvalsh(a), lambda: [_spd(5)]),
    "svdvals": (lambda a: torch.linalg.svdvals(a), lambda: [_f(2, 5, 3)]),
    "pinv": (lambda a: torch.linalg.pinv(a), lambda: [_f(4, 3)]),
    "matrix_rank": (
        lambda a: torch.linalg.matrix_rank(a),
        lambda: [torch.randn(4, 2) @ torch.randn(2, 5)],
    ),
}


@pytest.mark.parametrize("pad", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
@pytest.mark.parametrize("align", [True, False])
@pytest.mark.parametrize("dims", [2, 3])
def test_grid_sample(pad, mode, align, dims, eager):
    if dims == 2:
        x, g = torch.randn(2, 3, 5, 6), torch.rand(2, 4, 3, 2) * 2.6 - 1.3
    else:
        x, g = torch.randn(2, 3, 4, 5, 6), torch.rand(2, 3, 2, 4, 3) * 2.6 - 1.3
    xr, gr = x.clone().requires_grad_(True), g.clone().requires_grad_(True)
    xd, gd = x.to("tpu").requires_grad_(True), g.to("tpu").requires_grad_(True)
    ref = F.grid_sample(xr, gr, mode=mode, padding_mode=pad, align_corners=align)
    out = F.grid_sample(xd, gd, mode=mode, padding_mode=pad, align_corners=align)
    assert_tpu_close(out, ref, **TOL)
    go = torch.randn(ref.shape)
    rg = torch.autograd.grad(ref, [xr, gr], go)
    dg = torch.autograd.grad(out, [xd, gd], go.to("tpu"))
    assert_tpu_close(list(dg), list(rg), **TOL)


def _grads_of(r):
    items = r if isinstance(r, (tuple, list)) else [r]
    return [t for t in items if isinstance(t, torch.Tensor) and t.requires_grad]


@pytest.mark.parametrize("name", sorted(CASES))
def test_pool_misc(name, eager):
    fn, make = CASES[name]
    inputs = make()
    ref_in = [t.detach().requires_grad_(t.requires_grad) for t in inputs]
    dev_in = [t.detach().to("tpu").requires_grad_(t.requires_grad) for t in inputs]
    ref, out = fn(*ref_in), fn(*dev_in)
    assert_tpu_close(out, ref, **TOL, equal_nan=True)
    ro, do = _grads_of(ref), _grads_of(out)
    wrt = [k for k, t in enumerate(inputs) if t.requires_grad]
    if not ro or not wrt:
        return
    gs = [torch.randn(o.shape) for o in ro]
    rg = torch.autograd.grad(ro, [ref_in[k] for k in wrt], gs)
    dg = torch.autograd.grad(do, [dev_in[k] for k in wrt], [g.to("tpu") for g in gs])
    assert_tpu_close(list(dg), list(rg), **TOL)


def test_batch_norm_updates_running_stats(eager):
    x = torch.randn(6, 3, 4)
    rm, rv = torch.zeros(3), torch.ones(3)
    rm_d, rv_d = rm.to("tpu"), rv.to("tpu")
    F.batch_norm(x, rm, rv, training=True, momentum=0.3)
    F.batch_norm(x.to("tpu"), rm_d, rv_d, training=True, momentum=0.3)
    assert_tpu_close(rm_d, rm)
    assert_tpu_close(rv_d, rv)


@pytest.mark.parametrize(
    "op",
    ["native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_no_training"],
)
def test_batch_norm_eval_saves_no_statistics(op, eager):
    # The CPU returns empty save_mean / save_invstd in eval mode (PyTorch's meta: [C]).
    x, rm, rv = torch.randn(4, 2, 3), torch.randn(2), torch.rand(2) + 0.5
    f = getattr(torch.ops.aten, op)
    train = () if op.endswith("no_training") else (False,)

    def run(d):
        return f(x.to(d), None, None, rm.to(d), rv.to(d), *train, 0.1, 1e-5)

    for got, want in zip(run("tpu"), run("cpu")):
        assert_tpu_close(got, want)


def test_rrelu_training_slopes_in_range(eager):
    x = torch.randn(200).to("tpu")
    y = F.rrelu(x, 0.1, 0.3, training=True).cpu()
    xc = x.cpu()
    slope = (y / xc)[xc < 0]
    assert ((slope >= 0.1) & (slope <= 0.3)).all()
    assert torch.equal(y[xc >= 0], xc[xc >= 0])


EMPTY_BATCH = {
    "avg_pool2d": lambda x: F.avg_pool2d(x, 2),
    "adaptive_avg_pool2d": lambda x: F.adaptive_avg_pool2d(x, 2),
    "adaptive_max_pool2d": lambda x: F.adaptive_max_pool2d(x, 2, return_indices=True),
    "lp_pool2d": lambda x: F.lp_pool2d(x, 2, 2),
    # PyTorch's Python meta kernel fails here (it reshapes 0 elements with -1).
    "max_pool2d": lambda x: F.max_pool2d(x, 2, return_indices=True),
    "max_pool2d_backward": lambda x: torch.autograd.grad(
        F.max_pool2d(x.requires_grad_(), 2).sum(), x
    )[0],
    "sum_over_batch": lambda x: x.sum(0),
    "avg_pool2d_backward": lambda x: torch.autograd.grad(
        F.avg_pool2d(x.requires_grad_(), 2).sum(), x
    )[0],
}


@pytest.mark.parametrize("name", sorted(EMPTY_BATCH))
def test_empty_batch(name, eager):
    # Calls whose every output is empty compute nothing (the rules need not build
    # zero-size shapes); a reduction over the empty dim still gives its identity.
    x = torch.randn(0, 3, 4, 4)
    assert_tpu_close(EMPTY_BATCH[name](x.to("tpu")), EMPTY_BATCH[name](x))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8], ids=str)
def test_histc_integer(dtype, eager):
    # The CPU has no integer histc; CUDA's (which MoE routers call on expert ids)
    # bins in integer arithmetic with the bounds truncated to integers, and counts
    # in the input's dtype: the CPU's float histc of the same values and bounds.
    x = torch.randint(0, 12, (60,)).to(dtype)
    for bins, lo, hi in [(8, 0, 7), (5, 0, 0), (3, 0.5, 7.9), (6, 2, 2), (4, 3, 40)]:
        ref = torch.histc(x.float(), bins, int(lo), int(hi)).to(dtype)
        assert_tpu_close(torch.histc(x.to("tpu"), bins, lo, hi), ref)
