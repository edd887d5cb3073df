"""Fused Eager: ops are recorded and run as one program at cut points."""

from __future__ import annotations

import os
import re
import sys

import pytest
import torch
import torch.nn.functional as F
import torchtpu
from conftest import assert_tpu_close, check_py

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
from models import GPT, MLP, copy_task_batch


def _delta(before: dict, key: str) -> int:
    return torchtpu.metrics()[key] - before[key]


def _cuts() -> dict:
    return dict(torchtpu.metrics()["fused_cuts"])


def _cut_delta(before: dict, reason: str) -> int:
    return _cuts().get(reason, 0) - before.get(reason, 0)


@pytest.fixture
def fused():
    with torchtpu.eager_mode("fused"):
        yield


# --- mode selection


@pytest.mark.parametrize(
    "env", [{"TORCHTPU_EAGER": "fused"}, {"TORCH_TPU_DEFER_AND_FUSE": "1"}], ids=["eager", "tpu"]
)
def test_env_selects_fused(env):
    proc = check_py(
        """
        import torch, torchtpu
        assert torchtpu.get_eager_mode() == "fused", torchtpu.get_eager_mode()
        x = torch.arange(4.0, device="tpu")
        y = (x * 2 + 1).sum()
        assert torchtpu.metrics()["executions"] == 0  # recorded, not run
        print(y.item())
        """,
        env=env,
    )
    assert proc.stdout.strip() == "16.0"


def test_context_manager_is_thread_local_and_nests():
    assert torchtpu.get_eager_mode() == "strict"
    with torchtpu.eager_mode("fused"):
        assert torchtpu.get_eager_mode() == "fused"
        with torchtpu.eager_mode("debug"):
            assert torchtpu.get_eager_mode() == "debug"
        assert torchtpu.get_eager_mode() == "fused"
        seen = []
        import threading

        t = threading.Thread(target=lambda: seen.append(torchtpu.get_eager_mode()))
        t.start()
        t.join()
        assert seen == ["strict"]  # another thread follows the global mode
    assert torchtpu.get_eager_mode() == "strict"
    torchtpu.eager_mode("fused")  # global setter
    try:
        assert torchtpu.get_eager_mode() == "fused"
    finally:
        torchtpu.eager_mode("strict")


def test_backward_inside_context_is_recorded(fused):
    w = torch.randn(8, 8, device="tpu", requires_grad=True)
    x = torch.randn(4, 8, device="tpu")
    before = torchtpu.metrics()
    loss = (x @ w).tanh().sum()
    loss.backward()  # runs on autograd's device thread
    assert _delta(before, "executions") == 0
    assert _delta(before, "fused_ops") > 4
    wc, xc = w.detach().cpu().requires_grad_(), x.cpu()
    (xc @ wc).tanh().sum().backward()
    assert_tpu_close(w.grad, wc.grad)


# --- deferred recording


def test_metadata_is_immediate_and_nothing_runs(fused):
    x = torch.randn(3, 5, device="tpu")
    before = torchtpu.metrics()
    y = x.t() @ x
    z = y.to(torch.bfloat16).unsqueeze(0).expand(2, 5, 5)
    assert z.shape == (2, 5, 5) and z.dtype == torch.bfloat16
    assert z.stride() == (0, 5, 1)
    assert _delta(before, "executions") == 0
    xc = x.cpu()
    assert_tpu_close(z, (xc.t() @ xc).bfloat16().unsqueeze(0).expand(2, 5, 5))


def test_views_and_inplace_inside_a_graph(fused):
    base = torch.zeros(4, 6, device="tpu")
    ref = torch.zeros(4, 6)
    aliases = []
    for t in (base, ref):
        v = t[1:, ::2]
        v.add_(1)
        t.t()[2].mul_(3).add_(2)
        t.view(24)[5:9].fill_(-1)
        aliases.append(t.diagonal())
        aliases[-1].sub_(0.5)
    assert_tpu_close(base, ref)
    assert_tpu_close(aliases[0], aliases[1])


def test_copies_between_devices_and_dtypes(fused):
    a = torch.randn(5, 3, device="tpu")
    a0 = a.cpu()
    b = torch.empty(5, 3, dtype=torch.float64, device="tpu")
    b.copy_(a * 2)  # device -> device copy is recorded
    h = torch.arange(15.0).view(5, 3)
    a.copy_(h)  # host -> device into a storage the graph uses
    assert_tpu_close(a + b.float(), h + 2 * a0)


def test_unreachable_values_are_not_outputs(fused):
    x = torch.randn(64, device="tpu")
    torchtpu.flush()
    before = torchtpu.metrics()
    y = x * 2
    z = y + 1
    w = (z * z).sum()
    del y, z
    torchtpu.flush()
    assert _delta(before, "fused_graphs") == 1
    assert _delta(before, "fused_outputs") == 1  # only w
    assert_tpu_close(w, ((x.cpu() * 2 + 1) ** 2).sum())


