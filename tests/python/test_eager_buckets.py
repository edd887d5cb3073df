"""Bucketed eager calls (bucketed.h): ops whose sizes keep changing from call to
call run at bucket sizes with the real sizes as runtime values.

A growing KV cache (cat, the attention matmuls, softmax), reductions and
pointwise ops along a growing dim, and their backward ops must match the CPU
and stop compiling a program per length; TORCHTPU_EAGER_BUCKETS=0 turns it off.
The rest of the suite runs with it off (harness.OP_TEST_ENV): the lowerings at
exact sizes are what it tests.
"""

from __future__ import annotations

import threading

import pytest
import torch
import torch.nn.functional as F
import torchtpu
from conftest import F32_TOL, run_py


@pytest.fixture
def buckets(monkeypatch):
    monkeypatch.setenv("TORCHTPU_EAGER_BUCKETS", "1")


def programs() -> int:
    return sum(torchtpu.metrics()["programs_by_op"].values())


def bucketed() -> int:
    return torchtpu.metrics()["bucketed_calls"]


def attention_loop(dev, steps, seed, per_step=None):
    """A decoder's KV cache growing by one position per step."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(1, 4, 5, 16, generator=g).to(dev)
    v = torch.randn(1, 4, 5, 16, generator=g).to(dev)
    outs = []
    for _ in range(steps):
        q, kn, vn = (torch.randn(1, 4, 1, 16, generator=g).to(dev) for _ in range(3))
        k = torch.cat([k, kn], dim=2)
        v = torch.cat([v, vn], dim=2)
        w = torch.softmax(q @ k.transpose(2, 3) * 0.25, dim=-1)
        outs.append((w @ v).cpu())  # a read per step, as generate's stopping test
        if per_step is not None:
            per_step.append(programs())
    return torch.stack(outs), k.cpu(), v.cpu()


@pytest.mark.parametrize("eager", ["strict", "debug", "fused"], indirect=True)
def test_growing_kv_cache_stops_compiling_and_matches_cpu(eager, buckets):
    ref, ref_k, ref_v = attention_loop("cpu", 40, seed=1)
    per_step: list[int] = []
    b0 = bucketed()
    out, k, v = attention_loop("tpu", 40, seed=1, per_step=per_step)
    torch.testing.assert_close(out, ref, **F32_TOL)
    assert torch.equal(k, ref_k) and torch.equal(v, ref_v)  # cat moves values exactly
    assert bucketed() - b0 > 100
    # Lengths 6..45: after the first steps only the bucket boundaries (16, 32)
    # compile, a few programs each; exact sizes would compile 4 per step.
    assert per_step[-1] - per_step[5] <= 16, per_step
    assert per_step[-1] - per_step[-8] == 0, per_step


def sdpa_decode(dev, steps, mask):
    """Decoding through scaled_dot_product_attention without gradients (the fused
    op): one query row over a KV cache growing by one position per step, with no
    mask, a bool mask, or an additive mask made on the device."""
    g = torch.Generator().manual_seed(6)
    k = torch.randn(2, 4, 5, 16, generator=g).to(dev)
    v = torch.randn(2, 4, 5, 8, generator=g).to(dev)
    outs = []
    for _ in range(steps):
        q, kn = (torch.randn(2, 4, 1, 16, generator=g).to(dev) for _ in range(2))
        k = torch.cat([k, kn], 2)
        v = torch.cat([v, torch.randn(2, 4, 1, 8, generator=g).to(dev)], 2)
        keep = torch.rand(2, 1, 1, k.shape[2], generator=g) > 0.3
        keep[0, ..., 2:] = False  # batch 0 sees its first two keys only
        m = {"none": None, "bool": keep.to(dev), "float": (keep.to(dev).float() - 1) * 1e4}[mask]
        with torch.no_grad():
            outs.append(F.scaled_dot_product_attention(q, k, v, attn_mask=m).cpu())
    return torch.stack(outs)


def test_attention_op_runs_bucketed_along_a_growing_kv_cache(buckets):
    def attention_programs():
        by_op = torchtpu.metrics()["programs_by_op"]
        return {k: n for k, n in by_op.items() if k.startswith("torchtpu::attention")}

    before = attention_programs()
    for mask in ("none", "bool", "float"):  # a bool mask reaches the op as a float one
        got, ref = sdpa_decode("tpu", 40, mask), sdpa_decode("cpu", 40, mask)
        torch.testing.assert_close(got, ref, **F32_TOL)
    new = {k: n - before.get(k, 0) for k, n in attention_programs().items()}
    # Lengths 6..45, without and with a mask: 6, 7 and 8 exact, then a program or
    # two per bucket (16, 32, 64; the mask's storage may be exact or a bucket's),
    # where exact sizes would compile 120.
    assert new.get("torchtpu::attention (bucketed)", 0) >= 4, new
    assert sum(new.values()) <= 20, new


def test_attention_op_runs_bucketed_along_changing_prompt_lengths(buckets):
    """Causal attention at a new prompt length every call: the query and key
    lengths are bucketed together."""
    g = torch.Generator().manual_seed(7)
    b0 = bucketed()
    by_op = torchtpu.metrics()["programs_by_op"]
    p0 = by_op.get("torchtpu::attention (bucketed)", 0)
    for t in range(3, 30):
        q, k, v = (torch.randn(1, 2, t, 8, generator=g) for _ in range(3))
        with torch.no_grad():
            got = F.scaled_dot_product_attention(*(x.to("tpu") for x in (q, k, v)), is_causal=True)
        torch.testing.assert_close(
            got.cpu(), F.scaled_dot_product_attention(q, k, v, is_causal=True), **F32_TOL
        )
    assert bucketed() - b0 > 20
    assert torchtpu.metrics()["programs_by_op"]["torchtpu::attention (bucketed)"] > p0


def test_switch_off_compiles_every_length(monkeypatch):
    monkeypatch.setenv("TORCHTPU_EAGER_BUCKETS", "0")
    per_step: list[int] = []
    b0 = bucketed()
    attention_loop("tpu", 12, seed=2, per_step=per_step)
    assert bucketed() == b0
    assert per_step[-1] - per_step[5] >= 6 * 4, per_step


def reductions(x, b):
    return (
        (x * 2 + b[:, None]).sum(1),
        x.amax(1),
        x.amin(1, keepdim=True),
        torch.log_softmax(x, 1),
        torch.softmax(x, 1),
        x.sum(),
        (x > 0).all(1),
        (x > b[:, None]).any(),
        torch.where(x > 0, x, b[:, None] * 0.5),
    )


@pytest.mark.parametrize("eager", ["strict", "fused"], indirect=True)
def test_reductions_and_pointwise_along_a_growing_dim(eager, buckets):
    g = torch.Generator().manual_seed(3)
    b0 = bucketed()
    for n in range(3, 30):
        x = torch.randn(3, n, generator=g)
        b = torch.randn(3, generator=g)
        got = reductions(x.to("tpu"), b.to("tpu"))
        for want, have in zip(reductions(x, b), got):
            torch.testing.assert_close(have.cpu(), want, **F32_TOL)
        # Pointwise results are exact at any size.
        assert torch.equal(got[-1].cpu(), reductions(x, b)[-1])
    assert bucketed() - b0 > 50


def growing_with_moving_views(dev, steps, per_step=None):
    """A sequence grown by cat; each step reads and computes on its last column,
    a view whose offset moves in the storage the bucketed cat wrote."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 4, generator=g).to(dev)
    reads, outs = [], []
    for _ in range(steps):
        x = torch.cat([x, torch.randn(3, 1, generator=g).to(dev)], dim=1)
        last = x[:, -1:]
        outs.append((torch.exp(last) + x[:, -2:-1] * 2).cpu())
        reads.append(last.clone().cpu())
        if per_step is not None:
            per_step.append(programs())
    return torch.cat(outs, 1), torch.cat(reads, 1)


