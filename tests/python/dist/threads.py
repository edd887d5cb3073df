"""c10d ranks over the devices of one process (the tpu_local backend, one thread per
device through torchtpu.distributed.run_on_devices). Run with TORCHTPU_NUM_DEVICES=4.
argv: scenario (collectives|more|p2p|groups|fsdp_dtensor|ddp|faults|spmd) mode (strict|fused). Prints "<scenario> ok" last."""

import copy
import sys
import threading
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
            if dtype.is_floating_point:
                # PREMUL_SUM (FSDP2's gradient scaling), with a Python and a tensor factor.
                t = mine.clone()
                dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.5))
                out["all_reduce premul"] = t
                rs = torch.empty(2, 3, dtype=dtype, device=dev)
                factor = torch.tensor(0.25, device=dev)
                dist.reduce_scatter_tensor(rs, mine, op=dist._make_nccl_premul_sum(factor))
                out["reduce_scatter_tensor premul"] = rs
                rs = torch.empty(2, 3, dtype=dtype, device=dev)
                dist.reduce_scatter(rs, list(mine.chunk(N)), op=dist._make_nccl_premul_sum(2.0))
                out["reduce_scatter premul"] = rs
                assert torch.equal(mine.cpu(), xs[rank].to(dtype)), "inputs must not change"
            b = mine.clone()
            work = dist.broadcast(b, src=2, async_op=True)
            assert work.wait() and work.is_completed()
            assert work.result()[0] is b and work.get_future().value()[0] is b
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
            if dtype.is_floating_point:
                want["all_reduce premul"] = cpu_reduce([x * 0.5 for x in xs], R.SUM)
                quarter = cpu_reduce([x * 0.25 for x in xs], R.SUM)
                want["reduce_scatter_tensor premul"] = quarter.chunk(N)[rank]
                double = cpu_reduce([x * 2.0 for x in xs], R.SUM)
                want["reduce_scatter premul"] = double.chunk(N)[rank]
            want["broadcast"] = xs[2]
            want["all_to_all_single"] = torch.cat([x.chunk(N)[rank] for x in xs])
            for k, w in want.items():
                assert torch.equal(got[rank][k], w), (dtype, rank, k, got[rank][k], w)
    stats = torchtpu.metrics()["collectives"]
    assert all(v["host_copy_bytes"] == 0 for v in stats.values()), stats
    # 3 dtypes x 4 ranks x 6 all_reduce calls, and one PREMUL_SUM each for 2 float dtypes.
    assert stats["all_reduce"]["calls"] == 3 * N * 6 + 2 * N, stats

    # Large all-reduces back to back, never waited for in between: XLA:CPU aborted the
    # process when two replicated programs were in flight at once.
    def back_to_back(rank):
        t = torch.ones(1 << 20, device="tpu")
        for _ in range(10):
            dist.all_reduce(t)
        return t.cpu()

    for t in run_on_devices(back_to_back, N, join_timeout=JOIN):
        assert torch.equal(t, torch.full((1 << 20,), float(N**10))), t

    # A call one rank makes wrongly fails on every rank (no hang), as DistBackendError.
    def bad_reduce(rank):
        t = torch.ones(2, device="tpu")
        try:
            dist.reduce(t, dst=0, op=R.BAND if rank == 0 else R.SUM)
        except dist.DistBackendError as e:
            return str(e)
        return "no error"

    for msg in run_on_devices(bad_reduce, 2, join_timeout=JOIN):
        assert "rank 0: reduce with BAND on Float is not supported" in msg, msg
        assert "rank 1 ran #1 reduce(SUM, root 0) Float[2]" in msg, msg


def sent_rows(r, j):
    """Rows rank r sends to rank j in the uneven all_to_all checks (0 to 4)."""
    return (r + 2 * j) % 5


def piece(xs, r, j):
    """What rank r sends to rank j: rows of its input, shifted by j so pieces differ."""
    return xs[r][: sent_rows(r, j)] + j


