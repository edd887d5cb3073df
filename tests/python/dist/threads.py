"""c10d ranks over the devices of one process (the tpu_local backend, one thread per
device through torchtpu.distributed.run_on_devices). Run with TORCHTPU_NUM_DEVICES=4.
argv: scenario (collectives|ddp|faults) mode (strict|fused). Prints "<scenario> ok" last."""

import copy
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torchtpu
from torchtpu.distributed import run_on_devices

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples"))
from models import MLP

scenario, mode = sys.argv[1:3]
torchtpu.eager_mode(mode).__enter__()  # this thread's mode: run_on_devices passes it on
N = 4
JOIN = 60  # seconds: a hung rank fails the run instead of hanging it
R = dist.ReduceOp


def inputs(dtype, rows=8, cols=3):
    """Rank r's tensor (CPU): small integers so products and sums stay exact in int64."""
    g = torch.Generator().manual_seed(7)
    if dtype == torch.int64:
        return [torch.randint(-3, 4, (rows, cols), generator=g) for _ in range(N)]
    return [torch.randn(rows, cols, generator=g).to(dtype) for _ in range(N)]


def cpu_reduce(xs, op):
    """The reduction in rank order, as the device program does: float32 and int64 round
    at every step; bfloat16 accumulates in float32 and rounds once at the end (XLA:CPU's
    all-reduce; gloo would round at every step, so bf16 sums may differ from tpu_dist's in
    the last bit)."""
    if op in (R.MIN, R.MAX):
        return torch.stack(xs).amin(0) if op == R.MIN else torch.stack(xs).amax(0)
    wide = xs[0].dtype == torch.bfloat16
    acc = xs[0].float() if wide else xs[0].clone()
    for x in xs[1:]:
        x = x.float() if wide else x
        acc = acc * x if op == R.PRODUCT else acc + x
    acc = acc.to(xs[0].dtype)
    if op == R.AVG:
        acc = acc / N if acc.is_floating_point() else torch.div(acc, N, rounding_mode="trunc")
    return acc


def check_collectives():
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        xs = inputs(dtype)

        def body(rank, xs, dtype):
            assert torchtpu.get_eager_mode() == mode
            dev = torch.device("tpu", rank)
            mine = xs[rank].to(dev)
            out = {}
            for op in (R.SUM, R.AVG, R.MIN, R.MAX, R.PRODUCT):
                t = mine.clone()
                dist.all_reduce(t, op=op)
                out[f"all_reduce {op}"] = t
            # A view: the result goes through a device copy, not a buffer swap.
            base = torch.zeros(2, 8, 3, dtype=dtype, device=dev)
            base[1].copy_(mine)
            dist.all_reduce(base[1])
            out["all_reduce view"] = base
            gathered = torch.empty(N * 8, 3, dtype=dtype, device=dev)
            dist.all_gather_into_tensor(gathered, mine)
            out["all_gather_into_tensor"] = gathered
            pieces = [torch.empty(8, 3, dtype=dtype, device=dev) for _ in range(N)]
            dist.all_gather(pieces, mine)
            out["all_gather"] = torch.cat(pieces)
            for op in (R.SUM, R.AVG, R.MAX):
                rs = torch.empty(2, 3, dtype=dtype, device=dev)
                dist.reduce_scatter_tensor(rs, mine, op=op)
                out[f"reduce_scatter_tensor {op}"] = rs
            rs = torch.empty(2, 3, dtype=dtype, device=dev)
            dist.reduce_scatter(rs, list(mine.chunk(N)))
            out["reduce_scatter"] = rs
            b = mine.clone()
            dist.broadcast(b, src=2)
            out["broadcast"] = b
            a2a = torch.empty_like(mine)
            dist.all_to_all_single(a2a, mine)
            out["all_to_all_single"] = a2a
            dist.barrier()
            return {k: v.cpu() for k, v in out.items()}

        got = run_on_devices(body, N, args=(xs, dtype), join_timeout=JOIN)
        for rank in range(N):
            want = {
                f"all_reduce {op}": cpu_reduce(xs, op)
                for op in (R.SUM, R.AVG, R.MIN, R.MAX, R.PRODUCT)
            }
            want["all_reduce view"] = torch.stack([torch.zeros_like(xs[0]), cpu_reduce(xs, R.SUM)])
            want["all_gather_into_tensor"] = torch.cat(xs)
            want["all_gather"] = torch.cat(xs)
            for op in (R.SUM, R.AVG, R.MAX):
                want[f"reduce_scatter_tensor {op}"] = cpu_reduce(xs, op).chunk(N)[rank]
            want["reduce_scatter"] = cpu_reduce(xs, R.SUM).chunk(N)[rank]
            want["broadcast"] = xs[2]
            want["all_to_all_single"] = torch.cat([x.chunk(N)[rank] for x in xs])
            for k, w in want.items():
                assert torch.equal(got[rank][k], w), (dtype, rank, k, got[rank][k], w)
    stats = torchtpu.metrics()["collectives"]
    assert all(v["host_copy_bytes"] == 0 for v in stats.values()), stats
    # 3 dtypes x 4 ranks x 6 all_reduce calls, counted by kind.
    assert stats["all_reduce"]["calls"] == 3 * N * 6, stats

    # Large all-reduces back to back, never waited for in between: XLA:CPU aborted the
    # process when two replicated programs were in flight at once.
    def back_to_back(rank):
        t = torch.ones(1 << 20, device="tpu")
        for _ in range(10):
            dist.all_reduce(t)
        return t.cpu()

    for t in run_on_devices(back_to_back, N, join_timeout=JOIN):
        assert torch.equal(t, torch.full((1 << 20,), float(N**10))), t

    # Unsupported calls say so on every rank (no hang).
    def unsupported(rank):
        t = torch.ones(2, device="tpu")
        try:
            dist.reduce(t, dst=0)
        except RuntimeError as e:  # c10::DistBackendError arrives as RuntimeError
            return str(e)
        return "no error"

    for msg in run_on_devices(unsupported, 2, join_timeout=JOIN):
        assert "reduce is not supported between thread ranks" in msg and "tpu_dist" in msg, msg


