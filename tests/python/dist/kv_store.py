"""Worker of test_kv_store.py: each rank drives the PJRT key-value callbacks on the
c10d store torchrun_client_kv builds, and reads the other rank's value."""

from __future__ import annotations

import os

import torch
import torchtpu  # noqa: F401
from torchtpu import _C

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
other = (rank + 1) % world

# What a CUDA client would get: put this rank's key, block on the other's.
d = _C._kv_callback_exchange(
    "cuda", f"probe/{rank}", f"hello from {rank}".encode(), f"probe/{other}", 60_000
)
assert d["value"] == f"hello from {other}".encode(), d
assert d["try_get_before"] in (None, d["value"]), d
assert (d["node_id"], d["num_nodes"]) == (rank, world), d
assert d["where"].endswith("prefix torchtpu/pjrt/0/"), d

# A key nobody writes: the callback returns DEADLINE_EXCEEDED naming the key.
try:
    _C._kv_callback_exchange("cuda", f"unused/{rank}", b"", "nobody/writes/this", 300)
except RuntimeError as e:
    msg = str(e)
    assert "PJRT error 4" in msg and "'nobody/writes/this'" in msg, msg
    assert "timed out after 300 ms" in msg, msg
else:
    raise AssertionError("a missing key did not time out")

# TORCHTPU_KV_STORE=1: the (CPU) client itself was created with the store.
assert torch.ones(2, device="tpu").sum().item() == 2.0
info = _C._client_kv()
assert info is not None and (info["node_id"], info["num_nodes"]) == (rank, world), info
print(f"rank {rank}: kv ok via {d['where']}", flush=True)
