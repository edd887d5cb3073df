"""Value-dependent ops on tpu against PyTorch CPU: nonzero/argwhere,
masked_select, unique, repeat_interleave and equal (one host sync for the
size), and the static-shape relatives take, put, nonzero_static,
masked_scatter, bool-mask index_put and logspace."""

from __future__ import annotations

import pytest
import torch
from conftest import check_against_cpu, check_py


def _x():
    x = torch.randn(4, 5)
    x[x.abs() < 0.5] = 0
    return x


def _mask(*shape):
    return torch.rand(*shape) > 0.5


# name -> (fn(device, *inputs), make() -> inputs); float leaves get gradients.
CASES = {
    "nonzero": (lambda d, x: torch.nonzero(x), lambda: [_x()]),
    "nonzero_0d": (lambda d, x: torch.nonzero(x), lambda: [torch.tensor(2.0)]),
    "nonzero_bool_3d": (lambda d, m: torch.nonzero(m), lambda: [_mask(2, 3, 4)]),
    "nonzero_empty": (lambda d, x: torch.nonzero(x), lambda: [torch.zeros(3, 2)]),
    "argwhere": (lambda d, x: torch.argwhere(x), lambda: [_x().t()]),
    "nonzero_static_pad": (
        lambda d, x: torch.nonzero_static(x, size=25, fill_value=-7),
        lambda: [_x()],
    ),
    "nonzero_static_cut": (lambda d, x: torch.nonzero_static(x, size=2), lambda: [_x()]),
    "masked_select": (
        lambda d, x, m: torch.masked_select(x, m),
        lambda: [torch.randn(4, 5).requires_grad_(True), _mask(4, 5)],
    ),
    "masked_select_broadcast": (
        lambda d, x, m: torch.masked_select(x, m),
        lambda: [torch.randn(5).requires_grad_(True), _mask(3, 5)],
    ),
    "masked_scatter": (
        lambda d, x, m, s: x.masked_scatter(m, s),
        lambda: [
            torch.randn(4, 5).requires_grad_(True),
            _mask(4, 5),
            torch.randn(30).requires_grad_(True),
        ],
    ),
    "take": (
        lambda d, x: torch.take(x, torch.tensor([[0, -1], [7, 3]], device=d)),
        lambda: [torch.randn(3, 4).requires_grad_(True)],
    ),
    "put_accumulate": (
        lambda d, x, s: x.put(torch.tensor([1, 5, 1, -2], device=d), s, accumulate=True),
        lambda: [torch.randn(3, 4).requires_grad_(True), torch.randn(4).requires_grad_(True)],
    ),
    "put": (
        lambda d, x, s: x.put(torch.tensor([[0, 6], [11, 3]], device=d), s),
        lambda: [torch.randn(3, 4).requires_grad_(True), torch.randn(2, 2).requires_grad_(True)],
    ),
    "index_put_mask_rows": (
        lambda d, x, m, v: x.index_put((m,), v),
        lambda: [torch.randn(5, 3).requires_grad_(True), _mask(5), torch.randn(3)],
    ),
    "index_put_mask_accumulate": (
        lambda d, x, m: x.index_put((m,), torch.tensor(1.5, device=d), accumulate=True),
        lambda: [torch.randn(4, 5).requires_grad_(True), _mask(4, 5)],
    ),
    "repeat_interleave": (
        lambda d, r: torch.repeat_interleave(r),
        lambda: [torch.tensor([2, 0, 3, 1])],
    ),
    "repeat_interleave_self": (
        lambda d, x: torch.repeat_interleave(x, torch.tensor([1, 3, 2], device=d), dim=0),
        lambda: [torch.randn(3, 2).requires_grad_(True)],
    ),
    "unique": (
        lambda d, x: torch.unique(x, return_inverse=True, return_counts=True),
        lambda: [torch.randint(0, 5, (4, 6))],
    ),
    "unique_consecutive": (
        lambda d, x: torch.unique_consecutive(x, return_inverse=True, return_counts=True),
        lambda: [torch.tensor([1, 1, 2, 2, 2, 0, 1, 1])],
    ),
    "logspace": (lambda d: torch.logspace(-2, 3, 11, base=2.0, device=d), list),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_dynamic_op(name, eager):
    fn, make = CASES[name]
    check_against_cpu(fn, make())


def test_equal(eager):
    x = torch.randn(3, 4)
    assert torch.equal(x.to("tpu"), x.to("tpu").clone())
    assert not torch.equal(x.to("tpu"), (x + 1).to("tpu"))
    assert not torch.equal(x.to("tpu"), x[:2].to("tpu"))
    n = torch.tensor([float("nan")])
    assert torch.equal(n.to("tpu"), n.to("tpu")) == torch.equal(n, n)


@pytest.mark.parametrize(
    "fn",
    [torch.nonzero, lambda x: x[x > 0], lambda x: x[:, x[0] > 0]],
    ids=["nonzero", "bool_mask_index", "bool_mask_index_dim1"],
)
def test_value_dependent_ops_sync_once_without_fallback(fn):
    """One count read from the device, never a CPU fallback."""
    import torchtpu

    x = _x().to("tpu")
    torch.tpu.synchronize()
    torchtpu.reset_metrics()
    fn(x)
    m = torchtpu.metrics()
    assert m["fallbacks"] == 0
    assert m["host_syncs"] == 1


def _routed_step(x, w, threshold):
    """An MoE-like step: rows picked by a value-dependent mask go through a layer
    and are summed back; the number of rows changes with the data."""
    idx = (x[:, 0] > threshold).nonzero().squeeze(1)
    y = (x[idx] @ w).relu()
    out = torch.zeros_like(x).index_add_(0, idx, y)
    return ((out * 2 + 1) * x).sum(), out


def test_fused_graphs_stay_cached_when_a_count_changes():
    """Fused Eager runs the calls on count-sized values op by op, so the recorded graphs
    around them keep static keys: after warm-up no new fused graph is compiled, while
    the count changes every step. Values match the CPU. In a fresh process: the program
    table of a long test session empties itself when full, and its refills would count."""
    import inspect

    check_py(
        inspect.getsource(_routed_step)
        + """
import torch, torchtpu

g = torch.Generator().manual_seed(0)
w = torch.randn(8, 8, generator=g)
xs = [torch.randn(32, 8, generator=g) for _ in range(8)]
thresholds = [-1.0, 0.0, 0.5, -0.5, 0.2, -0.2, 0.8, -0.8]
counts = [int((x[:, 0] > t).sum()) for x, t in zip(xs, thresholds)]
assert len(set(counts)) == len(counts)


def fused_graphs():
    return sum(
        v for k, v in torchtpu.metrics()["programs_by_op"].items() if k.startswith("fused graph")
    )


wt = w.to("tpu")
with torchtpu.eager_mode("fused"):
    per_step = []
    for x, t in zip(xs, thresholds):
        before = fused_graphs()
        loss, out = _routed_step(x.to("tpu"), wt, t)
        ref_loss, ref_out = _routed_step(x, w, t)
        torch.testing.assert_close(out.cpu(), ref_out, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(loss.cpu(), ref_loss, rtol=1e-5, atol=1e-4)
        per_step.append(fused_graphs() - before)
assert sum(per_step[2:]) == 0, per_step
assert torchtpu.metrics()["fused_cuts"].get("value_sized", 0) > 0
"""
    )