def check_more():
    """reduce, gather, scatter, uneven and list all_to_all, coalesced calls."""
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        xs = inputs(dtype)

        def body(rank, xs, dtype):
            dev = torch.device("tpu", rank)
            mine = xs[rank].to(dev)
            out = {}
            for op, dst in ((R.SUM, 1), (R.AVG, 3), (R.MAX, 0)):
                t = mine.clone()
                dist.reduce(t, dst=dst, op=op)
                out[f"reduce {op}"] = t
            g = (
                [torch.empty(8, 3, dtype=dtype, device=dev) for _ in range(N)]
                if rank == 2
                else None
            )
            dist.gather(mine, g, dst=2)
            out["gather"] = torch.cat(g) if rank == 2 else mine
            s = torch.empty(2, 3, dtype=dtype, device=dev)
            dist.scatter(s, list(mine.chunk(N)) if rank == 1 else None, src=1)
            out["scatter"] = s
            # Uneven splits, zero-row pieces included.
            sends = [piece(xs, rank, j).to(dev) for j in range(N)]
            got = torch.empty(sum(sent_rows(j, rank) for j in range(N)), 3, dtype=dtype, device=dev)
            dist.all_to_all_single(
                got,
                torch.cat(sends),
                [sent_rows(j, rank) for j in range(N)],
                [sent_rows(rank, j) for j in range(N)],
            )
            out["all_to_all_single uneven"] = got
            lists = [torch.empty(sent_rows(j, rank), 3, dtype=dtype, device=dev) for j in range(N)]
            dist.all_to_all(lists, sends)
            out["all_to_all lists"] = torch.cat(lists)
            # Coalesced: one program for the calls inside the manager, dtypes mixed.
            a, b = mine.clone(), (mine[:2] * 2).to(torch.int64)
            with dist._coalescing_manager():
                dist.all_reduce(a)
                dist.all_reduce(b)
            out["all_reduce coalesced a"], out["all_reduce coalesced b"] = a, b
            g1 = torch.empty(N * 8, 3, dtype=dtype, device=dev)
            g2 = torch.empty(N * 2, dtype=dtype, device=dev)
            with dist._coalescing_manager():
                dist.all_gather_into_tensor(g1, mine)
                dist.all_gather_into_tensor(g2, mine[0, :2])
            out["all_gather_into_tensor coalesced"] = torch.cat([g1.flatten(), g2])
            r1 = torch.empty(2, 3, dtype=dtype, device=dev)
            r2 = torch.empty(1, dtype=dtype, device=dev)
            with dist._coalescing_manager():
                dist.reduce_scatter_tensor(r1, mine)
                dist.reduce_scatter_tensor(r2, mine.flatten()[:N])
            out["reduce_scatter_tensor coalesced"] = torch.cat([r1.flatten(), r2])
            c = [mine.clone(), mine[1].clone()]
            dist.all_reduce_coalesced(c, op=R.MAX)
            out["all_reduce_coalesced"] = torch.cat([c[0].flatten(), c[1]])
            lists = [
                [torch.empty_like(mine) for _ in range(N)],
                [torch.empty(3, dtype=dtype, device=dev) for _ in range(N)],
            ]
            dist.all_gather_coalesced(lists, [mine, mine[rank]])
            out["all_gather_coalesced"] = torch.cat(
                [torch.cat(lists[0]).flatten(), torch.cat(lists[1])]
            )
            # The device path of the coalescing manager: startCoalescing / endCoalescing.
            d = mine.clone()
            with dist._coalescing_manager(device=dev):
                dist.broadcast(d, src=3)
            out["broadcast in coalescing"] = d
            return {k: v.cpu() for k, v in out.items()}

        got = run_on_devices(body, N, args=(xs, dtype), join_timeout=JOIN)
        for rank in range(N):
            want = {}
            for op, dst in ((R.SUM, 1), (R.AVG, 3), (R.MAX, 0)):
                want[f"reduce {op}"] = cpu_reduce(xs, op) if rank == dst else xs[rank]
            want["gather"] = torch.cat(xs) if rank == 2 else xs[rank]
            want["scatter"] = xs[1].chunk(N)[rank]
            want["all_to_all_single uneven"] = torch.cat([piece(xs, j, rank) for j in range(N)])
            want["all_to_all lists"] = want["all_to_all_single uneven"]
            want["all_reduce coalesced a"] = cpu_reduce(xs, R.SUM)
            want["all_reduce coalesced b"] = cpu_reduce(
                [(x[:2] * 2).to(torch.int64) for x in xs], R.SUM
            )
            want["all_gather_into_tensor coalesced"] = torch.cat(
                [torch.cat(xs).flatten(), torch.cat([x[0, :2] for x in xs])]
            )
            want["reduce_scatter_tensor coalesced"] = torch.cat(
                [
                    cpu_reduce(xs, R.SUM).chunk(N)[rank].flatten(),
                    cpu_reduce([x.flatten()[:N] for x in xs], R.SUM)[rank : rank + 1],
                ]
            )
            want["all_reduce_coalesced"] = torch.cat(
                [cpu_reduce(xs, R.MAX).flatten(), cpu_reduce([x[1] for x in xs], R.MAX)]
            )
            want["all_gather_coalesced"] = torch.cat(
                [torch.cat(xs).flatten(), torch.cat([x[r] for r, x in enumerate(xs)])]
            )
            want["broadcast in coalescing"] = xs[3]
            for k, w in want.items():
                assert torch.equal(got[rank][k], w), (dtype, rank, k, got[rank][k], w)
    stats = torchtpu.metrics()["collectives"]
    assert all(v["host_copy_bytes"] == 0 for v in stats.values()), stats
    # One call per rank and dtype for each coalesced kind: one rendezvous, one program.
    for kind in (
        "all_reduce_coalesced",
        "all_gather_into_tensor_coalesced",
        "reduce_scatter_tensor_coalesced",
        "all_gather_coalesced",
    ):
        assert stats[kind]["calls"] == 3 * N * (2 if kind == "all_reduce_coalesced" else 1), (
            kind,
            stats,
        )
    assert "all_reduce" not in stats, stats


