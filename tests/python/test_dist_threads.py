"""c10d ranks over the devices of one process: the tpu_local backend through
torchtpu.distributed.run_on_devices, one thread per device (tests/python/dist/threads.py
in a subprocess with TORCHTPU_NUM_DEVICES=4; every rank thread is joined with a timeout)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import check_py

SCRIPT = Path(__file__).resolve().parent / "dist" / "threads.py"


def run(scenario, mode):
    proc = check_py(
        f"""
        import runpy, sys
        sys.argv = [{str(SCRIPT)!r}, {scenario!r}, {mode!r}]
        runpy.run_path(sys.argv[0], run_name="__main__")
        """,
        env={"TORCHTPU_NUM_DEVICES": "4"},
        timeout=120,
    )
    assert f"{scenario} ok" in proc.stdout, proc.stdout


@pytest.mark.parametrize("mode", ["strict", "fused"])
@pytest.mark.parametrize(
    "scenario", ["collectives", "more", "p2p", "groups", "ddp", "faults", "spmd"]
)
def test_thread_ranks(scenario, mode):
    run(scenario, mode)


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_fsdp2_and_dtensor(mode):
    """In Fused Eager, FSDP2's optimizer step deadlocked: DTensor's C++ dispatch called
    us holding the GIL while the graph's owner waited for it in a Python kernel."""
    run("fsdp_dtensor", mode)


def test_fsdp2_and_dtensor_in_spmd_mode():
    """FSDP2 shards sit at each rank's own offset of a flat buffer: the collectives
    are copied out so they still meet as one program per collective."""
    proc = check_py(
        f"""
        import runpy, sys
        sys.argv = [{str(SCRIPT)!r}, "fsdp_dtensor", "fused"]
        runpy.run_path(sys.argv[0], run_name="__main__")
        """,
        env={"TORCHTPU_NUM_DEVICES": "4", "TORCHTPU_SPMD": "1"},
        timeout=120,
    )
    assert "fsdp_dtensor ok" in proc.stdout, proc.stdout


def test_rank_threads_leave_the_global_mode_alone(monkeypatch):
    """Each rank thread takes the caller's mode for itself only. It used to set the
    global mode and undo it on entering; two ranks starting at once could leave the
    global mode Fused, and then a rank's exit skipped the flush of its graph (a later
    group ran that stale graph's collective)."""
    import torchtpu
    from torchtpu import _C
    from torchtpu.distributed import run_on_devices

    with torchtpu.eager_mode("fused"):
        calls = []
        monkeypatch.setattr(_C, "set_mode", calls.append)
        modes = run_on_devices(lambda rank: torchtpu.get_eager_mode(), 1)
    assert modes == ["fused"] and calls == [], (modes, calls)