def check_ddp():
    from torch.nn.parallel import DistributedDataParallel as DDP

    steps, per_rank = 3, 8

    def batches(n):
        g = torch.Generator().manual_seed(1)
        return [
            (
                torch.randn(per_rank * n, 32, generator=g),
                torch.randint(0, 10, (per_rank * n,), generator=g),
            )
            for _ in range(steps)
        ]

    def train(model, dev, data, rank=0, n=1):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in data:
            x, y = x.chunk(n)[rank].to(dev), y.chunk(n)[rank].to(dev)
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            opt.step()
        inner = model.module if isinstance(model, DDP) else model
        return [p.detach().cpu() for p in inner.parameters()]

    # Built once: the CPU generator is process-global, so seeding then initializing
    # in every rank thread at once would interleave their draws.
    torch.manual_seed(0)
    init = MLP()

    def model():
        return copy.deepcopy(init)

    for n in (2, 4):
        data = batches(n)
        single = train(model().to("tpu:0"), "tpu:0", data)

        def body(rank, data, n):
            dev = torch.device("tpu", rank)
            ddp = DDP(model().to(dev))
            return train(ddp, dev, data, rank, n)

        got = run_on_devices(body, n, args=(data, n), join_timeout=JOIN)
        for rank in range(n):
            for p, q, ref in zip(got[rank], got[0], single):
                assert torch.equal(p, q), f"rank {rank} differs from rank 0"
                torch.testing.assert_close(p, ref, rtol=1e-5, atol=1e-6)
    m = torchtpu.metrics()
    stats = m["collectives"]
    assert (m["fused_ops"] > 0) == (mode == "fused"), m["fused_ops"]
    assert all(v["host_copy_bytes"] == 0 for v in stats.values()), stats
    assert stats["all_reduce"]["calls"] >= steps * (2 + 4), stats


def expect_failure(body, n, timeout=None):
    start = time.monotonic()
    try:
        run_on_devices(body, n, timeout=timeout, join_timeout=JOIN)
    except RuntimeError as e:  # c10::DistBackendError arrives as RuntimeError
        return e, time.monotonic() - start
    raise AssertionError("expected an error")


