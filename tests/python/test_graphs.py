"""torch.tpu.graph / TPUGraph (python/torchtpu/graphs.py, csrc/aten/replay.cpp): a
captured region replays as one program, with torch.cuda.CUDAGraph's contract: static
input tensors fed by copy_, results in the tensors the region wrote, host values of the
capture, fresh random numbers per replay."""

from __future__ import annotations

import os
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F
import torchtpu
from conftest import check_py
from torchtpu.graphs import TPUGraph

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples")
sys.path.insert(0, EXAMPLES)
from models import GPT, MLP, copy_task_batch


def _count(name: str) -> int:
    return torchtpu.metrics()[name]


def _batches(model: str, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    if model == "gpt":
        return [copy_task_batch(gen, 4, 16, 64) for _ in range(n)]
    return [
        (torch.randn(16, 32, generator=gen), torch.randint(0, 10, (16,), generator=gen))
        for _ in range(n)
    ]


def _cpu_mlp_losses(batches: list) -> list[float]:
    """The MLP's losses trained on the CPU with AdamW (lr 1e-2), seeded as the tests'."""
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    out = []
    for x, y in batches:
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        out.append(loss.item())
    return out


def _loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return model(x, y) if isinstance(model, GPT) else F.cross_entropy(model(x), y)


def _train(model_name: str, device: str, graph: bool, steps: int = 7):
    """Losses and final parameters; with `graph`, steps after the second replay a
    captured step (the third step is the capture, which runs it once)."""
    torch.manual_seed(0)
    model = (GPT if model_name == "gpt" else MLP)().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, capturable=device == "tpu")
    batches = _batches(model_name, steps)

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = _loss(model, x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss

    losses = []
    if not graph:
        for x, y in batches:
            losses.append(step(x.to(device), y.to(device)).item())
        return losses, [p.detach().cpu() for p in model.parameters()]
    sx, sy = batches[0][0].to(device), batches[0][1].to(device)
    g = torch.tpu.TPUGraph()
    for i, (x, y) in enumerate(batches):
        sx.copy_(x)
        sy.copy_(y)
        if i < 2:
            losses.append(step(sx, sy).item())
        elif i == 2:
            with torch.tpu.graph(g):
                static_loss = step(sx, sy)
            losses.append(static_loss.item())
        else:
            replays, ops = _count("graph_replays"), _count("fused_ops")
            g.replay()
            losses.append(static_loss.item())
            # One launch: nothing was recorded op by op.
            assert _count("graph_replays") == replays + 1
            assert _count("fused_ops") == ops
    return losses, [p.detach().cpu() for p in model.parameters()]


@pytest.mark.parametrize("mode", ["strict", "fused"])
@pytest.mark.parametrize("model_name", ["mlp", "gpt"])
def test_replayed_training_matches_eager(model_name, mode):
    cpu_losses, _ = _train(model_name, "cpu", graph=False)
    with torchtpu.eager_mode(mode):  # the capture records Fused whatever the mode
        losses, params = _train(model_name, "tpu", graph=True)
    assert losses == pytest.approx(cpu_losses, rel=1e-5)
    if mode == "fused":
        # Adam's normalization magnifies last-bit differences in small gradients, so
        # the parameters are compared with the same steps in Fused Eager.
        with torchtpu.eager_mode(mode):
            eager_losses, eager_params = _train(model_name, "tpu", graph=False)
        assert losses == pytest.approx(eager_losses, rel=1e-6)
        for p, r in zip(params, eager_params):
            torch.testing.assert_close(p, r)


def test_outputs_follow_static_inputs():
    a = torch.arange(6.0).to("tpu")
    w = torch.ones(6).to("tpu")
    g = torch.tpu.TPUGraph()
    with torch.tpu.graph(g):
        out = a * 2 + w
        w.add_(1)  # an in-place write the replay repeats
        dropped = a - 1  # an output nobody keeps
    del dropped
    torch.testing.assert_close(out.cpu(), torch.arange(6.0) * 2 + 1)
    a.copy_(torch.full((6,), 10.0))
    g.replay()
    torch.testing.assert_close(out.cpu(), torch.full((6,), 22.0))
    torch.testing.assert_close(w.cpu(), torch.full((6,), 3.0))
    g.replay()
    torch.testing.assert_close(w.cpu(), torch.full((6,), 4.0))


def test_donated_input_shared_by_another_tensor():
    # A whole-tensor copy_ shares the source's buffer; the replay must not let the
    # program consume it (the source keeps its value).
    a = torch.zeros(4).to("tpu")
    g = torch.tpu.TPUGraph()
    with torch.tpu.graph(g):
        a.add_(1)
    b = torch.full((4,), 5.0).to("tpu")
    a.copy_(b)
    g.replay()
    torch.testing.assert_close(a.cpu(), torch.full((4,), 6.0))
    torch.testing.assert_close(b.cpu(), torch.full((4,), 5.0))


def test_random_numbers_are_drawn_anew():
    x = torch.ones(1000).to("tpu")
    g = torch.tpu.TPUGraph()
    with torch.tpu.graph(g):
        out = F.dropout(x, 0.5) + torch.rand(1000, device="tpu")
    first = out.cpu()
    g.replay()
    second = out.cpu()
    assert not torch.equal(first, second)
    assert 0.3 < (second > 1).float().mean().item() < 0.7


def test_host_read_inside_capture_is_refused():
    x = torch.ones(3).to("tpu")
    g = torch.tpu.TPUGraph()
    with pytest.raises(RuntimeError, match="host read a tpu value"), torch.tpu.graph(g):
        y = x + 1
        y.sum().item()
        z = y * 3
    # The region's work ran once, as recorded.
    torch.testing.assert_close(z.cpu(), torch.full((3,), 6.0))
    with pytest.raises(RuntimeError, match="nothing was captured"):
        g.replay()
    assert not torch.tpu.is_current_stream_capturing()


def test_optimizer_without_capturable_is_refused():
    p = torch.nn.Parameter(torch.ones(3).to("tpu"))
    opt = torch.optim.AdamW([p], lr=0.1)
    p.grad = torch.ones(3).to("tpu")
    opt.step()
    g = torch.tpu.TPUGraph()
    with pytest.raises(RuntimeError, match="capturable=True"), torch.tpu.graph(g):
        opt.step()
    assert not torch.tpu.is_current_stream_capturing()
    opt.step()  # outside a capture the guard stays quiet


def test_exception_inside_capture_ends_it():
    x = torch.ones(3).to("tpu")
    g = torch.tpu.TPUGraph()
    with pytest.raises(ValueError), torch.tpu.graph(g):
        assert torch.tpu.is_current_stream_capturing()
        y = x + 1
        raise ValueError("user error")
    assert not torch.tpu.is_current_stream_capturing()
    torch.testing.assert_close(y.cpu(), torch.full((3,), 2.0))
    with torch.tpu.graph(g):  # the same graph captures later
        y = x * 5
    g.replay()
    torch.testing.assert_close(y.cpu(), torch.full((3,), 5.0))


def test_capture_state_errors():
    x = torch.ones(3).to("tpu")
    g = torch.tpu.TPUGraph()
    with torch.tpu.graph(g):
        y = x + 1
    with pytest.raises(RuntimeError, match="already holds a capture"):
        g.capture_begin()
    inner = torch.tpu.TPUGraph()
    with (
        pytest.raises(RuntimeError, match="replay\\(\\) inside a graph capture"),
        torch.tpu.graph(inner),
    ):
        x.mul_(1)
        g.replay()
    g.reset()
    with pytest.raises(RuntimeError, match="nothing was captured"):
        g.replay()
    with pytest.raises(RuntimeError, match="recorded no tpu ops"), torch.tpu.graph(inner):
        pass
    torch.testing.assert_close(y.cpu(), torch.full((3,), 2.0))


def test_resized_input_is_refused():
    x = torch.ones(4).to("tpu")
    g = torch.tpu.TPUGraph()
    with torch.tpu.graph(g):
        y = x * 2
    x.untyped_storage().resize_(32)
    with pytest.raises(RuntimeError, match="changed its storage's size or dtype"):
        g.replay()
    del y


@pytest.mark.usefixtures("fresh_dynamo")
def test_compiled_model_inside_capture():
    # A torch.compile'd forward (and its backward graph) join the region's program.
    torch.manual_seed(0)
    model = MLP().to("tpu")
    fwd = torch.compile(model, backend="tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, capturable=True)
    batches = _batches("mlp", 6)
    sx, sy = batches[0][0].to("tpu"), batches[0][1].to("tpu")

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(fwd(sx), sy)
        loss.backward()
        opt.step()
        return loss

    losses = []
    for x, y in batches[:2]:
        sx.copy_(x)
        sy.copy_(y)
        losses.append(step().item())
    g = torch.tpu.TPUGraph()
    sx.copy_(batches[2][0])
    sy.copy_(batches[2][1])
    with torch.tpu.graph(g):
        static_loss = step()
    losses.append(static_loss.item())
    for x, y in batches[3:]:
        sx.copy_(x)
        sy.copy_(y)
        g.replay()
        losses.append(static_loss.item())
    assert losses == pytest.approx(_cpu_mlp_losses(batches), rel=1e-5)


def test_graphed_training_step():
    torch.manual_seed(0)
    model = MLP().to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, capturable=True)

    @torchtpu.graphed
    def step(x, y, scale=1.0):
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y) * scale
        loss.backward()
        opt.step()
        return {"loss": loss, "tag": "train"}

    batches = _batches("mlp", 7)
    outs = [step(x.to("tpu"), y.to("tpu")) for x, y in batches]
    assert all(o["tag"] == "train" for o in outs)
    # Steps 4-7 replay; each returns a tensor of its own, so earlier losses keep
    # their values.
    assert torchtpu.metrics()["graph_replays"] >= 4
    losses = [o["loss"].item() for o in outs]
    assert losses == pytest.approx(_cpu_mlp_losses(batches), rel=1e-5)
    assert len(set(losses)) == len(losses)
    # Another value of a non-tensor argument or another shape is another signature:
    # warmed up and captured anew.
    x, y = batches[0]
    replays = torchtpu.metrics()["graph_replays"]
    for _ in range(4):
        step(x[:8].to("tpu"), y[:8].to("tpu"), scale=0.5)
    assert torchtpu.metrics()["graph_replays"] == replays + 1
    with pytest.raises(TypeError, match="must be on tpu"):
        step(x, y)


