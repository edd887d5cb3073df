"""Cheaper builds. Small programs, and larger ones without reductions, sorts or
scatters, get cheaper compile settings for good (XLA:CPU), counted as quick
compiles. Tiered compiles: a larger program the cache has no final build of is
compiled quick first, then replaced by the final build once it has run a few times
(compiled in the background). By default only programs whose two builds agree bit
for bit tier (IEEE-exact arithmetic and data movement: AdamW's foreach ops);
TORCHTPU_TIERED_COMPILE=1 tiers every larger program, where values change at most
in the last bits across the swap (none under deterministic algorithms), and =0
none. The next process finds the optimized builds in the disk cache."""

from __future__ import annotations

import json

import pytest
from conftest import check_py

# Runs a few ops `runs` times (their programs' results kept per run), waits for
# the background compiles, runs once more and prints the metrics and whether
# every run gave the bits of the first.
SCRIPT = """
import json, torch, torchtpu
torchtpu.eager_mode({mode!r})
torch.use_deterministic_algorithms({deterministic})
torch.manual_seed(0)
x = torch.randn(64, 48).to("tpu")
w = torch.randn(48, 32).to("tpu")

def step():
    y = torch.softmax(x @ w, -1)
    return [y, (torch.tanh(x) * 3 + 1).sum(0), torch.cumsum(x, 1), y.argmax(-1)]

def host(vals):
    return [v.cpu() for v in vals]

first = host(step())
quick = torchtpu.metrics()["quick_compiles"]
later = [host(step()) for _ in range({runs})]
torchtpu._C.wait_tier_ups()
compiles_before = torchtpu.metrics()["compiles"]
last = host(step())
m = torchtpu.metrics()
pairs = [(a, b) for run in later + [last] for a, b in zip(first, run)]
same = all(torch.equal(a, b) for a, b in pairs)
near = all(torch.allclose(a.double(), b.double(), rtol=1e-6, atol=1e-6) for a, b in pairs)
cpu = [torch.softmax(x.cpu() @ w.cpu(), -1)]
print(json.dumps(dict(quick_after_first=quick, quick=m["quick_compiles"], tier_ups=m["tier_ups"],
    tier_up_compiles=m["tier_up_compiles"], compiles=m["compiles"],
    compiles_after_tier_up=m["compiles"] - compiles_before, same=same, near=near,
    close=torch.allclose(first[0], cpu[0], rtol=1e-5, atol=1e-6))))
"""


def run(tmp_path, mode="strict", runs=2, env=None, deterministic=False):
    code = SCRIPT.format(mode=mode, runs=runs, deterministic=deterministic)
    env = {
        "TORCHTPU_CACHE_DIR": str(tmp_path),
        "TORCHTPU_TIERED_COMPILE": "1",
        "TORCHTPU_SMALL_QUICK": "0",  # every program here tiers
        **(env or {}),
    }
    out = check_py(code, env).stdout
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_quick_builds_are_replaced_without_changing_values(tmp_path, mode):
    m = run(tmp_path, mode)
    assert m["quick_after_first"] > 0, m
    assert m["tier_ups"] >= 1 and m["tier_up_compiles"] >= 1, m
    assert m["near"] and m["close"], m
    # Background compiles are not counted as the program's compiles.
    assert m["compiles_after_tier_up"] == 0, m


def test_next_process_starts_with_the_optimized_builds(tmp_path):
    first = run(tmp_path)
    assert first["quick"] > 0 and first["tier_ups"] > 0, first
    again = run(tmp_path)
    assert again["quick"] == 0 and again["compiles"] == 0 and again["tier_ups"] == 0, again
    assert again["same"], again


def test_programs_run_once_are_never_recompiled(tmp_path):
    m = run(tmp_path, runs=0, env={"TORCHTPU_TIER_UP_RUNS": "3"})
    assert m["quick"] > 0 and m["tier_ups"] == 0 and m["tier_up_compiles"] == 0, m


@pytest.mark.parametrize(
    "how",
    [{"env": {"TORCHTPU_TIERED_COMPILE": ""}}, {"deterministic": True}],
    ids=["default", "deterministic"],
)
def test_inexact_programs_untiered_by_default_and_all_under_deterministic_algorithms(tmp_path, how):
    m = run(tmp_path, **how)
    assert m["quick"] == 0 and m["tier_ups"] == 0 and m["compiles"] > 0, m
    assert m["same"] and m["close"], m


