"""The PJRT key-value store on torchrun's c10d store (what a multi-process CUDA
client exchanges its topology through). The CPU plugin never calls the callbacks,
so the ranks drive them through a _C test hook; see csrc/dist/kv_store.cpp."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "dist"))
from launch import torchrun


def test_two_ranks_exchange_through_the_c10d_store():
    r = torchrun("kv_store.py", 2, env={"TORCHTPU_KV_STORE": "1"}, timeout=120)
    assert r.returncode == 0, r.output[-6000:]
    for rank in (0, 1):
        assert f"rank {rank}: kv ok via c10d TCPStore 127.0.0.1:" in r.output, r.output[-6000:]


def test_single_process_cpu_client_has_no_store(monkeypatch):
    import torch
    import torchtpu  # noqa: F401
    from torchtpu import _C

    torch.ones(1, device="tpu").item()
    assert _C._client_kv() is None
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setenv("TORCHTPU_KV_STORE", "1")
    with pytest.raises(RuntimeError, match="TORCHTPU_KV_STORE=1 needs RANK, WORLD_SIZE"):
        _C._kv_callback_exchange("cpu", "a", b"", "a", 10)
