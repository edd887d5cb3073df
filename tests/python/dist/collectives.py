"""Every collective on tpu tensors against gloo on the same values as CPU tensors:
results must be bit-identical. Run by test_distributed.py under torchrun (2 or 4 ranks).
argv[1]: how the group is made ("default", "tpu_dist", "mixed")."""

import os
import sys

import torch
import torch.distributed as dist
import torchtpu

how = sys.argv[1] if len(sys.argv) > 1 else "mixed"
if how == "default":
    dist.init_process_group()
elif how == "tpu_dist":
    dist.init_process_group("tpu_dist")
else:
    dist.init_process_group("cpu:gloo,tpu:tpu_dist")
# The CPU reference always runs on a gloo group.
gloo = dist.new_group(backend="gloo")
rank, n = dist.get_rank(), dist.get_world_size()
# A group without this rank (DeviceMesh makes such groups): a non-member marker, no error.
solo = dist.new_group([0])
assert (solo == dist.GroupMember.NON_GROUP_MEMBER) == (rank != 0), solo
dev = torch.device("tpu", int(os.environ["LOCAL_RANK"]))
torch.tpu.set_device(dev)
assert torch.tpu.device_count() >= n, torch.tpu.device_count()

DTYPES = (torch.float32, torch.bfloat16, torch.int64)
checked = []


def data(dtype, shape, salt):
    g = torch.Generator().manual_seed(1000 * rank + salt)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    return torch.randint(-4, 5, shape, generator=g).to(dtype)


def same(actual, expected, what):
    a = actual.cpu()
    assert a.dtype == expected.dtype and a.shape == expected.shape, (what, a, expected)
    assert torch.equal(a, expected), f"rank {rank} {what}:\n{a}\nvs gloo\n{expected}"
    checked.append(what)


def ops_for(dtype):
    ops = [dist.ReduceOp.SUM, dist.ReduceOp.MIN, dist.ReduceOp.MAX, dist.ReduceOp.PRODUCT]
    if dtype.is_floating_point:
        ops += [dist.ReduceOp.AVG, "premul"]
    else:
        ops += [dist.ReduceOp.BAND, dist.ReduceOp.BOR]
    return ops


def premul_ref(x, factor):
    # gloo has no PREMUL_SUM: its definition, scale then sum.
    y = x * factor
    dist.all_reduce(y, group=gloo)
    return y