# --- cut points


def test_cut_reasons(fused):
    x = torch.randn(8, device="tpu")
    cuts = _cuts()
    (x + 1).sum().item()
    assert _cut_delta(cuts, "item") == 1
    (x * 2).cpu()
    assert _cut_delta(cuts, "to_cpu") == 1
    y = x * 3
    assert bool((y > -100).all())
    assert _cut_delta(cuts, "item") == 2
    y = x - 1
    text = repr(y)  # printing reads the values
    assert "tpu" in text and _cut_delta(cuts, "to_cpu") >= 2
    y = x[(x * 2) > 0]  # nonzero: the output size depends on values
    assert _cut_delta(cuts, "data_dependent") >= 1
    assert_tpu_close(y, x.cpu()[x.cpu() > 0])
    y = x.exp()
    with torchtpu.eager_mode("strict"):
        pass
    assert _cut_delta(cuts, "mode_switch") == 1
    y = x.sin()
    torch.tpu.synchronize()
    assert _cut_delta(cuts, "synchronize") == 1
    y = x.cos()
    torchtpu.flush()
    assert _cut_delta(cuts, "user") == 1
    assert_tpu_close(y, x.cpu().cos())


def test_a_read_runs_the_calls_it_needs_first(fused):
    x = torch.randn(16, device="tpu")
    w = torch.ones(16, device="tpu")
    before, cuts = torchtpu.metrics(), _cuts()
    t = x * 3
    c = w * 5  # reads w before the needed part writes it: must run first
    for _ in range(130):  # the rest: enough calls to be worth a second program
        c = c + 1
    r = t * 2  # reads t, which the needed part makes and then drops
    w.add_(x)
    loss = (w * t).sum()
    del t
    assert loss.item() == pytest.approx(((1 + x.cpu()) * 3 * x.cpu()).sum().item(), rel=1e-5)
    assert _delta(before, "fused_graphs") == 2
    assert _cut_delta(cuts, "item+rest") == 1
    assert_tpu_close(c, torch.full((16,), 135.0))
    assert_tpu_close(r, x.cpu() * 6)
    assert_tpu_close(w, 1 + x.cpu())
    # A read that needs (nearly) everything is one program, and so is a small rest.
    before = torchtpu.metrics()
    (x + 1).sum().item()
    v = x * 2
    for _ in range(20):
        v = v + 1
    (x - 1).sum().item()
    assert _delta(before, "fused_graphs") == 2
    assert_tpu_close(v, x.cpu() * 2 + 20)


@pytest.mark.parametrize("stats", [False, True], ids=["prefix", "unneeded_calls_among"])
def test_a_read_seen_before_runs_ahead(fused, stats):
    # Without `stats` the read needs exactly the graph's first calls, and 70 calls
    # follow (a split). With them, as a forward with batch norm: running-statistics
    # updates are recorded among the calls the loss needs but are not needed; the cut
    # goes after the last needed call and runs them too. 20 calls follow: too few
    # for a split, enough to run ahead.
    x = torch.randn(16, device="tpu")
    c = torch.zeros(16, device="tpu")
    stat = torch.zeros(16, device="tpu")
    rest = 20 if stats else 70
    torchtpu.flush()
    cuts, ran_before_read = _cuts(), []
    for step in range(4):
        graphs = torchtpu.metrics()["fused_graphs"]
        h = x * (step + 1)
        if stats:
            stat.mul_(0.9).add_(h, alpha=0.1)  # not needed by the read
        loss = h.sum()
        for _ in range(rest):  # not needed by the read
            c = c + 1
        ran_before_read.append(torchtpu.metrics()["fused_graphs"] - graphs)
        assert loss.item() == pytest.approx(x.cpu().sum().item() * (step + 1), rel=1e-5, abs=1e-5)
    # Learned at the first read; from then on the needed calls run as soon as they
    # are recorded, and the read ends the graph of the others.
    assert ran_before_read == [0, 1, 1, 1]
    assert _cut_delta(cuts, "read_ahead") == 3
    assert _cut_delta(cuts, "item") == 4
    assert_tpu_close(c, torch.full((16,), 4.0 * rest))
    expect = torch.zeros(16)
    for step in range(4 if stats else 0):
        expect = expect * 0.9 + x.cpu() * (step + 1) * 0.1
    assert_tpu_close(stat, expect)


