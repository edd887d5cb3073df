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

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


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


def test_compiled_calls_leave_the_global_mode_alone(monkeypatch):
    """A compiled graph runs in Fused Eager for its own thread only: it used to set the
    global mode and undo it on every call, racing with other threads (thread ranks)."""
    fn = torch.compile(lambda x: (x.sin() * 2).sum(), backend="tpu")
    x = torch.randn(5, device="tpu")
    calls = []
    monkeypatch.setattr(torchtpu._C, "set_mode", calls.append)
    got = fn(x)  # compiles, and runs the graph through Fused Eager once
    assert calls == [], calls
    assert_tpu_close(got, (x.cpu().sin() * 2).sum())


def _raised_by_backend(fn, *args) -> BaseException:
    """The backend's own exception (Dynamo wraps it in BackendCompilerFailed)."""
    with pytest.raises(Exception) as info:
        fn(*args)
    return getattr(info.value, "inner_exception", info.value)


def test_unknown_option_raises():
    x = torch.randn(3, device="tpu")
    err = _raised_by_backend(torch.compile(torch.sin, backend="tpu", options={"fast": 1}), x)
    assert isinstance(err, ValueError) and "unknown options ['fast']" in str(err)
    err = _raised_by_backend(torch.compile(torch.cos, backend="tpu", options={"buckets": [8]}), x)
    assert isinstance(err, ValueError) and "needs bounded_dynamism" in str(err)


def test_recompile_is_reported_with_its_cause():
    fn = torch.compile(lambda x: x.sin() * 2, backend="tpu")
    torchtpu.compile_report(clear=True)
    fn(torch.randn(2, 5, device="tpu"))
    fn(torch.randn(2, 7, device="tpu"))
    events = torchtpu.compile_report()
    recompiles = [e for e in events if e["event"] == "recompile"]
    assert len(recompiles) == 1
    assert "size mismatch at index 1. expected 5, actual 7" in recompiles[0]["reason"]
    programs = [e["reason"] for e in events if e["event"] == "program"]
    assert programs[0] == "static sizes" and programs[1].endswith("=7 (exact sizes)")


