"""Linear algebra on tpu against PyTorch CPU: triangular solves, Cholesky,
partial-pivot LU and what builds on it (solve, inverse, det, slogdet,
lu_unpack, lu_solve), cross products; values and gradients."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_tpu_close

LA = torch.linalg
TOL = {"rtol": 1e-4, "atol": 1e-4}


def _spd(*shape):
    a = torch.randn(*shape)
    return a @ a.mT + shape[-1] * torch.eye(shape[-1])


def _tri(*shape, upper=False):
    a = torch.randn(*shape) + 3 * torch.eye(shape[-1])
    return a.triu() if upper else a.tril()


def _g(t):
    return t.requires_grad_(True)


# name -> (fn(*inputs), make() -> CPU inputs)
CASES = {
    "solve_triangular_lower_left": (
        lambda a, b: LA.solve_triangular(a, b, upper=False),
        lambda: [_g(_tri(4, 4)), _g(torch.randn(4, 3))],
    ),
    "solve_triangular_upper_right_unit_batch": (
        lambda a, b: LA.solve_triangular(a, b, upper=True, left=False, unitriangular=True),
        lambda: [_g(_tri(2, 4, 4, upper=True)), _g(torch.randn(3, 4))],
    ),
    "triangular_solve_transpose": (
        lambda b, a: torch.triangular_solve(b, a, upper=True, transpose=True)[0],
        lambda: [_g(torch.randn(3, 4, 2)), _g(_tri(3, 4, 4, upper=True))],
    ),
    "cholesky": (lambda a: LA.cholesky(a), lambda: [_g(_spd(3, 5, 5))]),
    "cholesky_upper": (lambda a: torch.cholesky(a, upper=True), lambda: [_g(_spd(4, 4))]),
    "cholesky_solve": (
        lambda b, a: torch.cholesky_solve(b, LA.cholesky(a)),
        lambda: [_g(torch.randn(5, 2)), _g(_spd(5, 5))],
    ),
    "cholesky_inverse": (
        lambda a: torch.cholesky_inverse(LA.cholesky(a), upper=False),
        lambda: [_g(_spd(2, 4, 4))],
    ),
    "lu_factor": (lambda a: LA.lu_factor(a), lambda: [_g(torch.randn(2, 5, 5))]),
    "lu_wide": (lambda a: LA.lu(a), lambda: [_g(torch.randn(3, 5))]),
    "lu_tall": (lambda a: LA.lu(a), lambda: [_g(torch.randn(2, 6, 4))]),
    "lu_unpack": (lambda a: torch.lu_unpack(*LA.lu_factor(a)), lambda: [_g(torch.randn(4, 4))]),
    "solve_matrix": (
        lambda a, b: LA.solve(a, b),
        lambda: [_g(torch.randn(2, 4, 4)), _g(torch.randn(4, 3))],
    ),
    "solve_vector": (
        lambda a, b: LA.solve(a, b),
        lambda: [_g(torch.randn(5, 5)), _g(torch.randn(5))],
    ),
    "solve_right": (
        lambda a, b: LA.solve(a, b, left=False),
        lambda: [_g(torch.randn(4, 4)), _g(torch.randn(2, 4))],
    ),
    "inv": (lambda a: LA.inv(a), lambda: [_g(torch.randn(3, 4, 4))]),
    "det": (lambda a: LA.det(a), lambda: [_g(torch.randn(3, 5, 5))]),
    "det_transposed": (lambda a: LA.det(a.mT), lambda: [_g(torch.randn(4, 4))]),
    "slogdet": (lambda a: LA.slogdet(a), lambda: [_g(torch.randn(3, 4, 4))]),
    "logdet_spd": (lambda a: torch.logdet(a), lambda: [_g(_spd(4, 4))]),
    "cross": (
        lambda a, b: LA.cross(a, b, dim=1),
        lambda: [_g(torch.randn(4, 3, 2)), _g(torch.randn(1, 3, 2))],
    ),
}

CASES.update(
    {
        "qr_reduced_tall": (lambda a: LA.qr(a), lambda: [_g(torch.randn(2, 5, 3))]),
        "qr_complete_wide": (lambda a: LA.qr(a, mode="complete"), lambda: [_g(torch.randn(3, 5))]),
        "qr_r": (lambda a: LA.qr(a, mode="r")[1], lambda: [torch.randn(4, 4)]),
        "lstsq_tall": (
            lambda a, b: LA.lstsq(a, b, driver="gels").solution,
            lambda: [_g(torch.randn(6, 3)), _g(torch.randn(6, 2))],
        ),
        "lstsq_wide_batch": (
            lambda a, b: LA.lstsq(a, b).solution,
            lambda: [_g(torch.randn(2, 3, 5)), _g(torch.randn(2, 3, 4))],
        ),
        # gelsd/gelss also return A's singular values (and residuals when tall).
        "lstsq_gelsd_tall": (
            lambda a, b: LA.lstsq(a, b, driver="gelsd"),
            lambda: [torch.randn(2, 6, 4), torch.randn(2, 6, 1)],
        ),
        "lstsq_gelss_wide": (
            lambda a, b: LA.lstsq(a, b, driver="gelss"),
            lambda: [torch.randn(3, 5), torch.randn(3, 2)],
        ),
        "geqrf": (lambda a: torch.geqrf(a), lambda: [torch.randn(5, 4)]),
        "householder_product": (
            lambda a, t: LA.householder_product(a, t),
            lambda: [_g(torch.randn(5, 3)), _g(torch.rand(3))],
        ),
        "ormqr": (
            lambda a, t, o: torch.ormqr(a, t, o, left=False, transpose=True),
            lambda: [torch.randn(4, 4), torch.rand(4), _g(torch.randn(3, 4))],
        ),
    }
)

for _left in [True, False]:
    for _adj in [True, False]:
        CASES[f"lu_solve_left{int(_left)}_adjoint{int(_adj)}"] = (
            lambda a, b, le=_left, ad=_adj: LA.lu_solve(*LA.lu_factor(a), b, left=le, adjoint=ad),
            lambda le=_left: [
                _g(torch.randn(4, 4)),
                _g(torch.randn(4, 2) if le else torch.randn(2, 4)),
            ],
        )


def _outputs(r):
    return [t for t in (r if isinstance(r, (tuple, list)) else [r]) if t.requires_grad]


@pytest.mark.parametrize("name", sorted(CASES))
def test_linalg(name, eager):
    fn, make = CASES[name]
    inputs = make()
    ref_in = [t.detach().requires_grad_(t.requires_grad) for t in inputs]
    dev_in = [t.detach().to("tpu").requires_grad_(t.requires_grad) for t in inputs]
    ref, out = fn(*ref_in), fn(*dev_in)
    assert_tpu_close(out, ref, **TOL)
    ref_o, out_o = _outputs(ref), _outputs(out)
    if not ref_o:
        return
    grads = [torch.randn(o.shape) for o in ref_o]
    wrt = [k for k, t in enumerate(inputs) if t.requires_grad]
    ref_g = torch.autograd.grad(ref_o, [ref_in[k] for k in wrt], grads, allow_unused=True)
    dev_g = torch.autograd.grad(
        out_o, [dev_in[k] for k in wrt], [g.to("tpu") for g in grads], allow_unused=True
    )
    for d, r in zip(dev_g, ref_g):
        if r is not None:
            assert_tpu_close(d, r, **TOL)


def test_cholesky_ex_info_and_lu_singular(eager):
    a = torch.tensor([[4.0, 2.0, 0.0], [2.0, 1.0, 0.0], [0.0, 0.0, 1.0]])  # PSD, not PD
    _, info = LA.cholesky_ex(a.to("tpu"))
    # XLA's factor is all NaN on failure, so only "failed" (not where) is known.
    assert info.item() != 0 and LA.cholesky_ex(a)[1].item() != 0
    with pytest.raises(RuntimeError):
        LA.cholesky(a.to("tpu"))
    s = torch.tensor([[1.0, 2.0], [2.0, 4.0]])
    _, _, info = LA.lu_factor_ex(s.to("tpu"))
    assert info.item() == LA.lu_factor_ex(s)[2].item()
    assert_tpu_close(LA.det(s.to("tpu")), LA.det(s))


# matrix_exp follows the CPU's algorithm and rounding: its float32 error grows with
# ||A|| through the squarings (OpInfo's samples, uniform in [-9, 9], are off by ~1e-2
# at 1e5), far past the default tolerance unless the same roundings happen on tpu.
MEXP_NORMS = {  # one 1-norm per Taylor degree of each dtype, then scaling and squaring
    torch.float32: [1e-8, 1e-4, 1e-2, 0.3, 1.2, 2.5, 7.0],
    torch.float64: [1e-17, 1e-9, 1e-4, 0.03, 0.2, 0.8, 7.0],
}


def _mexp_inputs(dtype, n=4):
    g = torch.Generator().manual_seed(0)
    big = torch.rand(8, 5, 5, generator=g, dtype=dtype) * 18 - 9
    x = torch.randn(len(MEXP_NORMS[dtype]), n, n, generator=g, dtype=dtype)
    norms = torch.tensor(MEXP_NORMS[dtype], dtype=dtype)[:, None, None]
    return [big, big[3], x / x.abs().sum(-2).amax(-1)[:, None, None] * norms]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_matrix_exp_matches_cpu_rounding(dtype, eager):
    for a in _mexp_inputs(dtype):
        # torch.testing's default tolerance (conftest's float32 default is looser)
        tol = {"rtol": 1.3e-6, "atol": 1e-5} if dtype == torch.float32 else {}
        assert_tpu_close(LA.matrix_exp(a.to("tpu")), LA.matrix_exp(a), **tol)


def test_matrix_exp_large_and_backward(eager):
    # n >= 8 multiplies with dot (another summation order): close, not bitwise
    for a in [_mexp_inputs(torch.float32, n=9)[2], torch.randn(2, 12, 12)]:
        assert_tpu_close(LA.matrix_exp(a.to("tpu")), LA.matrix_exp(a), rtol=1e-5, atol=1e-5)
    # the gradient is a matrix_exp of a [2n, 2n] block matrix
    a = torch.randn(2, 4, 4, requires_grad=True)
    d = a.detach().to("tpu").requires_grad_(True)
    g = torch.randn(2, 4, 4)
    (ga,) = torch.autograd.grad(LA.matrix_exp(a), a, g)
    (gd,) = torch.autograd.grad(LA.matrix_exp(d), d, g.to("tpu"))
    assert_tpu_close(gd, ga, **TOL)


# eigh / svd: values against the CPU; vectors against the CPU's up to a unit factor per
# column (a sign, or a phase when complex), which LAPACK picks by its own algorithm.
EIG_TOL = {
    torch.float32: {"rtol": 1e-5, "atol": 1e-5},
    torch.complex64: {"rtol": 1e-5, "atol": 1e-5},
    torch.float64: {"rtol": 1e-10, "atol": 1e-10},
    torch.complex128: {"rtol": 1e-10, "atol": 1e-10},
}


def _assert_same_columns(v, ve, **tol):
    v = v.detach().cpu()
    ph = (ve.conj() * v).sum(-2, keepdim=True)
    torch.testing.assert_close(v * (ph.conj() / ph.abs()), ve, **tol)


@pytest.mark.parametrize("uplo", ["L", "U"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.complex64, torch.complex128])
def test_eigh_matches_cpu(dtype, uplo, eager):
    a = torch.randn(2, 5, 5, dtype=dtype)  # only the UPLO triangle is read
    if dtype.is_complex:
        a.diagonal(dim1=-2, dim2=-1).imag.fill_(0.5)  # ignored, as by LAPACK
    w, v = LA.eigh(a.to("tpu"), UPLO=uplo)
    we, ve = LA.eigh(a, UPLO=uplo)
    assert_tpu_close(w, we, **EIG_TOL[dtype])
    _assert_same_columns(v, ve, **EIG_TOL[dtype])
    assert_tpu_close(LA.eigvalsh(a.to("tpu"), UPLO=uplo), we, **EIG_TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.complex64])
def test_eigh_backward(dtype, eager):
    x = torch.randn(4, 4, dtype=dtype)
    x = x + x.mH
    wts = torch.randn(4, 4)

    def loss(a):
        w, v = LA.eigh(a)  # a loss that no sign or phase of the vectors changes
        return (w * torch.arange(1.0, 5.0, device=a.device)).sum() + (
            v.abs() ** 2 * wts.to(a.device)
        ).sum()

    a = x.clone().requires_grad_(True)
    d = x.to("tpu").requires_grad_(True)
    (ga,) = torch.autograd.grad(loss(a), a)
    (gd,) = torch.autograd.grad(loss(d), d)
    assert_tpu_close(gd, ga, **TOL)


@pytest.mark.parametrize("shape", [(6, 4), (2, 3, 5)])
def test_svd_complex_matches_cpu(shape, eager):
    a = torch.randn(*shape, dtype=torch.complex64)
    u, s, vh = LA.svd(a.to("tpu"), full_matrices=False)
    ue, se, vhe = LA.svd(a, full_matrices=False)
    assert_tpu_close(s, se, **TOL)
    _assert_same_columns(u, ue, **TOL)
    _assert_same_columns(vh.mH, vhe.mH, **TOL)
    assert_tpu_close(LA.svdvals(a.to("tpu")), se, **TOL)


# ldl_factor: LAPACK's compact LD and pivots (Bunch-Kaufman, 2x2 blocks as negative pairs);
# complex inputs are complex symmetric (hermitian=False, the default)
def _ldl_inputs(dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 6, 6, generator=g, dtype=dtype)
    pd = x @ x.mT + torch.eye(6, dtype=dtype)
    singular = torch.zeros(4, 4, dtype=dtype)
    singular[2, 2] = 1.0
    return {
        "indefinite_2x2_pivots": x + x.mT,
        "pd": pd,
        "general_lower_read": x[0],
        "singular": singular,
        "one": torch.randn(1, 1, generator=g, dtype=dtype),
    }


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.complex64])
def test_ldl_factor_matches_cpu(dtype, eager):
    tol = EIG_TOL[dtype]
    for name, a in _ldl_inputs(dtype).items():
        ld, piv, info = LA.ldl_factor_ex(a.to("tpu"))
        ld_e, piv_e, info_e = LA.ldl_factor_ex(a)
        assert torch.equal(piv.cpu(), piv_e), name
        assert torch.equal(info.cpu(), info_e), name
        assert_tpu_close(ld, ld_e, **tol)
    a = _ldl_inputs(dtype)["indefinite_2x2_pivots"]
    assert (LA.ldl_factor(a)[1] < 0).any()  # the rows above do exercise 2x2 blocks


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.complex64])
def test_ldl_solve_matches_cpu(dtype, eager):
    a = _ldl_inputs(dtype)["indefinite_2x2_pivots"]
    ld, piv = LA.ldl_factor(a)
    # B broadcasts to LD's batch (the CPU kernel crashes when LD would broadcast to B's)
    for rhs in [torch.randn(3, 6, 2, dtype=dtype), torch.randn(6, 4, dtype=dtype)]:
        x = LA.ldl_solve(ld.to("tpu"), piv.to("tpu"), rhs.to("tpu"))
        assert_tpu_close(x, LA.ldl_solve(ld, piv, rhs), rtol=1e-4, atol=1e-4)


def test_ldl_factor_complex_hermitian_is_an_error():
    a = torch.randn(3, 3, dtype=torch.complex64)
    with pytest.raises((RuntimeError, NotImplementedError), match="ldl_factor"):
        LA.ldl_factor(a.to("tpu"), hermitian=True)
