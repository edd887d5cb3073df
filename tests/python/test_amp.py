"""Mixed precision on tpu: autocast, GradScaler and fused optimizers.

Autocast follows PyTorch's CUDA policy lists. The dtype every op returns is
checked against CUDA autocast itself (PyTorch's own CUDA kernels run on fake
CUDA tensors, which needs no GPU) and against CPU autocast; values against
CPU autocast within bfloat16 tolerance. GradScaler and the fused optimizer
steps are compared with the CPU's kernels.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys

import pytest
import torch
import torch.nn.functional as F
import torchtpu
from conftest import run_py, tpu
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
from models import GPT, copy_task_batch

BF16_TOL = {"rtol": 1e-2, "atol": 1e-2}


def _r(*shape, dtype=torch.float32):
    return torch.randn(*shape).to(dtype)


def _bf(*shape):
    return _r(*shape, dtype=torch.bfloat16)


# name -> (fn, inputs). Inputs are float32 unless the row is about an op that
# receives a lower-precision value (the output of a matmul, in a model).
AUTOCAST_OPS = {
    # lower precision
    "mm": (torch.mm, lambda: [_r(4, 8), _r(8, 6)]),
    "linear": (F.linear, lambda: [_r(4, 8), _r(6, 8), _r(6)]),
    "conv2d": (F.conv2d, lambda: [_r(1, 3, 8, 8), _r(4, 3, 3, 3), _r(4)]),
    "bmm": (torch.bmm, lambda: [_r(2, 4, 8), _r(2, 8, 5)]),
    "baddbmm": (torch.baddbmm, lambda: [_r(2, 4, 5), _r(2, 4, 8), _r(2, 8, 5)]),
    "addmm": (torch.addmm, lambda: [_r(6), _r(4, 8), _r(8, 6)]),
    "matmul": (torch.matmul, lambda: [_r(3, 4, 8), _r(8, 6)]),
    "einsum": (lambda a, b: torch.einsum("ij,jk->ik", a, b), lambda: [_r(4, 8), _r(8, 6)]),
    "sdpa": (F.scaled_dot_product_attention, lambda: [_r(2, 2, 4, 8)] * 3),
    "mm_bf16_f32": (torch.mm, lambda: [_bf(4, 8), _r(8, 6)]),
    "mm_f64": (torch.mm, lambda: [_r(4, 8, dtype=torch.float64), _r(8, 6, dtype=torch.float64)]),
    # float32
    "softmax": (lambda x: torch.softmax(x, -1), lambda: [_r(4, 8)]),
    "softmax_bf16": (lambda x: torch.softmax(x, -1), lambda: [_bf(4, 8)]),
    "log_softmax_bf16": (lambda x: torch.log_softmax(x, -1), lambda: [_bf(4, 8)]),
    "layer_norm_bf16": (lambda x: F.layer_norm(x, (8,)), lambda: [_bf(4, 8)]),
    "group_norm_bf16": (lambda x: F.group_norm(x, 2), lambda: [_bf(2, 4, 3)]),
    "cross_entropy_bf16": (
        F.cross_entropy,
        lambda: [_bf(4, 8), torch.tensor([1, 0, 7, 3])],
    ),
    "mse_loss_bf16": (F.mse_loss, lambda: [_bf(4, 8), _r(4, 8)]),
    "bce_with_logits_bf16": (F.binary_cross_entropy_with_logits, lambda: [_bf(6), torch.rand(6)]),
    "exp_bf16": (torch.exp, lambda: [_bf(4, 8)]),
    "log_bf16": (lambda x: torch.log(x.abs() + 1), lambda: [_bf(4, 8)]),
    "pow_bf16": (lambda x: torch.pow(x, 2), lambda: [_bf(4, 8)]),
    "rsqrt_bf16": (lambda x: torch.rsqrt(x.abs() + 1), lambda: [_bf(4, 8)]),
    "sum_bf16": (lambda x: x.sum(), lambda: [_bf(4, 8)]),
    "cumsum_bf16": (lambda x: torch.cumsum(x, 1), lambda: [_bf(4, 8)]),
    "norm_bf16": (lambda x: torch.norm(x), lambda: [_bf(4, 8)]),
    # promote
    "cat_mixed": (lambda a, b: torch.cat([a, b]), lambda: [_r(4, 8), _bf(4, 8)]),
    "stack_mixed": (lambda a, b: torch.stack([a, b]), lambda: [_r(4, 8), _bf(4, 8)]),
    "addcmul_mixed": (torch.addcmul, lambda: [_r(4, 8), _bf(4, 8), _bf(4, 8)]),
    "atan2_mixed": (torch.atan2, lambda: [_r(4, 8), _bf(4, 8)]),
    # no policy: runs in its input's dtype
    "gelu_bf16": (F.gelu, lambda: [_bf(4, 8)]),
    "add_mixed": (torch.add, lambda: [_bf(4, 8), _r(4, 8)]),
}

# CPU autocast's lists are shorter than CUDA's: these float32-policy ops keep
# a bfloat16 input's dtype on the CPU; on CUDA (and tpu) they return float32.
DIFFERS_FROM_CPU = {
    "softmax_bf16",
    "log_softmax_bf16",
    "layer_norm_bf16",
    "group_norm_bf16",
    "exp_bf16",
    "log_bf16",
    "pow_bf16",
    "rsqrt_bf16",
    "sum_bf16",
    "cumsum_bf16",
    "norm_bf16",
}


def _cuda_autocast_dtype(fn, inputs) -> torch.dtype:
    """The dtype CUDA autocast (bfloat16) gives `fn`: PyTorch's AutocastCUDA kernels
    on fake CUDA tensors of the inputs' shapes and dtypes."""
    enabled, dtype = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
    with FakeTensorMode():
        fakes = [torch.empty(t.shape, dtype=t.dtype, device="cuda") for t in inputs]
        torch.set_autocast_enabled("cuda", True)
        torch.set_autocast_dtype("cuda", torch.bfloat16)
        try:
            return fn(*fakes).dtype
        finally:
            torch.set_autocast_enabled("cuda", enabled)
            torch.set_autocast_dtype("cuda", dtype)


