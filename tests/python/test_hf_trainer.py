"""Hugging Face Trainer and accelerate on tpu: device selection, bf16 autocast,
gradient accumulation, checkpoint save and resume, against the same Trainer run on
CPU.  A tiny GPT-2 from a config (random init, no downloads); dropout off so CPU
and tpu runs see the same computation (one resume test turns it on).  transformers
finds tpu through torch.accelerator; accelerate through its own switch,
ACCELERATE_TORCH_DEVICE=tpu (docs/ECOSYSTEM.md)."""

from __future__ import annotations

import pytest
import torch
import torchtpu
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

STEPS = 6  # optimizer steps; a checkpoint after step 3
ACCUM = 2  # micro-batches per optimizer step


class _Tokens(torch.utils.data.Dataset):
    def __init__(self, n=STEPS * ACCUM * 4, seq=16):
        g = torch.Generator().manual_seed(1)
        # counting sequences from random starts: learnable in a few steps
        self.x = (torch.randint(0, 128, (n, 1), generator=g) + torch.arange(seq)) % 128

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.x[i]}


def _model(seed=0, dropout=0.0):
    torch.manual_seed(seed)
    cfg = GPT2Config(
        n_layer=2,
        n_embd=64,
        n_head=4,
        vocab_size=128,
        n_positions=32,
        resid_pdrop=dropout,
        embd_pdrop=dropout,
        attn_pdrop=dropout,
        bos_token_id=0,
        eos_token_id=0,
    )
    return GPT2LMHeadModel(cfg)


def _trainer(device, out, monkeypatch, model=None, cls=Trainer, **kw):
    # accelerate picks its device when TrainingArguments builds its PartialState;
    # tpu only through its env switch (which it would also apply to use_cpu runs).
    if device == "tpu":
        monkeypatch.setenv("ACCELERATE_TORCH_DEVICE", "tpu")
    else:
        monkeypatch.delenv("ACCELERATE_TORCH_DEVICE", raising=False)
    opts = {
        "output_dir": str(out),
        "report_to": [],
        "use_cpu": device == "cpu",
        "max_steps": STEPS,
        "per_device_train_batch_size": 4,
        "gradient_accumulation_steps": ACCUM,
        "logging_steps": 1,
        "save_strategy": "no",
        "learning_rate": 1e-2,
        "lr_scheduler_type": "constant",
        "seed": 0,
        "dataloader_num_workers": 0,
        "disable_tqdm": True,
    }
    opts.update(kw)
    args = TrainingArguments(**opts)
    return cls(model=model or _model(), args=args, train_dataset=_Tokens())


def _losses(trainer):
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    out = tmp_path_factory.mktemp("hf")
    try:
        cpu = _trainer("cpu", out / "cpu", mp)
        cpu.train()
        cpu_device = cpu.accelerator.device  # accelerate's state is one per process
        tpu = _trainer("tpu", out / "tpu", mp, save_strategy="steps", save_steps=3)
        calls = []
        tpu.model.register_forward_hook(lambda m, a, o: calls.append(o.loss.device.type))
        tpu.train()
        yield {
            "cpu": cpu,
            "tpu": tpu,
            "calls": calls,
            "cpu_device": cpu_device,
            "out": out,
            "mp": mp,
        }
    finally:
        mp.undo()


def test_trainer_and_accelerate_select_tpu(runs):
    t = runs["tpu"]
    assert t.args.device.type == "tpu"
    assert t.accelerator.device.type == "tpu"  # accelerate's PartialState
    assert t.args.n_gpu == 1 and t.accelerator.distributed_type.value == "NO"
    assert {p.device.type for p in t.model.parameters()} == {"tpu"}
    assert runs["cpu_device"].type == "cpu" and runs["cpu"].args.device.type == "cpu"


def test_gradient_accumulation_matches_cpu(runs):
    # every micro-batch ran on tpu; one logged loss per optimizer step
    assert runs["calls"] == ["tpu"] * (STEPS * ACCUM)
    assert runs["tpu"].state.global_step == STEPS
    cpu, tpu = _losses(runs["cpu"]), _losses(runs["tpu"])
    assert len(cpu) == len(tpu) == STEPS
    assert tpu == pytest.approx(cpu, abs=2e-4)
    assert tpu[-1] < tpu[0]  # it learns