def test_graphed_returns_unreplayable_capture_errors():
    x = torch.ones(3).to("tpu")

    @torchtpu.graphed(warmup=0)
    def f(t):
        return (t + 1).sum().item()

    with pytest.raises(RuntimeError, match="host read a tpu value"):
        f(x)
    assert not torch.tpu.is_current_stream_capturing()


@pytest.mark.parametrize("spmd", [True, False])
def test_graphed_ddp_step_on_thread_ranks(spmd):
    """Thread ranks in SPMD mode record DDP's gradient all-reduce into the step's
    program: each rank captures its replica and its replays meet the other ranks'.
    Without SPMD mode the all-reduce runs on its own, and the capture says so."""
    proc = check_py(
        f"""
        import copy, sys
        import torch, torchtpu
        import torch.nn.functional as F
        from torch.nn.parallel import DistributedDataParallel as DDP
        sys.path.insert(0, {EXAMPLES!r})
        from models import MLP
        from torchtpu.distributed import run_on_devices, spmd

        N = 2
        g = torch.Generator().manual_seed(1)
        data = [(torch.randn(16 * N, 32, generator=g), torch.randint(0, 10, (16 * N,), generator=g))
                for _ in range(6)]
        torch.manual_seed(0)
        init = MLP()

        def train(rank, use_graph):
            dev = torch.device("tpu", rank)
            model = DDP(copy.deepcopy(init).to(dev))
            opt = torch.optim.AdamW(model.parameters(), lr=0.01, capturable=True)

            def step(x, y):
                opt.zero_grad(set_to_none=True)
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
                return loss

            if use_graph:
                step = torchtpu.graphed(step)
            losses = []
            for x, y in data:
                losses.append(step(x.chunk(N)[rank].to(dev), y.chunk(N)[rank].to(dev)))
            return [l.item() for l in losses]

        with torchtpu.eager_mode("fused"), spmd({spmd}):
            ref = run_on_devices(train, N, args=(False,), join_timeout=60)
            replays = torchtpu.metrics()["graph_replays"]
            try:
                got = run_on_devices(train, N, args=(True,), join_timeout=60)
            except RuntimeError as e:
                print("refused:", e)
            else:
                assert got == ref, (got, ref)
                assert torchtpu.metrics()["graph_replays"] - replays == N * 3
                print("replayed ok")
        """,
        env={"TORCHTPU_NUM_DEVICES": "2"},
        timeout=180,
    )
    if spmd:
        assert "replayed ok" in proc.stdout, proc.stdout
    else:
        assert "refused:" in proc.stdout and "a program ran during the capture" in proc.stdout


