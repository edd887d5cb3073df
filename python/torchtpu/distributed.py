"""torch.distributed on tpu: the ``tpu_dist`` c10d backend.

Importing torchtpu registers it for the ``tpu`` device, so under torchrun
``dist.init_process_group()`` (gloo for cpu, tpu_dist for tpu),
``init_process_group("tpu_dist")`` (tpu_dist for both) and
``init_process_group("cpu:gloo,tpu:tpu_dist")`` all work. Before every collective the
ranks agree on what they run; a mismatch or a rank that stops arriving raises on
every surviving rank within ``TORCHTPU_DIST_TIMEOUT`` seconds (default 30).

``run_on_devices(fn, n)`` runs ``fn(rank)`` in n threads of this process, one per
device, each with a default process group of the ``tpu_local`` backend: collectives
between these ranks run as replicated device programs (no host copies, no gloo).
``spmd()`` lets their Fused Eager graphs run across all_reduce, all_gather and
reduce_scatter instead of cutting there.
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from . import _C

NAME = "tpu_dist"
LOCAL = "tpu_local"
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
    dist.Backend.register_backend(LOCAL, _create_local, extended_api=True, devices=["tpu"])
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


# --------------------------------------------------------------------------- thread ranks
# tpu_local: c10d ranks that are threads of this process, rank r on tpu:r. c10d keeps
# its groups in the process-global ``_world``; threads started by run_on_devices see
# their own (every other thread sees the process's), as torch's threaded test groups do.

_sessions = itertools.count()


def _create_local(opts, _pg_options):
    # The ranks agree through the group's store on one rendezvous name; a rank of
    # another process would see a foreign pid and must use tpu_dist.
    store = dist.PrefixStore(f"{LOCAL}/", opts.store)
    if opts.group_rank == 0:
        store.set("session", f"{os.getpid()}:{next(_sessions)}")
    session = store.get("session").decode()
    if session.split(":")[0] != str(os.getpid()):
        raise dist.DistBackendError(
            f"{LOCAL}: rank {opts.group_rank} is in process {os.getpid()} but rank 0 in "
            f"process {session.split(':')[0]}; tpu_local ranks are threads of one process "
            "(torchtpu.distributed.run_on_devices); across processes use tpu_dist"
        )
    secs = timeout_seconds(opts.timeout)
    # Global rank r runs on tpu:r; a subgroup's ranks on their global ranks' devices.
    devices = list(opts.global_ranks_in_group) or list(range(opts.group_size))
    return _C._dist_local_backend(session, opts.group_rank, devices, secs)


class spmd:  # used like a function, as torch.no_grad
    """SPMD mode for thread ranks (``run_on_devices``): in Fused Eager, ``all_reduce``,
    ``all_gather_into_tensor`` and ``reduce_scatter_tensor`` (and their coalesced forms)
    are recorded into each rank's graph, which then runs as one replicated program over
    the group's devices, so a step with collectives in it can be one program. Off by
    default (``TORCHTPU_SPMD=1`` turns it on): every rank must then cut its graphs at the
    same ops, so rank-specific reads between collectives (rank 0 calling ``.item()``)
    make the ranks' programs differ, and every rank raises naming both programs rather
    than hang. Takes effect at once; as a context manager, restores the previous
    setting on exit. Process-wide."""

    def __init__(self, enabled: bool = True) -> None:
        self._before = _C._dist_spmd()
        _C._dist_set_spmd(bool(enabled))

    def __enter__(self) -> spmd:  # noqa: PYI034
        return self

    def __exit__(self, *exc: object) -> None:
        _C._dist_set_spmd(self._before)


def spmd_enabled() -> bool:
    """Whether SPMD mode is on (``spmd``)."""
    return _C._dist_spmd()


class _RankWorld:
    """One thread rank's c10d state (the fields of torch's ``_World``)."""

    def __init__(self) -> None:
        self.default_pg = None
        self.pg_map: dict = {}
        self.pg_names: dict = {}
        self.pg_group_ranks: dict = {}
        self.pg_backend_config: dict = {}
        self.group_count = 0
        self.tags_to_pg: dict = {}
        self.pg_to_tag: dict = {}
        self.pg_coalesce_state: dict = {}
        self.comms: list = []

    @property
    def pg_config_info(self) -> list:
        return dist.distributed_c10d._World.pg_config_info.fget(self)


class _ThreadWorlds:
    """Stands in for c10d's ``_world``: a rank thread's own state, else the process's."""

    def __init__(self, base) -> None:
        object.__setattr__(self, "_base", base)
        object.__setattr__(self, "_local", threading.local())

    def _get(self):
        return getattr(self._local, "world", None) or self._base

    def __getattr__(self, name: str):
        return getattr(self._get(), name)

    def __setattr__(self, name: str, value) -> None:
        setattr(self._get(), name, value)


_threads_lock = threading.Lock()
_threads_active = 0
_fake_lock_before = None


def _sharding_propagator():
    from torch.distributed.tensor._sharding_prop import ShardingPropagator

    return ShardingPropagator


def _keep_fake_cuda_guard() -> None:
    """A CUDA build of torch on a machine without a usable GPU (torch 2.11 seen): the
    first FakeTensorMode installs a no-op CUDA device guard, and one installed from a
    thread that then ends is gone; the autograd engine's next start reads it and
    segfaults (DTensor's fake propagation in rank threads, then a backward on tpu).
    Installed from the calling thread first, it stays."""
    ensure = getattr(torch._C, "_ensureCUDADeviceGuardSet", None)
    if ensure is not None and torch.version.cuda and not torch.cuda.is_available():
        ensure()


