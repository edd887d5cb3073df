"""torch.distributed on tpu (the tpu_dist backend): collectives, DDP, FSDP2, DTensor,
MPMD and faults, each run as 2-4 ranks on loopback by tests/python/dist/launch.py."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "dist"))
from launch import spawn_ranks, torchrun


def _ok(result, nproc: int) -> list[str]:
    """Each rank's closing report ("rank N: ..."); ranks' prints may share a line."""
    reports = re.findall(r"rank (\d+): (.*?)(?=rank \d+: |\n|$)", result.output)
    assert result.returncode == 0, result.output[-6000:]
    assert sorted(int(r) for r, _ in reports) == list(range(nproc)), result.output[-6000:]
    return [text for _, text in reports]


@pytest.mark.parametrize(
    "nproc,how,mode",
    [(2, "mixed", "strict"), (4, "tpu_dist", "strict"), (2, "default", "fused")],
)
def test_collectives_match_gloo(nproc, how, mode):
    r = torchrun("collectives.py", nproc, env={"TORCHTPU_EAGER": mode}, args=(how,))
    for line in _ok(r, nproc):
        assert "bit-identical to gloo" in line


@pytest.mark.parametrize("scenario", ["extra_broadcast", "other_shape", "exits", "stuck"])
def test_divergent_ranks_fail_fast_naming_both_sides(scenario):
    timeout_s = 8
    results, seconds = spawn_ranks(
        "faults.py", 2, args=(scenario,), env={"TORCHTPU_DIST_TIMEOUT": str(timeout_s)},
        timeout=90, watch=(0,) if scenario in ("exits", "stuck") else None)
    survivors = results if scenario in ("extra_broadcast", "other_shape") else results[:1]
    for res in survivors:
        assert res.returncode not in (0, None), res.output[-3000:]
        err = next((ln for ln in res.output.splitlines() if "ERROR" in ln), "")
        text = res.output[res.output.find(err):]
        assert "tpu_dist" in err, res.output[-3000:]
        # Both sides named: each rank's line, with the collective and the Python line.
        assert "rank 0: " in text and "rank 1: " in text, text
        assert "faults.py:" in text, text
        if scenario == "extra_broadcast":
            assert "broadcast" in text and "all_reduce" in text, text
        if scenario == "other_shape":
            assert "Float[3]" in text and "Float[4]" in text, text
        if scenario in ("exits", "stuck"):
            assert "did not reach collective #2" in text, text
    # Within the timeout (plus start-up and the fault report's short wait).
    assert seconds < 60, seconds


@pytest.mark.parametrize(
    "wrapper,model,mode",
    [
        ("ddp", "mlp", "strict"),
        ("ddp_unused", "mlp", "fused"),
        ("ddp_hook", "gpt", "strict"),
        ("ddp", "gpt", "fused"),
        ("ddp", "gpt", "compile"),
        ("fsdp", "mlp", "strict"),
        ("fsdp", "gpt", "fused"),
        ("fsdp", "gpt", "compile"),
    ],
)
def test_data_parallel_training_matches_single_process(wrapper, model, mode):
    r = torchrun("training.py", 2, args=(wrapper, model, mode))
    _ok(r, 2)


def test_dtensor_on_tpu_mesh():
    for line in _ok(torchrun("dtensor.py", 2), 2):
        assert "DTensor checks passed" in line


@pytest.mark.parametrize("mode", ["fused", "compile"])
def test_mpmd_rank0_evaluates_without_recompiles(mode):
    for line in _ok(torchrun("mpmd.py", 2, args=(mode,)), 2):
        assert "0 compiles after warm-up" in line


def test_in_process_device_collectives_are_programs():
    from conftest import check_py

    proc = check_py(
        """
        import time, torch, torchtpu
        from torchtpu import distributed as td
        n = 4
        assert torch.tpu.device_count() == n
        start = time.monotonic()
        for dtype in (torch.float32, torch.bfloat16, torch.int64):
            xs = [(torch.arange(12) % 5 - 2 + 3 * i).reshape(3, 4).to(dtype) for i in range(n)]
            on = lambda: [x.to(f"tpu:{i}") for i, x in enumerate(xs)]
            for op, ref in (("sum", sum(xs)), ("max", torch.stack(xs).amax(0)),
                            ("min", torch.stack(xs).amin(0))):
                ts = on()
                td.device_all_reduce(ts, op)
                for t in ts:
                    assert torch.equal(t.cpu(), ref), (dtype, op, t, ref)
            for d in (0, 1):
                for g in td.device_all_gather(on(), dim=d):
                    assert torch.equal(g.cpu(), torch.cat(xs, d))
            rs = td.device_reduce_scatter(on(), dim=1)
            for i, r in enumerate(rs):
                assert torch.equal(r.cpu(), sum(xs).chunk(n, 1)[i]), (i, r)
                assert r.device == torch.device("tpu", i)
            a2a = td.device_all_to_all(on(), split_dim=1, concat_dim=0)
            for j, r in enumerate(a2a):
                assert torch.equal(r.cpu(), torch.cat([x.chunk(n, 1)[j] for x in xs], 0))
            perm = td.device_permute(on(), [(i, (i + 1) % n) for i in range(n)])
            for i, r in enumerate(perm):
                assert torch.equal(r.cpu(), xs[(i - 1) % n])
        seconds = time.monotonic() - start
        stats = torchtpu.metrics()["collectives"]
        assert all(v["host_copy_bytes"] == 0 for v in stats.values()), stats
        assert stats["device_all_reduce"]["calls"] == 9, stats
        try:
            td.device_all_reduce([torch.ones(2, device="tpu:1"), torch.ones(2, device="tpu:0")])
            raise SystemExit("expected an error")
        except RuntimeError as e:
            assert "must be on tpu:0" in str(e), e
        print("SECONDS", seconds)
        """,
        env={"TORCHTPU_NUM_DEVICES": "4"},
    )
    seconds = float(proc.stdout.split("SECONDS")[1])
    assert seconds < 5, seconds


def test_collective_inside_compiled_function_cuts_the_program():
    for line in _ok(torchrun("compiled_collective.py", 2), 2):
        assert "compiled collective ok" in line


def test_detail_debug_names_both_sides():
    # TORCH_DISTRIBUTED_DEBUG=DETAIL: torch wraps the backend in its own checking
    # wrapper and ours exchanges full descriptions on every collective.
    results, _ = spawn_ranks("faults.py", 2, args=("other_shape",), timeout=90,
                             env={"TORCHTPU_DIST_TIMEOUT": "8",
                                  "TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
    for res in results:
        assert res.returncode not in (0, None), res.output[-3000:]
        assert "ERROR" in res.output, res.output[-3000:]
        text = res.output[res.output.find("ERROR"):]
        assert "[3]" in text and "[4]" in text, text


def test_pinned_host_memory_and_record_stream():
    import torch
    import torchtpu  # noqa: F401

    pinned = torch.randn(64).pin_memory()
    assert pinned.is_pinned() and not torch.randn(64).is_pinned()
    assert pinned[10:].is_pinned()  # a pointer inside a pinned block
    t = pinned.to("tpu", non_blocking=True)
    t.record_stream(torch.tpu.Stream())
    assert torch.equal(t.cpu(), pinned)
