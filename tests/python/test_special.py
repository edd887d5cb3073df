"""Special functions on tpu against PyTorch CPU: the gamma family, Bessel
functions, orthogonal polynomials and small exp/log/erf relatives, forward
(on non-contiguous inputs too) and gradients where torch defines them."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_tpu_close


def _wide(*shape):
    """Values over [-9, 9] plus a few exact points (0, +-1, large)."""
    x = torch.empty(*shape).uniform_(-9, 9)
    flat = x.view(-1)
    flat[:6] = torch.tensor([0.0, 1.0, -1.0, 0.5, 14.0, -13.5])
    return x


def _pos(*shape):
    return torch.empty(*shape).uniform_(0.05, 30)


S = torch.special
# name -> (fn, make inputs, differentiable)
UNARY = {
    "lgamma": (torch.lgamma, _wide, True),
    "digamma": (torch.digamma, _wide, True),
    "trigamma": (lambda x: torch.polygamma(1, x), _wide, True),
    "polygamma3": (lambda x: torch.polygamma(3, x), _wide, False),
    "mvlgamma": (lambda x: torch.mvlgamma(x.abs() + 2, 3), _wide, True),
    "i0": (torch.i0, _wide, True),
    "i0e": (S.i0e, _wide, True),
    "i1": (S.i1, _wide, True),
    "i1e": (S.i1e, _wide, True),
    "k0": (S.modified_bessel_k0, _pos, False),
    "k1": (S.modified_bessel_k1, _pos, False),
    "k0e": (S.scaled_modified_bessel_k0, _pos, False),
    "k1e": (S.scaled_modified_bessel_k1, _pos, False),
    "j0": (S.bessel_j0, _wide, False),
    "j1": (S.bessel_j1, _wide, False),
    "y0": (S.bessel_y0, _pos, False),
    "y1": (S.bessel_y1, _pos, False),
    "spherical_j0": (S.spherical_bessel_j0, _wide, False),
    "airy_ai": (S.airy_ai, lambda *s: _wide(*s) * 1.4, False),
    "angle": (torch.angle, _wide, False),
    "sinc": (torch.sinc, _wide, True),
    "entr": (S.entr, _wide, True),
    "erfcx": (S.erfcx, lambda *s: _wide(*s) / 2, True),
    "log_ndtr": (S.log_ndtr, _wide, True),
    "ndtri": (S.ndtri, lambda *s: torch.rand(*s) * 0.98 + 0.01, True),
}

POLY = [
    "chebyshev_polynomial_t",
    "chebyshev_polynomial_u",
    "chebyshev_polynomial_v",
    "chebyshev_polynomial_w",
    "shifted_chebyshev_polynomial_t",
    "shifted_chebyshev_polynomial_u",
    "shifted_chebyshev_polynomial_v",
    "shifted_chebyshev_polynomial_w",
    "hermite_polynomial_h",
    "hermite_polynomial_he",
    "laguerre_polynomial_l",
    "legendre_polynomial_p",
]


@pytest.mark.parametrize("name", sorted(UNARY))
def test_special_unary(name, eager):
    fn, make, diff = UNARY[name]
    x = make(6, 8)
    ref = fn(x)
    assert_tpu_close(fn(x.to("tpu")), ref, rtol=2e-5, atol=1e-5, equal_nan=True)
    xt = x.t()  # non-contiguous
    assert_tpu_close(fn(xt.to("tpu").t().t()), fn(xt), rtol=2e-5, atol=1e-5, equal_nan=True)
    if diff:
        xc, xd = x.clone().requires_grad_(True), x.to("tpu").requires_grad_(True)
        g = torch.randn(6, 8)
        (gc,) = torch.autograd.grad(fn(xc), xc, g)
        (gd,) = torch.autograd.grad(fn(xd), xd, g.to("tpu"))
        assert_tpu_close(gd, gc, rtol=2e-5, atol=1e-5, equal_nan=True)


@pytest.mark.parametrize("name", POLY)
def test_orthogonal_polynomials(name, eager):
    fn = getattr(S, name)
    x = torch.cat([torch.empty(30).uniform_(-1.5, 1.5), torch.tensor([1.0, -1.0, 0.0, 0.5])])
    n = torch.tensor([-1.0, 0.0, 1.0, 2.0, 3.5, 7.0, 9.0, 12.0, 5.0, 4.0]).repeat(4)[:34]
    ref = fn(x, n)
    assert_tpu_close(fn(x.to("tpu"), n.to("tpu")), ref, rtol=1e-4, atol=1e-4, equal_nan=True)
    # Broadcast: every x against every n, and a Python-number n.
    ref = fn(x[:, None], n[None, :10])
    assert_tpu_close(
        fn(x.to("tpu")[:, None], n.to("tpu")[None, :10]), ref, rtol=1e-4, atol=1e-4, equal_nan=True
    )
    assert_tpu_close(fn(x.to("tpu"), 6), fn(x, 6), rtol=1e-4, atol=1e-4, equal_nan=True)


@pytest.mark.parametrize(
    "name",
    ["zeta", "nextafter", "logaddexp2", "heaviside", "xlog1py", "igamma", "igammac"],
)
def test_special_binary(name, eager):
    a = torch.empty(5, 7).uniform_(-9, 9)
    b = torch.empty(7).uniform_(-9, 9)
    fns = {
        "zeta": lambda x, y: S.zeta(x.abs() + 1.5, y),
        "nextafter": torch.nextafter,
        "logaddexp2": torch.logaddexp2,
        "heaviside": lambda x, y: torch.heaviside(x.round(), y),
        "xlog1py": lambda x, y: S.xlog1py(x, y.abs()),
        "igamma": lambda x, y: torch.igamma(x.abs() + 0.1, y.abs()),
        "igammac": lambda x, y: torch.igammac(x.abs(), y.abs() * 2),
    }
    fn = fns[name]
    assert_tpu_close(fn(a.to("tpu"), b.to("tpu")), fn(a, b), rtol=2e-5, atol=1e-5, equal_nan=True)


def test_zeta_below_one_is_nan(eager):
    # x < 1 is NaN for any q, integer q <= 0 included (bool inputs give zeta(0, 0)).
    x = torch.tensor([0.0, 0.5, 1.0, 2.0, 0.0, -1.0, 3.0])
    q = torch.tensor([0.0, 1.0, 0.0, 0.0, -2.0, 1.0, -1.5])
    assert_tpu_close(S.zeta(x.to("tpu"), q.to("tpu")), S.zeta(x, q), equal_nan=True)
    b, c = torch.tensor([True, False, False]), torch.tensor([False, False, True])
    assert_tpu_close(S.zeta(b.to("tpu"), c.to("tpu")), S.zeta(b, c), equal_nan=True)


def test_frexp_and_signbit(eager):
    x = torch.tensor([0.0, -0.0, 1.0, -3.5, 1e-40, -2e-39, 6e37, float("inf"), 0.75, 1e-3])
    m, e = torch.frexp(x.to("tpu"))
    rm, re = torch.frexp(x)
    assert_tpu_close(m, rm)
    assert_tpu_close(e, re)
    assert_tpu_close(torch.signbit(x.to("tpu")), torch.signbit(x))
    xi = torch.tensor([-3, 0, 4])
    assert_tpu_close(torch.signbit(xi.to("tpu")), torch.signbit(xi))