def _serialize_fake_propagation(on: bool) -> None:
    """DTensor derives output metadata by running ops under a FakeTensorMode, whose
    state is not thread-safe: rank threads at once got fake tensors on another rank's
    device. Torch's own threaded tests serialize it with the propagator's
    `_fake_mode_lock`; torch 2.11 has no such hook, so there the method that runs
    them is wrapped instead. `on` False puts back what was there."""
    global _fake_lock_before
    prop = _sharding_propagator()
    hook = "_fake_mode_lock" if hasattr(prop, "_fake_mode_lock") else None
    if not on:
        setattr(prop, hook or "_propagate_tensor_meta_non_cached", _fake_lock_before)
        return
    if hook:
        _fake_lock_before = prop._fake_mode_lock
        prop._fake_mode_lock = threading.Lock()
        return
    _fake_lock_before = method = prop._propagate_tensor_meta_non_cached
    lock = threading.Lock()

    def serialized(self, op_schema):
        with lock:
            return method(self, op_schema)

    prop._propagate_tensor_meta_non_cached = serialized


def _enter_threads() -> _ThreadWorlds:
    global _threads_active
    c10d = dist.distributed_c10d
    with _threads_lock:
        if not isinstance(c10d._world, _ThreadWorlds):
            c10d._world = _ThreadWorlds(c10d._world)
        if _threads_active == 0:
            # c10d's C++ group registry per thread (autograd threads map to their rank).
            torch._C._distributed_c10d._set_thread_isolation_mode(True)
            _serialize_fake_propagation(True)
            _keep_fake_cuda_guard()
        _threads_active += 1
        return c10d._world


def _leave_threads() -> None:
    global _threads_active
    with _threads_lock:
        _threads_active -= 1
        if _threads_active == 0:
            torch._C._distributed_c10d._set_thread_isolation_mode(False)
            _serialize_fake_propagation(False)


def run_on_devices(
    fn: Callable[..., Any],
    nranks: int | None = None,
    args: Sequence[Any] = (),
    timeout: float | timedelta | None = None,
    join_timeout: float | None = None,
) -> list:
    """Runs ``fn(rank, *args)`` in ``nranks`` threads (default: every tpu device), rank r
    on ``tpu:r`` with ``torch.tpu.set_device(r)`` done and a default process group of
    the ``tpu_local`` backend, so ``dist.all_reduce(t)``, ``dist.get_rank()`` and DDP work
    as under torchrun. Returns each rank's result.

    A rank that raises or returns makes the others' next collective fail at once. The
    ranks' errors are raised as one: a rank's own error first (rather than the failed
    collectives it caused), the others as notes. ``timeout``: for collectives (else
    ``TORCHTPU_DIST_TIMEOUT``); ``join_timeout``: seconds to wait for the threads
    (TimeoutError naming the ranks still running). The threads share the CPU generator:
    build models before calling, not seeded in every rank."""
    n = torch.tpu.device_count() if nranks is None else int(nranks)
    if not 1 <= n <= torch.tpu.device_count():
        raise ValueError(
            f"run_on_devices: {n} ranks but {torch.tpu.device_count()} tpu devices in this "
            "process (set TORCHTPU_NUM_DEVICES before importing torchtpu)"
        )
    if isinstance(timeout, (int, float)):
        timeout = timedelta(seconds=timeout)
    store = dist.HashStore()
    results: list = [None] * n
    errors: list = [None] * n
    worlds = _enter_threads()
    from ._modes import get_eager_mode, thread_mode

    mode = get_eager_mode()  # the caller's (maybe thread-local) eager mode, in every rank
    hook = sys.excepthook  # init_process_group chains a rank prefix onto it per rank

    def rank_main(rank: int) -> None:
        worlds._local.world = _RankWorld()
        backend = None
        why = "its function returned"
        try:
            torch.tpu.set_device(rank)
            # Backward runs on this thread, so hooks see this rank's groups.
            with torch.autograd.set_multithreading_enabled(False), thread_mode(mode):
                dist.init_process_group(
                    LOCAL, store=store, rank=rank, world_size=n, timeout=timeout
                )
                pg = dist.distributed_c10d._get_default_group()
                backend = pg._get_backend(torch.device("tpu"))
                results[rank] = fn(rank, *args)
        except BaseException as e:  # noqa: BLE001 - raised by the caller
            errors[rank] = e
            why = f"it raised {type(e).__name__}"
        finally:
            # A collective the others start without this rank fails at once.
            if backend is not None:
                _C._dist_local_left(backend, why)
            if dist.is_initialized():
                dist.destroy_process_group()
            worlds._local.world = None

    threads = [
        threading.Thread(target=rank_main, args=(r,), name=f"tpu_local rank {r}", daemon=True)
        for r in range(n)
    ]
    try:
        for t in threads:
            t.start()
        deadline = None if join_timeout is None else time.monotonic() + join_timeout
        for t in threads:
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        running = [r for r, t in enumerate(threads) if t.is_alive()]
        if running:
            raise TimeoutError(
                f"run_on_devices: ranks {running} still running after {join_timeout} s"
            )
    finally:
        _leave_threads()
        sys.excepthook = hook
    failed = [r for r in range(n) if errors[r] is not None]
    if failed:
        # The cause first: a rank's own error rather than the others' failed collectives.
        own = [r for r in failed if not str(errors[r]).startswith(f"{LOCAL}:")]
        failed = own + [r for r in failed if r not in own]
        first = errors[failed[0]]
        for r in failed[1:]:
            first.add_note(f"rank {r} also raised {type(errors[r]).__name__}: {errors[r]}")
        raise first
    return results
