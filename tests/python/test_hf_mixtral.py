"""A tiny Mixtral (sparse mixture of experts: router softmax and top-k, tokens
gathered per expert and summed back) from a config, random init, no downloads:
forward logits, router logits and the load-balancing loss, then two AdamW
training steps, on tpu against the same model on CPU in each eager mode."""

from __future__ import annotations

import pytest
import torch
import torchtpu

transformers = pytest.importorskip("transformers")

TOL = {"rtol": 2e-4, "atol": 2e-4}


def _model():
    torch.manual_seed(0)
    cfg = transformers.MixtralConfig(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=64,
        output_router_logits=True,
        router_aux_loss_coef=0.02,
    )
    return transformers.MixtralForCausalLM(cfg)


def _batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 96, (2, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding: masked tokens still routed, left out of the aux loss
    return ids, mask


def _run(device, steps=2):
    model = _model().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids, mask = (t.to(device) for t in _batch())
    out = []
    for _ in range(steps):
        r = model(input_ids=ids, attention_mask=mask, labels=ids)
        r.loss.backward()
        grads = {k: p.grad.detach().cpu().clone() for k, p in model.named_parameters()}
        out.append(
            (r.logits.detach().cpu(), r.aux_loss.detach().cpu(), r.loss.detach().cpu(), grads)
        )
        opt.step()
        opt.zero_grad()
    return out


@pytest.fixture(scope="module")
def cpu_run():
    return _run("cpu")


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_mixtral_forward_and_training_match_cpu(cpu_run, mode):
    with torchtpu.eager_mode(mode):
        got = _run("tpu")
    for step, (g, w) in enumerate(zip(got, cpu_run)):
        for name, a, e in zip(("logits", "aux_loss", "loss"), g[:3], w[:3]):
            torch.testing.assert_close(a, e, **TOL, msg=f"step {step} {name}")
        for k, e in w[3].items():
            torch.testing.assert_close(g[3][k], e, **TOL, msg=f"step {step} grad {k}")
