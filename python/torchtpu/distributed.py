"""torch.distributed on tpu: the ``tpu_dist`` c10d backend.

Importing torchtpu registers it for the ``tpu`` device, so under torchrun
``dist.init_process_group()`` (gloo for cpu, tpu_dist for tpu),
``init_process_group("tpu_dist")`` (tpu_dist for both) and
``init_process_group("cpu:gloo,tpu:tpu_dist")`` all work. Before every collective the
ranks agree on what they run; a mismatch or a rank that stops arriving raises on
every surviving rank within ``TORCHTPU_DIST_TIMEOUT`` seconds (default 30).
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch.distributed as dist

from . import _C

NAME = "tpu_dist"
DEFAULT_TIMEOUT_S = 30.0


def timeout_seconds(requested: timedelta | None) -> float:
    """The shorter of TORCHTPU_DIST_TIMEOUT and the process group's own timeout."""
    secs = float(os.environ.get("TORCHTPU_DIST_TIMEOUT", DEFAULT_TIMEOUT_S))
    if requested is not None and requested.total_seconds() > 0:
        secs = min(secs, requested.total_seconds())
    return secs


def _create(opts, _pg_options):
    # The transport across processes: host memory and a gloo group of the same
    # ranks, with its own key space in the group's store.
    store = dist.PrefixStore(f"{NAME}/", opts.store)
    secs = timeout_seconds(opts.timeout)
    host = dist.ProcessGroupGloo(store, opts.group_rank, opts.group_size, timedelta(seconds=secs))
    return _C._dist_backend(store, opts.group_rank, opts.group_size, host, secs)


def _fix_default_backend(helper):
    """torch 2.13's init_process_group() without a backend maps the accelerator (tpu) to
    its plugin backend but marks GLOO as the group's default backend type, which the
    group then lacks (DDP's logger and get_backend() fail). Mark ours instead."""

    def wrapped(*args, **kwargs):
        out = helper(*args, **kwargs)
        pg = out[0] if isinstance(out, tuple) else out
        if not isinstance(pg, dist.ProcessGroup):  # this rank is not in the new group
            return out
        try:
            pg._get_backend(dist.distributed_c10d.torch.device("tpu"))
        except RuntimeError:
            return out
        types = dist.ProcessGroup.BackendType
        if pg._get_backend_name() == "gloo":
            try:
                pg._get_backend(dist.distributed_c10d.torch.device("cpu"))
            except RuntimeError:
                pg._set_default_backend(types.CUSTOM)
        return out

    wrapped.__wrapped__ = helper
    return wrapped


def register() -> None:
    if not dist.is_available() or NAME in dist.Backend.backend_list:
        return
    dist.Backend.register_backend(NAME, _create, extended_api=True, devices=["tpu", "cpu"])
    c10d = dist.distributed_c10d
    c10d._new_process_group_helper = _fix_default_backend(c10d._new_process_group_helper)


# --------------------------------------------------------------------------- in-process
# Collectives across the devices of this process (TORCHTPU_NUM_DEVICES=N): one tensor
# per device, tensor i on tpu:i, run as one replicated StableHLO program (no host copy).


def _device(kind, tensors, reduce="sum", dim=0, dim2=0, pairs=()):
    import torch

    flat = [int(v) for p in pairs for v in p]
    return torch.ops.torchtpu.device_collective(kind, list(tensors), reduce, dim, dim2, flat)


def device_all_reduce(tensors, op: str = "sum") -> None:
    """In place: every tensor becomes the reduction (sum, prod, max, min) of all."""
    for t, r in zip(tensors, _device("all_reduce", tensors, op)):
        t.copy_(r)


def device_all_gather(tensors, dim: int = 0) -> list:
    """Each device gets the concatenation of every device's tensor along ``dim``."""
    return _device("all_gather", tensors, dim=dim)


def device_reduce_scatter(tensors, dim: int = 0, op: str = "sum") -> list:
    """Reduces across devices, device i keeping the i-th slice along ``dim``."""
    return _device("reduce_scatter", tensors, op, dim)


def device_all_to_all(tensors, split_dim: int = 0, concat_dim: int = 0) -> list:
    """Device i sends its j-th slice along ``split_dim`` to device j, which concatenates
    what it receives along ``concat_dim``."""
    return _device("all_to_all", tensors, dim=split_dim, dim2=concat_dim)


def device_permute(tensors, pairs) -> list:
    """Sends device ``src``'s tensor to device ``dst`` for each (src, dst); devices that
    receive nothing get zeros."""
    return _device("permute", tensors, pairs=pairs)
