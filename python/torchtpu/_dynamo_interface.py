"""Dynamo DeviceInterface for the tpu device."""

from __future__ import annotations

from typing import Any

from torch._dynamo.device_interface import DeviceInterface

from . import device as _tpu


class TpuInterface(DeviceInterface):
    Stream = _tpu.Stream
    Event = _tpu.Event

    class Worker:
        @staticmethod
        def set_device(device: int) -> None:
            _tpu.set_device(device)

        @staticmethod
        def current_device() -> int:
            return _tpu.current_device()

        @staticmethod
        def get_device_properties(device: Any = None) -> Any:
            return _tpu.get_device_properties(device)

    current_device = staticmethod(_tpu.current_device)
    set_device = staticmethod(_tpu.set_device)
    device_count = staticmethod(_tpu.device_count)
    is_available = staticmethod(_tpu.is_available)
    synchronize = staticmethod(_tpu.synchronize)
    current_stream = staticmethod(_tpu.current_stream)
    get_device_properties = staticmethod(_tpu.get_device_properties)

    @staticmethod
    def exchange_device(device: int) -> int:
        prev = _tpu.current_device()
        _tpu.set_device(device)
        return prev

    @staticmethod
    def maybe_exchange_device(device: int) -> int:
        return TpuInterface.exchange_device(device)

    @staticmethod
    def get_raw_stream(device_idx: int) -> int:
        return 0

    @staticmethod
    def get_compute_capability(device: Any = None) -> str:
        return "tpu"