# A program of exact arithmetic (lerp: multiplies, adds, a select) and one with a
# transcendental function (tanh), each run a few times, then again after the
# background compiles: tier-ups and the result's bits.
EXACT = """
import json, torch, torchtpu
torch.manual_seed(0)
a, b = torch.randn(300, 40).to("tpu"), torch.randn(300, 40).to("tpu")
out = {}
for name, f in (("exact", lambda: torch.lerp(a, b, 0.3)), ("rounded", lambda: torch.tanh(a))):
    before = torchtpu.metrics()["tier_ups"]
    runs = [f().cpu() for _ in range(4)]
    torchtpu._C.wait_tier_ups()
    runs.append(f().cpu())
    out[name] = torchtpu.metrics()["tier_ups"] - before
    out[name + "_same"] = all(torch.equal(runs[0], r) for r in runs)
    out[name + "_bits"] = runs[-1].view(torch.int32).tolist()
print(json.dumps(out))
"""


def run_exact(cache_dir, tiered: str) -> dict:
    env = {"TORCHTPU_CACHE_DIR": str(cache_dir), "TORCHTPU_TIERED_COMPILE": tiered}
    return json.loads(check_py(EXACT, env).stdout.strip().splitlines()[-1])


def test_exact_programs_tier_by_default_with_the_same_bits(tmp_path):
    m = run_exact(tmp_path / "a", "")
    assert m["exact"] >= 1 and m["rounded"] == 0, {k: m[k] for k in ("exact", "rounded")}
    assert m["exact_same"] and m["rounded_same"]
    off = run_exact(tmp_path / "b", "0")
    assert off["exact"] == 0 and off["rounded"] == 0
    # The quick and the final build of the exact program agree with the untiered one.
    assert m["exact_bits"] == off["exact_bits"] and m["rounded_bits"] == off["rounded_bits"]


# Small and large programs in one mode: how many compiled quick, and whether
# each result matches the CPU's (and, for the small one, its exact bits in a
# second process: one build per program, whatever ran before).
SMALL = """
import json, torch, torchtpu
torchtpu.eager_mode({mode!r})

def f(x, w):
    return torch.softmax(torch.tanh(x @ w) * 3 + 1, -1).sum(0)

def g(x, w):  # plain loops and a dot: no reduction
    return torch.tanh(x @ w) * 3 + 1

def r(x, w):  # reductions only (in Strict each op is a program)
    return torch.softmax(x, -1).sum(0)

def quick():
    return torchtpu.metrics()["quick_compiles"]

torch.manual_seed(0)
out = {{}}
for name, n, fn in (("small", 16, f), ("large", 256, r), ("plain", 256, g)):
    x, w = torch.randn(n, 32), torch.randn(32, n)
    q = quick()
    y = fn(x.to("tpu"), w.to("tpu")).cpu()
    out[name] = quick() - q
    out[name + "_close"] = torch.allclose(y, fn(x, w), rtol=1e-5, atol=1e-6)
    out[name + "_bits"] = y.view(torch.int32).tolist()
print(json.dumps(out))
"""


