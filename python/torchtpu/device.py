"""The ``torch.tpu`` device module, shaped like ``torch.cuda``."""

from __future__ import annotations

from typing import Any, Self

import torch

from . import _C

_initialized = False
_DeviceLike = int | str | torch.device | None


def _index(device: _DeviceLike) -> int:
    if device is None:
        return current_device()
    if isinstance(device, int):
        return device
    d = torch.device(device)
    if d.type != "tpu":
        raise ValueError(f"expected a tpu device, got {d}")
    return current_device() if d.index is None else d.index


def is_available() -> bool:
    return device_count() > 0


def device_count() -> int:
    return _C.device_count()


def init() -> None:
    """Starts the PJRT runtime; raises RuntimeError naming the plugin problem."""
    global _initialized
    _C._init()
    _initialized = True


_lazy_init = init


def is_initialized() -> bool:
    return _initialized


def _is_in_bad_fork() -> bool:
    return False


def current_device() -> int:
    return _C.current_device()


def set_device(device: _DeviceLike) -> None:
    # Initializes like torch.cuda.set_device: DeviceMesh (and other callers) take
    # is_initialized() as "the user picked a device" and otherwise reset it to LOCAL_RANK.
    init()
    _C.set_device(_index(device))


class device:
    def __init__(self, device: _DeviceLike) -> None:
        self.idx = _index(device)
        self.prev = -1

    def __enter__(self) -> None:
        self.prev = current_device()
        set_device(self.idx)

    def __exit__(self, *exc: object) -> None:
        set_device(self.prev)


def synchronize(device: _DeviceLike = None) -> None:
    """Waits for all work queued on the device."""
    _C.synchronize()


def get_device_name(device: _DeviceLike = None) -> str:
    p = _C.platform()
    return f"TorchTPU ({p['name']})"


def get_device_properties(device: _DeviceLike = None) -> Any:
    """Name, platform and memory of a device. ``total_memory`` is what the allocator
    hands out on it: ``TORCHTPU_MEMORY_LIMIT`` when set, else the host's physical
    memory (the XLA:CPU plugin allocates there; the PJRT layer does not report device
    memory). No compute-unit count is given: XLA:CPU has no such fixed number."""
    from types import SimpleNamespace

    p = _C.platform()
    return SimpleNamespace(
        name=get_device_name(device),
        type="tpu",
        index=_index(device),
        platform=p["name"],
        platform_version=p["version"],
        total_memory=_C.memory_limit(),
    )


# ---- RNG (one Philox state per device: 16 bytes [seed | offset])


def manual_seed(seed: int) -> None:
    _C.manual_seed(current_device(), int(seed) & 0xFFFFFFFFFFFFFFFF)


def manual_seed_all(seed: int) -> None:
    for i in range(device_count()):
        _C.manual_seed(i, int(seed) & 0xFFFFFFFFFFFFFFFF)


def seed() -> None:
    _C.seed(current_device())


def seed_all() -> None:
    for i in range(device_count()):
        _C.seed(i)


def initial_seed() -> int:
    return _C.initial_seed(current_device())


def get_rng_state(device: _DeviceLike = "tpu") -> torch.Tensor:
    raw = _C.get_rng_state(_index(device))
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8)


def set_rng_state(new_state: torch.Tensor, device: _DeviceLike = "tpu") -> None:
    _C.set_rng_state(_index(device), bytes(new_state.to(torch.uint8).cpu().numpy().tobytes()))


def get_rng_state_all() -> list:
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state_all(states: list) -> None:
    for i, s in enumerate(states):
        set_rng_state(s, i)


# ---- AMP


def get_amp_supported_dtype() -> list:
    return [torch.bfloat16, torch.float16]


def is_bf16_supported() -> bool:
    return True


# ---- memory


# Every tpu storage is one allocation, freed with the storage: nothing is cached, so
# reserved bytes equal allocated bytes.


