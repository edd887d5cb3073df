"""Padding (reflect/replicate/circular) and interpolation on tpu vs CPU:
forward and gradient, both eager modes.

Interpolation is a contraction with per-axis weight matrices, so its sums run
in another order than CPU's kernels: linear modes use rtol=atol=1e-5 like the
rest, bicubic (4 taps with negative weights) 1e-4.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_tpu_close, tpu

CUBIC_TOL = {"rtol": 1e-4, "atol": 1e-4}


def _pad(pad, mode):
    return lambda x: F.pad(x, pad, mode=mode)


def _interp(**kw):
    return lambda x: F.interpolate(x, **kw)


# name -> (function, input shape, tolerance)
CASES = {
    "reflect1d": (_pad((2, 3), "reflect"), (2, 3, 6), {}),
    "reflect1d_unbatched": (_pad((1, 2), "reflect"), (3, 5), {}),
    "reflect2d": (_pad((1, 2, 3, 1), "reflect"), (2, 3, 5, 6), {}),
    "reflect2d_negative": (_pad((-1, 2, 2, -1), "reflect"), (1, 2, 5, 6), {}),
    "reflect3d": (_pad((1, 2, 2, 1, 1, 1), "reflect"), (1, 2, 3, 4, 5), {}),
    "replicate1d": (_pad((3, 1), "replicate"), (2, 3, 4), {}),
    "replicate2d": (_pad((2, 1, 0, 3), "replicate"), (2, 3, 4, 5), {}),
    "replicate3d": (_pad((1, 1, 2, 0, 1, 3), "replicate"), (1, 2, 3, 4, 2), {}),
    "circular2d": (_pad((1, 2, 2, 1), "circular"), (2, 3, 4, 5), {}),
    "nearest1d_size": (_interp(size=7, mode="nearest"), (2, 3, 4), {}),
    "nearest2d_scale2": (_interp(scale_factor=2, mode="nearest"), (2, 3, 3, 4), {}),
    "nearest2d_down": (_interp(size=(3, 2), mode="nearest"), (1, 2, 7, 5), {}),
    "nearest2d_scale_frac": (_interp(scale_factor=(1.7, 0.6), mode="nearest"), (1, 2, 5, 6), {}),
    "nearest3d": (_interp(size=(3, 5, 2), mode="nearest"), (1, 2, 2, 3, 4), {}),
    "nearest_exact1d": (_interp(size=5, mode="nearest-exact"), (2, 3, 7), {}),
    "nearest_exact2d": (_interp(scale_factor=1.5, mode="nearest-exact"), (1, 2, 4, 5), {}),
    "nearest_exact3d": (_interp(size=(2, 5, 3), mode="nearest-exact"), (1, 2, 3, 3, 4), {}),
    "linear1d": (_interp(size=9, mode="linear"), (2, 3, 4), {}),
    "linear1d_align": (_interp(size=9, mode="linear", align_corners=True), (2, 3, 4), {}),
    "linear1d_down_scale": (_interp(scale_factor=0.6, mode="linear"), (2, 3, 8), {}),
    "bilinear_size": (_interp(size=(7, 5), mode="bilinear"), (2, 3, 4, 3), {}),
    "bilinear_size_align": (
        _interp(size=(7, 5), mode="bilinear", align_corners=True),
        (2, 3, 4, 3),
        {},
    ),
    "bilinear_scale": (_interp(scale_factor=(2.5, 1.5), mode="bilinear"), (1, 2, 3, 4), {}),
    "bilinear_scale_align": (
        _interp(scale_factor=2, mode="bilinear", align_corners=True),
        (1, 2, 3, 4),
        {},
    ),
    "bilinear_down": (_interp(size=(3, 2), mode="bilinear"), (2, 2, 7, 5), {}),
    "bilinear_same_size": (_interp(size=(4, 6), mode="bilinear"), (1, 2, 4, 5), {}),
    "bilinear_recompute": (
        _interp(scale_factor=1.3, mode="bilinear", recompute_scale_factor=True),
        (1, 2, 5, 4),
        {},
    ),
    "trilinear": (_interp(size=(3, 5, 4), mode="trilinear"), (1, 2, 2, 3, 5), {}),
    "trilinear_align": (
        _interp(scale_factor=2, mode="trilinear", align_corners=True),
        (1, 2, 2, 3, 2),
        {},
    ),
    "bicubic": (_interp(size=(7, 6), mode="bicubic"), (2, 2, 4, 3), CUBIC_TOL),
    "bicubic_align": (
        _interp(size=(7, 6), mode="bicubic", align_corners=True),
        (2, 2, 4, 3),
        CUBIC_TOL,
    ),
    "bicubic_scale_down": (_interp(scale_factor=0.7, mode="bicubic"), (1, 2, 8, 9), CUBIC_TOL),
    "bilinear_aa_down": (
        _interp(size=(3, 4), mode="bilinear", antialias=True),
        (2, 2, 8, 9),
        {},
    ),
    "bilinear_aa_scale_align": (
        _interp(scale_factor=(0.4, 1.5), mode="bilinear", antialias=True, align_corners=True),
        (1, 2, 10, 4),
        {},
    ),
    "bicubic_aa_down": (
        _interp(size=(4, 3), mode="bicubic", antialias=True),
        (1, 2, 9, 10),
        CUBIC_TOL,
    ),
    "bicubic_aa_up": (
        _interp(scale_factor=1.7, mode="bicubic", antialias=True),
        (1, 2, 4, 5),
        CUBIC_TOL,
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_resample(name: str, eager: str) -> None:
    fn, shape, tol = CASES[name]
    x = torch.randn(*shape, requires_grad=True)
    xt = tpu(x)
    expected = fn(x)
    actual = fn(xt)
    assert_tpu_close(actual, expected, **tol)
    grad = torch.randn_like(expected)
    expected.backward(grad)
    actual.backward(tpu(grad))
    assert xt.grad is not None
    assert_tpu_close(xt.grad, x.grad, **tol)


@pytest.mark.parametrize(
    "op, args",
    [
        (torch.ops.aten.upsample_nearest2d.out, ([6, 5], 1.5, 1.25)),
        (torch.ops.aten.upsample_bilinear2d.out, ([6, 5], False, None, None)),
        (torch.ops.aten.reflection_pad2d.out, ([1, 2, 2, 1],)),
        (torch.ops.aten.replication_pad1d.out, ([2, 1],)),
    ],
)
def test_out_variants(op, args) -> None:
    x = torch.randn(2, 3, 4, 4) if "pad1d" not in str(op) else torch.randn(2, 3, 4)
    expected = op(x, *args, out=torch.empty(0))
    actual = op(tpu(x), *args, out=torch.empty(0, device="tpu"))
    assert_tpu_close(actual, expected)


def test_nearest_uint8_image() -> None:
    x = torch.randint(0, 255, (1, 3, 5, 4), dtype=torch.uint8)
    expected = F.interpolate(x, scale_factor=1.6, mode="nearest")
    actual = F.interpolate(tpu(x), scale_factor=1.6, mode="nearest")
    assert_tpu_close(actual, expected)


@pytest.mark.parametrize(
    "fn",
    [
        _pad((2, 1, 1, 2), "reflect"),
        _interp(scale_factor=1.5, mode="nearest"),
        _interp(size=(5, 7), mode="bilinear", align_corners=False),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_other_float_dtypes(fn, dtype) -> None:
    # bfloat16 interpolates in float32 and rounds once, as CPU does.
    x = torch.randn(1, 2, 4, 5, dtype=dtype)
    assert_tpu_close(fn(tpu(x)), fn(x))