def test_checkpoint_resume_continues_the_run(runs):
    ckpt = runs["out"] / "tpu" / "checkpoint-3"
    assert (ckpt / "model.safetensors").exists() and (ckpt / "optimizer.pt").exists()
    # a different init: everything must come from the checkpoint
    t = _trainer("tpu", runs["out"] / "resume", runs["mp"], model=_model(seed=7))
    t.train(resume_from_checkpoint=str(ckpt))
    assert t.state.global_step == STEPS
    # log_history comes back from the checkpoint: steps 1-3 loaded, 4-6 run here
    assert len(_losses(t)) == STEPS
    assert _losses(t)[3:] == pytest.approx(_losses(runs["tpu"])[3:], abs=1e-5)
    want = runs["tpu"].model.state_dict()
    for k, v in t.model.state_dict().items():
        torch.testing.assert_close(v.cpu(), want[k].cpu(), rtol=1e-5, atol=1e-5, msg=k)


def test_bf16_autocasts_on_tpu(runs, tmp_path):
    t = _trainer("tpu", tmp_path, runs["mp"], bf16=True, max_steps=2)
    assert t.accelerator.native_amp and t.accelerator.mixed_precision == "bf16"
    seen = []
    mlp = t.model.transformer.h[0].mlp.c_fc
    mlp.register_forward_hook(lambda m, a, o: seen.append((o.device.type, o.dtype)))
    t.train()
    assert seen and set(seen) == {("tpu", torch.bfloat16)}
    assert mlp.weight.dtype == torch.float32  # master weights stay float32
    # bfloat16 matmuls: close to the float32 CPU curve, not bit-equal
    assert _losses(t) == pytest.approx(_losses(runs["cpu"])[:2], abs=3e-2)


def test_resume_with_dropout_restores_the_tpu_generator(runs, tmp_path):
    # transformers' Trainer checkpoints no tpu generator; torchtpu.hf.Trainer adds it
    from torchtpu import hf

    mp = runs["mp"]
    a = _trainer(
        "tpu",
        tmp_path / "a",
        mp,
        _model(dropout=0.1),
        hf.Trainer,
        save_strategy="steps",
        save_steps=3,
    )
    a.train()
    ckpt = tmp_path / "a" / "checkpoint-3"
    assert (ckpt / "rng_state_tpu.pth").exists()
    b = _trainer("tpu", tmp_path / "b", mp, _model(seed=7, dropout=0.1), hf.Trainer)
    b.train(resume_from_checkpoint=str(ckpt))
    assert _losses(b)[3:] == pytest.approx(_losses(a)[3:], abs=1e-5)


@pytest.mark.parametrize("mode", ["debug", "fused"])
def test_other_eager_modes_match_cpu(runs, tmp_path, mode):
    # Trainer reads losses and grad norms on the host every step: Fused Eager cuts there
    with torchtpu.eager_mode(mode):
        t = _trainer("tpu", tmp_path, runs["mp"], max_steps=2)
        t.train()
    assert _losses(t) == pytest.approx(_losses(runs["cpu"])[:2], abs=2e-4)


def _accelerate_run(device, monkeypatch):
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    if device == "tpu":
        monkeypatch.setenv("ACCELERATE_TORCH_DEVICE", "tpu")
    else:
        monkeypatch.delenv("ACCELERATE_TORCH_DEVICE", raising=False)
    AcceleratorState._reset_state(reset_partial_state=True)
    acc = Accelerator(cpu=device == "cpu", mixed_precision="bf16", gradient_accumulation_steps=2)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data = torch.utils.data.TensorDataset(torch.randn(32, 8), torch.randn(32, 4))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    seen = set()
    model[0].register_forward_hook(lambda m, a, o: seen.add((a[0].device.type, o.dtype)))
    model, opt, loader = acc.prepare(model, opt, loader)
    for x, y in loader:
        with acc.accumulate(model):
            with acc.autocast():  # prepare() returns float32 outputs; the hook sees inside
                out = model(x)
            acc.backward(torch.nn.functional.mse_loss(out.float(), y))
            opt.step()
            opt.zero_grad()
    dev = acc.device
    AcceleratorState._reset_state(reset_partial_state=True)
    return dev, seen, [p.detach().cpu() for p in model.parameters()]


def test_accelerate_selects_tpu(monkeypatch):
    dev, seen, weights = _accelerate_run("tpu", monkeypatch)
    assert dev.type == "tpu" and seen == {("tpu", torch.bfloat16)}
    cpu_dev, cpu_seen, cpu_weights = _accelerate_run("cpu", monkeypatch)
    assert cpu_dev.type == "cpu" and cpu_seen == {("cpu", torch.bfloat16)}
    for w, c in zip(weights, cpu_weights):
        torch.testing.assert_close(w, c, rtol=2e-2, atol=2e-2)