for dtype in DTYPES:
    name = str(dtype).removeprefix("torch.")
    for op in ops_for(dtype):
        x = data(dtype, (3, 5), 1)
        t = x.to(dev)
        if op == "premul":
            dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.5))
            ref = premul_ref(x, 0.5)
        else:
            dist.all_reduce(t, op=op)
            ref = x.clone()
            dist.all_reduce(ref, op=op, group=gloo)
        same(t, ref, f"all_reduce {op} {name}")

    # A strided view: results land in the device storage through the view.
    base = data(dtype, (4, 6), 2)
    tb = base.to(dev)
    view = tb.t()[1:5]
    dist.all_reduce(view)
    ref_base = base.clone()
    ref_view = ref_base.t()[1:5].contiguous()
    dist.all_reduce(ref_view, group=gloo)
    ref_base.t()[1:5] = ref_view
    same(tb, ref_base, f"all_reduce strided view {name}")

    x = data(dtype, (2, 3), 3)
    outs = [torch.empty(2, 3, dtype=dtype, device=dev) for _ in range(n)]
    dist.all_gather(outs, x.to(dev))
    refs = [torch.empty(2, 3, dtype=dtype) for _ in range(n)]
    dist.all_gather(refs, x, group=gloo)
    for i in range(n):
        same(outs[i], refs[i], f"all_gather {name}")

    out = torch.empty(2 * n, 3, dtype=dtype, device=dev)
    dist.all_gather_into_tensor(out, x.to(dev))
    ref = torch.empty(2 * n, 3, dtype=dtype)
    dist.all_gather_into_tensor(ref, x, group=gloo)
    same(out, ref, f"all_gather_into_tensor {name}")

    red_ops = [dist.ReduceOp.SUM] + ([dist.ReduceOp.AVG] if dtype.is_floating_point else [])
    for op in red_ops:
        xs = [data(dtype, (2, 2), 10 + i) for i in range(n)]
        o = torch.empty(2, 2, dtype=dtype, device=dev)
        dist.reduce_scatter(o, [v.to(dev) for v in xs], op=op)
        r = torch.empty(2, 2, dtype=dtype)
        dist.reduce_scatter(r, [v.clone() for v in xs], op=op, group=gloo)
        same(o, r, f"reduce_scatter {op} {name}")

        big = data(dtype, (2 * n, 3), 20)
        o = torch.empty(2, 3, dtype=dtype, device=dev)
        dist.reduce_scatter_tensor(o, big.to(dev), op=op)
        r = torch.empty(2, 3, dtype=dtype)
        dist.reduce_scatter_tensor(r, big.clone(), op=op, group=gloo)
        same(o, r, f"reduce_scatter_tensor {op} {name}")
    if dtype.is_floating_point:
        big = data(dtype, (2 * n, 3), 21)
        o = torch.empty(2, 3, dtype=dtype, device=dev)
        dist.reduce_scatter_tensor(o, big.to(dev), op=dist._make_nccl_premul_sum(2.0))
        scaled = big * 2.0
        r = torch.empty(2, 3, dtype=dtype)
        dist.reduce_scatter_tensor(r, scaled, group=gloo)
        same(o, r, f"reduce_scatter_tensor PREMUL_SUM {name}")

    root = n - 1
    x = data(dtype, (5,), 30)
    t = x.to(dev)
    dist.broadcast(t, src=root)
    ref = x.clone()
    dist.broadcast(ref, src=root, group=gloo)
    same(t, ref, f"broadcast {name}")

    x = data(dtype, (5,), 31)
    t = x.to(dev)
    dist.reduce(t, dst=root, op=dist.ReduceOp.SUM)
    ref = x.clone()
    dist.reduce(ref, dst=root, op=dist.ReduceOp.SUM, group=gloo)
    same(t, ref if rank == root else x, f"reduce {name}")

    ins = [data(dtype, (2,), 40 + i) for i in range(n)]
    outs = [torch.empty(2, dtype=dtype, device=dev) for _ in range(n)]
    dist.all_to_all(outs, [v.to(dev) for v in ins])
    # gloo's list form is gone in some torch releases; its single form is the reference.
    ref = torch.empty(2 * n, dtype=dtype)
    dist.all_to_all_single(ref, torch.cat(ins), group=gloo)
    for i in range(n):
        same(outs[i], ref[2 * i : 2 * i + 2], f"all_to_all {name}")
    # Uneven pieces (gloo's list form wants equal ones: its single form is the reference).
    ins = [data(dtype, (i + 1,), 45 + i) for i in range(n)]
    outs = [torch.empty(rank + 1, dtype=dtype, device=dev) for _ in range(n)]
    dist.all_to_all(outs, [v.to(dev) for v in ins])
    r = torch.empty(n * (rank + 1), dtype=dtype)
    dist.all_to_all_single(r, torch.cat(ins), [rank + 1] * n, [i + 1 for i in range(n)], group=gloo)
    same(torch.cat([o.cpu() for o in outs]), r, f"all_to_all uneven {name}")

    x = data(dtype, (2 * n, 3), 50)
    o = torch.empty(2 * n, 3, dtype=dtype, device=dev)
    dist.all_to_all_single(o, x.to(dev))
    r = torch.empty(2 * n, 3, dtype=dtype)
    dist.all_to_all_single(r, x, group=gloo)
    same(o, r, f"all_to_all_single {name}")
    # Uneven: rank r sends i+1 rows to rank i, receives r+1 rows from each.
    in_splits = [i + 1 for i in range(n)]
    out_splits = [rank + 1] * n
    x = data(dtype, (sum(in_splits), 2), 51)
    o = torch.empty(sum(out_splits), 2, dtype=dtype, device=dev)
    dist.all_to_all_single(o, x.to(dev), out_splits, in_splits)
    r = torch.empty(sum(out_splits), 2, dtype=dtype)
    dist.all_to_all_single(r, x, out_splits, in_splits, group=gloo)
    same(o, r, f"all_to_all_single uneven {name}")

    chunks = [data(dtype, (3,), 60 + i) for i in range(n)] if rank == 0 else None
    o = torch.empty(3, dtype=dtype, device=dev)
    dist.scatter(o, [c.to(dev) for c in chunks] if chunks else None, src=0)
    r = torch.empty(3, dtype=dtype)
    dist.scatter(r, [c.clone() for c in chunks] if chunks else None, src=0, group=gloo)
    same(o, r, f"scatter {name}")

    x = data(dtype, (3,), 70)
    gl = [torch.empty(3, dtype=dtype, device=dev) for _ in range(n)] if rank == 0 else None
    dist.gather(x.to(dev), gl, dst=0)
    rl = [torch.empty(3, dtype=dtype) for _ in range(n)] if rank == 0 else None
    dist.gather(x, rl, dst=0, group=gloo)
    if rank == 0:
        for i in range(n):
            same(gl[i], rl[i], f"gather {name}")

    # Point to point: a ring.
    x = data(dtype, (4,), 80)
    got = torch.empty(4, dtype=dtype, device=dev)
    reqs = [dist.isend(x.to(dev), (rank + 1) % n), dist.irecv(got, (rank - 1) % n)]
    for q in reqs:
        q.wait()
    ref = torch.empty(4, dtype=dtype)
    reqs = [dist.isend(x, (rank + 1) % n, group=gloo), dist.irecv(ref, (rank - 1) % n, group=gloo)]
    for q in reqs:
        q.wait()
    same(got, ref, f"send/recv {name}")

