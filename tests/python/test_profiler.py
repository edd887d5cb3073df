"""Conventions users rely on: torch.profiler events and traces, torch.accelerator,
torch.utils.benchmark and TORCH_LOGS."""

from __future__ import annotations

import json
import logging

import pytest
import torch
import torchtpu
from conftest import assert_tpu_close, check_py
from torch.profiler import ProfilerActivity, profile
from torch.utils import benchmark


def _names(prof) -> list[str]:
    return [e.key for e in prof.key_averages()]


def _has(names: list[str], prefix: str) -> bool:
    return any(n.startswith(prefix) for n in names)


def test_profiler_shows_ops_compiles_executions_transfers(tmp_path):
    host = torch.randn(3, 13, 7)  # sizes no other test uses: the program is new here
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        x = host.to("tpu")
        y = torch.cos(x) + 1
        back = y.cpu()
        torch.tpu.synchronize()
    torch.testing.assert_close(back, torch.cos(host) + 1)
    names = _names(prof)
    for want in (
        "aten::cos",
        "aten::add",
        "torchtpu::compile aten::cos",
        "torchtpu::execute aten::cos",
        "torchtpu::execute aten::add",
        "torchtpu::compile_cache ",
        "torchtpu::to_device",
        "torchtpu::to_host",
        "torchtpu::synchronize",
    ):
        assert _has(names, want), (want, names)

    # The Chrome trace (what Perfetto and chrome://tracing open) holds them too;
    # transfers carry their byte count as the event's input.
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    ours = [e for e in events if e.get("name", "").startswith("torchtpu::")]
    assert {e["ph"] for e in ours} == {"X"} and all(e["dur"] >= 0 for e in ours)
    to_host = [e for e in ours if e["name"] == "torchtpu::to_host"]
    assert to_host and to_host[0]["args"]["Concrete Inputs"] == [str(host.nbytes)]
    to_dev = [e for e in ours if e["name"] == "torchtpu::to_device"]
    assert any(e["args"]["Concrete Inputs"] == [str(host.nbytes)] for e in to_dev)
    # Strict Eager's execution nests inside its ATen op.
    cos = next(e for e in events if e.get("name") == "aten::cos")
    run = next(e for e in ours if e["name"].startswith("torchtpu::execute aten::cos"))
    assert cos["ts"] <= run["ts"] and run["ts"] + run["dur"] <= cos["ts"] + cos["dur"] + 1


def test_profiler_shows_fused_graphs():
    x = torch.randn(5, 11, device="tpu")
    cpu = [ProfilerActivity.CPU]
    with profile(activities=cpu, record_shapes=True) as prof, torchtpu.eager_mode("fused"):
        y = (x * 3 + 2).exp()
        torchtpu.flush()
    assert_tpu_close(y, (x.cpu() * 3 + 2).exp())
    names = _names(prof)
    assert "torchtpu::fused_flush user" in names, names
    assert "torchtpu::execute fused_graph" in names, names
    run = next(e for e in prof.events() if e.name == "torchtpu::execute fused_graph")
    assert run.concrete_inputs == [3]  # the graph's op count


def test_profiler_copies_and_repeated_ops():
    a = torch.randn(4, 6, device="tpu")
    torch.cos(a)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.cos(a)  # seen before: no compile event
        a.t().contiguous()  # a copy program
    names = _names(prof)
    assert _has(names, "torchtpu::execute aten::cos") and not _has(
        names, "torchtpu::compile aten::cos"
    )
    assert _has(names, "torchtpu::execute copy_read"), names


def test_profiler_privateuse1_activity_runs():
    # torch.profiler accepts the backend's activity; its events are host-side ranges
    # (no device-side track: the PJRT layer reports no per-program device times).
    x = torch.randn(4, device="tpu")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        (x * 2).cpu()
    assert _has(_names(prof), "torchtpu::execute aten::mul")


def test_no_events_without_profiler():
    x = torch.randn(4, device="tpu")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        pass
    (x * 2).cpu()
    assert not _has(_names(prof), "torchtpu::")


# ---------------------------------------------------------------- torch.accelerator


def test_torch_accelerator_api():
    assert torch.accelerator.is_available()
    assert torch.accelerator.current_accelerator() == torch.device("tpu")
    assert torch.accelerator.device_count() == torch.tpu.device_count()
    assert torch.accelerator.current_device_index() == 0
    assert torch.accelerator.current_stream().device.type == "tpu"
    x = torch.ones(1024, device="tpu") * 2
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.accelerator.synchronize()
    assert "torchtpu::synchronize" in _names(prof)
    assert torch.accelerator.memory_allocated() == torch.tpu.memory_allocated()
    stats = torch.accelerator.memory_stats()
    assert stats["allocation.all.current"] >= 1
    assert stats["allocated_bytes.all.current"] >= x.nbytes
    free, total = torch.accelerator.get_memory_info()
    assert total == torch.tpu.get_device_properties().total_memory and 0 <= free <= total
    torch.accelerator.reset_peak_memory_stats()
    assert torch.accelerator.max_memory_allocated() == torch.accelerator.memory_allocated()


# ---------------------------------------------------------------- torch.utils.benchmark


def test_benchmark_timer_synchronizes_device():
    x = torch.randn(64, 64, device="tpu")
    timer = benchmark.Timer(stmt="x @ x", globals={"x": x})
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        m = timer.timeit(3)
    # torch.utils.benchmark syncs torch.accelerator around each timed block.
    syncs = [e for e in prof.events() if e.name == "torchtpu::synchronize"]
    assert len(syncs) >= 2
    assert m.mean > 0


# ---------------------------------------------------------------- TORCH_LOGS


_LOG_SCRIPT = """
    import torch, torchtpu
    x = torch.ones(3, device="tpu")
    with torchtpu.eager_mode("fused"):
        y = x * 2
    print(y.cpu().tolist())
"""


@pytest.mark.parametrize(
    "setting,info,debug",
    [(None, False, False), ("torchtpu", True, False), ("+torchtpu", True, True)],
)
def test_torch_logs(setting, info, debug, monkeypatch):
    monkeypatch.delenv("TORCH_LOGS", raising=False)
    proc = check_py(_LOG_SCRIPT, env={"TORCH_LOGS": setting} if setting else {})
    assert "[2.0, 2.0, 2.0]" in proc.stdout
    assert ("summary:" in proc.stderr and "ops," in proc.stderr) == info, proc.stderr
    assert ("eager mode fused entered" in proc.stderr) == debug, proc.stderr


def test_logger_is_registered_with_torch_logging():
    from torch._logging._internal import log_registry

    assert log_registry.is_log("torchtpu")
    assert logging.getLogger("torchtpu.compile").parent.name == "torchtpu"
