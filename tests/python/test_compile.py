"""torch.compile(backend="tpu"): Dynamo/aot_autograd graphs through the eager lowering rules."""

from __future__ import annotations

import os
import sys

import pytest
import torch
import torch.nn.functional as F
import torchtpu
from conftest import assert_tpu_close, check_py

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
from models import GPT, MLP, copy_task_batch


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _rel(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


def _cnn() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(8 * 4 * 4, 10),
    )


@pytest.mark.parametrize("name", ["tpu", "torchtpu"])
def test_backend_names(name):
    m = MLP().to("tpu")
    x = torch.randn(4, 32, device="tpu")
    before = torchtpu.metrics()
    out = torch.compile(m, backend=name)(x)
    assert_tpu_close(out, m(x).cpu())
    after = torchtpu.metrics()
    assert after["compiled_graphs"] - before["compiled_graphs"] == 1
    assert after["fused_cuts"].get("compiled_graph", 0) > before["fused_cuts"].get(
        "compiled_graph", 0
    )


@pytest.mark.parametrize("model", ["MLP", "CNN", "GPT"])
def test_inference_matches_eager(model):
    torch.manual_seed(0)
    if model == "GPT":
        m = GPT().to("tpu").eval()
        gen = torch.Generator().manual_seed(0)
        args = [t.to("tpu") for t in copy_task_batch(gen, 2, 16, 64)]
    elif model == "CNN":
        m = _cnn().to("tpu").eval()
        args = [torch.randn(4, 3, 8, 8, device="tpu")]
    else:
        m = MLP().to("tpu")
        args = [torch.randn(8, 32, device="tpu")]
    with torch.no_grad():
        want = m(*args)
        got = torch.compile(m, backend="tpu")(*args)
    assert_tpu_close(got, want.cpu())


def _train(model_fn, batches, steps: int, compile_mode: str | None, **opt_kw) -> list[float]:
    torch.manual_seed(0)
    model = model_fn().to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01, **opt_kw)
    fwd = torch.compile(model, backend="tpu") if compile_mode == "model" else model

    def loss_of(x, y):
        return fwd(x, y) if isinstance(model, GPT) else F.cross_entropy(fwd(x), y)

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = loss_of(x, y)
        loss.backward()
        opt.step()
        return loss

    if compile_mode == "step":
        step = torch.compile(step, backend="tpu")
    if compile_mode == "loss":
        loss_of = torch.compile(loss_of, backend="tpu")
    return [step(*(t.to("tpu") for t in batches[i % len(batches)])).item() for i in range(steps)]


def _mlp_batches():
    gen = torch.Generator().manual_seed(0)
    return [
        (torch.randn(16, 32, generator=gen), torch.randint(0, 10, (16,), generator=gen))
        for _ in range(2)
    ]


def _gpt_batches():
    gen = torch.Generator().manual_seed(0)
    return [copy_task_batch(gen, 4, 32, 64) for _ in range(2)]


@pytest.mark.parametrize("mode", ["model", "loss", "step"])
def test_mlp_training_matches_eager(mode):
    kw = {"capturable": True} if mode == "step" else {}
    eager = _train(MLP, _mlp_batches(), 6, None, **kw)
    got = _train(MLP, _mlp_batches(), 6, mode, **kw)
    assert _rel(got, eager) <= 1e-4
    assert got[-1] < got[0]


@pytest.mark.parametrize("mode", ["model", "step"])
def test_gpt_training_matches_eager(mode):
    kw = {"capturable": True} if mode == "step" else {}
    eager = _train(GPT, _gpt_batches(), 5, None, **kw)
    got = _train(GPT, _gpt_batches(), 5, mode, **kw)
    assert _rel(got, eager) <= 1e-4


def test_cnn_batchnorm_buffers_are_updated():
    torch.manual_seed(0)
    ref = _cnn().to("tpu")
    torch.manual_seed(0)
    m = _cnn().to("tpu")
    cm = torch.compile(m, backend="tpu")
    x = torch.randn(4, 3, 8, 8, device="tpu")
    for _ in range(3):
        cm(x).sum().backward()
        ref(x).sum().backward()
    bn, bn_ref = m[1], ref[1]
    assert int(bn.num_batches_tracked) == 3
    assert_tpu_close(bn.running_mean, bn_ref.running_mean.cpu())
    assert_tpu_close(bn.running_var, bn_ref.running_var.cpu())
    assert_tpu_close(m[0].weight.grad, ref[0].weight.grad.cpu())


def test_dropout_matches_eager_with_the_same_seed():
    eager = _train(lambda: GPT(dropout=0.1), _gpt_batches(), 3, None)
    got = _train(lambda: GPT(dropout=0.1), _gpt_batches(), 3, "model")
    assert _rel(got, eager) <= 1e-4
    no_dropout = _train(GPT, _gpt_batches(), 3, None)
    assert got != no_dropout


def test_graph_break_falls_back_to_eager():
    def fn(x):
        y = x.sin() * 2
        print("graph break")  # Dynamo splits the graph here
        return (y + 1).cos()

    x = torch.randn(5, device="tpu")
    before = torchtpu.metrics()["compiled_graphs"]
    got = torch.compile(fn, backend="tpu")(x)
    assert torchtpu.metrics()["compiled_graphs"] - before == 2
    assert_tpu_close(got, ((x.cpu().sin() * 2) + 1).cos())


def test_unsupported_option_is_reported():
    with pytest.raises(Exception, match="bounded_dynamism"):
        torch.compile(torch.sin, backend="tpu", options={"bounded_dynamism": True})(
            torch.randn(3, device="tpu")
        )


def test_second_process_compiles_nothing():
    examples = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples")
    code = f"""
        import sys, torch, torchtpu
        sys.path.insert(0, {examples!r})
        from models import MLP
        torch.manual_seed(0)
        m = torch.compile(MLP().to("tpu"), backend="tpu")
        x = torch.randn(8, 32, device="tpu")
        m(x).sum().backward()
        print(torchtpu.metrics()["compiles"], torchtpu.metrics()["compiled_graphs"])
        """
    first = check_py(code).stdout.split()
    second = check_py(code).stdout.split()
    assert int(first[-2]) > 0 and int(first[-1]) == 2  # forward and backward graphs
    assert int(second[-2]) == 0 and int(second[-1]) == 2
