"""Complex tensors on the tpu device against the CPU, in every eager mode:
creation, copies, views that reinterpret the storage (view_as_real,
view_as_complex, .real, .imag), the lazy conj() bit, polar/complex,
elementwise math, matmuls, reductions, printing, autograd, and a Llama-style
attention block with complex rotary embeddings that trains."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_tpu_close

C64, C128 = torch.complex64, torch.complex128


@pytest.fixture(autouse=True)
def _every_mode(eager):
    """Every test here runs in each eager mode."""
    yield


def crandn(*shape, dtype=C64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, 2, generator=g, dtype=torch.float64).to(dtype.to_real()).contiguous()


def cplx(*shape, dtype=C64, seed=0):
    return torch.view_as_complex(crandn(*shape, dtype=dtype, seed=seed))


# ---------------------------------------------------------------- creation and copies


@pytest.mark.parametrize("dtype", [C64, C128], ids=str)
def test_roundtrip_copies(dtype):
    x = cplx(3, 5, dtype=dtype)
    d = x.to("tpu")
    assert d.dtype == dtype and d.device.type == "tpu"
    assert torch.equal(d.cpu(), x)
    # Device -> device copies: contiguous, transposed, into a strided view.
    assert torch.equal(d.clone().cpu(), x)
    assert torch.equal(d.t().contiguous().cpu(), x.t().contiguous())
    e = torch.zeros(5, 6, dtype=dtype, device="tpu")
    e[:, ::2].copy_(d.t())
    ref = torch.zeros(5, 6, dtype=dtype)
    ref[:, ::2].copy_(x.t())
    assert torch.equal(e.cpu(), ref)
    # A host strided view uploads into a device strided view.
    e[:, 1::2] = x.t()
    ref[:, 1::2] = x.t()
    assert torch.equal(e.cpu(), ref)


@pytest.mark.parametrize("dtype", [C64, C128], ids=str)
def test_creation(dtype):
    assert_tpu_close(torch.zeros(2, 3, dtype=dtype, device="tpu"), torch.zeros(2, 3, dtype=dtype))
    assert_tpu_close(torch.ones(4, dtype=dtype, device="tpu"), torch.ones(4, dtype=dtype))
    assert_tpu_close(
        torch.full((2, 2), 1.5 - 2j, dtype=dtype, device="tpu"),
        torch.full((2, 2), 1.5 - 2j, dtype=dtype),
    )
    x = torch.empty(3, dtype=dtype, device="tpu").fill_(0.25 + 4j)
    assert_tpu_close(x, torch.full((3,), 0.25 + 4j, dtype=dtype))
    assert_tpu_close(torch.tensor([1 + 2j, -3j], device="tpu"), torch.tensor([1 + 2j, -3j]))


def test_dtype_conversions():
    r = torch.randn(4, 3)
    d = r.to("tpu")
    assert_tpu_close(d.to(C64), r.to(C64))
    assert_tpu_close(d.to(C64).to(C128), r.to(C64).to(C128))
    z = cplx(4, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "discards the imaginary part", once per process
        back = z.to("tpu").to(torch.float32)
    assert_tpu_close(back, z.real.clone())
    assert_tpu_close(z.to("tpu").to(C128), z.to(C128))


# ---------------------------------------------------------------- views


def test_view_as_real_and_complex_read():
    z = cplx(3, 4)
    d = z.to("tpu")
    assert_tpu_close(torch.view_as_real(d), torch.view_as_real(z))
    assert_tpu_close(torch.view_as_real(d.t()), torch.view_as_real(z.t()))
    assert_tpu_close(d.real, z.real)
    assert_tpu_close(d.imag, z.imag)
    assert_tpu_close(d.t().imag * 2, z.t().imag * 2)
    r = crandn(2, 5)
    assert_tpu_close(torch.view_as_complex(r.to("tpu")), torch.view_as_complex(r))
    # A complex view of a real storage's slice (offset in real units).
    r2 = torch.randn(4, 6)
    assert_tpu_close(
        torch.view_as_complex(r2.to("tpu")[1:].view(3, 3, 2)),
        torch.view_as_complex(r2[1:].view(3, 3, 2)),
    )


def test_writes_through_views():
    z = cplx(3, 4)
    d = z.clone().to("tpu")
    # Real-typed writes into a complex storage, and complex ones into a real storage.
    d.real.mul_(2)
    z.real.mul_(2)
    d.imag[1:].zero_()
    z.imag[1:].zero_()
    torch.view_as_real(d)[:, ::2, 1] += 1.0
    torch.view_as_real(z)[:, ::2, 1] += 1.0
    assert_tpu_close(d, z)
    r = torch.randn(2, 3, 2)
    dr = r.to("tpu")
    torch.view_as_complex(dr).mul_(1j)
    torch.view_as_complex(r).mul_(1j)
    assert_tpu_close(dr, r)


def test_conj_bit():
    z, w = cplx(3, 4), cplx(4, 2, seed=1)
    d, e = z.to("tpu"), w.to("tpu")
    c = d.conj()
    assert c.is_conj()
    assert_tpu_close(c, z.conj())
    assert_tpu_close(c.resolve_conj(), z.conj().resolve_conj())
    assert_tpu_close(torch.conj_physical(d), torch.conj_physical(z))
    assert_tpu_close(c + 1, z.conj() + 1)
    # mm and friends take conj() inputs without PyTorch's fallback.
    assert_tpu_close(c @ e, z.conj() @ w)
    assert_tpu_close(d.t().conj() @ d, z.t().conj() @ z, rtol=1e-5, atol=1e-5)
    assert_tpu_close(torch.vdot(d[0], d[1]), torch.vdot(z[0], z[1]))
    assert_tpu_close(torch.dot(d[0].conj(), d[1]), torch.dot(z[0].conj(), z[1]))
    # conj().imag carries the negative bit.
    assert_tpu_close(c.imag, z.conj().imag)
    assert_tpu_close(c.imag * 3, z.conj().imag * 3)
    # Writing through a conj view stores the conjugate.
    c2, z2 = d.clone(), z.clone()
    c2.conj()[1:].copy_(e.t())
    z2.conj()[1:].copy_(w.t())
    c2[0].conj().copy_(d[1].conj())
    z2[0].conj().copy_(z[1].conj())
    assert_tpu_close(c2, z2)


# ---------------------------------------------------------------- math

UNARY = {
    "exp": torch.exp,
    "abs": torch.abs,
    "angle": torch.angle,
    "sgn": torch.sgn,
    "neg": torch.neg,
    "reciprocal": torch.reciprocal,
    "sqrt": torch.sqrt,
    "log": torch.log,
    "square": torch.square,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "sin": torch.sin,
    "sinh": torch.sinh,
    "cosh": torch.cosh,
    "asinh": torch.asinh,
    "atanh": torch.atanh,
}


@pytest.mark.parametrize("dtype", [C64, C128], ids=str)
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary(name, dtype):
    z = cplx(4, 5, dtype=dtype)
    z[0, 0] = 0
    if name in ("log", "reciprocal"):
        z[0, 0] = 1
    assert_tpu_close(UNARY[name](z.to("tpu")), UNARY[name](z), rtol=2e-5, atol=2e-5)


BINARY = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b,
    "add_alpha": lambda a, b: torch.add(a, b, alpha=2 - 1j),
    "pow2": lambda a, b: a**2,
    "scalar_mul": lambda a, b: a * (0.5 + 2j),
    "scalar_add": lambda a, b: a + 1j,
    "real_mul": lambda a, b: a * b.real,
    "eq": lambda a, b: a == a.conj(),
    "lerp": lambda a, b: torch.lerp(a, b.expand_as(a), 0.3),
}


@pytest.mark.parametrize("dtype", [C64, C128], ids=str)
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary(name, dtype):
    a, b = cplx(3, 4, dtype=dtype), cplx(4, seed=1, dtype=dtype)  # b broadcasts
    assert_tpu_close(BINARY[name](a.to("tpu"), b.to("tpu")), BINARY[name](a, b))


def test_polar_and_complex():
    r, t = torch.rand(3, 4) + 0.5, torch.randn(3, 4)
    assert_tpu_close(torch.polar(r.to("tpu"), t.to("tpu")), torch.polar(r, t))
    assert_tpu_close(torch.complex(r.to("tpu"), t.to("tpu")), torch.complex(r, t))
    r64, t64 = r.double(), t.double()
    assert_tpu_close(torch.polar(r64.to("tpu"), t64.to("tpu")), torch.polar(r64, t64))


def test_matmul_and_reductions():
    a, b, v = cplx(2, 3, 4), cplx(4, 5, seed=1), cplx(4, seed=2)
    da, db, dv = a.to("tpu"), b.to("tpu"), v.to("tpu")
    tol = {"rtol": 1e-5, "atol": 1e-5}
    assert_tpu_close(da @ db, a @ b, **tol)
    assert_tpu_close(torch.bmm(da, da.transpose(1, 2)), torch.bmm(a, a.transpose(1, 2)), **tol)
    assert_tpu_close(da @ dv, a @ v, **tol)
    assert_tpu_close(
        torch.addmm(db[:3, :3], da[0], db[:, :3]), torch.addmm(b[:3, :3], a[0], b[:, :3]), **tol
    )
    assert_tpu_close(da.sum(), a.sum(), **tol)
    assert_tpu_close(da.sum(dim=1), a.sum(dim=1), **tol)
    assert_tpu_close(da.mean(), a.mean(), **tol)
    assert_tpu_close(da.mean(dim=(0, 2), keepdim=True), a.mean(dim=(0, 2), keepdim=True), **tol)
    # Variances and norms of complex values are real.
    assert_tpu_close(da.var(dim=1), a.var(dim=1), **tol)
    assert_tpu_close(torch.std_mean(da, dim=2), torch.std_mean(a, dim=2), **tol)
    for p in (2, 1, float("inf")):
        assert_tpu_close(
            torch.linalg.vector_norm(da, p, dim=-1), torch.linalg.vector_norm(a, p, dim=-1), **tol
        )
    assert_tpu_close(torch.norm(da), torch.norm(a), **tol)


def test_printing():
    z = torch.tensor([[1 + 2j, -0.5j], [3.25 + 0j, -1 - 1j]])
    d = z.to("tpu")
    assert repr(d) == repr(z)[:-1] + ", device='tpu:0')"
    assert str(d.conj()) == str(z.conj())[:-1] + ", device='tpu:0')"
    z128 = z.to(C128)
    assert repr(z128.to("tpu")) == repr(z128)[:-1] + ", device='tpu:0')"


# ---------------------------------------------------------------- autograd


def _grads(fn, leaves, device):
    ins = [t.detach().to(device).requires_grad_() for t in leaves]
    out = fn(*ins)
    out.backward()
    return out.detach(), [t.grad for t in ins]


@pytest.mark.parametrize(
    "name",
    ["mul_abs", "view_as_real_mix", "polar", "div_exp", "matmul", "real_imag"],
)
def test_backward(name):
    w = torch.randn(3, 4, 2)
    fns = {
        "mul_abs": lambda z, u: (z * u).abs().sum(),
        "view_as_real_mix": lambda z, u: (torch.view_as_real(z * u.conj()) * w.to(z.device)).sum(),
        "polar": lambda z, u: (torch.polar(z.abs() + 1, u.angle()) * z).real.sum(),
        "div_exp": lambda z, u: (z / (u + 2)).exp().imag.pow(2).sum(),
        "matmul": lambda z, u: (z @ u.t()).abs().pow(2).sum(),
        "real_imag": lambda z, u: (z.real * u.imag - z.imag.sin()).sum(),
    }
    leaves = [cplx(3, 4), cplx(3, 4, seed=1)]
    ref, ref_g = _grads(fns[name], leaves, "cpu")
    out, dev_g = _grads(fns[name], leaves, "tpu")
    assert_tpu_close(out, ref, rtol=1e-5, atol=1e-5)
    assert_tpu_close(dev_g, ref_g, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- Llama-style RoPE


def precompute_freqs_cis(dim, end, theta=10000.0, device="cpu"):
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2, device=device)[: dim // 2].float() / dim))
    t = torch.arange(end, device=device, dtype=torch.float32)
    freqs = torch.outer(t, freqs)
    return torch.polar(torch.ones_like(freqs), freqs)


def apply_rotary_emb(xq, xk, freqs_cis):
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    freqs_cis = freqs_cis.view(1, xq_.shape[1], 1, xq_.shape[-1])
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)
    xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


class Block(torch.nn.Module):
    def __init__(self, dim=32, heads=4, vocab=50, seq=8):
        super().__init__()
        self.heads, self.hd = heads, dim // heads
        self.emb = torch.nn.Embedding(vocab, dim)
        self.wq = torch.nn.Linear(dim, dim, bias=False)
        self.wk = torch.nn.Linear(dim, dim, bias=False)
        self.wv = torch.nn.Linear(dim, dim, bias=False)
        self.wo = torch.nn.Linear(dim, dim, bias=False)
        self.norm = torch.nn.RMSNorm(dim)
        self.out = torch.nn.Linear(dim, vocab, bias=False)
        self.register_buffer("freqs_cis", precompute_freqs_cis(self.hd, seq), persistent=False)

    def forward(self, tokens):
        b, s = tokens.shape
        h = self.emb(tokens)
        x = self.norm(h)
        q = self.wq(x).view(b, s, self.heads, self.hd)
        k = self.wk(x).view(b, s, self.heads, self.hd)
        v = self.wv(x).view(b, s, self.heads, self.hd)
        q, k = apply_rotary_emb(q, k, self.freqs_cis[:s])
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(self.hd)
        mask = torch.full((s, s), float("-inf"), device=tokens.device).triu(1)
        att = F.softmax(att + mask, dim=-1)
        o = (att @ v).transpose(1, 2).reshape(b, s, -1)
        return self.out(h + self.wo(o))


def _train(device, steps=5, compiled=False):
    torch.manual_seed(0)
    model = Block().to(device)
    fwd = torch.compile(model, backend="tpu") if compiled else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 50, (2, 8), generator=g)
    targets = torch.randint(0, 50, (2, 8), generator=g)
    losses = []
    for _ in range(steps):
        logits = fwd(tokens.to(device))
        loss = F.cross_entropy(logits.view(-1, 50), targets.to(device).view(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, model.wq.weight.detach().cpu()


def test_llama_rope_block_trains():
    ref, ref_w = _train("cpu")
    got, got_w = _train("tpu")
    assert ref[-1] < ref[0]
    for a, e in zip(got, ref):
        assert abs(a - e) <= 1e-5 * abs(e), (got, ref)
    torch.testing.assert_close(got_w, ref_w, rtol=1e-4, atol=1e-5)
