"""The hardware advisor (torchtpu.advise, python -m torchtpu.advise) and the per-op
program counter it reads (metrics()["programs_by_op"])."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
import torchtpu
from conftest import _BACKEND_ENV, PYTHON_DIR
from torch import nn
from torchtpu.advise import CHIPS, Advisor, chip


class Attention(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in self.qkv(x).split(d, 2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.attn = Attention(d, heads)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln(x))
        return x + self.mlp(x)


class GPT(nn.Module):
    def __init__(self, vocab: int = 128, d: int = 256, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx)
        for blk in self.blocks:
            x = blk(x)
        return self.head(x)


def _gpt_run(heads: int) -> Advisor:
    torch.manual_seed(0)
    model = GPT(heads=heads).to("tpu")
    idx = torch.randint(0, 128, (2, 128)).to("tpu")
    adv = Advisor("v5e")
    with adv, torch.no_grad():
        adv.mark_step()
        model(idx)
    return adv


@pytest.fixture(scope="module")
def gpt64() -> Advisor:
    return _gpt_run(heads=4)  # head dim 64 at d_model 256


def _kind(report, kind: str):
    return [f for f in report.findings if f.kind == kind]


def test_head_dim_64_names_attention_layers_and_suggests_128(gpt64):
    report = gpt64.report("v5e")
    (f,) = _kind(report, "head_dim")
    assert f.layers == ["blocks.0.attn", "blocks.1.attn"], f
    assert "head dim 64" in f.what
    assert "use head_dim 128 (n_heads 2 instead of 4 at d_model 256)" in f.fix
    # QK^T and PV pad 64 to 128 in one dim each: half their matrix-unit time.
    assert 0.01 < f.waste < 0.5, f
    wastes = [x.waste for x in report.findings if x.waste is not None]
    assert wastes == sorted(wastes, reverse=True)
    # On a 256-wide unit the same run pads more and the fix says so.
    (g,) = _kind(gpt64.report("v6e"), "head_dim")
    assert g.waste > f.waste and "use head_dim 256" in g.fix and "128" in g.fix
    # Hopper's 128-byte alignment is 64 bfloat16 elements: nothing to pad there.
    assert not _kind(gpt64.report("h100"), "head_dim")


def test_head_dim_128_has_no_head_dim_finding():
    report = _gpt_run(heads=2).report("v5e")
    assert not _kind(report, "head_dim"), report


def test_float32_matmuls_suggest_autocast(gpt64):
    (f,) = _kind(gpt64.report("v5e"), "float32")
    assert "100% of matmul FLOPs run in float32" in f.what
    assert "torch.autocast('tpu', dtype=torch.bfloat16)" in f.fix
    assert f.waste == pytest.approx(0.5)  # half the operand bytes
    # H100 runs float32 matmuls as TF32 at half the bfloat16 rate: a time estimate.
    (g,) = _kind(gpt64.report("h100"), "float32")
    assert g.basis == "of estimated matmul time" and 0.3 < g.waste <= 0.5


def test_autocast_run_has_no_float32_finding():
    mlp = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 256)).to("tpu")
    x = torch.randn(64, 256).to("tpu")

    def step(i: int) -> None:
        with torch.autocast("tpu", dtype=torch.bfloat16):
            mlp(x)

    report = torchtpu.advise(step_fn=step, steps=1, target="v5e")
    assert not _kind(report, "float32"), report
    assert "estimated matrix-unit use 100%" in str(report)


def test_linear_dims_name_the_layer_and_the_multiple():
    model = nn.Sequential(nn.Linear(256, 200), nn.ReLU(), nn.Linear(200, 256))
    report = torchtpu.advise(model, torch.randn(64, 256), target="v5e", steps=1)
    dims = {(f.layer, f.what.split(" is")[0]): f.fix for f in _kind(report, "matmul_dim")}
    assert dims[("0", "Linear out_features 200")] == "make out_features a multiple of 128: 256"
    assert dims[("2", "Linear in_features 200")] == "make in_features a multiple of 128: 256"


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_shape_that_changes_every_step_names_the_op(mode):
    base = torch.randn(1200).to("tpu")
    keep = []  # live results: Fused Eager computes only what is still reachable

    def step(i: int) -> None:
        x = base[: 1001 + 7 * i]  # a view: no program of its own
        keep.append(torch.exp(x).sum())

    with torchtpu.eager_mode(mode):
        report = torchtpu.advise(step_fn=step, steps=4, target="v5e")
    rec = _kind(report, "recompile")
    assert rec, report
    text = "\n".join(f.what for f in rec)
    if mode == "strict":
        assert "aten::exp" in text and "every step" in text, text
    else:
        assert "fused graph of" in text and "aten::exp" in text, text
    assert "input 0 dim 0: 1001 -> 1008 -> 1015 -> 1022" in text, text
    assert "bounded_dynamism" in rec[0].fix


def test_fixed_shapes_have_no_recompile_finding():
    base = torch.randn(1300).to("tpu")
    report = torchtpu.advise(step_fn=lambda i: torch.exp(base[:1111]).sum(), steps=3)
    assert not _kind(report, "recompile"), report


def test_growing_kv_cache_suggests_static_cache():
    proj = nn.Linear(32, 32).to("tpu")
    state = {"k": torch.zeros(1, 2, 0, 16).to("tpu")}

    def step(i: int) -> None:
        new = proj(torch.randn(1, 1, 32).to("tpu")).view(1, 1, 2, 16).transpose(1, 2)
        state["k"] = torch.cat([state["k"], new], dim=2)
        state["out"] = (state["k"] * 2).sum()

    report = torchtpu.advise(step_fn=step, steps=4, target="v5e")
    (f,) = _kind(report, "kv_cache")
    assert "grows input 0 dim 2 by 1" in f.what, f
    assert "cache_implementation='static'" in f.fix


def test_programs_by_op_counts_new_signatures():
    def count(name: str) -> int:  # over the op's overloads ("erfc.out" is what runs)
        ops = torchtpu.metrics()["programs_by_op"]
        return sum(n for op, n in ops.items() if op.split(".")[0] == name)

    before = count("erfc")
    x = torch.rand(1237).to("tpu")
    torch.erfc(x)
    torch.erfc(x)  # same signature: the program table has it
    assert count("erfc") == before + 1
    torch.erfc(torch.rand(1238).to("tpu"))
    assert count("erfc") == before + 2
    with torchtpu.eager_mode("fused"):
        torch.erfc(torch.rand(1239).to("tpu")).sum().item()
    fused = [k for k in torchtpu.metrics()["programs_by_op"] if k.startswith("fused graph of")]
    assert any("aten::erfc" in k for k in fused), fused


def test_chip_table():
    assert chip("v5e").unit == 128 and chip("TPU v6e").unit == 256 and chip("ironwood").unit == 256
    assert chip("H200").hbm_gb == 141 and chip("current") is CHIPS["cpu"]
    for c in CHIPS.values():
        assert c.sources and all(s.startswith("https://") for s in c.sources), c
    with pytest.raises(ValueError, match="unknown target"):
        chip("v3")


SCRIPT = """
import sys, torch, torchtpu
from torch import nn
model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256)).to("tpu")
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(32, 256).to("tpu")
for step in range(int(sys.argv[1])):
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    torch.unique(torch.stack([x[0], x[0] * 0, x[0]]), dim=0)
    print(step, loss.item())
"""


def test_cli_runs_a_script(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    env = {k: v for k, v in os.environ.items() if k not in _BACKEND_ENV}
    env.update(PYTHONPATH=str(PYTHON_DIR), TORCHTPU_CPU_FALLBACK="1")
    proc = subprocess.run(
        [sys.executable, "-m", "torchtpu.advise", "--target", "v5e", str(script), "3"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    out = proc.stdout
    assert proc.returncode == 0, proc.stderr
    assert "0 " in out.splitlines()[0], out  # the script ran with its own arguments
    assert "steps observed: 3 (optimizer steps)" in out, out
    assert "host sync inside the loop (.item() every step)" in out, out
    assert "train.py:13]" in out, out
    assert "aten::unique_dim ran on the CPU 3 times" in out, out
    assert "100% of matmul FLOPs run in float32" in out, out
