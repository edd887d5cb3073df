"""Views and in-place ops: a write through any view must show in the base and
in every other alias, exactly as on the CPU."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_tpu_close

BASE_SHAPE = (4, 6)


@pytest.fixture(autouse=True)
def _every_mode(eager):
    """Every test here runs in each eager mode."""
    yield


# name -> function making a view of a (4, 6) base
VIEWS = {
    "slice_step": lambda x: x[1:, ::2],
    "slice_neg_start": lambda x: x[-3:, 1:5:3],
    "select": lambda x: x.select(1, 2),
    "narrow": lambda x: x.narrow(0, 1, 2),
    "transpose": lambda x: x.transpose(0, 1),
    "permute": lambda x: x.view(2, 2, 6).permute(2, 0, 1),
    "t": lambda x: x.t(),
    "T": lambda x: x.T,
    "expand": lambda x: x[:1].expand(3, 6),
    "unsqueeze": lambda x: x.unsqueeze(1),
    "squeeze": lambda x: x[1:2].squeeze(0),
    "view": lambda x: x.view(3, 8),
    "reshape": lambda x: x.reshape(2, 12),
    "flatten": lambda x: x[1:3].flatten(),
    "unfold": lambda x: x.unfold(1, 2, 2),
    "diagonal": lambda x: x.diagonal(offset=1),
    "split": lambda x: x.split(2, dim=1)[1],
    "chunk": lambda x: x.chunk(2, dim=0)[1],
    "unbind": lambda x: x.unbind(0)[2],
    "as_strided": lambda x: x.as_strided((3, 2), (6, 2), 1),
    "movedim": lambda x: x.view(2, 2, 6).movedim(0, 2),
    "ellipsis_index": lambda x: x[..., 1],
    "none_index": lambda x: x[None, 1:3, 2],
    "view_of_view": lambda x: x[1:].t()[::2],
    "view_of_view_of_view": lambda x: x.view(2, 12)[:, 3:].view(2, 3, 3)[:, 1],
}


def _arange_like(v: torch.Tensor) -> torch.Tensor:
    return torch.arange(v.numel(), dtype=v.dtype, device=v.device).reshape(v.shape) * 0.5 - 3


def _mask_like(v: torch.Tensor) -> torch.Tensor:
    return (torch.arange(v.numel(), device=v.device) % 3 == 0).reshape(v.shape)


# name -> in-place op applied to a view
INPLACE = {
    "add_": lambda v: v.add_(1.5),
    "add_tensor_alpha": lambda v: v.add_(_arange_like(v), alpha=2),
    "mul_": lambda v: v.mul_(-2),
    "copy_": lambda v: v.copy_(_arange_like(v)),
    "copy_broadcast": lambda v: v.copy_(torch.tensor(4.25, device=v.device)),
    "fill_": lambda v: v.fill_(3.0),
    "zero_": lambda v: v.zero_(),
    "clamp_": lambda v: v.clamp_(-0.5, 0.5),
    "masked_fill_": lambda v: v.masked_fill_(_mask_like(v), 9.0),
    "relu_": lambda v: v.relu_(),
    "setitem": lambda v: v.__setitem__(..., 7.0),
}


def _base() -> torch.Tensor:
    return torch.randn(BASE_SHAPE, generator=torch.Generator().manual_seed(11))


def _aliases(x: torch.Tensor):
    """Other views of the base, made before the write."""
    return [x.t(), x[2], x.view(-1)[5:17:3], x.diagonal()]


@pytest.mark.parametrize("op", list(INPLACE), ids=str)
@pytest.mark.parametrize("view", list(VIEWS), ids=str)
def test_inplace_through_view(view, op):
    make_view, fn = VIEWS[view], INPLACE[op]
    cpu = _base()
    dev = cpu.to("tpu")
    cpu_aliases, dev_aliases = _aliases(cpu), _aliases(dev)
    cpu_view, dev_view = make_view(cpu), make_view(dev)
    assert dev_view.shape == cpu_view.shape and dev_view.stride() == cpu_view.stride()
    try:
        cpu_ret = fn(cpu_view)
    except RuntimeError as err:
        # e.g. writing into an expanded view: the tpu must refuse it too
        with pytest.raises(RuntimeError):
            fn(dev_view)
        assert "memory location" in str(err) or "expand" in str(err)
        return
    dev_ret = fn(dev_view)
    if op != "setitem":
        assert dev_ret is dev_view or dev_ret.data_ptr() == dev_view.data_ptr()
        assert_tpu_close(dev_ret, cpu_ret)
    assert_tpu_close(dev_view, cpu_view)
    assert_tpu_close(dev, cpu)
    for a, e in zip(dev_aliases, cpu_aliases):
        assert_tpu_close(a, e)


def test_views_share_storage():
    x = torch.zeros(BASE_SHAPE, device="tpu")
    for name, make_view in VIEWS.items():
        v = make_view(x)
        assert v.untyped_storage().data_ptr() == x.untyped_storage().data_ptr(), name
        assert v._is_view(), name


def test_inplace_on_base_seen_through_existing_views():
    cpu = _base()
    dev = cpu.to("tpu")
    cpu_views = {n: f(cpu) for n, f in VIEWS.items()}
    dev_views = {n: f(dev) for n, f in VIEWS.items()}
    for step in (
        lambda x: x.add_(1),
        lambda x: x.mul_(torch.arange(6.0, device=x.device)),
        lambda x: x[:, 1:3].sub_(10),
        lambda x: x.copy_(x.flip(0)),
        lambda x: x.t().contiguous(),  # a read, not a write: nothing changes
        lambda x: x.view(-1)[::5].fill_(-1),
    ):
        step(cpu)
        step(dev)
        for name in VIEWS:
            assert_tpu_close(dev_views[name], cpu_views[name], msg=name)


def test_chained_inplace_on_overlapping_views():
    cpu = _base()
    dev = cpu.to("tpu")
    for x in (cpu, dev):
        a = x[1:3]
        b = x[:, 2:5]
        a.mul_(2)
        b[1:3].add_(a[:, 2:5])  # the same memory through two views, written just before
        x.t()[0].copy_(b[:, 0])
    assert_tpu_close(dev, cpu)


def test_data_assignment():
    p = torch.nn.Parameter(torch.arange(6.0).to("tpu"))
    old = p.data
    p.data = torch.full((2, 3), 5.0, device="tpu")
    assert p.shape == (2, 3)
    assert p.requires_grad
    assert_tpu_close(p.detach(), torch.full((2, 3), 5.0))
    assert_tpu_close(old, torch.arange(6.0))  # the old tensor is untouched
    p.data.add_(1)  # in-place through .data reaches the parameter
    assert_tpu_close(p.detach(), torch.full((2, 3), 6.0))
    (p * 2).sum().backward()
    assert_tpu_close(p.grad, torch.full((2, 3), 2.0))


def test_set_source_tensor_aliases():
    x = torch.arange(8.0, device="tpu")
    y = torch.empty(0, device="tpu")
    y.set_(x)
    assert y.shape == x.shape
    x.add_(1)
    assert_tpu_close(y, torch.arange(8.0) + 1)
    y.mul_(2)
    assert_tpu_close(x, (torch.arange(8.0) + 1) * 2)


def test_set_storage_offset_size_stride():
    cpu = torch.arange(12.0)
    dev = cpu.to("tpu")
    rc = torch.empty(0).set_(cpu.untyped_storage(), 2, (3, 2), (1, 3))
    rd = torch.empty(0, device="tpu").set_(dev.untyped_storage(), 2, (3, 2), (1, 3))
    assert_tpu_close(rd, rc)
    rc.fill_(-1)
    rd.fill_(-1)
    assert_tpu_close(dev, cpu)


def test_set_empty():
    x = torch.ones(3, device="tpu")
    x.set_()
    assert x.shape == (0,) and x.numel() == 0


def test_resize_grow_keeps_prefix():
    x = torch.arange(6.0, device="tpu")
    x.resize_(10)
    assert x.shape == (10,)
    assert_tpu_close(x[:6], torch.arange(6.0))
    x.resize_(2, 2)
    assert_tpu_close(x, torch.arange(4.0).reshape(2, 2))
    x.resize_(3, 4)
    x.fill_(2)
    assert_tpu_close(x.sum(), torch.tensor(24.0))


def test_resize_as_and_out_resize():
    x = torch.empty(0, device="tpu")
    torch.add(torch.ones(2, 3, device="tpu"), 1, out=x)
    assert x.shape == (2, 3)
    assert_tpu_close(x, torch.full((2, 3), 2.0))
    y = torch.zeros(1, device="tpu").resize_as_(x)
    assert y.shape == (2, 3)


def test_untyped_storage_resize():
    x = torch.arange(4.0, device="tpu")
    s = x.untyped_storage()
    assert s.nbytes() == 16
    s.resize_(32)
    assert s.nbytes() == 32
    assert_tpu_close(x, torch.arange(4.0))  # same sizes, the prefix is kept
    y = torch.empty(0, device="tpu").set_(s, 0, (8,), (1,))
    assert_tpu_close(y[:4], torch.arange(4.0))


def test_storage_shared_after_detach_and_view_dtype_size():
    x = torch.arange(6.0, device="tpu")
    d = x.detach()
    d[0] = 100
    assert x[0].item() == 100
    i = x.view(torch.int32)  # same element size: a bit view
    assert_tpu_close(i, torch.tensor([100.0, 1, 2, 3, 4, 5]).view(torch.int32))


# ---------------------------------------------------------------- non-contiguous inputs to ops

NONCONTIG_OPS = {
    "add": lambda a, b: a + b,
    "mul_scalar": lambda a, b: a * 3,
    "matmul": lambda a, b: a @ b.t(),
    "sum_dim": lambda a, b: a.sum(0),
    "exp": lambda a, b: a.exp(),
    "softmax": lambda a, b: a.softmax(-1),
    "cat": lambda a, b: torch.cat([a, b], 0),
    "where": lambda a, b: torch.where(a > 0, a, b),
    "clone": lambda a, b: a.clone(),
    "contiguous": lambda a, b: a.contiguous(),
}

NONCONTIG_INPUTS = {
    "transposed": lambda x: x.t(),
    "strided": lambda x: x[::2, 1::2],
    "offset": lambda x: x[1:, 1:][:3, :3],
    "expanded": lambda x: x[0, :3].expand(3, 3),
    "view_of_permute": lambda x: x.view(2, 2, 6).permute(2, 1, 0)[:3, 1],
}


@pytest.mark.parametrize("kind", list(NONCONTIG_INPUTS), ids=str)
@pytest.mark.parametrize("op", list(NONCONTIG_OPS), ids=str)
def test_noncontiguous_inputs(op, kind):
    make = NONCONTIG_INPUTS[kind]
    ca, cb = _base(), _base() * 2 - 1
    da, db = ca.to("tpu"), cb.to("tpu")
    va, vb = make(ca), make(cb)
    assert va.shape == vb.shape and not va.is_contiguous()
    dva, dvb = make(da), make(db)
    assert not dva.is_contiguous()
    assert_tpu_close(NONCONTIG_OPS[op](dva, dvb), NONCONTIG_OPS[op](va, vb))
    assert_tpu_close(da, ca)  # inputs untouched