def check_p2p():
    xs = inputs(torch.float32)

    def body(rank, xs):
        dev = torch.device("tpu", rank)
        mine = xs[rank].to(dev)
        out = {}
        # A ring of isend / irecv: posting both before waiting cannot deadlock.
        got = torch.empty_like(mine)
        works = [dist.isend(mine, (rank + 1) % N), dist.irecv(got, (rank - 1) % N)]
        for w in works:
            w.wait()
        out["ring"] = got
        # Blocking pairs with tags, two in a row on one key (received in order), and a
        # receive into a view.
        if rank == 0:
            works = [dist.isend(mine, 1, tag=5), dist.isend(mine * 2, 1, tag=5)]
            dist.send(mine[:, 0].contiguous(), 1, tag=7)  # received first
            for w in works:
                w.wait()
        elif rank == 1:
            a, b = torch.empty_like(mine), torch.empty_like(mine)
            base = torch.zeros(8, 3, device=dev)
            dist.recv(base[:, 1], 0, tag=7)
            dist.recv(a, 0, tag=5)
            dist.recv(b, 0, tag=5)
            out["tags"] = torch.cat([a, b, base])
        # From any rank: the source comes back.
        if rank == 3:
            t = torch.empty_like(mine)
            out["source"] = torch.tensor(dist.recv(t))
            out["any"] = t
        elif rank == 2:
            dist.send(mine + 1, 3)
        return {k: v.cpu() for k, v in out.items()}

    got = run_on_devices(body, N, args=(xs,), join_timeout=JOIN)
    for rank in range(N):
        assert torch.equal(got[rank]["ring"], xs[(rank - 1) % N]), rank
    base = torch.zeros(8, 3)
    base[:, 1] = xs[0][:, 0]
    assert torch.equal(got[1]["tags"], torch.cat([xs[0], xs[0] * 2, base])), got[1]["tags"]
    assert got[3]["source"].item() == 2 and torch.equal(got[3]["any"], xs[2] + 1), got[3]
    stats = torchtpu.metrics()["collectives"]
    assert stats["send"]["calls"] == N + 4 and stats["recv"]["calls"] == N + 4, stats
    assert all(v["host_copy_bytes"] == 0 for v in stats.values()), stats


