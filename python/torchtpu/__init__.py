"""TorchTPU: run PyTorch programs on XLA devices through PJRT.

Importing this package registers the ``tpu`` device::

    import torch, torchtpu
    x = torch.ones(3, device="tpu")
"""

from __future__ import annotations

import os

# XLA's INFO logs (one line per client start) are noise for PyTorch users;
# warnings and errors still print. Set TF_CPP_MIN_LOG_LEVEL=0 to see them.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
# XLA:CPU defaults tuned for eager-sized programs, read once when the plugin starts
# (an explicit XLA_FLAGS setting wins): copy insertion with region analysis (the
# default copies every donated input before the program updates it in place, 132
# copies in a GPT step) and XNNPACK kernels (about 2x faster GPT steps on 2 cores).
if os.environ.get("TORCHTPU_PLATFORM", "cpu") == "cpu":
    for _flag in ("--xla_cpu_copy_insertion_use_region_analysis", "--xla_cpu_use_xnnpack"):
        if _flag not in os.environ.get("XLA_FLAGS", ""):
            os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" {_flag}=true").strip()

import torch

from . import _C  # noqa: F401  (loads the native core: registers the kernels)
from ._C import cache_stats, flush
from ._compile import compile_report
from ._jax_op import JaxOp, jax_op
from ._metrics import metrics, metrics_report, reset_metrics
from ._modes import eager_mode, get_eager_mode
from .graphs import graphed

__all__ = [
    "JaxOp",
    "advise",
    "cache_stats",
    "compile_report",
    "device",
    "eager_mode",
    "flush",
    "get_eager_mode",
    "graphed",
    "jax_op",
    "metrics",
    "metrics_report",
    "optim",
    "reset_metrics",
]


def __getattr__(name: str):
    # torchtpu.advise(...) imports the advisor on first use (a callable module, so that
    # `python -m torchtpu.advise script.py` runs it as a script too).
    if name == "advise":
        import importlib

        return importlib.import_module(".advise", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _register() -> None:
    if torch._C._get_privateuse1_backend_name() != "tpu":
        torch.utils.rename_privateuse1_backend("tpu")
    from . import device as _device_module

    torch._register_device_module("tpu", _device_module)
    torch.utils.generate_methods_for_privateuse1_backend(for_storage=True)
    from . import _ctc, _decomp, _logging, _meta, _printing, _shutdown

    _ctc.install()
    _meta.install()
    _printing.install()
    _decomp.install()
    _shutdown.install()
    _logging.install()
    from . import _compile, distributed

    distributed.register()
    _compile.install_backend()
    # The autograd engine hands a non-CPU device's backward to a worker thread of
    # its own while the caller waits. Our backward only records or launches
    # programs, so the handoff's two thread switches (about 25 us per backward)
    # buy nothing: backward runs on the calling thread, as PyTorch runs its lazy
    # device's. A thread-local setting: this thread's; rank threads set their own.
    torch.autograd.set_multithreading_enabled(False)


_register()
from . import device, optim
