"""torch._grouped_mm on tpu against the CPU kernel: rows grouped (2d x 3d, an MoE's
experts), columns grouped (3d x 2d), contraction grouped (2d x 2d, its weight gradient)
and bmm (3d x 3d), with an empty group, forward and backward, in every eager mode. The
group ends stay on the device: no host read, one program whatever the group sizes."""

from __future__ import annotations

import pytest
import torch
import torchtpu

OFFS = [3, 3, 9, 16]  # group ends; group 1 is empty

CASES = {
    "rows_2d_3d": ((16, 8), (4, 8, 4)),
    "cols_3d_2d": ((4, 5, 8), (8, 16)),
    "contraction_2d_2d": ((8, 16), (16, 4)),
    "bmm_3d_3d": ((4, 5, 8), (4, 8, 4)),
}


def _run(a, b, offs):
    return torch._grouped_mm(a, b, offs=offs)


@pytest.mark.parametrize("eager", ["strict", "debug", "fused"], indirect=True)
@pytest.mark.parametrize("case", list(CASES))
def test_grouped_mm_matches_cpu(case, eager):
    g = torch.Generator().manual_seed(0)
    sa, sb = CASES[case]
    a = torch.randn(*sa, generator=g, requires_grad=True)
    b = torch.randn(*sb, generator=g, requires_grad=True)
    offs = None if case == "bmm_3d_3d" else torch.tensor(OFFS, dtype=torch.int32)
    ref = _run(a, b, offs)
    w = torch.randn(ref.shape, generator=g)
    (ref * w).sum().backward()

    at = a.detach().to("tpu").requires_grad_()
    bt = b.detach().to("tpu").requires_grad_()
    got = _run(at, bt, None if offs is None else offs.to("tpu"))
    (got * w.to("tpu")).sum().backward()
    torch.testing.assert_close(got.cpu(), ref, rtol=1e-5, atol=1e-5)
    if case != "cols_3d_2d":  # the CPU kernel has no backward for 3d x 2d
        torch.testing.assert_close(at.grad.cpu(), a.grad, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(bt.grad.cpu(), b.grad, rtol=1e-5, atol=1e-5)


def test_group_sizes_never_reach_the_host():
    a = torch.randn(16, 8, device="tpu")
    b = torch.randn(4, 8, 4, device="tpu")
    _run(a, b, torch.tensor(OFFS, dtype=torch.int32, device="tpu")).cpu()
    torchtpu.reset_metrics()
    for ends in ([1, 5, 5, 16], [16, 16, 16, 16], [0, 2, 4, 6]):
        _run(a, b, torch.tensor(ends, dtype=torch.int32, device="tpu"))
    m = torchtpu.metrics()
    assert m["compiles"] == 0 and m["host_syncs"] == 0 and m["fallbacks"] == 0, m