def check_groups():
    """Subgroups whose ranks are not devices 0..n-1: each group rank runs on its global
    rank's device (new_group, a 2-D DeviceMesh's dimension groups, DTensor on it)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    xs = inputs(torch.float32)
    g = torch.Generator().manual_seed(5)
    w = torch.randn(8, 4, generator=g)

    def body(rank, xs):
        dev = torch.device("tpu", rank)
        mine = xs[rank].to(dev)
        out = {}
        odd, even = dist.new_group([1, 3]), dist.new_group([0, 2])
        group = odd if rank % 2 else even
        t = mine.clone()
        dist.all_reduce(t, group=group)
        out["all_reduce"] = t
        gathered = torch.empty(2 * 8, 3, device=dev)
        dist.all_gather_into_tensor(gathered, mine, group=group)
        out["all_gather"] = gathered
        b = mine.clone()
        dist.broadcast(b, group=group, group_src=1)
        out["broadcast"] = b
        got = torch.empty_like(mine)
        if dist.get_rank(group) == 0:
            dist.send(mine * 3, group=group, group_dst=1)
        else:
            dist.recv(got, group=group, group_src=0)
            out["recv"] = got
        # A 2-D mesh: dimension 0 groups ranks {0, 2} and {1, 3}.
        mesh = init_device_mesh("tpu", (2, 2))
        t = mine.clone()
        dist.all_reduce(t, group=mesh.get_group(0))
        out["mesh dim 0"] = t
        d = distribute_tensor(w.to(dev), mesh, [Shard(0), Replicate()])
        out["dtensor local"] = d.to_local()
        out["dtensor full"] = d.redistribute(mesh, [Replicate(), Replicate()]).to_local()
        return {k: v.cpu() for k, v in out.items()}

    got = run_on_devices(body, N, args=(xs,), join_timeout=JOIN)
    for rank in range(N):
        peers = [rank % 2, rank % 2 + 2]
        want = {
            "all_reduce": xs[peers[0]] + xs[peers[1]],
            "all_gather": torch.cat([xs[p] for p in peers]),
            "broadcast": xs[peers[1]],
            "mesh dim 0": xs[peers[0]] + xs[peers[1]],
            "dtensor local": w.chunk(2)[rank // 2],
            "dtensor full": w,
        }
        if rank >= 2:
            want["recv"] = xs[peers[0]] * 3
        assert got[rank].keys() == want.keys(), (rank, got[rank].keys())
        for k, v in want.items():
            assert torch.equal(got[rank][k], v), (rank, k, got[rank][k], v)
    stats = torchtpu.metrics()["collectives"]
    assert all(v["host_copy_bytes"] == 0 for v in stats.values()), stats


def check_fsdp_dtensor():
    """DTensor on a mesh of thread ranks and an FSDP2 step, against one device."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    g = torch.Generator().manual_seed(3)
    w, x = torch.randn(8, 8, generator=g), torch.randn(16, 8, generator=g)

    def dtensor(rank):
        mesh = init_device_mesh("tpu", (N,))
        a = distribute_tensor(w.to(f"tpu:{rank}"), mesh, [Shard(0)])
        b = distribute_tensor(x.t().contiguous().to(f"tpu:{rank}"), mesh, [Replicate()])
        got = {
            # Sharding propagation runs the op under a FakeTensorMode: rank threads at
            # once once got fake tensors on another rank's device (now serialized).
            "matmul": [(a @ b).full_tensor() for _ in range(5)][-1],
            "local": a.to_local(),
            "full": a.full_tensor(),
            "replicated": a.redistribute(mesh, [Replicate()]).to_local(),
            "gathered rows": b.redistribute(mesh, [Shard(1)]).full_tensor(),
        }
        return {k: v.cpu() for k, v in got.items()}

    for rank, got in enumerate(run_on_devices(dtensor, N, join_timeout=JOIN)):
        assert torch.equal(got["local"], w.chunk(N)[rank]), rank
        assert torch.equal(got["full"], w) and torch.equal(got["replicated"], w), rank
        assert torch.equal(got["gathered rows"], x.t()), rank
        # Each rank's rows are its shard's own product, as one device computes it.
        rows = torch.cat([(w.chunk(N)[k].to("tpu:0") @ x.t().to("tpu:0")).cpu() for k in range(N)])
        assert torch.equal(got["matmul"], rows), rank

    torch.manual_seed(0)
    init = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))

    def train(m, xs, fsdp):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for _ in range(2):
            opt.zero_grad()
            m(xs).square().mean().backward()
            opt.step()
        if fsdp:
            return [p.full_tensor().detach().cpu() for p in m.parameters()]
        return [p.detach().cpu() for p in m.parameters()]

    def fsdp(rank):
        m = copy.deepcopy(init).to(f"tpu:{rank}")
        for layer in (m[0], m[2], m):
            fully_shard(layer)
        return train(m, x.chunk(N)[rank].to(f"tpu:{rank}"), True)

    single = train(copy.deepcopy(init).to("tpu:0"), x.to("tpu:0"), False)
    for rank, got in enumerate(run_on_devices(fsdp, N, join_timeout=JOIN)):
        for p, ref in zip(got, single):
            torch.testing.assert_close(p, ref, rtol=1e-5, atol=1e-6)
    stats = torchtpu.metrics()["collectives"]
    assert all(v["host_copy_bytes"] == 0 for v in stats.values()), stats


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
    except dist.DistBackendError as e:  # every failure a rank sees, as torch's own backends
        return e, time.monotonic() - start
    raise AssertionError("expected an error")