@pytest.mark.parametrize("eager", ["strict", "debug", "fused"], indirect=True)
def test_moving_views_of_a_bucketed_storage_compile_per_bucket(eager, buckets):
    ref = growing_with_moving_views("cpu", 40)
    per_step: list[int] = []
    got = growing_with_moving_views("tpu", 40, per_step)
    torch.testing.assert_close(got[0], ref[0], **F32_TOL)
    assert torch.equal(got[1], ref[1])
    # Columns 5..44: with their offsets as runtime values, the reads and the
    # ops on the moving views compile at the bucket boundaries (16, 32) only,
    # where exact offsets would compile every step.
    assert per_step[-1] - per_step[8] <= 12, per_step
    assert per_step[-1] - per_step[-8] == 0, per_step


def settles(sizes, between=lambda: None):
    """Matmuls at sizes back every step, after the op's dims have changed: the
    bucketed calls stop after a few steps."""
    g = torch.Generator().manual_seed(7)
    w = torch.randn(24, 7, generator=g)
    tw = w.to("tpu")
    for n in range(5, 12):  # a changing size: the op's dims count as changing
        (torch.randn(n, 24, generator=g).to("tpu") @ tw).cpu()
    a = [torch.randn(n, 24, generator=g) for n in sizes]
    b = [w, torch.randn(24, 30, generator=g)]
    ta, tb = [x.to("tpu") for x in a], [x.to("tpu") for x in b]
    per_step, cuts = [], []
    for _ in range(14):
        outs = [(x @ y).relu() for x, y in zip(ta, tb)]
        for o, x, y in zip(outs, a, b):
            torch.testing.assert_close(o.cpu(), (x @ y).relu(), **F32_TOL)
        per_step.append(bucketed())
        cuts.append(torchtpu.metrics()["fused_cuts"].get("bucketed", 0))
        between()
    assert per_step[1] > per_step[0], per_step  # bucketed at first
    assert per_step[-1] == per_step[-6], per_step
    assert cuts[-1] == cuts[-6], cuts


