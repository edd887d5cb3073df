"""Training parity: MLP and GPT trained on tpu give CPU's losses (float32, 1e-4 relative);
MobileNetV3-Small's loss and gradients match CPU's."""

from __future__ import annotations

import os
import sys

import pytest
import torch
import torch.nn.functional as F
import torchtpu

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
from models import GPT, MLP, MobileNetV3Small, copy_task_batch, train_losses

STEPS = 20


def _mlp_batches():
    gen = torch.Generator().manual_seed(0)
    return [
        (torch.randn(16, 32, generator=gen), torch.randint(0, 10, (16,), generator=gen))
        for _ in range(4)
    ]


def _gpt_batches():
    gen = torch.Generator().manual_seed(0)
    return [copy_task_batch(gen, 4, 32, 64) for _ in range(4)]


def _assert_parity(tpu: list[float], cpu: list[float]) -> None:
    assert len(tpu) == len(cpu) == STEPS
    for step, (a, b) in enumerate(zip(tpu, cpu)):
        assert abs(a - b) <= 1e-4 * abs(b), f"step {step}: tpu {a} vs cpu {b}"
    assert tpu[-1] < tpu[0], "the model did not learn"


@pytest.mark.parametrize("mode", ["strict", "debug", "fused"])
@pytest.mark.parametrize("foreach", [True, False])
def test_mlp_adamw_parity(mode: str, foreach: bool) -> None:
    batches = _mlp_batches()
    cpu = train_losses(MLP, batches, "cpu", STEPS, foreach=foreach)
    with torchtpu.eager_mode(mode):
        tpu = train_losses(MLP, batches, "tpu", STEPS, foreach=foreach)
    _assert_parity(tpu, cpu)


@pytest.mark.parametrize("mode", ["strict", "debug", "fused"])
def test_gpt_adamw_parity(mode: str) -> None:
    batches = _gpt_batches()
    cpu = train_losses(GPT, batches, "cpu", STEPS)
    with torchtpu.eager_mode(mode):
        tpu = train_losses(GPT, batches, "tpu", STEPS)
    _assert_parity(tpu, cpu)


def test_gpt_steady_state_compiles_nothing() -> None:
    batches = _gpt_batches()
    train_losses(GPT, batches, "tpu", 2)
    before = torchtpu.metrics()["compiles"]
    train_losses(GPT, batches, "tpu", 3)
    assert torchtpu.metrics()["compiles"] == before


def test_gpt_dropout_reproducible_with_manual_seed() -> None:
    batches = _gpt_batches()

    def dropout_gpt() -> GPT:
        return GPT(dropout=0.1)

    a = train_losses(dropout_gpt, batches, "tpu", 4)
    b = train_losses(dropout_gpt, batches, "tpu", 4)  # train_losses reseeds with manual_seed(0)
    assert a == b
    torch.manual_seed(1)
    model = dropout_gpt().to("tpu")
    x, y = (t.to("tpu") for t in batches[0])
    c = model(x, y).item()
    torch.manual_seed(1)
    model2 = dropout_gpt().to("tpu")
    torch.tpu.manual_seed(2)  # other dropout masks, same weights
    d = model2(x, y).item()
    assert c != d


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_mobilenet_v3_small_grads_match_cpu(mode: str) -> None:
    """One forward and backward of MobileNetV3-Small (train-mode batch norm, depthwise
    3x3 and 5x5 convs, squeeze-excite, hardswish/hardsigmoid) on a 2x3x64x64 batch: the
    loss to 1e-4 relative, every gradient and the batch-norm running stats to the
    convolution tests' rtol=atol=1e-4. (The projection batch norms' bias gradients are
    zero in exact arithmetic, since a train-mode batch norm follows and removes per-channel
    shifts: both sides give ~1e-9 noise there, inside atol.)"""
    torch.manual_seed(0)
    cpu = MobileNetV3Small(num_classes=10, dropout=0.0)
    dev = MobileNetV3Small(num_classes=10, dropout=0.0)
    dev.load_state_dict(cpu.state_dict())
    dev.to("tpu")
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 64, 64, generator=gen)
    y = torch.randint(0, 10, (2,), generator=gen)
    expected = F.cross_entropy(cpu(x), y)
    expected.backward()
    with torchtpu.eager_mode(mode):
        loss = F.cross_entropy(dev(x.to("tpu")), y.to("tpu"))
        loss.backward()
    assert abs(loss.item() - expected.item()) <= 1e-4 * abs(expected.item())
    for (name, p_cpu), p_dev in zip(cpu.named_parameters(), dev.parameters()):
        assert p_dev.grad is not None, name
        torch.testing.assert_close(p_dev.grad.cpu(), p_cpu.grad, rtol=1e-4, atol=1e-4, msg=name)
    for (name, b_cpu), b_dev in zip(cpu.named_buffers(), dev.buffers()):
        torch.testing.assert_close(b_dev.cpu(), b_cpu, rtol=1e-4, atol=1e-4, msg=name)