def _autocast_row_problem(name: str) -> str | None:
    fn, make = AUTOCAST_OPS[name]
    inputs = make()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = fn(*inputs)
    with torch.autocast("tpu"):
        out = fn(*[tpu(t) for t in inputs])
    cuda = _cuda_autocast_dtype(fn, inputs)
    if out.dtype != cuda:
        return f"{name}: tpu autocast gave {out.dtype}, CUDA autocast {cuda}"
    if name in DIFFERS_FROM_CPU:
        assert (ref.dtype, cuda) == (torch.bfloat16, torch.float32), name
    elif out.dtype != ref.dtype:
        return f"{name}: tpu autocast gave {out.dtype}, CPU autocast {ref.dtype}"
    torch.testing.assert_close(
        out.cpu().double(), ref.double(), **BF16_TOL, msg=lambda m: f"{name}: {m}"
    )
    return None


def test_autocast_dtypes_match_cuda_and_cpu(eager):
    # One test over the whole table, so rows that keep their dtype (no policy,
    # float64, natural promotion) are checked alongside the ones autocast casts.
    problems = [p for name in AUTOCAST_OPS if (p := _autocast_row_problem(name))]
    assert not problems, "\n".join(problems)


def test_autocast_defaults_to_bfloat16_and_takes_float16():
    assert torch.get_autocast_dtype("tpu") == torch.bfloat16
    a, b = _r(4, 8), _r(8, 6)
    with torch.autocast("tpu"):
        assert torch.is_autocast_enabled("tpu")
        assert torch.mm(tpu(a), tpu(b)).dtype == torch.bfloat16
    with torch.autocast("tpu", dtype=torch.float16):
        out = torch.mm(tpu(a), tpu(b))
    with torch.autocast("cpu", dtype=torch.float16):
        ref = torch.mm(a, b)
    assert out.dtype == ref.dtype == torch.float16
    torch.testing.assert_close(out.cpu(), ref, rtol=2e-3, atol=2e-3)
    assert torch.mm(tpu(a), tpu(b)).dtype == torch.float32  # outside autocast