# Sizes of each test and mode of its own (the keys of an earlier run are static already).
@pytest.mark.parametrize("eager", ["strict", "fused"], indirect=True)
def test_sizes_back_every_step_get_exact_programs(eager, buckets):
    """Once an op's dims have changed (a growing sequence, or another model's calls
    of it), a call at a size it has not seen runs bucketed. Sizes that come back
    every step are a loop's static shapes: after a few steps they run exact
    programs (in Fused Eager inside the step's graph), not bucketed calls."""
    settles((40, 13) if eager == "strict" else (44, 17))


@pytest.mark.parametrize("eager", ["strict", "fused"], indirect=True)
def test_another_threads_reads_are_not_this_threads_steps(eager, buckets):
    """A step is counted in the reads of the thread that runs it: another thread's
    reads (a thread rank, a logging thread) between this thread's steps do not
    keep its static sizes bucketed."""
    x = torch.ones(3).to("tpu")

    def reads():
        t = threading.Thread(target=lambda: [x.cpu() for _ in range(6)])
        t.start()
        t.join()

    settles((36, 11) if eager == "strict" else (52, 19), between=reads)


_TABLE_DROPS = """
import torch, torchtpu
g = torch.Generator().manual_seed(7)
w = torch.randn(24, 7, generator=g)
tw = w.to("tpu")
for n in range(5, 12):  # the op's dims count as changing
    (torch.randn(n, 24, generator=g).to("tpu") @ tw).cpu()
a = [torch.randn(n, 24, generator=g) for n in (40, 13)]
b = [w, torch.randn(24, 30, generator=g)]
ta, tb = [x.to("tpu") for x in a], [x.to("tpu") for x in b]
per_step = []
for step in range(16):
    outs = [(x @ y).relu() for x, y in zip(ta, tb)]
    for o, x, y in zip(outs, a, b):
        torch.testing.assert_close(o.cpu(), (x @ y).relu(), rtol=1e-4, atol=1e-4)
    per_step.append(torchtpu.metrics()["bucketed_calls"])
    if step == 7:  # another model's programs fill the 64-entry program table
        relu = torchtpu.metrics()["programs_by_op"]["relu"]
        for k in range(100):
            torch.ones(k + 2, device="tpu").exp()
print("PER_STEP", per_step)
print("RELU_AGAIN", torchtpu.metrics()["programs_by_op"]["relu"] - relu)
"""