def check_faults():
    # One rank passes another shape: every rank raises naming both calls.
    def other_shape(rank):
        t = torch.ones(3 if rank == 1 else 4, device="tpu")
        try:
            dist.all_reduce(t)
        except RuntimeError as e:  # c10::DistBackendError arrives as RuntimeError
            return str(e)
        return "no error"

    msgs = run_on_devices(other_shape, 3, join_timeout=JOIN)
    for rank, msg in enumerate(msgs):
        assert f"rank {rank} of 3 reporting" in msg, msg
        assert "rank 0: #1 all_reduce(SUM) Float[4]" in msg, msg
        assert "rank 1: #1 all_reduce(SUM) Float[3]" in msg, msg
        assert "threads.py:" in msg, msg

    # A different collective on one rank.
    def other_call(rank):
        t = torch.ones(4, device="tpu")
        if rank == 0:
            dist.broadcast(t, src=0)
        else:
            dist.all_reduce(t)

    e, _ = expect_failure(other_call, 2)
    assert "broadcast(root 0)" in str(e) and "all_reduce(SUM)" in str(e), e
    assert "rank 1 also raised RuntimeError" in "".join(e.__notes__), e.__notes__

    # A rank that arrives late: the others raise at the timeout naming it; the late
    # rank then finds the group stopped.
    def late(rank):
        t = torch.ones(4, device="tpu")
        dist.all_reduce(t)
        if rank == 2:
            time.sleep(3)  # longer than the timeout
        dist.all_reduce(t)

    e, seconds = expect_failure(late, 3, timeout=1.5)
    msg = str(e)
    assert "collective #2 failed on rank 0 of 3 after waiting at most 1.5 s" in msg, msg
    assert "rank 2: did not reach collective #2" in msg, msg
    assert "rank 1: #2 all_reduce(SUM) Float[4]" in msg, msg
    assert "Last collective every rank agreed on: #1" in msg, msg
    assert "this group stopped at an earlier failure" in "".join(e.__notes__), e.__notes__
    assert seconds < 10, seconds

    # A rank that returns early: the others fail at once instead of at the timeout.
    def returns(rank):
        t = torch.ones(4, device="tpu")
        dist.all_reduce(t)
        if rank != 1:
            dist.all_reduce(t)

    e, seconds = expect_failure(returns, 3, timeout=30)
    assert "rank 1 left the group (its function returned)" in str(e), e
    assert seconds < 10, seconds

    # A rank that raises: the others fail at once, naming it.
    def raises(rank):
        t = torch.ones(4, device="tpu")
        if rank == 1:
            raise ValueError("boom")
        dist.all_reduce(t)

    start = time.monotonic()
    try:
        run_on_devices(raises, 2, timeout=30, join_timeout=JOIN)
        raise AssertionError("expected ValueError")
    except ValueError as e:
        notes = "".join(e.__notes__)
        assert "rank 0 also raised RuntimeError" in notes, notes
        assert "rank 1 left the group (it raised ValueError)" in notes, notes
    assert time.monotonic() - start < 10

    # Uneven all_to_all splits: every rank raises, saying what to use instead.
    def uneven(rank):
        t = torch.arange(4.0, device="tpu")
        dist.all_to_all_single(torch.empty_like(t), t, [1, 3], [1, 3])

    e, _ = expect_failure(uneven, 2)
    assert "uneven split sizes is not supported" in str(e) and "tpu_dist" in str(e), e

    # A tensor on another rank's device fails every rank, naming it.
    def wrong_device(rank):
        dist.all_reduce(torch.ones(4, device="tpu:0"))

    e, _ = expect_failure(wrong_device, 2)
    assert "rank 1: a Float[4] tensor on tpu:0" in str(e), e


start = time.monotonic()
{"collectives": check_collectives, "ddp": check_ddp, "faults": check_faults}[scenario]()
m = torchtpu.metrics()
print(f"compiles {m['compiles']} fused_cuts {m['fused_cuts']}", flush=True)
print(f"{scenario} ok in {time.monotonic() - start:.1f} s", flush=True)