def test_binary_cross_entropy_runs_in_float32():
    # CUDA raises for it under autocast; tpu runs it in float32 as the CPU does.
    p, t = torch.rand(6).to(torch.bfloat16), torch.rand(6).to(torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = F.binary_cross_entropy(p, t)
    with torch.autocast("tpu"):
        out = F.binary_cross_entropy(tpu(p), tpu(t))
    assert out.dtype == ref.dtype == torch.float32
    torch.testing.assert_close(out.cpu(), ref, **BF16_TOL)


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.ln, self.fc2 = nn.Linear(8, 16), nn.LayerNorm(16), nn.Linear(16, 5)

    def forward(self, x):
        h = self.ln(F.gelu(self.fc1(x)))
        logits = self.fc2(h)
        return h, logits, torch.softmax(logits, -1)


@pytest.mark.parametrize("where", ["inside", "outside"])
def test_autocast_under_compile(where):
    torch.manual_seed(0)
    net = _Net().to("tpu")
    x, y = tpu(_r(4, 8)), torch.tensor([0, 4, 2, 1], device="tpu")

    def step(x, y):
        with torch.autocast("tpu") if where == "inside" else contextlib.nullcontext():
            h, logits, p = net(x)
            return h, logits, p, F.cross_entropy(logits, y)

    compiled = torch.compile(step, backend="tpu", fullgraph=True)
    results = []
    for fn in (step, compiled):
        net.zero_grad()
        with torch.autocast("tpu") if where == "outside" else contextlib.nullcontext():
            outs = fn(x, y)
        outs[-1].backward()
        results.append((outs, [p.grad.clone() for p in net.parameters()]))
    (eager, eager_grads), (comp, comp_grads) = results
    assert [t.dtype for t in comp] == [t.dtype for t in eager]
    assert [t.dtype for t in comp] == [torch.float32, torch.bfloat16, torch.float32, torch.float32]
    for a, b in zip(comp + tuple(comp_grads), eager + tuple(eager_grads)):
        torch.testing.assert_close(a.cpu().double(), b.cpu().double(), **BF16_TOL)
    assert all(g.dtype == torch.float32 for g in comp_grads)


def _gpt_batches():
    gen = torch.Generator().manual_seed(0)
    return [copy_task_batch(gen, 4, 32, 64) for _ in range(3)]


def _gpt_amp_run(device: str, fused: bool):
    """Losses, logits/loss dtypes and scales of 3 autocast + GradScaler AdamW steps."""
    torch.manual_seed(0)
    model = GPT(d=32, layers=1).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01, fused=fused)
    scaler = torch.amp.GradScaler(device)
    losses, dtypes, scales = [], [], []
    for x, y in _gpt_batches():
        x, y = x.to(device), y.to(device)
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=torch.bfloat16):
            logits = model(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
        dtypes.append((logits.dtype, loss.dtype))
        scales.append(scaler.get_scale())
    return losses, dtypes, scales


@functools.cache
def _gpt_amp_cpu():
    return _gpt_amp_run("cpu", fused=True)


@pytest.mark.parametrize("fused", [True, False], ids=["fused_adamw", "foreach_adamw"])
def test_gpt_autocast_gradscaler_training_matches_cpu(eager, fused):
    losses, dtypes, scales = _gpt_amp_run("tpu", fused)
    ref_losses, ref_dtypes, ref_scales = _gpt_amp_cpu()
    assert dtypes == ref_dtypes == [(torch.bfloat16, torch.float32)] * 3
    assert scales == ref_scales
    for step, (a, b) in enumerate(zip(losses, ref_losses)):
        assert abs(a - b) <= 2e-2 * abs(b), f"step {step}: tpu {a} vs cpu {b}"


def _scaler_run(device: str, fused: bool):
    """Scales and weights after each of 5 steps; steps 2 and 3 get an inf and a
    NaN gradient, so they are skipped and the scale backs off."""
    torch.manual_seed(0)
    model = nn.Linear(8, 4).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=fused, foreach=not fused)
    scaler = torch.amp.GradScaler(device, init_scale=2.0**10, growth_interval=2)
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(1)).to(device)
    scales, weights = [], []
    for step in range(5):
        opt.zero_grad()
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = model(x).float().pow(2).mean()
        scaler.scale(loss).backward()
        if step == 2:
            model.weight.grad[0, 0] = float("inf")
        if step == 3:
            model.bias.grad[1] = float("nan")
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
        weights.append(torch.cat([model.weight.detach().flatten(), model.bias.detach()]).cpu())
    return scales, weights


