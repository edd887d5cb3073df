"""Ops without a rule run on the device through PyTorch's decompositions (torch._decomp)."""

from __future__ import annotations

import pytest
import torch
import torchtpu
from conftest import check_against_cpu, check_py
from torchtpu import _decomp


def _floor_divide_(dev, a, b):
    out = a.clone()
    out.floor_divide_(b)
    return out


def _mvlgamma_out(dev, x):
    out = torch.empty(0, device=dev)
    torch.mvlgamma(x, 3, out=out)
    return out


CASES = [
    # (op counted, fn(device, *inputs), inputs)
    ("tril_indices", lambda dev: torch.tril_indices(5, 4, -1, device=dev), []),
    ("triu_indices", lambda dev: torch.triu_indices(4, 6, 2, device=dev), []),
    (
        "bucketize.Scalar",
        lambda dev, b: torch.bucketize(2.5, b, right=True),
        [torch.tensor([1.0, 2.5, 3.0, 5.0])],
    ),
    (
        "floor_divide_.Tensor",
        _floor_divide_,
        [torch.randint(-9, 9, (3, 4)), torch.tensor([2, -3, 4, 5])],
    ),
    ("mvlgamma.out", _mvlgamma_out, [torch.rand(7) * 3 + 2]),
]


@pytest.mark.parametrize("name,fn,inputs", CASES, ids=[c[0] for c in CASES])
def test_decomposed_op_runs_on_device(eager, name, fn, inputs):
    before = torchtpu.metrics()
    check_against_cpu(fn, inputs)
    after = torchtpu.metrics()
    assert after["fallbacks"] == before["fallbacks"]
    counted = after["decomposed_ops"].get(name, 0) - before["decomposed_ops"].get(name, 0)
    assert counted >= 1
    assert after["decomposed"] > before["decomposed"]


def test_ops_with_rules_are_not_decomposed():
    decomposed = set(_decomp.decomposed_ops())
    assert "tril_indices" in decomposed
    for name in ("add.Tensor", "add.out", "add_.Tensor", "_softmax.out", "mm", "fill_.Scalar"):
        assert name not in decomposed
        assert torchtpu._C.has_lowering(f"aten::{name}")
    before = torchtpu.metrics()["decomposed"]
    torch.ones(3, device="tpu").add_(1).cpu()
    assert torchtpu.metrics()["decomposed"] == before


def test_circular_decomposition_is_reported_or_falls_back():
    # gcd.out's decomposition runs aten::gcd, whose kernel calls gcd.out again.
    a, b = torch.tensor([12, 18, 7]), torch.tensor([8, 12, 3])
    with pytest.raises(NotImplementedError, match=r"aten::gcd\.out\(int64\[3\], int64\[3\]"):
        torch.gcd(a.to("tpu"), b.to("tpu"))
    check_py(
        """
        import torch, torchtpu
        a, b = torch.tensor([12, 18, 7]), torch.tensor([8, 12, 3])
        out = torch.empty(0, dtype=torch.long, device="tpu")
        r = torch.gcd(a.to("tpu"), b.to("tpu"), out=out)
        assert r is out and out.device.type == "tpu"
        assert torch.equal(out.cpu(), torch.gcd(a, b)), out
        assert torchtpu.metrics()["fallback_ops"] == {"gcd.out": 1}, torchtpu.metrics()
        """,
        env={"TORCHTPU_CPU_FALLBACK": "1"},
    )
