"""Replay of compiled graphs (csrc/aten/replay.cpp): after its first call, a graph that
ran as one program launches that program directly while its arguments keep their
layout; outputs, in-place writes to arguments, aliases and random numbers are those of
recording the graph again."""

from __future__ import annotations

import os
import sys

import pytest
import torch
import torch.nn.functional as F
import torchtpu
from conftest import assert_tpu_close

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
from models import MLP

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def _counts() -> tuple[int, int]:
    m = torchtpu.metrics()
    return m["graph_replays"], m["fused_ops"]


def _train_mlp(steps: int, step_compiled: bool = False) -> tuple[list[float], list[torch.Tensor]]:
    """Losses and final parameters of the MLP trained with its forward compiled, or
    (`step_compiled`) with its clip + AdamW step compiled instead: capturable, so the
    step counts live on the device, as PyTorch suggests for compiled optimizer steps."""
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    model = MLP().to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, capturable=step_compiled)
    fwd = model if step_compiled else torch.compile(model, backend="tpu")

    def step():
        if step_compiled:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    step = torch.compile(step, backend="tpu") if step_compiled else step
    x = torch.randn(16, 32, generator=gen).to("tpu")
    y = torch.randint(0, 10, (16,), generator=gen).to("tpu")
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(fwd(x), y)
        loss.backward()
        step()
        losses.append(loss.item())
    return losses, [p.detach().cpu() for p in model.parameters()]


def test_training_replays_forward_and_backward(monkeypatch):
    monkeypatch.setenv("TORCHTPU_GRAPH_REPLAY", "0")
    before, _ = _counts()
    off, _ = _train_mlp(6)
    assert _counts()[0] == before
    monkeypatch.delenv("TORCHTPU_GRAPH_REPLAY")
    torch._dynamo.reset()
    on, _ = _train_mlp(6)
    # Every step but the first (which captures) launches the forward's and the
    # backward's programs directly.
    assert _counts()[0] - before == 2 * 5
    assert on == off  # bit-identical to recording every call
    assert on[-1] < on[0]


def test_replay_records_no_ops():
    fn = torch.compile(lambda x, w: torch.tanh(x @ w).sum(0), backend="tpu")
    x, w = torch.randn(8, 4, device="tpu"), torch.randn(4, 3, device="tpu")
    fn(x, w)
    replays, ops = _counts()
    for _ in range(5):
        got = fn(x, w)
    r2, ops2 = _counts()
    assert (r2 - replays, ops2 - ops) == (5, 0)
    assert_tpu_close(got, torch.tanh(x.cpu() @ w.cpu()).sum(0))


def test_in_place_writes_and_aliases_of_arguments():
    def fn(x, y):
        x.add_(1)
        return x.view(-1)[:3], y * 2, x.t()

    cfn = torch.compile(fn, backend="tpu")
    x, y = torch.zeros(3, 2, device="tpu"), torch.randn(4, device="tpu")
    xc, yc = x.cpu(), y.cpu()
    for _ in range(4):
        got = cfn(x, y)
        want = fn(xc, yc)
        for g, w in zip(got, want):
            assert_tpu_close(g, w)
    assert_tpu_close(x, torch.full((3, 2), 4.0))
    # Each replay counts as the in-place write it replaces (autograd's saved-tensor check).
    v = x._version
    cfn(x, y)
    assert x._version > v
    # The aliases share the argument's storage, as in eager.
    got[0].fill_(-1)
    assert float(x[0, 0]) == -1.0 and float(got[2][0, 0]) == -1.0


def test_outputs_sharing_a_new_storage_stay_shared():
    def fn(x):
        y = x * 2
        return y, y.view(-1)

    cfn = torch.compile(fn, backend="tpu")
    x = torch.randn(2, 3, device="tpu")
    for _ in range(3):
        a, b = cfn(x)
    assert torchtpu.metrics()["graph_replays"] > 0
    b.zero_()
    assert float(a.abs().sum()) == 0.0


def test_each_layout_is_captured_and_replayed():
    cfn = torch.compile(lambda x: x.exp() + 1, backend="tpu")
    base = torch.randn(40, device="tpu")
    before = torchtpu.metrics()["graph_replays"]
    # Same sizes, other storage offsets: one graph, a capture per layout (up to 4;
    # one graph serves every instance of a module class, each with its own layout).
    for lo in (0, 5, 0, 5, 10, 15, 20, 25, 0, 25):
        assert_tpu_close(cfn(base[lo : lo + 5]), base.cpu()[lo : lo + 5].exp() + 1)
    # Captured: 0, 5, 10, 15; replayed: the second 0 and 5, and the last 0;
    # 20 and 25 run the graph (4 layouts held).
    assert torchtpu.metrics()["graph_replays"] - before == 3


def test_random_numbers_are_fresh_on_every_replay():
    cfn = torch.compile(lambda x: F.dropout(x, 0.5, training=True), backend="tpu")
    x = torch.ones(64, device="tpu")
    torch.manual_seed(3)
    outs = [cfn(x).cpu() for _ in range(4)]
    assert torchtpu.metrics()["graph_replays"] > 0
    assert all(not torch.equal(outs[i], outs[i + 1]) for i in range(3))
    # The same stream as recording every call.
    torch._dynamo.reset()
    os.environ["TORCHTPU_GRAPH_REPLAY"] = "0"
    try:
        cfn = torch.compile(lambda x: F.dropout(x, 0.5, training=True), backend="tpu")
        torch.manual_seed(3)
        ref = [cfn(x).cpu() for _ in range(4)]
    finally:
        del os.environ["TORCHTPU_GRAPH_REPLAY"]
    assert all(torch.equal(a, b) for a, b in zip(outs, ref))


def test_a_graph_without_tensor_outputs_replays(monkeypatch):
    """An optimizer step returns nothing and writes its arguments: it was refused
    (no tensor output to tell a replay from a layout mismatch)."""
    monkeypatch.setenv("TORCHTPU_GRAPH_REPLAY", "0")
    off, p_off = _train_mlp(5, step_compiled=True)
    monkeypatch.delenv("TORCHTPU_GRAPH_REPLAY")
    torch._dynamo.reset()
    torchtpu.compile_report(clear=True)  # earlier tests' events stay in it otherwise
    before, _ = _counts()
    on, p_on = _train_mlp(5, step_compiled=True)
    assert _counts()[0] - before >= 4  # every step after the first replays
    assert not [e for e in torchtpu.compile_report() if e["event"] == "no_replay"]
    assert on == off
    for a, b in zip(p_on, p_off):
        assert torch.equal(a, b)