# async_op: the work completes with its outputs, and its future carries them.
t = torch.full((3,), float(rank + 1), device=dev)
work = dist.all_reduce(t, async_op=True)
work.wait()
fut_val = work.get_future().wait()
same(fut_val[0], torch.full((3,), float(n * (n + 1) // 2)), "async all_reduce future")
assert work.is_completed()
same(work.result()[0], torch.full((3,), float(n * (n + 1) // 2)), "async all_reduce result()")

# Coalesced calls: the manager's work completes with every output.
with dist._coalescing_manager(async_ops=True) as cm:
    a = torch.ones(3, device=dev) * (rank + 1)
    b = torch.ones(2, device=dev) * (rank + 1)
    dist.all_reduce(a)
    dist.all_reduce(b)
cm.wait()
same(a, torch.full((3,), float(n * (n + 1) // 2)), "coalesced all_reduce")
same(b, torch.full((2,), float(n * (n + 1) // 2)), "coalesced all_reduce")
# The coalesced entry points themselves, against gloo.
xs = [data(torch.float32, (4,), 90), data(torch.float32, (2, 3), 91)]
ts = [x.to(dev) for x in xs]
dist.all_reduce_coalesced(ts)
refs = [x.clone() for x in xs]
dist.all_reduce_coalesced(refs, group=gloo)
for t, r in zip(ts, refs):
    same(t, r, "all_reduce_coalesced")
bigs = [data(torch.float32, (2 * n,), 92), data(torch.float32, (n, 3), 93)]
outs = [torch.empty(2, device=dev), torch.empty(1, 3, device=dev)]
with dist._coalescing_manager(async_ops=True) as cm:
    for o, big in zip(outs, bigs):
        dist.reduce_scatter_tensor(o, big.to(dev))
cm.wait()
for o, big in zip(outs, bigs):
    r = torch.empty(o.shape)
    dist.reduce_scatter_tensor(r, big.clone(), group=gloo)
    same(o, r, "reduce_scatter_tensor_coalesced")
assert torchtpu.metrics()["collectives"].get("reduce_scatter_tensor_coalesced", {}).get("calls"), (
    torchtpu.metrics()["collectives"]
)

# The backend keeps no reference to finished outputs: their memory comes back.
torch.tpu.synchronize()
base = torch.tpu.memory_allocated()
for _ in range(10):
    t = torch.ones(1 << 16, device=dev)
    dist.all_reduce(t)
    del t
torch.tpu.synchronize()
assert torch.tpu.memory_allocated() <= base, (base, torch.tpu.memory_allocated())

dist.barrier()
pg = dist.distributed_c10d._get_default_group()
seq = pg._get_backend(dev)._get_sequence_number_for_group()
assert seq > 0, seq
stats = torchtpu.metrics()["collectives"]
assert stats["all_reduce"]["calls"] >= 3 * 6, stats
assert stats["all_reduce"]["host_copy_bytes"] > 0, stats
if torchtpu.get_eager_mode() == "fused":
    assert torchtpu.metrics()["fused_cuts"].get("collective", 0) > 0, torchtpu.metrics()[
        "fused_cuts"
    ]
print(f"rank {rank}: {len(checked)} checks bit-identical to gloo; seq {seq}", flush=True)
dist.destroy_process_group()