class _SeqPool(torch.nn.Module):
    """Per-position layers, then values mixed along the sequence (dim 1): masked
    mean/max/var, a contraction over it and a softmax along it."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(8, 16)
        self.out = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor):
        h = F.gelu(self.inp(x))
        gram = h.transpose(1, 2) @ h
        pooled = h.mean(1) + h.amax(1) + h.var(1, correction=0) + gram.mean(-1)
        return self.out(pooled), h.softmax(1)


def _bounded(model, **extra):
    return torch.compile(model, backend="tpu", options={"bounded_dynamism": True, **extra})


def _buckets_used(graph_kind: str = "inference") -> list[int]:
    out = []
    for e in torchtpu.compile_report():
        kind = e["graph"].endswith(graph_kind)
        if e["event"] == "program" and kind and e["reason"].startswith("new bucket"):
            out.append(int(e["reason"].split("=")[1].split()[0]))
    return out


def _seq_pool_pair():
    """A CPU reference _SeqPool and a tpu copy with the same weights."""
    torch.manual_seed(0)
    ref = _SeqPool()
    m = _SeqPool().to("tpu")
    m.load_state_dict(ref.state_dict())
    return ref, m


def test_bounded_dynamism_lengths_1_to_512_compile_10_programs():
    ref, m = _seq_pool_pair()
    m = _bounded(m)
    gen = torch.Generator().manual_seed(0)
    torchtpu.compile_report(clear=True)
    before = torchtpu.metrics()["compiles"]
    outs = {}
    with torch.no_grad():
        for n in range(1, 513):
            x = torch.randn(1, n, 8, generator=gen)
            got = m(x.to("tpu"))
            if n in (1, 2, 3, 5, 17, 100, 257, 500, 512):
                outs[n] = (x, got)
    # Size 1 is its own (static) graph: Dynamo specializes it; then one program per
    # power-of-two bucket, keyed by the bucket size, not the length.
    assert torchtpu.metrics()["compiles"] - before <= 10
    assert _buckets_used() == [2, 4, 8, 16, 32, 64, 128, 256, 512]
    with torch.no_grad():
        for n, (x, got) in outs.items():
            want = ref(x)
            assert got[1].shape == want[1].shape == (1, n, 16)
            for g, w in zip(got, want):
                torch.testing.assert_close(g.cpu(), w, rtol=1e-4, atol=1e-5, equal_nan=True)


def test_bounded_dynamism_masked_reductions_backward():
    ref, m = _seq_pool_pair()
    cm = _bounded(m)
    torchtpu.compile_report(clear=True)
    for n in (3, 5, 7):
        x = torch.randn(2, n, 8)
        xt = x.to("tpu").requires_grad_()
        x.requires_grad_()
        out, probs = cm(xt)
        want_out, want_probs = ref(x)
        # The mean's backward divides by the length: the real one, not the bucket.
        (out.square().sum() + probs[:, :, 0].sum()).backward()
        (want_out.square().sum() + want_probs[:, :, 0].sum()).backward()
        assert_tpu_close(xt.grad, x.grad, rtol=1e-4, atol=1e-5)
        for p, q in zip(m.parameters(), ref.parameters()):
            assert_tpu_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
            p.grad, q.grad = None, None
    assert _buckets_used("forward") == [8] and _buckets_used("backward") == [8]
    assert not [e for e in torchtpu.compile_report() if e["event"] == "fallback"]


def test_bounded_dynamism_flattened_output_backward():
    def fn(x, w):
        h = (x @ w).tanh()
        return h.reshape(-1, 4)  # [2*n, 4]: the padded rows interleave

    w = torch.randn(8, 4)
    cf = _bounded(fn)
    torchtpu.compile_report(clear=True)
    for n in (3, 5, 6):
        x = torch.randn(2, n, 8, requires_grad=True)
        wc = w.clone().requires_grad_()
        xt, wt = (t.detach().to("tpu").requires_grad_() for t in (x, w))
        got, want = cf(xt, wt), fn(x, wc)
        assert_tpu_close(got, want.detach())
        g = torch.randn_like(want)  # a tangent with the flattened layout
        got.backward(g.to("tpu"))
        want.backward(g)
        assert_tpu_close(xt.grad, x.grad, rtol=1e-4, atol=1e-5)
        assert_tpu_close(wt.grad, wc.grad, rtol=1e-4, atol=1e-5)
    assert _buckets_used("backward") == [8]


def test_bounded_dynamism_user_buckets_and_exact_fallbacks():
    def fn(x):
        return x.softmax(1).cumsum(1).sum(1), x.sort(dim=1).values

    def pooled(x):
        return x.softmax(1).cumsum(1).sum(1)

    torchtpu.compile_report(clear=True)
    cf = _bounded(pooled, buckets=[4, 16])
    sorted_fn = _bounded(fn)
    for n in (3, 5, 12, 20):
        x = torch.randn(2, n)
        xt = x.to("tpu")
        if n == 3:
            torch._dynamo.mark_dynamic(xt, 1)  # symbolic from the first call
        assert_tpu_close(cf(xt), pooled(x))
        got = sorted_fn(xt)
        for g, w in zip(got, fn(x)):
            assert_tpu_close(g, w)
    reasons = [e["reason"] for e in torchtpu.compile_report() if e["event"] != "recompile"]
    assert _buckets_used() == [4, 16]  # 3 -> 4; 5 and 12 -> 16
    assert any("above the largest bucket" in r for r in reasons)
    fallbacks = [r for r in reasons if r.startswith("runs at exact sizes")]
    assert len(fallbacks) == 1 and "aten.sort.default" in fallbacks[0]


def test_bounded_dynamism_size_used_as_a_value_is_the_real_size():
    def fn(x):
        return x.sum(1) / x.shape[1] + torch.full((1,), x.shape[1] * 0.5, device=x.device)

    cf = _bounded(fn)
    torchtpu.compile_report(clear=True)
    for n in (3, 5, 6):
        x = torch.randn(2, n)
        assert_tpu_close(cf(x.to("tpu")), fn(x))
    assert _buckets_used() == [8]


def test_bounded_dynamism_gpt_matches_cpu():
    torch.manual_seed(0)
    ref = GPT(layers=1)
    model = GPT(layers=1).to("tpu")
    model.load_state_dict(ref.state_dict())
    cm = _bounded(model)
    gen = torch.Generator().manual_seed(0)
    torchtpu.compile_report(clear=True)
    for n in (12, 9):  # one bucket: the second length compiles nothing
        x, y = (t.to("tpu") for t in copy_task_batch(gen, 2, n, 64))
        if n == 12:  # symbolic from the first call (else Dynamo traces it static first)
            torch._dynamo.mark_dynamic(x, 1)
            torch._dynamo.mark_dynamic(y, 1)
        model.zero_grad(set_to_none=True)
        ref.zero_grad(set_to_none=True)
        before = torchtpu.metrics()["compiles"]
        loss = cm(x, y)
        loss.backward()
        want = ref(x.cpu(), y.cpu())
        want.backward()
        assert _rel([loss.item()], [want.item()]) <= 1e-4
        for p, q in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-4, atol=1e-6)
        assert (torchtpu.metrics()["compiles"] == before) == (n == 9)
    assert _buckets_used("forward") == [16] and _buckets_used("backward") == [16]
    with torch.no_grad():
        for n in (3, 4):  # one bucket: the program is reused
            x, _ = copy_task_batch(gen, 2, n, 64)
            assert_tpu_close(cm(x.to("tpu")), ref(x), rtol=1e-4, atol=1e-5)
    assert _buckets_used() == [4]
    assert not [e for e in torchtpu.compile_report() if e["event"] == "fallback"]


def test_second_process_compiles_nothing(tmp_path):
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
    env = {"TORCHTPU_CACHE_DIR": str(tmp_path)}  # empty: earlier tests share the session's
    first = check_py(code, env).stdout.split()
    second = check_py(code, env).stdout.split()
    assert int(first[-2]) > 0 and int(first[-1]) == 2  # forward and backward graphs
    assert int(second[-2]) == 0 and int(second[-1]) == 2


def test_cpu_tensors_train_like_cpu_eager():
    # A graph of CPU tensors keeps PyTorch's ops: with the tpu decompositions a GPT's
    # loss drifted from step 1 on (a core decomposition of CPU attention's backward).
    def run(compiled: bool) -> list[float]:
        torch.manual_seed(0)
        model = GPT()
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        f = torch.compile(model, backend="tpu") if compiled else model
        losses = []
        for x, y in _gpt_batches() * 2:
            opt.zero_grad()
            loss = f(x, y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    assert _rel(run(True), run(False)) <= 1e-5


def test_complex_rope_and_fft_compiled():
    """Complex RoPE (polar, view_as_complex, complex mul) and FFTs under compile."""
    from test_complex import _train

    ref, _ = _train("cpu", steps=3)
    got, _ = _train("tpu", steps=3, compiled=True)
    assert _rel(got, ref) <= 1e-5, (got, ref)
    x = torch.randn(4, 16)
    fn = torch.compile(lambda t: torch.fft.rfft2(t).abs().sum(), backend="tpu")
    dx = x.to("tpu").requires_grad_()
    cx = x.clone().requires_grad_()
    out, ref_out = fn(dx), torch.fft.rfft2(cx).abs().sum()
    out.backward()
    ref_out.backward()
    assert_tpu_close(out, ref_out.detach(), rtol=1e-5, atol=1e-4)
    assert_tpu_close(dx.grad, cx.grad, rtol=1e-4, atol=1e-4)


def test_backend_named_without_installed_entry_point():
    # A source tree on PYTHONPATH (bench/device.sh) has no distribution and so no
    # entry point: importing torchtpu still names the backend to Dynamo.
    check_py(
        """
        import importlib.metadata as md

        real = md.distribution

        def distribution(name):
            if name == "torchtpu":
                raise md.PackageNotFoundError(name)
            return real(name)

        md.distribution = distribution
        md.entry_points = lambda **kw: md.EntryPoints([])
        import torch, torchtpu

        fn = torch.compile(lambda x: (x * 2).sin(), backend="tpu")
        x = torch.randn(5)
        torch.testing.assert_close(fn(x.to("tpu")).cpu(), (x * 2).sin())
        fn2 = torch.compile(lambda x: x + 1, backend="torchtpu")
        torch.testing.assert_close(fn2(x.to("tpu")).cpu(), x + 1)
        """
    )