def test_cut_at_size_cap_and_cpu_fallback():
    check_py(
        """
        import torch, torchtpu
        x = torch.randn(4, device="tpu")
        y = x
        for _ in range(25):
            y = y * 1.01 + 0.1
        cuts = torchtpu.metrics()["fused_cuts"]
        assert cuts.get("size_cap") == 2, cuts
        exp = x.cpu()
        for _ in range(25):
            exp = exp * 1.01 + 0.1
        torch.testing.assert_close(y.cpu(), exp)
        # An op without a lowering reads its inputs on the host: a cut.
        m = torch.stack([x, x * 0, x]) * 2
        u = torch.unique(m, dim=0)
        assert torchtpu.metrics()["fused_cuts"].get("cpu_fallback") == 1
        torch.testing.assert_close(u.cpu(), torch.unique(m.cpu(), dim=0))
        """,
        env={
            "TORCHTPU_EAGER": "fused",
            "TORCHTPU_FUSED_MAX_OPS": "20",
            "TORCHTPU_CPU_FALLBACK": "1",
        },
    )


def test_loop_without_syncs_is_cut_per_iteration(fused):
    torch.manual_seed(0)
    model = MLP().to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    gen = torch.Generator().manual_seed(0)
    data = [(torch.randn(16, 32, generator=gen), torch.randint(0, 10, (16,), generator=gen))]
    losses = []
    compiles = []
    for _ in range(14):
        x, y = (t.to("tpu") for t in data[0])
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
        compiles.append(torchtpu.metrics()["compiles"])
    cuts = _cuts()
    assert cuts.get("loop_detected", 0) >= 1
    assert cuts.get("loop_boundary", 0) >= 5
    assert compiles[-1] == compiles[-6], "steady-state steps compiled"
    torch.manual_seed(0)
    ref = MLP()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for i in range(14):
        ref_opt.zero_grad(set_to_none=True)
        ref_loss = F.cross_entropy(ref(data[0][0]), data[0][1])
        ref_loss.backward()
        ref_opt.step()
        assert abs(losses[i].item() - ref_loss.item()) <= 1e-4 * abs(ref_loss.item())


# --- memory


def test_inplace_updates_donate_their_buffers(fused):
    p = torch.randn(1000, device="tpu")
    torchtpu.flush()
    before = torchtpu.metrics()
    for _ in range(3):
        p.mul_(0.5).add_(1.0)
        torchtpu.flush()
    assert _delta(before, "donated_bytes") == 3 * 1000 * 4
    q = p  # a second holder of the same storage does not block donation
    keep = p.detach().clone()
    before = torchtpu.metrics()
    q.add_(1.0)
    torchtpu.flush()
    assert _delta(before, "donated_bytes") == 4000
    assert_tpu_close(p, keep.cpu() + 1)