def run_small(tmp_path, mode, env=None):
    env = {"TORCHTPU_CACHE_DIR": str(tmp_path), **(env or {})}
    return json.loads(check_py(SMALL.format(mode=mode), env).stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_small_programs_get_the_cheaper_build(tmp_path, mode):
    m = run_small(tmp_path / "a", mode)
    assert m["small"] >= 1 and m["large"] == 0 and m["plain"] >= 1, m
    assert m["small_close"] and m["large_close"] and m["plain_close"], m
    off = run_small(tmp_path / "b", mode, {"TORCHTPU_SMALL_QUICK": "0"})
    assert off["small"] == 0 and off["large"] == 0 and off["plain"] == 0, off
    assert off["small_close"], off
    again = run_small(tmp_path / "c", mode)
    assert again["small_bits"] == m["small_bits"], (again, m)


def dumped_builds(tmp_path, xla_flags="", mode="strict"):
    """Runs SMALL with XLA's dumps on; for each compiled program, whether it got the
    small build (level 1), the LLVM options XLA used for it and whether its LLVM
    module was compiled in one part."""
    dump = tmp_path / "dump"
    run_small(tmp_path / "cache", mode, {"XLA_FLAGS": f"{xla_flags} --xla_dump_to={dump}"})
    builds = []
    for f in sorted(dump.glob("*.debug_options")):
        text = f.read_text()
        llvm = {line.split('"')[1] for line in text.splitlines() if line.strip().startswith("key:")}
        one_part = "xla_cpu_parallel_codegen_split_count: 1\n" in text
        builds.append(("xla_backend_optimization_level: 1" in text, llvm, one_part))
    return builds


def test_small_builds_skip_llvm_loop_unrolling_and_vectorizing(tmp_path):
    builds = dumped_builds(tmp_path)
    ours = {"xla_cpu_disable_loop_unrolling", "xla_cpu_optimize_for_size"}
    small = [llvm for is_small, llvm, _ in builds if is_small]
    other = [llvm for is_small, llvm, _ in builds if not is_small]
    assert small and other, builds
    assert all(llvm == ours for llvm in small), builds
    assert all(not llvm for llvm in other), builds
    # Strict's per-op programs compile their LLVM modules in one part (several
    # compile at once on the async threads); Fused graphs larger than small ones
    # in XLA's parallel parts.
    assert all(one_part for _, _, one_part in builds), builds
    graphs = dumped_builds(tmp_path / "fused", mode="fused")
    assert any(not is_small for is_small, _, _ in graphs), graphs
    assert all(one_part == is_small for is_small, _, one_part in graphs), graphs
    # A user's own LLVM options reach every build, ours none.
    mine = dumped_builds(
        tmp_path / "mine", "--xla_backend_extra_options=xla_cpu_disable_slp_vectorizer"
    )
    assert mine and all(llvm == {"xla_cpu_disable_slp_vectorizer"} for _, llvm, _ in mine), mine


# amax's backward compares its input with the max, so a program that computes the
# input twice must round both copies alike. The elemental emitter at level 0 did not
# (56 of these 160 gradients wrong); the small build must.
AMAX_AFTER_GELU = """
import json, torch, torchtpu, torch.nn.functional as F
torchtpu.eager_mode("fused")
torch.manual_seed(0)
lin = torch.nn.Linear(8, 16)
lt = torch.nn.Linear(8, 16).to("tpu")
lt.load_state_dict(lin.state_dict())
bad = 0
for rep in range(40):
    for n in (3, 5, 7, 9):
        x = torch.randn(2, n, 8)
        xt = x.to("tpu").requires_grad_()
        x.requires_grad_()
        F.gelu(lt(xt)).amax(1).square().sum().backward()
        F.gelu(lin(x)).amax(1).square().sum().backward()
        bad += not torch.allclose(xt.grad.cpu(), x.grad, rtol=1e-4, atol=1e-5)
        lt.zero_grad()
        lin.zero_grad()
print(json.dumps({"bad": bad, "quick": torchtpu.metrics()["quick_compiles"]}))
"""


def test_small_build_keeps_amax_gradients_after_gelu(tmp_path):
    out = check_py(AMAX_AFTER_GELU, {"TORCHTPU_CACHE_DIR": str(tmp_path)}).stdout
    m = json.loads(out.strip().splitlines()[-1])
    assert m["quick"] > 0 and m["bad"] == 0, m


# A plain program (no reduction) under tiered compiles: quick first, then its own
# build (the elemental emitter at XLA's default level), which the next process finds.
PLAIN_TIERED = """
import json, torch, torchtpu
torch.manual_seed(0)
x, w = torch.randn(256, 32).to("tpu"), torch.randn(32, 256).to("tpu")

def g():
    return (torch.tanh(x @ w) * 3 + 1).cpu()

first = g()
quick = torchtpu.metrics()["quick_compiles"]
for _ in range(3):
    g()
torchtpu._C.wait_tier_ups()
last = g()
m = torchtpu.metrics()
print(json.dumps(dict(quick=quick, tier_ups=m["tier_ups"], compiles=m["compiles"],
    near=torch.allclose(first, last, rtol=1e-6, atol=1e-6),
    close=torch.allclose(last, torch.tanh(x.cpu() @ w.cpu()) * 3 + 1, rtol=1e-5, atol=1e-5))))
"""


def test_plain_programs_tier_up_to_their_own_build(tmp_path):
    env = {"TORCHTPU_CACHE_DIR": str(tmp_path), "TORCHTPU_TIERED_COMPILE": "1"}
    m = json.loads(check_py(PLAIN_TIERED, env).stdout.strip().splitlines()[-1])
    assert m["quick"] >= 1 and m["tier_ups"] >= 1, m
    assert m["near"] and m["close"], m
    again = json.loads(check_py(PLAIN_TIERED, env).stdout.strip().splitlines()[-1])
    assert again["quick"] == 0 and again["compiles"] == 0 and again["tier_ups"] == 0, again
