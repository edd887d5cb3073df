"""torch.fft on the tpu device against the CPU (pocketfft), forward and
backward, in every eager mode: the 1-d, 2-d and n-d forms of fft/ifft,
rfft/irfft, hfft/ihfft with each normalization and signal size, and
stft/istft. They reach _fft_r2c, _fft_c2r and _fft_c2c, lowered to
stablehlo.fft."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_tpu_close

# Sums of up to 64 products: float32 rounding differs from pocketfft's order.
TOL = {"rtol": 1e-4, "atol": 1e-4}


@pytest.fixture(autouse=True)
def _every_mode(eager):
    """Every test here runs in each eager mode."""
    yield


def _real(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _cplx(*shape, seed=0):
    return torch.view_as_complex(_real(*shape, 2, seed=seed))


# name -> (fn, input maker); fns take the input and return a tensor.
CASES = {
    "fft": (lambda x: torch.fft.fft(x), lambda: _cplx(3, 16)),
    "fft_real_in": (lambda x: torch.fft.fft(x, dim=0), lambda: _real(8, 3)),
    "fft_n_pad_ortho": (lambda x: torch.fft.fft(x, n=20, norm="ortho"), lambda: _cplx(2, 16)),
    "ifft": (lambda x: torch.fft.ifft(x), lambda: _cplx(4, 12)),
    "ifft_forward_norm": (lambda x: torch.fft.ifft(x, norm="forward", dim=0), lambda: _cplx(6, 5)),
    "rfft": (lambda x: torch.fft.rfft(x), lambda: _real(3, 16)),
    "rfft_odd_trunc": (lambda x: torch.fft.rfft(x, n=9, norm="forward"), lambda: _real(2, 15)),
    "irfft": (lambda x: torch.fft.irfft(x), lambda: _cplx(3, 9)),
    "irfft_n_odd": (lambda x: torch.fft.irfft(x, n=15, norm="ortho"), lambda: _cplx(2, 8)),
    "hfft": (lambda x: torch.fft.hfft(x), lambda: _cplx(2, 9)),
    "ihfft": (lambda x: torch.fft.ihfft(x), lambda: _real(2, 16)),
    "fft2": (lambda x: torch.fft.fft2(x), lambda: _cplx(2, 8, 6)),
    "ifft2": (lambda x: torch.fft.ifft2(x, norm="ortho"), lambda: _cplx(2, 8, 6)),
    "rfft2": (lambda x: torch.fft.rfft2(x), lambda: _real(2, 6, 8)),
    "irfft2": (lambda x: torch.fft.irfft2(x), lambda: _cplx(2, 6, 5)),
    "fftn_4d": (lambda x: torch.fft.fftn(x), lambda: _cplx(2, 3, 4, 5)),
    "fftn_middle_dims": (lambda x: torch.fft.fftn(x, dim=(0, 2)), lambda: _cplx(4, 3, 6)),
    "rfftn_4d": (lambda x: torch.fft.rfftn(x, norm="ortho"), lambda: _real(2, 3, 4, 6)),
    "irfftn": (lambda x: torch.fft.irfftn(x, s=(4, 6), dim=(0, 2)), lambda: _cplx(4, 2, 4)),
    "hfft2": (lambda x: torch.fft.hfft2(x), lambda: _cplx(4, 5)),
    "fftshift_freq": (lambda x: torch.fft.fftshift(torch.fft.fft(x), dim=-1), lambda: _cplx(2, 8)),
}


def _as_real(t):
    return torch.view_as_real(t.resolve_conj()) if t.is_complex() else t


@pytest.mark.parametrize("name", sorted(CASES))
def test_fft_forward_backward(name):
    fn, make = CASES[name]
    x = make()
    ref_in = x.clone().requires_grad_()
    dev_in = x.to("tpu").requires_grad_()
    ref, out = fn(ref_in), fn(dev_in)
    assert out.dtype == ref.dtype and out.shape == ref.shape
    assert_tpu_close(out, ref, **TOL)
    w = torch.randn(_as_real(ref).shape, generator=torch.Generator().manual_seed(7))
    (_as_real(ref) * w).sum().backward()
    (_as_real(out) * w.to("tpu")).sum().backward()
    assert_tpu_close(dev_in.grad, ref_in.grad, **TOL)


def test_fft_float64():
    x = _cplx(4, 16).to(torch.complex128)
    assert_tpu_close(torch.fft.fft(x.to("tpu")), torch.fft.fft(x), rtol=1e-10, atol=1e-10)
    r = _real(3, 10).double()
    assert_tpu_close(torch.fft.irfft(torch.fft.rfft(r.to("tpu"))), r, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("center", [True, False])
def test_stft_istft(center):
    sig = _real(2, 200)
    # Without centering the frames' edges must not vanish (istft divides by them).
    win = torch.hann_window(32) if center else torch.hamming_window(32)

    def run(device, x):
        spec = torch.stft(
            x, n_fft=32, hop_length=8, window=win.to(device), center=center, return_complex=True
        )
        back = torch.istft(
            spec, n_fft=32, hop_length=8, window=win.to(device), center=center, length=200
        )
        return spec, back

    ref_in = sig.clone().requires_grad_()
    dev_in = sig.to("tpu").requires_grad_()
    ref_spec, ref_back = run("cpu", ref_in)
    spec, back = run("tpu", dev_in)
    assert_tpu_close(spec, ref_spec, **TOL)
    assert_tpu_close(back, ref_back, **TOL)
    w = torch.randn(ref_spec.shape + (2,), generator=torch.Generator().manual_seed(3))
    ((torch.view_as_real(ref_spec) * w).sum() + ref_back.pow(2).sum()).backward()
    ((torch.view_as_real(spec) * w.to("tpu")).sum() + back.pow(2).sum()).backward()
    assert_tpu_close(dev_in.grad, ref_in.grad, **TOL)