def memory_allocated(device: _DeviceLike = None) -> int:
    """Bytes held by live tpu storages on the device."""
    return _C.memory_allocated(_index(device))


def max_memory_allocated(device: _DeviceLike = None) -> int:
    """The peak of ``memory_allocated`` since start or ``reset_peak_memory_stats``."""
    return _C.max_memory_allocated(_index(device))


def memory_reserved(device: _DeviceLike = None) -> int:
    return memory_allocated(device)


def max_memory_reserved(device: _DeviceLike = None) -> int:
    return max_memory_allocated(device)


def reset_peak_memory_stats(device: _DeviceLike = None) -> None:
    _C.reset_peak_memory_stats(_index(device))


def reset_accumulated_memory_stats(device: _DeviceLike = None) -> None:
    _C.reset_accumulated_memory_stats(_index(device))


def reset_max_memory_allocated(device: _DeviceLike = None) -> None:
    reset_peak_memory_stats(device)


def memory_stats(device: _DeviceLike = None) -> dict:
    """``torch.cuda.memory_stats`` keys for what is tracked: ``{allocation, segment,
    active, allocated_bytes, reserved_bytes, active_bytes, requested_bytes}.all.{current,
    peak, allocated, freed}``, ``num_ooms``, ``num_alloc_retries`` (always 0: nothing
    to retry), ``num_device_alloc`` and ``num_device_free``."""
    return dict(sorted(_C.memory_stats(_index(device)).items()))


def mem_get_info(device: _DeviceLike = None) -> tuple[int, int]:
    """(free, total) bytes of the device's allocator limit (the allocator's own
    getMemoryInfo, which torch.accelerator.get_memory_info also reads)."""
    return torch.accelerator.get_memory_info(torch.device("tpu", _index(device)))


def empty_cache() -> None:
    """Buffers are freed as soon as their tensors die; nothing is cached."""


# ---- streams and events (one in-order queue per device underneath)


class Stream(torch.Stream):
    def __new__(cls, device: _DeviceLike = None, priority: int = 0, **kwargs: Any) -> Self:
        idx = _index(device)
        return super().__new__(cls, device=torch.device("tpu", idx), priority=priority, **kwargs)

    def wait_stream(self, stream: torch.Stream) -> None:
        synchronize()

    def wait_event(self, event: torch.Event) -> None:
        event.synchronize()

    def record_event(self, event: torch.Event | None = None) -> torch.Event:
        event = event or Event()
        event.record(self)
        return event


class Event(torch.Event):
    def __new__(
        cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False
    ) -> Self:
        return super().__new__(
            cls,
            device=torch.device("tpu", current_device()),
            enable_timing=enable_timing,
            blocking=blocking,
            interprocess=interprocess,
        )


_current_streams: dict[int, Stream] = {}


def current_stream(device: _DeviceLike = None) -> Stream:
    idx = _index(device)
    if idx not in _current_streams:
        _current_streams[idx] = Stream(idx)
    return _current_streams[idx]


def default_stream(device: _DeviceLike = None) -> Stream:
    return current_stream(device)


def set_stream(stream: Stream) -> None:
    _current_streams[stream.device_index] = stream


class stream:
    def __init__(self, s: Stream | None) -> None:
        self.s = s
        self.prev: Stream | None = None

    def __enter__(self) -> None:
        if self.s is not None:
            self.prev = current_stream(self.s.device_index)
            set_stream(self.s)

    def __exit__(self, *exc: object) -> None:
        if self.s is not None and self.prev is not None:
            set_stream(self.prev)


def get_device_interface() -> type:
    """Dynamo's DeviceInterface for tpu (used by torch.compile machinery)."""
    from ._dynamo_interface import TpuInterface

    return TpuInterface


# torch.cuda's graph names, on torch.tpu.
from .graphs import (  # noqa: F401
    TPUGraph,
    graph,
    graph_pool_handle,
    is_current_stream_capturing,
)
