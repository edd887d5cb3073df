"""Training parity: MLP and GPT trained on tpu give CPU's losses (float32, 1e-4 relative)."""

from __future__ import annotations

import os
import sys

import pytest
import torch
import torchtpu

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
from models import GPT, MLP, copy_task_batch, train_losses

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