def check_faults():
    # One rank passes another shape: every rank raises naming both calls.
    def other_shape(rank):
        t = torch.ones(3 if rank == 1 else 4, device="tpu")
        try:
            dist.all_reduce(t)
        except dist.DistBackendError as e:
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
    assert "rank 1 also raised DistBackendError" in "".join(e.__notes__), e.__notes__

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
        assert "rank 0 also raised DistBackendError" in notes, notes
        assert "rank 1 left the group (it raised ValueError)" in notes, notes
    assert time.monotonic() - start < 10

    # all_to_all splits that do not pair up: every rank raises naming the pair.
    def unpaired(rank):
        t = torch.arange(4.0, device="tpu")
        dist.all_to_all_single(torch.empty_like(t), t, [1, 3], [1, 3])

    e, _ = expect_failure(unpaired, 2)
    assert "rank 0 sends 3 rows to rank 1, which expects 1 from it" in str(e), e

    # A receive of another size: both sides raise, naming both calls.
    def p2p_size(rank):
        if rank == 0:
            dist.send(torch.ones(3, device="tpu"), 1)
        else:
            dist.recv(torch.empty(4, device="tpu"), 0)

    e, _ = expect_failure(p2p_size, 2)
    assert "rank 1 receives Float[4]" in str(e) and "rank 0 sent Float[3]" in str(e), e
    assert "also raised DistBackendError" in "".join(e.__notes__), e.__notes__

    # A receive with another tag: no hang; the receiver's error shows what was sent.
    def p2p_tag(rank):
        if rank == 0:
            dist.send(torch.ones(3, device="tpu"), 1, tag=1)
        else:
            dist.recv(torch.empty(3, device="tpu"), 0, tag=2)

    e, seconds = expect_failure(p2p_tag, 2, timeout=1.5)
    # Whichever side times out first names the other side's call and tag (the other
    # then sees it gone).
    msg = str(e) + "".join(e.__notes__)
    assert "within 1.5 s (check src and tag); waiting for rank 1:" in msg, msg
    assert "tag 1" in msg and "tag 2" in msg, msg
    assert seconds < 10, seconds

    # A sender that never comes: the receiver fails at the timeout, or at once when
    # the sender's function returns.
    def p2p_late(rank):
        if rank == 0:
            time.sleep(3)
        else:
            dist.recv(torch.empty(3, device="tpu"), 0)

    e, seconds = expect_failure(p2p_late, 2, timeout=1.5)
    assert "nothing arrived within 1.5 s; no send to rank 1 is waiting" in str(e), e
    assert seconds < 10, seconds

    def p2p_gone(rank):
        if rank == 1:
            dist.recv(torch.empty(3, device="tpu"), 0)

    e, seconds = expect_failure(p2p_gone, 2, timeout=30)
    assert "rank 0 left the group (its function returned) without sending it" in str(e), e
    assert seconds < 10, seconds

    # A tensor on another rank's device fails every rank, naming it.
    def wrong_device(rank):
        dist.all_reduce(torch.ones(4, device="tpu:0"))

    e, _ = expect_failure(wrong_device, 2)
    assert "rank 1: a Float[4] tensor on tpu:0" in str(e), e