def test_static_sizes_stay_exact_after_the_program_table_drops_them():
    """Strict's program table drops its programs when full; the static sizes of a
    loop that settled come back at their exact programs, not bucketed for steps."""
    env = {"TORCHTPU_EAGER_BUCKETS": "1", "TORCHTPU_CACHE_MEMORY_ENTRIES": "64"}
    r = run_py(_TABLE_DROPS, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    per_step = eval(r.stdout.split("PER_STEP")[1].split("\n")[0])
    assert per_step[1] > per_step[0], per_step  # bucketed at first
    assert per_step[7] == per_step[6], per_step  # settled before the table filled
    assert per_step[-1] == per_step[7], per_step
    assert int(r.stdout.split("RELU_AGAIN")[1]) == 2  # the table had dropped them


@pytest.mark.parametrize("eager", ["strict", "fused"], indirect=True)
def test_backward_along_a_growing_dim(eager, buckets):
    """Attention-like training at a new sequence length every step: mm, softmax
    and their backward ops (contractions over the padded dim) match the CPU."""
    g = torch.Generator().manual_seed(4)
    w_cpu = torch.randn(8, 8, generator=g)
    w_tpu = w_cpu.to("tpu").requires_grad_()
    w_cpu.requires_grad_()
    b0 = bucketed()
    for t in range(4, 24):
        x = torch.randn(2, t, 8, generator=g)
        grads = []
        for w, dev in ((w_cpu, "cpu"), (w_tpu, "tpu")):
            xs = x.to(dev).detach().requires_grad_()
            h = (xs.reshape(2 * t, 8) @ w).reshape(2, t, 8)
            s = torch.softmax(h, dim=1)
            loss = (s * h).sum()
            loss.backward()
            grads.append((loss.detach().cpu(), xs.grad.cpu(), w.grad.cpu()))
            w.grad = None
        for want, have in zip(*grads):
            torch.testing.assert_close(have, want, rtol=1e-4, atol=1e-4)
    assert bucketed() - b0 > 50


_GENERATE = """
import torch, torchtpu
from transformers import GPT2Config, GPT2LMHeadModel, LogitsProcessor, LogitsProcessorList
torch.manual_seed(0)
cfg = GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=128)
m = GPT2LMHeadModel(cfg).eval()
ids = torch.randint(0, 64, (1, 5))
kw = dict(max_new_tokens=40, do_sample=False, pad_token_id=0)
with torch.no_grad():
    ref = m.generate(ids, **kw)
m = m.to("tpu")
seen = []
class Count(LogitsProcessor):
    def __call__(self, input_ids, scores):
        seen.append(sum(torchtpu.metrics()["programs_by_op"].values()))
        return scores
with torch.no_grad():
    out = m.generate(ids.to("tpu"), **kw, logits_processor=LogitsProcessorList([Count()]))
assert torch.equal(out.cpu(), ref), (out, ref)
print("PER_TOKEN", [b - a for a, b in zip(seen, seen[1:])])
print("BUCKETED", torchtpu.metrics()["bucketed_calls"])
"""


@pytest.mark.parametrize("mode,on", [("strict", "1"), ("fused", "1"), ("strict", "0")])
def test_dynamic_cache_generate_compiles_per_bucket(mode, on):
    pytest.importorskip("transformers")
    env = {"TORCHTPU_HOST_CHURN": "2", "TORCHTPU_EAGER_BUCKETS": on, "TORCHTPU_EAGER": mode}
    r = run_py(_GENERATE, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    per_token = eval(r.stdout.split("PER_TOKEN")[1].split("\n")[0].strip())
    later = sum(per_token[6:])  # tokens 8..41: cache lengths 13..45
    if on == "1":
        # Only the bucket boundaries (16, 32) compile: the attention op's and the
        # cats' programs.
        assert later <= 12 and int(r.stdout.split("BUCKETED")[1]) > 0, per_token
    else:
        # A program per token for each of the two cats and the attention op.
        assert later >= 3 * len(per_token[6:]), per_token