@pytest.mark.parametrize("fused", [True, False], ids=["fused_adamw", "foreach_adamw"])
def test_grad_scaler_skips_non_finite_steps_as_cpu(eager, fused):
    scales, weights = _scaler_run("tpu", fused)
    ref_scales, ref_weights = _scaler_run("cpu", fused)
    assert scales == ref_scales == [1024.0, 2048.0, 1024.0, 512.0, 512.0]
    assert torch.equal(weights[2], weights[1]) and torch.equal(weights[3], weights[1])
    assert not torch.equal(weights[4], weights[3])
    for a, b in zip(weights, ref_weights):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_fused_eager_scaler_step_has_no_host_sync():
    # With a fused optimizer GradScaler hands grad_scale/found_inf to the step:
    # the check, the step and the scale update are recorded without a sync.
    torch.manual_seed(0)
    model = nn.Linear(8, 4).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    scaler = torch.amp.GradScaler("tpu")
    x = tpu(_r(16, 8))
    with torchtpu.eager_mode("fused"):
        for _ in range(2):
            opt.zero_grad()
            with torch.autocast("tpu"):
                loss = model(x).float().pow(2).mean()
            scaler.scale(loss).backward()
            before = torchtpu.metrics()["host_syncs"]
            scaler.step(opt)
            scaler.update()
            assert torchtpu.metrics()["host_syncs"] == before
        assert scaler.get_scale() == 2.0**16


# name -> (optimizer, hyperparameters); every one is run with fused=True.
OPTIMIZERS = {
    "adam": (torch.optim.Adam, {"lr": 1e-2}),
    "adam_wd_amsgrad_maximize": (
        torch.optim.Adam,
        {"lr": 1e-2, "weight_decay": 0.1, "amsgrad": True, "maximize": True},
    ),
    "adamw": (torch.optim.AdamW, {"lr": 1e-2, "weight_decay": 0.1}),
    "adamw_amsgrad": (torch.optim.AdamW, {"lr": 1e-2, "amsgrad": True}),
    "sgd": (torch.optim.SGD, {"lr": 1e-2}),
    "sgd_momentum_wd": (
        torch.optim.SGD,
        {"lr": 1e-2, "momentum": 0.9, "dampening": 0.1, "weight_decay": 0.1},
    ),
    "sgd_nesterov_maximize": (
        torch.optim.SGD,
        {"lr": 1e-2, "momentum": 0.9, "nesterov": True, "maximize": True},
    ),
    "adagrad": (torch.optim.Adagrad, {"lr": 1e-1, "lr_decay": 0.01, "weight_decay": 0.1}),
}