def check_spmd():
    """SPMD mode (torchtpu.distributed.spmd): collectives recorded into each rank's Fused
    graph, which runs as one replicated program over the ranks; results equal to SPMD
    mode off, fewer graphs, no recompiles once warm, rank-specific reads fall back to one
    program per collective, and a real mismatch raises on every rank."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from torchtpu.distributed import spmd

    fused = mode == "fused"

    def collectives(rank, steps=3):
        dev = torch.device("tpu", rank)
        out = []
        for dtype in (torch.float32, torch.bfloat16, torch.int64):
            x = inputs(dtype)[rank].to(dev)
            for step in range(steps):
                y = x * (step + 1) + 1  # recorded before the collective and after it
                dist.all_reduce(y)
                y = y * 2
                top = x.clone()
                dist.all_reduce(top, op=R.MAX)
                avg = x + step
                dist.all_reduce(avg, op=R.AVG)
                gathered = torch.empty(N * 8, 3, dtype=dtype, device=dev)
                dist.all_gather_into_tensor(gathered, y)
                rs = torch.empty(2, 3, dtype=dtype, device=dev)
                dist.reduce_scatter_tensor(rs, gathered[8:16], op=R.AVG)
                out += [y, top, avg, gathered, rs]
                if dtype.is_floating_point:
                    pm = torch.empty(2, 3, dtype=dtype, device=dev)
                    dist.reduce_scatter_tensor(pm, y, op=dist._make_nccl_premul_sum(0.5))
                    out.append(pm)
                a, b = y + 1, x - 1
                with dist._coalescing_manager():
                    dist.all_reduce(a)
                    dist.all_reduce(b)
                out += [a, b]
        return [t.cpu() for t in out]

    def counters():
        m = torchtpu.metrics()
        return m["fused_graphs"], m["fused_cuts"], m["compiles"]

    def run(fn, on, *args):
        graphs0, cuts0, _ = counters()
        with spmd(on):
            got = run_on_devices(fn, N, args=args, join_timeout=JOIN)
        graphs1, cuts1, compiles = counters()
        cuts = {k: v - cuts0.get(k, 0) for k, v in cuts1.items() if v != cuts0.get(k, 0)}
        return got, graphs1 - graphs0, cuts, compiles

    ref, ref_graphs, ref_cuts, _ = run(collectives, False)
    got, graphs, cuts, _ = run(collectives, True)
    for rank in range(N):
        for k, (p, q) in enumerate(zip(got[rank], ref[rank])):
            assert torch.equal(p, q), (rank, k, p, q)
    print(f"collectives: {graphs} graphs with SPMD, {ref_graphs} without; cuts {cuts}")
    if fused:
        assert cuts.get("collective", 0) == 0 and ref_cuts["collective"] > 0, (cuts, ref_cuts)
        assert graphs * 3 <= ref_graphs, (graphs, ref_graphs)
        # Warm: the same work again compiles nothing.
        _, _, _, before = run(collectives, True)
        _, _, _, after = run(collectives, True)
        assert after == before, (before, after)

    # DDP: each step's gradient all-reduce inside the step's graph.
    steps, per_rank = 4, 8
    g = torch.Generator().manual_seed(1)
    data = [
        (
            torch.randn(per_rank * N, 32, generator=g),
            torch.randint(0, 10, (per_rank * N,), generator=g),
        )
        for _ in range(steps)
    ]
    torch.manual_seed(0)
    init = MLP()

    def train(model, dev, rank=0, n=1, log=False):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        losses = []
        for x, y in data:
            x, y = x.chunk(n)[rank].to(dev), y.chunk(n)[rank].to(dev)
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            if log and rank == 0:
                losses.append(loss.item())  # rank 0 alone reads: MPMD inside SPMD mode
        inner = model.module if isinstance(model, DDP) else model
        return [p.detach().cpu() for p in inner.parameters()]

    def ddp(rank, log):
        dev = torch.device("tpu", rank)
        return train(DDP(copy.deepcopy(init).to(dev)), dev, rank, N, log)

    single = train(copy.deepcopy(init).to("tpu:0"), "tpu:0")
    for log in (False, True):
        got, graphs, cuts, _ = run(ddp, True, log)
        _, ref_graphs, ref_cuts, _ = run(ddp, False, log)
        print(
            f"ddp (rank 0 logs: {log}): {graphs} graphs, cuts {cuts}; off: {ref_graphs}, {ref_cuts}"
        )
        for rank in range(N):
            for p, q, want in zip(got[rank], got[0], single):
                assert torch.equal(p, q), f"rank {rank} differs from rank 0"
                torch.testing.assert_close(p, want, rtol=1e-5, atol=1e-6)
        if fused:
            assert cuts.get("collective", 0) < ref_cuts["collective"], (cuts, ref_cuts)
            assert (cuts.get("spmd_programs_differ", 0) > 0) == log or not log, cuts

    if fused:
        # Rank 1 waits for rank 0 in the SPMD meet, holding its graph, while rank 0
        # touches rank 1's tensor x: keeps it, frees it, or reads it.
        shared, made = {}, threading.Event()

        def touch_other(rank, action):
            t = torch.ones(4, device="tpu")
            x = t * 3  # the same program on both ranks
            dist.all_reduce(t)
            if rank == 1:
                shared["x"], x = x, None
                made.set()
                return t.cpu()  # runs the graph: waits in the meet for rank 0
            assert made.wait(JOIN)
            if action != "keep":
                time.sleep(1)  # rank 1 is in the meet by now
            if action == "read":
                return shared["x"].cpu()
            if action == "free":
                del shared["x"]
            return t.cpu()

        with spmd():
            # A free must not wait for the graph (the first run compiles, the second
            # meets at once).
            for action in ("keep", "free"):
                made.clear()
                got = run_on_devices(touch_other, 2, args=(action,), timeout=8, join_timeout=JOIN)
                assert all(torch.equal(g, torch.full((4,), 2.0)) for g in got), got
            # A read must wait for it: both fail at the timeout, and the error says what
            # rank 0 waits for.
            made.clear()
            e, seconds = expect_failure(lambda rank: touch_other(rank, "read"), 2, timeout=3)
        msg = str(e) + "".join(getattr(e, "__notes__", []))
        assert (
            "rank 0: did not reach collective #1: its thread waits for the lock of tpu:1's "
            "Fused graph" in msg
        ), msg
        assert seconds < 20, seconds

    # A real mismatch: one rank's collective has another shape.
    def other_shape(rank):
        t = torch.ones(3 if rank == 1 else 4, device="tpu")
        dist.all_reduce(t)
        return t.cpu()

    with spmd():
        e, seconds = expect_failure(other_shape, 3)
    msg = str(e)
    if fused:
        assert "SPMD program(1 op holding all_reduce(sum) Float[4]" in msg, msg
        assert "SPMD program(1 op holding all_reduce(sum) Float[3]" in msg, msg
    assert seconds < 20, seconds

    # A rank that returns before its collective: the others fail at once.
    def gone(rank):
        t = torch.ones(4, device="tpu")
        if rank != 1:
            dist.all_reduce(t)
        return t.cpu()

    with spmd():
        e, seconds = expect_failure(gone, 3)
    assert "rank 1 left the group" in str(e), e
    assert seconds < 20, seconds
    assert (torchtpu.metrics()["fused_ops"] > 0) == fused


start = time.monotonic()
{
    "collectives": check_collectives,
    "more": check_more,
    "p2p": check_p2p,
    "groups": check_groups,
    "fsdp_dtensor": check_fsdp_dtensor,
    "ddp": check_ddp,
    "faults": check_faults,
    "spmd": check_spmd,
}[scenario]()
m = torchtpu.metrics()
print(f"compiles {m['compiles']} fused_cuts {m['fused_cuts']}", flush=True)
print(f"{scenario} ok in {time.monotonic() - start:.1f} s", flush=True)
