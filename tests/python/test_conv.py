"""Convolution and pooling on tpu vs CPU: forward and backward, both eager modes.

Convolutions use rtol=atol=1e-4: XLA accumulates the products in another
order (and may pick another algorithm) than CPU's oneDNN/im2col kernels, so
float32 sums differ by a few ulps times the reduction length.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_tpu_close, tpu

CONV_TOL = {"rtol": 1e-4, "atol": 1e-4}


def _randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape)


def _ties(*shape: int) -> torch.Tensor:
    """Small integers: many equal values inside a pooling window."""
    return torch.randint(0, 3, shape).float()


# name -> (function, input factories). Every float input gets a gradient.
CONV = {
    "conv1d": (lambda x, w, b: F.conv1d(x, w, b), [(2, 3, 11), (5, 3, 3), (5,)]),
    "conv1d_stride_pad_dil": (
        lambda x, w: F.conv1d(x, w, stride=3, padding=2, dilation=2),
        [(2, 4, 17), (6, 4, 4)],
    ),
    "conv1d_same_even_kernel": (
        lambda x, w: F.conv1d(x, w, padding="same"),
        [(2, 3, 10), (4, 3, 4)],
    ),
    "conv2d_bias": (lambda x, w, b: F.conv2d(x, w, b), [(2, 3, 7, 6), (4, 3, 3, 3), (4,)]),
    "conv2d_stride_pad": (
        lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1),
        [(2, 4, 9, 8), (6, 4, 3, 3), (6,)],
    ),
    "conv2d_asym_stride_pad_dil": (
        lambda x, w: F.conv2d(x, w, stride=(1, 2), padding=(2, 1), dilation=(2, 1)),
        [(2, 3, 9, 8), (5, 3, 3, 2)],
    ),
    "conv2d_same": (lambda x, w: F.conv2d(x, w, padding="same"), [(1, 4, 8, 7), (3, 4, 4, 3)]),
    "conv2d_same_dilated": (
        lambda x, w, b: F.conv2d(x, w, b, padding="same", dilation=2),
        [(2, 2, 7, 7), (3, 2, 3, 3), (3,)],
    ),
    "conv2d_valid_unused_rows": (
        lambda x, w: F.conv2d(x, w, stride=3, padding="valid"),
        [(2, 3, 8, 9), (4, 3, 2, 2)],
    ),
    "conv2d_groups": (
        lambda x, w, b: F.conv2d(x, w, b, padding=1, groups=2),
        [(2, 4, 6, 6), (6, 2, 3, 3), (6,)],
    ),
    "conv2d_depthwise": (
        lambda x, w: F.conv2d(x, w, padding=1, stride=2, groups=4),
        [(2, 4, 7, 7), (8, 1, 3, 3)],
    ),
    # One filter per channel: lowered as a sum over the kernel taps (conv.cpp).
    "conv2d_depthwise_one_filter": (
        lambda x, w, b: F.conv2d(x, w, b, padding=1, stride=2, groups=4),
        [(2, 4, 7, 7), (4, 1, 3, 3), (4,)],
    ),
    "conv2d_depthwise_asym_dil": (
        lambda x, w: F.conv2d(x, w, stride=(2, 1), padding=(2, 0), dilation=(2, 1), groups=3),
        [(2, 3, 9, 8), (3, 1, 3, 2)],
    ),
    "conv2d_depthwise_same_even": (
        lambda x, w: F.conv2d(x, w, padding="same", groups=3),
        [(1, 3, 6, 5), (3, 1, 2, 4)],
    ),
    "conv1d_depthwise_unused_tail": (
        lambda x, w: F.conv1d(x, w, stride=3, groups=5),
        [(2, 5, 10), (5, 1, 3)],
    ),
    "conv1d_depthwise_three_filters": (
        lambda x, w, b: F.conv1d(x, w, b, stride=2, padding=1, dilation=2, groups=3),
        [(2, 3, 11), (9, 1, 3), (9,)],
    ),
    "conv3d_depthwise": (
        lambda x, w: F.conv3d(x, w, padding=1, stride=(1, 2, 1), groups=2),
        [(1, 2, 4, 5, 4), (2, 1, 3, 3, 3)],
    ),
    "conv2d_groups_stride_dil": (
        lambda x, w: F.conv2d(x, w, stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=3),
        [(1, 6, 9, 8), (3, 2, 2, 3)],
    ),
    "conv2d_1x1": (lambda x, w: F.conv2d(x, w), [(3, 5, 4, 4), (2, 5, 1, 1)]),
    "conv2d_unbatched": (lambda x, w: F.conv2d(x, w, padding=1), [(3, 5, 5), (2, 3, 3, 3)]),
    "conv3d": (
        lambda x, w, b: F.conv3d(x, w, b, padding=1),
        [(1, 2, 5, 4, 5), (3, 2, 3, 3, 3), (3,)],
    ),
    "conv3d_stride_groups": (
        lambda x, w: F.conv3d(x, w, stride=(1, 2, 1), padding=(0, 1, 1), groups=2),
        [(2, 4, 4, 6, 5), (4, 2, 2, 3, 2)],
    ),
    "conv_transpose1d": (
        lambda x, w, b: F.conv_transpose1d(x, w, b, stride=3, padding=1, output_padding=2),
        [(2, 3, 7), (3, 2, 4), (2,)],
    ),
    "conv_transpose2d": (
        lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1),
        [(2, 4, 5, 6), (4, 3, 3, 3), (3,)],
    ),
    "conv_transpose2d_groups_dil": (
        lambda x, w: F.conv_transpose2d(
            x, w, stride=(2, 3), padding=(0, 2), output_padding=(1, 0), dilation=(1, 2), groups=2
        ),
        [(2, 4, 5, 4), (4, 3, 3, 3)],
    ),
    "conv_transpose2d_stride1": (
        lambda x, w: F.conv_transpose2d(x, w, padding=1),
        [(1, 3, 4, 4), (3, 2, 3, 3)],
    ),
    "conv_transpose3d": (
        lambda x, w: F.conv_transpose3d(x, w, stride=2, padding=1),
        [(1, 2, 3, 4, 3), (2, 3, 3, 2, 3)],
    ),
}

POOL = {
    "max_pool2d": (lambda x: F.max_pool2d(x, 2), _randn, (2, 3, 8, 8)),
    "max_pool2d_indices": (
        lambda x: F.max_pool2d(x, 3, stride=2, padding=1, return_indices=True),
        _randn,
        (2, 3, 9, 8),
    ),
    "max_pool2d_ties_first_max": (
        lambda x: F.max_pool2d(x, 3, stride=1, padding=1, return_indices=True),
        _ties,
        (2, 2, 6, 6),
    ),
    "max_pool2d_ceil_dilation": (
        lambda x: F.max_pool2d(
            x, (2, 3), stride=2, padding=1, dilation=(2, 1), ceil_mode=True, return_indices=True
        ),
        _randn,
        (2, 3, 9, 8),
    ),
    "max_pool2d_unbatched": (
        lambda x: F.max_pool2d(x, (3, 2), stride=(2, 1), return_indices=True),
        _randn,
        (3, 7, 6),
    ),
    "max_pool2d_module": (torch.nn.MaxPool2d(2, ceil_mode=True), _randn, (2, 3, 7, 5)),
    "avg_pool2d": (lambda x: F.avg_pool2d(x, 2), _randn, (2, 3, 8, 8)),
    "avg_pool2d_pad_include": (lambda x: F.avg_pool2d(x, 3, 2, 1), _randn, (2, 3, 9, 8)),
    "avg_pool2d_pad_exclude": (
        lambda x: F.avg_pool2d(x, 3, 2, 1, count_include_pad=False),
        _randn,
        (2, 3, 9, 8),
    ),
    "avg_pool2d_ceil_include": (
        lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True),
        _randn,
        (2, 3, 8, 8),
    ),
    "avg_pool2d_ceil_exclude": (
        lambda x: F.avg_pool2d(x, (3, 2), (2, 2), (1, 1), ceil_mode=True, count_include_pad=False),
        _randn,
        (2, 3, 8, 7),
    ),
    "avg_pool2d_divisor_override": (
        lambda x: F.avg_pool2d(x, (2, 3), (1, 2), (1, 0), divisor_override=5),
        _randn,
        (2, 3, 7, 8),
    ),
    "avg_pool2d_unbatched": (lambda x: F.avg_pool2d(x, 2, 1), _randn, (3, 5, 6)),
    "adaptive_avg_pool2d_divisible": (
        lambda x: F.adaptive_avg_pool2d(x, (3, 4)),
        _randn,
        (2, 3, 9, 8),
    ),
    "adaptive_avg_pool2d_uneven": (
        lambda x: F.adaptive_avg_pool2d(x, (4, 3)),
        _randn,
        (2, 3, 9, 7),
    ),
    "adaptive_avg_pool2d_upsample": (
        lambda x: F.adaptive_avg_pool2d(x, (5, 6)),
        _randn,
        (1, 2, 3, 4),
    ),
    "adaptive_avg_pool2d_global": (torch.nn.AdaptiveAvgPool2d(1), _randn, (2, 3, 5, 4)),
    "adaptive_avg_pool2d_unbatched": (
        lambda x: F.adaptive_avg_pool2d(x, (2, 3)),
        _randn,
        (3, 5, 7),
    ),
}


def _check_grad(fn, cpu_args, tol) -> None:
    """Forward and backward of fn on tpu match CPU (results and every input grad)."""
    tpu_args = [tpu(a) for a in cpu_args]
    expected = fn(*cpu_args)
    actual = fn(*tpu_args)
    assert_tpu_close(actual, expected, **tol)
    out_c = expected[0] if isinstance(expected, tuple) else expected
    out_t = actual[0] if isinstance(actual, tuple) else actual
    grad = torch.randn_like(out_c)
    out_c.backward(grad)
    out_t.backward(tpu(grad))
    for a_t, a_c in zip(tpu_args, cpu_args):
        assert a_t.grad is not None
        assert_tpu_close(a_t.grad, a_c.grad, **tol)


@pytest.mark.parametrize("name", list(CONV))
def test_conv(name: str, eager: str) -> None:
    fn, shapes = CONV[name]
    args = [torch.randn(*s, requires_grad=True) for s in shapes]
    _check_grad(fn, args, CONV_TOL)


@pytest.mark.parametrize("name", list(POOL))
def test_pool(name: str, eager: str) -> None:
    fn, make, shape = POOL[name]
    x = make(*shape).requires_grad_(True)
    # Indices compare exactly; values and grads to float32 tolerance.
    _check_grad(fn, [x], {})


@pytest.mark.parametrize("mask", [(True, False, False), (False, True, True), (True, True, False)])
def test_convolution_backward_output_mask(mask: tuple[bool, bool, bool]) -> None:
    x, w = torch.randn(2, 3, 6, 6), torch.randn(4, 3, 3, 3)
    g = torch.randn(2, 4, 4, 4)
    args = ([4], [1, 1], [0, 0], [1, 1], False, [0, 0], 1, list(mask))
    expected = torch.ops.aten.convolution_backward(g, x, w, *args)
    actual = torch.ops.aten.convolution_backward(tpu(g), tpu(x), tpu(w), *args)
    for a, e, m in zip(actual, expected, mask):
        assert (a is not None) == m and (e is not None) == m
        if m:
            assert_tpu_close(a, e, **CONV_TOL)


@pytest.mark.parametrize(
    "kernel,stride,pad,dil,ceil", [(3, 2, 1, 1, False), (2, 2, 0, 1, True), (3, 1, 1, 2, True)]
)
def test_max_pool2d_indices_edges(kernel, stride, pad, dil, ceil, eager: str) -> None:
    """Indices as torch reports them: ties to the first position, the last NaN,
    windows of -inf next to padding."""
    x = torch.randn(2, 3, 9, 10)
    x[0, 0, 2, 3] = x[0, 0, 3, 3] = float("nan")
    x[0, 2, 4, 4] = x[0, 2, 4, 5] = 9.0
    x[1, 1] = float("-inf")
    x[1, 2, :, :4] = float("-inf")
    args = (kernel, stride, pad, dil, ceil)
    expected = F.max_pool2d(x, *args, return_indices=True)
    actual = F.max_pool2d(tpu(x), *args, return_indices=True)
    assert_tpu_close(actual, expected, equal_nan=True)


def test_max_pool2d_nan_propagates() -> None:
    x = torch.randn(1, 1, 4, 4)
    x[0, 0, 1, 1] = float("nan")
    x[0, 0, 0, 1] = float("nan")
    expected = F.max_pool2d(x, 2, return_indices=True)
    actual = F.max_pool2d(tpu(x), 2, return_indices=True)
    assert_tpu_close(actual, expected, equal_nan=True)


def _cnn() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 8, 3, padding=1, groups=2),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(8 * 2 * 2, 10),
    )


def _train(device: str, steps: int = 5) -> list[float]:
    torch.manual_seed(0)
    model = _cnn().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(8, 3, 8, 8, generator=gen).to(device)
    y = torch.randint(0, 10, (8,), generator=gen).to(device)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_small_cnn_sgd_parity(eager: str) -> None:
    cpu = _train("cpu")
    got = _train("tpu")
    for step, (a, b) in enumerate(zip(got, cpu)):
        assert abs(a - b) <= 1e-4 * abs(b), f"step {step}: tpu {a} vs cpu {b}"
    assert got[-1] < got[0], "the model did not learn"
