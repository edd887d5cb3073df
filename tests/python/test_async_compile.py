"""Async compiles: a program's first build compiles on a pool of threads while
the host goes on, and launches queue behind it in order, handing out placeholder
buffers. Values, and their order of writes, are those of running each op at
once (TORCHTPU_ASYNC_COMPILE=0)."""

from __future__ import annotations

import json

import pytest
from conftest import check_py

# New programs and hits on programs still compiling, in-place writes queued
# behind them, a value-dependent host op, and a read at the end: the bits of
# every result and the metrics.
SCRIPT = """
import json, torch, torchtpu
torchtpu.eager_mode({mode!r})
torch.manual_seed(0)
x0 = torch.randn(33, 17)
w0 = torch.randn(17, 9)

def work(dev):
    x, w = x0.to(dev), w0.to(dev)
    acc = torch.zeros(33, 9, device=dev)
    outs = []
    for k in range(4):
        y = torch.tanh(x @ w) * (k + 1)
        acc.add_(y)                 # a queued write over a queued value
        acc.mul_(0.5)
        outs.append(acc.clone())
        x = x[:, torch.arange(17, device=dev) % (17 - k)] + 0.25
    mask = acc > 0
    outs.append(acc[mask])          # nonzero: reads values on the host
    outs.append(torch.cumsum(acc, 0).softmax(-1))
    return [o.cpu() for o in outs]

got = work("tpu")
want = work("cpu")
m = torchtpu.metrics()
print(json.dumps(dict(
    close=all(torch.allclose(a, b, rtol=1e-5, atol=1e-5) for a, b in zip(got, want)),
    shapes=all(a.shape == b.shape for a, b in zip(got, want)),
    bits=[a.double().sum().item() for a in got],
    compiles=m["compiles"], busy=torchtpu._C._async_busy())))
"""


def run(tmp_path, mode, env=None):
    out = check_py(
        SCRIPT.format(mode=mode), {"TORCHTPU_CACHE_DIR": str(tmp_path), **(env or {})}
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_async_compiles_give_the_bits_of_running_at_once(tmp_path, mode):
    on = run(tmp_path / "on", mode)
    assert on["close"] and on["shapes"], on
    assert on["compiles"] > 0 and not on["busy"], on
    one = run(tmp_path / "one", mode, {"TORCHTPU_COMPILE_THREADS": "1"})
    off = run(tmp_path / "off", mode, {"TORCHTPU_ASYNC_COMPILE": "0"})
    assert on["bits"] == one["bits"] == off["bits"]
    assert on["compiles"] == one["compiles"] == off["compiles"]


# With the pool held, cold ops return at once: their launches queue (busy)
# behind compiles that have not started. Released, the values are right.
HELD = """
import json, torch, torchtpu
torchtpu.eager_mode("strict")
x = torch.randn(40, 24)
t = x.to("tpu")
torchtpu._C._async_hold(True)
y = (t.exp() - 1) @ t.T
y.add_(2)
z = y.sum(1)
queued = torchtpu._C._async_busy()
torchtpu._C._async_hold(False)
want = ((x.exp() - 1) @ x.T + 2).sum(1)
print(json.dumps(dict(queued=queued, close=torch.allclose(z.cpu(), want, rtol=1e-5, atol=1e-4),
                      compiles=torchtpu.metrics()["compiles"])))
"""


@pytest.mark.parametrize("on", [True, False])
def test_cold_ops_queue_behind_their_compiles(tmp_path, on):
    env = {"TORCHTPU_CACHE_DIR": str(tmp_path)}
    if not on:
        env["TORCHTPU_ASYNC_COMPILE"] = "0"
    r = json.loads(check_py(HELD, env).stdout.strip().splitlines()[-1])
    assert r["close"] and r["compiles"] >= 3, r
    assert r["queued"] is on, r


# Compiles still running when the script ends: they finish before the interpreter
# exits and XLA's static state is torn down (a compile running then crashed the
# process), and the process exits with the script's status. A 12-block MLP's step
# in Fused Eager: loss.item() waits for the forward's program only, and the
# backward and optimizer program (about twice the forward's compile) compiles on.
AT_EXIT = """
import sys, torch, torch.nn.functional as F, torchtpu
from torch import nn
torchtpu.eager_mode("fused")
torch.manual_seed(0)
blocks = [m for _ in range(12) for m in (nn.Linear(64, 64), nn.LayerNorm(64), nn.GELU())]
model = nn.Sequential(*blocks, nn.Linear(64, 10)).to("tpu")
x, y = torch.randn(4, 64).to("tpu"), torch.randint(0, 10, (4,)).to("tpu")
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
loss = F.cross_entropy(model(x), y)
loss.backward()
opt.step()
print("loss", loss.item(), "queued", torchtpu._C._async_busy(), flush=True)
sys.exit(3)
"""


def test_exit_waits_for_compiles_in_flight(tmp_path):
    from conftest import run_py

    proc = run_py(AT_EXIT, {"TORCHTPU_CACHE_DIR": str(tmp_path)})
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "queued True" in proc.stdout, proc.stdout