def _captured_adamw_step(lr) -> tuple[torch.nn.Parameter, torch.optim.AdamW, TPUGraph]:
    """A parameter, its capturable AdamW at `lr`, and a graph of one step on (p * p).sum()
    captured after two warm-up steps."""
    p = torch.nn.Parameter(torch.ones(3).to("tpu"))
    opt = torch.optim.AdamW([p], lr=lr, capturable=True)

    def step():
        opt.zero_grad(set_to_none=False)
        (p * p).sum().backward()
        opt.step()

    for _ in range(2):
        step()
    g = torch.tpu.TPUGraph()
    with torch.tpu.graph(g):
        step()
    return p, opt, g


def test_replay_refuses_changed_host_hyperparameters():
    _, opt, g = _captured_adamw_step(0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    g.replay()
    with warnings.catch_warnings():
        # A replay is the optimizer's step: no "scheduler.step() before optimizer.step()".
        warnings.simplefilter("error")
        sched.step()  # lr is a Python float: the capture froze the old one
    with pytest.raises(RuntimeError, match="AdamW's lr changed since the capture"):
        g.replay()
    # A learning rate kept in a tpu tensor may change between replays.
    lr = torch.tensor(0.1, device="tpu")
    q, _, g2 = _captured_adamw_step(lr)
    before = q.detach().cpu()
    g2.replay()
    moved = q.detach().cpu()
    assert (moved < before).all()
    lr.fill_(0.0)  # read on the device by each replay
    g2.replay()
    torch.testing.assert_close(q.detach().cpu(), moved, rtol=0, atol=0)
