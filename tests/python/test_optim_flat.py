"""torchtpu.optim.flatten: parameters and optimizer state as views of flat storages, and
foreach ops over such lists (or over adjacent slices of one value) lowered once for the
whole list (csrc/aten/foreach.cpp flat_sizes, program.cpp tiling)."""

from __future__ import annotations

import os
import re
import sys

import pytest
import torch
import torchtpu
from conftest import check_py

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
from models import MLP


def _train(flat: bool, mode: str, steps: int = 4, opt_cls=torch.optim.AdamW, **kw):
    torch.manual_seed(0)
    model = MLP().to("tpu")
    opt = opt_cls(model.parameters(), lr=1e-2, **kw)
    if flat:
        torchtpu.optim.flatten(opt)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(16, 32, generator=gen).to("tpu")
    y = torch.randint(0, 10, (16,), generator=gen).to("tpu")
    losses = []
    with torchtpu.eager_mode(mode):
        for _ in range(steps):
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            losses.append(loss.item())
    return model, opt, losses


@pytest.mark.parametrize("mode", ["strict", "fused"])
@pytest.mark.parametrize(
    "opt_cls, kw",
    [
        (torch.optim.AdamW, {"weight_decay": 0.01}),
        (torch.optim.Adam, {"amsgrad": True}),
        (torch.optim.SGD, {"momentum": 0.9, "nesterov": True}),
    ],
)
def test_flat_training_matches(mode, opt_cls, kw):
    # The same arithmetic per element; XLA may contract a*b+c to an FMA in one
    # kernel and not in another, so equal to the last bit or two.
    m0, _, ref = _train(False, mode, opt_cls=opt_cls, **kw)
    m1, opt, got = _train(True, mode, opt_cls=opt_cls, **kw)
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=0)
    for p, q in zip(m1.parameters(), m0.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach().cpu(), rtol=1e-5, atol=1e-7)
    # Parameters and their per-parameter state each share one storage.
    params = list(m1.parameters())
    assert len({p.untyped_storage().data_ptr() for p in params}) == 1
    for key, v in opt.state[params[0]].items():
        if isinstance(v, torch.Tensor) and v.shape == params[0].shape:
            assert len({opt.state[p][key].untyped_storage().data_ptr() for p in params}) == 1
    # state_dict round trip keeps values.
    sd = opt.state_dict()
    key = next(k for k, v in sd["state"][0].items() if isinstance(v, torch.Tensor) and v.dim())
    assert torch.equal(sd["state"][0][key].cpu(), opt.state[params[0]][key].cpu())


def test_tied_and_cpu_parameters_stay_put():
    w = torch.nn.Parameter(torch.randn(4, 4, device="tpu"))
    tied = torch.nn.Parameter(w.data.view(16))  # shares w's storage
    cpu = torch.nn.Parameter(torch.randn(3))
    other = torch.nn.Parameter(torch.randn(5, device="tpu"))
    third = torch.nn.Parameter(torch.randn(2, device="tpu"))
    opt = torch.optim.SGD([w, tied, cpu, other, third], lr=0.1)
    before = w.untyped_storage().data_ptr()
    torchtpu.optim.flatten(opt)
    assert w.untyped_storage().data_ptr() == tied.untyped_storage().data_ptr() == before
    assert cpu.device.type == "cpu"
    assert other.untyped_storage().data_ptr() == third.untyped_storage().data_ptr()


def test_a_foreach_over_a_flat_list_is_one_op_over_the_whole_range(tmp_path):
    # The fused program of an AdamW step over flattened parameters computes the
    # update once on the whole flat range, not once per parameter.
    check_py(
        """
        import torch, torchtpu
        torchtpu.eager_mode("fused")
        torch.manual_seed(0)
        ps = [torch.nn.Parameter(torch.randn(s, device="tpu")) for s in (48, 16, 32)]
        opt = torchtpu.optim.flatten(torch.optim.AdamW(ps, lr=1e-2))
        for _ in range(3):
            for p in ps:
                p.grad = torch.ones_like(p)
            opt.step()
            torchtpu.flush()
        """,
        env={"TORCHTPU_DUMP_FUSED": str(tmp_path), "TORCHTPU_CACHE_DIR": "off"},
    )
    texts = [p.read_text() for p in sorted(tmp_path.glob("*.mlir"))]
    last = texts[-1]
    assert re.search(r'"stablehlo.sqrt"\([^)]*\) : \(tensor<96xf32>\)', last), last[-3000:]
    for n in (48, 16, 32):
        assert not re.search(rf'"stablehlo.sqrt"\([^)]*\) : \(tensor<{n}xf32>\)', last)


def test_views_of_one_tensor_update_in_place():
    x = torch.arange(12.0, device="tpu")
    parts = list(x.split([5, 4, 3]))
    torch._foreach_mul_(parts, 2.0)
    torch._foreach_add_(parts, [1.0, 1.0, 1.0])  # a uniform scalar list
    torch._foreach_add_(parts, [1.0, 2.0, 3.0])  # per-element scalars
    want = torch.arange(12.0) * 2 + 1 + torch.tensor([1.0] * 5 + [2.0] * 4 + [3.0] * 3)
    assert torch.equal(x.cpu(), want)