def test_training_step_donates_parameters_and_state(fused):
    torch.manual_seed(0)
    model = MLP().to("tpu")
    nbytes = sum(p.numel() * 4 for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(8, 32, device="tpu"), torch.randint(0, 10, (8,), device="tpu")
    for step in range(3):
        before = torchtpu.metrics()
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()
        torchtpu.flush()
        if step > 0:  # parameters, exp_avg and exp_avg_sq are updated in place
            assert _delta(before, "donated_bytes") >= 3 * nbytes


# --- values that change every step


def test_changing_learning_rate_does_not_recompile(fused):
    torch.manual_seed(0)
    model = MLP().to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    x, y = torch.randn(8, 32, device="tpu"), torch.randint(0, 10, (8,), device="tpu")
    for step in range(6):
        if step == 3:
            compiles = torchtpu.metrics()["compiles"]
            hits = torchtpu.metrics()["fused_cache_hits"]
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        sched.step()
        loss.item()
    assert torchtpu.metrics()["compiles"] == compiles
    # Two programs per step: the forward (run ahead of loss.item()), then the rest.
    assert torchtpu.metrics()["fused_cache_hits"] - hits == 6


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_python_numbers_travel_packed_and_are_read_at_the_call(mode):
    x = torch.randn(64, device="tpu")
    a = torch.tensor(2.0)  # a 0-dim CPU tensor: read when the op is called

    def chain(s):
        y = x
        for k in range(40):
            y = y * (1.0 + k / 1000) + s - 0.25
        return y * a

    def want(s):
        y = x.cpu()
        for k in range(40):
            y = y * (1.0 + k / 1000) + s - 0.25
        return y * 2.0

    with torchtpu.eager_mode(mode):
        chain(0.5).cpu()  # warm-up: compile, upload the scalar packs once
        before = torchtpu.metrics()
        out = chain(0.5)
        a.fill_(3.0)  # after the call: must not change the recorded value
        got = out.cpu()
        a.fill_(2.0)
        # Same numbers again: the packed scalar buffers are reused (none uploaded).
        assert _delta(before, "bytes_to_device") == 0
        assert_tpu_close(chain(0.75), want(0.75))  # new numbers, same program
    torch.testing.assert_close(got, want(0.5))
    assert _delta(before, "compiles") == 0


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_fresh_out_tensors_do_not_rerun_the_meta_kernel(mode):
    # torch.arange(n) fills a fresh empty out= tensor each call; its size is known
    # from the first call with the same arguments (its meta kernel is Python).
    with torchtpu.eager_mode(mode):
        torch.arange(7, device="tpu")
        before = torchtpu.metrics()
        for _ in range(5):
            got = torch.arange(7, device="tpu")
        assert _delta(before, "meta_calls") == 0
        assert torch.arange(2, 9, 3, device="tpu").tolist() == [2, 5, 8]
        assert _delta(before, "meta_calls") >= 1
    assert got.tolist() == list(range(7))


# --- errors


def test_errors_are_raised_at_the_recording_call(fused):
    x = torch.randn(3, 4, device="tpu")
    with pytest.raises(RuntimeError, match="size mismatch|shapes cannot be multiplied"):
        torch.mm(x, x)
    with pytest.raises(NotImplementedError, match="aten::unique_dim"):
        torch.unique(x, dim=0)
    assert_tpu_close(x * 2, x.cpu() * 2)


def test_debug_fusion_logs_each_materialization():
    proc = check_py(
        """
        import torch, torchtpu
        x = torch.randn(4, device="tpu")
        (x.sin() + 1).sum().item()
        """,
        env={"TORCHTPU_EAGER": "fused", "TORCHTPU_DEBUG_FUSION": "1"},
    )
    # randn, sin, add, sum; each op names the Python line that recorded it
    assert "[tpu fused] cut=item ops=4" in proc.stderr, proc.stderr
    assert "compiled" in proc.stderr
    assert "aten::normal_ (recorded at <string>:3)" in proc.stderr, proc.stderr
    assert "aten::sum.IntList_out (recorded at <string>:4)" in proc.stderr, proc.stderr


# --- training


@pytest.mark.parametrize("name", ["MLP", "GPT"])
def test_training_after_warmup_compiles_nothing(name, fused):
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    if name == "GPT":
        model = GPT().to("tpu")
        batches = [copy_task_batch(gen, 4, 32, 64) for _ in range(4)]
    else:
        model = MLP().to("tpu")
        batches = [
            (torch.randn(16, 32, generator=gen), torch.randint(0, 10, (16,), generator=gen))
            for _ in range(4)
        ]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    ran_before_item = []
    for step in range(22):
        if step == 2:
            before, cuts = torchtpu.metrics(), _cuts()
        x, y = (t.to("tpu") for t in batches[step % 4])
        graphs = torchtpu.metrics()["fused_graphs"]
        opt.zero_grad(set_to_none=True)
        loss = model(x, y) if name == "GPT" else F.cross_entropy(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        ran_before_item.append(torchtpu.metrics()["fused_graphs"] - graphs)
        loss.item()
    assert _delta(before, "compiles") == 0
    # Every call's output metadata comes from a call seen before: no meta kernel runs.
    assert _delta(before, "meta_calls") == 0
    # A step is two programs: the forward that loss.item() needs, then backward
    # and optimizer. From the second step on, the forward runs as soon as it is
    # recorded, before loss.item().
    assert _delta(before, "fused_graphs") == 2 * 20
    assert _delta(before, "fused_cache_hits") == 2 * 20
    assert _cut_delta(cuts, "read_ahead") == 20
    assert ran_before_item[1:] == [1] * 21


# --- program shape


@pytest.mark.parametrize("op", ["embedding", "index_put", "index_add"])
def test_row_scatters_use_one_index_per_row(fused, op, tmp_path, monkeypatch):
    """Gradients of embeddings and row writes scatter whole rows: an index per row, the row
    a window. An index per element made XLA:CPU loop over every scalar."""
    monkeypatch.setenv("TORCHTPU_DUMP_FUSED", str(tmp_path))
    idx = torch.tensor([[3, 5, 3], [0, 36, 5]])
    src = torch.randn(2, 3, 11)

    def run(dev):
        w = torch.zeros(37, 11, device=dev)
        i, s = idx.to(dev), src.to(dev)
        if op == "embedding":
            w.requires_grad_(True)
            (F.embedding(i, w) * s).sum().backward()
            return w.grad
        if op == "index_put":
            return w.index_put_((i,), s, accumulate=True)
        return w.index_add_(0, i.flatten(), s.reshape(6, 11))

    assert_tpu_close(run("tpu"), run("cpu"))
    text = "".join(p.read_text() for p in tmp_path.glob("*.mlir"))
    scatters = re.findall(r"#stablehlo\.scatter<[^>]*>", text)
    assert scatters, text
    for dims in scatters:
        assert "update_window_dims = [1]" in dims, dims
