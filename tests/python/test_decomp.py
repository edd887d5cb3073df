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


_CIRCULAR = """
import torch
from torch._decomp import decomposition_table

# A decomposition that runs its own op (as prims-based references of structured ops
# can): _linalg_eigvals has no rule and no decomposition of its own.
op = torch.ops.aten._linalg_eigvals.default
decomposition_table[op] = lambda x: op(x)
import torchtpu

x = torch.tensor([[2.0, 1.0], [0.0, 3.0]])
"""


def test_circular_decomposition_is_reported():
    check_py(
        _CIRCULAR
        + """
try:
    op(x.to("tpu"))
    raise SystemExit("no error")
except NotImplementedError as e:
    want = "aten::_linalg_eigvals(float32[2, 2]) has no tpu lowering (its decomposition runs"
    assert want in str(e), e
"""
    )


def test_circular_decomposition_falls_back_to_cpu():
    check_py(
        _CIRCULAR
        + """
out = op(x.to("tpu"))
assert out.device.type == "tpu" and torch.equal(out.cpu(), op(x)), out
assert torchtpu.metrics()["fallback_ops"] == {"_linalg_eigvals": 1}, torchtpu.metrics()
assert torchtpu.metrics()["decomposed"] == 0
""",
        env={"TORCHTPU_CPU_FALLBACK": "1"},
    )