def _optim_run(device: str, cls, hyper: dict, steps: int = 4, **impl):
    """Parameters after each step (the learning rate changes at step 2, as a
    schedule would change it)."""
    gen = torch.Generator().manual_seed(0)
    params = [
        torch.randn(5, 3, generator=gen).to(device).requires_grad_(),
        torch.randn(7, generator=gen).to(device).requires_grad_(),
    ]
    opt = cls(params, **hyper, **impl)
    out = []
    for step in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen).to(device)
        if step == 2:
            for group in opt.param_groups:
                group["lr"] = group["lr"] * 0.5
        opt.step()
        out.append(torch.cat([p.detach().flatten() for p in params]).cpu())
    return out


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_fused_optimizer_matches_foreach_and_cpu(eager, name):
    cls, hyper = OPTIMIZERS[name]
    fused = _optim_run("tpu", cls, hyper, fused=True)
    foreach = _optim_run("tpu", cls, hyper, foreach=True)
    cpu = _optim_run("cpu", cls, hyper, fused=True)
    for f, e, c in zip(fused, foreach, cpu):
        torch.testing.assert_close(f, e, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(f, c, rtol=1e-6, atol=1e-7)


def test_fused_optimizer_tensor_lr_matches_capturable_foreach_and_cpu():
    hyper = {"weight_decay": 0.1}
    fused = _optim_run("tpu", torch.optim.AdamW, {**hyper, "lr": torch.tensor(1e-2)}, fused=True)
    lr = torch.tensor(1e-2, device="tpu")
    on_device = _optim_run("tpu", torch.optim.AdamW, {**hyper, "lr": lr}, fused=True)
    capturable = _optim_run(
        "tpu",
        torch.optim.AdamW,
        {**hyper, "lr": torch.tensor(1e-2, device="tpu")},
        foreach=True,
        capturable=True,
    )
    cpu = _optim_run("cpu", torch.optim.AdamW, {**hyper, "lr": torch.tensor(1e-2)}, fused=True)
    for f, d, e, c in zip(fused, on_device, capturable, cpu):
        torch.testing.assert_close(f, c, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(d, c, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(f, e, rtol=1e-5, atol=1e-6)


def test_fused_optimizer_schedule_never_recompiles():
    params = [torch.randn(5, 3, device="tpu", requires_grad=True)]
    opt = torch.optim.AdamW(params, lr=1e-2, fused=True)
    for step in range(4):
        params[0].grad = torch.ones(5, 3, device="tpu")
        opt.param_groups[0]["lr"] = 1e-2 / (step + 1)
        opt.param_groups[0]["betas"] = (0.9 - 0.01 * step, 0.999)
        if step == 2:
            before = torchtpu.metrics()["compiles"]
        opt.step()
    torch.tpu.synchronize()
    assert torchtpu.metrics()["compiles"] == before


# The fused steps called directly, with every list they write compared:
# params, grads (unscaled in place when grad_scale is given) and states.
# name -> (op, number of state lists, whether it takes state_steps, attributes)
_ADAM = {"beta1": 0.9, "beta2": 0.99, "weight_decay": 0.1, "eps": 1e-8, "amsgrad": True,
         "maximize": False}  # fmt: skip
RAW_STEPS = {
    "adam": (torch._fused_adam_, 3, True, _ADAM),
    "adamw": (torch._fused_adamw_, 3, True, _ADAM),
    "sgd": (
        torch._fused_sgd_,
        1,
        False,
        {
            "weight_decay": 0.1,
            "momentum": 0.9,
            "dampening": 0.0,
            "nesterov": False,
            "maximize": False,
            "is_first_step": False,
        },
    ),
    "adagrad": (
        torch._fused_adagrad_,
        1,
        True,
        {"lr_decay": 0.01, "weight_decay": 0.1, "eps": 1e-10, "maximize": True},
    ),
}


def _raw_step(name, device, tensors, lr_kind, scale, found):
    op, _, with_steps, attrs = RAW_STEPS[name]
    params, grads, states, steps = ([t.clone().to(device) for t in lst] for lst in tensors)
    n = len(params)
    lists = [params, grads] + [states[k * n : (k + 1) * n] for k in range(len(states) // n)]
    if with_steps:
        lists.append(steps)
    kw = dict(attrs, lr=0.01 if lr_kind == "float" else torch.tensor(0.01, device=device))
    if scale is not None:
        kw["grad_scale"] = torch.tensor(scale, device=device)
        kw["found_inf"] = torch.tensor(found, device=device)
    op(*lists, **kw)
    return [t.cpu() for t in params + grads + states]


@pytest.mark.parametrize("name", list(RAW_STEPS))
def test_fused_step_grad_scale_found_inf_and_tensor_lr_as_cpu(eager, name):
    n_states = RAW_STEPS[name][1]
    gen = torch.Generator().manual_seed(0)
    shapes = [(4, 3), (6,)]
    params = [torch.randn(s, generator=gen) for s in shapes]
    grads = [torch.randn(s, generator=gen) * 8 for s in shapes]
    states = [torch.rand(s, generator=gen) for _ in range(n_states) for s in shapes]
    steps = [torch.tensor(3.0) for _ in shapes]
    tensors = (params, grads, states, steps)
    for lr_kind in ("float", "tensor"):
        for scale, found in [(None, None), (8.0, 0.0), (8.0, 1.0)]:
            out = _raw_step(name, "tpu", tensors, lr_kind, scale, found)
            ref = _raw_step(name, "cpu", tensors, lr_kind, scale, found)
            for a, b in zip(out, ref):
                torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
            if found == 1.0:
                assert all(torch.equal(a, b) for a, b in zip(out, params + grads + states))


def test_float32_dots_follow_torch_precision_settings(tmp_path):
    # As on PyTorch's CUDA: float32 matmuls are IEEE float32 unless a setting allows
    # TF32 (XLA:GPU takes a dot's DEFAULT precision as TF32), convolutions allow TF32
    # until cudnn says otherwise; the older and the newer API alike, mixed too. A
    # change of setting reaches the programs built after it.
    r = run_py(
        """
        import torch, torchtpu
        a = torch.randn(8, 8, device="tpu")
        x, w = torch.randn(1, 2, 5, 5, device="tpu"), torch.randn(3, 2, 3, 3, device="tpu")

        def step():
            ((a @ a).sum() + torch.nn.functional.conv2d(x, w).sum()).cpu()

        with torchtpu.eager_mode("fused"):
            step()
            torch.set_float32_matmul_precision("high")
            torch.backends.cudnn.allow_tf32 = False
            step()
            torch.set_float32_matmul_precision("highest")
            step()
            torch.backends.cuda.matmul.fp32_precision = "tf32"
            torch.backends.cudnn.conv.fp32_precision = "tf32"
            step()
            (a.bfloat16() @ a.bfloat16()).cpu()
        """,
        env={"TORCHTPU_DUMP_FUSED": str(tmp_path), "TORCHTPU_CACHE_DIR": "off"},
    )
    assert r.returncode == 0, r.stderr
    dumps = sorted(tmp_path.glob("fused_*.mlir"), key=lambda f: int(f.stem.split("_")[1]))
    texts = [f.read_text() for f in dumps]

    def precisions(text, op):
        return [
            ln.split("precision_config = [#stablehlo<precision ")[1].split(">")[0]
            for ln in text.splitlines()
            if f"stablehlo.{op}" in ln
        ]

    got = [(precisions(t, "dot_general"), precisions(t, "convolution")) for t in texts]
    assert got == [
        (["HIGHEST"], ["DEFAULT"]),
        (["DEFAULT"], ["HIGHEST"]),
        (["HIGHEST"], ["HIGHEST"]),
        (["DEFAULT"], ["DEFAULT"]),
        (["DEFAULT"], []),  # bfloat16: nothing to round more
    ], got
