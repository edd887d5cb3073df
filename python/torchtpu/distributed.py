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
