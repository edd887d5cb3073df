"""What a user does first after `pip install .`: run from outside the source tree by
`make wheel-check` (tests/ecosystem/wheel_check.sh) with the clean venv's python.

Checks the installed torchtpu (not the source tree's) imports, finds the XLA:CPU plugin it
depends on, computes like CPU, trains a step, and that torch.compile finds the backend
through the installed entry point.
"""

import importlib.metadata as md
import os
import sys
import time

start = time.monotonic()
import torch
import torchtpu

here = os.path.dirname(os.path.abspath(torchtpu.__file__))
assert "site-packages" in here, f"torchtpu imported from {here}, not from the installed wheel"
print(f"torchtpu {md.version('torchtpu')} from {here}")
print("requires:", [r for r in md.requires("torchtpu") if "extra ==" not in r])
print(f"torch {torch.__version__}, import {time.monotonic() - start:.1f} s")

x = torch.randn(4, 8)
w = torch.randn(8, 3)
y = (x.to("tpu") @ w.to("tpu")).relu()
torch.testing.assert_close(y.cpu(), (x @ w).relu())
print("matmul+relu on", y.device, "matches CPU")

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))
model.to("tpu")
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
data, target = torch.randn(32, 8, device="tpu"), torch.randn(32, 1, device="tpu")
losses = []
for _ in range(5):
    loss = torch.nn.functional.mse_loss(model(data), target)
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss.item())
assert losses[-1] < losses[0], losses
print("training losses", [round(v, 4) for v in losses])

compiled = torch.compile(lambda a: (a * 2).sin(), backend="tpu")
torch.testing.assert_close(compiled(x.to("tpu")).cpu(), (x * 2).sin())
print("torch.compile(backend='tpu') ok; metrics", {k: torchtpu.metrics()[k]
                                                  for k in ("compiles", "executions")})
print(f"wheel smoke passed in {time.monotonic() - start:.1f} s")
sys.exit(0)
