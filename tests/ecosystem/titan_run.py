"""Runs TorchTitan's own trainer (the `torchtitan.train` entry point, its config registry
and CLI options) on the tpu device or on CPU.

    python tests/ecosystem/titan_run.py --device tpu -- --module llama3 \
        --config llama3_debugmodel [TorchTitan options...]
    torchrun --nproc-per-node 2 tests/ecosystem/titan_run.py --device tpu -- ...

What this adapter does before handing argv to `torchtitan.train` (TorchTitan's files are
never edited):
  * tpu: imports torchtpu. That registers the PrivateUse1 device "tpu" and `torch.tpu`;
    TorchTitan's own device detection (torch._utils._get_available_device_type, read in
    torchtitan.tools.utils) then selects "tpu", and torch.distributed's default backend
    map gives it `tpu_dist`. Nothing in TorchTitan is patched.
  * cpu (the reference): TorchTitan has no CPU device option (it falls back to "cuda"), so
    torchtitan.tools.utils.device_type/device_module are set to "cpu" and a small CPU
    device module before the trainer is imported. Gloo has no PREMUL_SUM, which FSDP2's
    reduce-scatter uses for TorchTitan's gradient divide factor, so the CPU reference asks
    FSDP2 for its SUM-then-divide path (its `force_sum_reduction_for_comms` knob, there
    for MTIA): the same gradients, reduced the way gloo can.
  * both: torchtitan 0.3.0 imports `triton` at module level for MoE/fused kernels the
    llama3 model never runs, and does not declare it (CUDA torch wheels bring it). When
    triton is absent, a placeholder module is installed whose kernels raise if launched.
  * both: torchtitan 0.3.0 calls torch.distributed.set_timeout (newer than torch 2.13)
    after the first step; when torch lacks it, it is mapped to
    distributed_c10d._set_pg_timeout, torch 2.13's spelling of the same thing.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import runpy
import sys
import types


def _placeholder_triton() -> None:
    if importlib.util.find_spec("triton") is not None:
        return
    # torch probes for triton once (cached) or at import: let it see the truth first, so
    # its own code (inductor) never takes the placeholder for triton.
    import torch._inductor.compile_fx  # noqa: F401
    from torch.utils._triton import has_triton_package

    has_triton_package()

    class _Any:
        """Stands for any triton attribute at import time; fails if actually used."""

        def __init__(self, name: str) -> None:
            self._name = name

        def __getattr__(self, attr: str) -> _Any:
            return _Any(f"{self._name}.{attr}")

        def __call__(self, *args, **kwargs):
            # `@triton.jit` and `@triton.jit(...)` run at import: the decorated kernel
            # imports but fails if it is ever launched.
            if len(args) == 1 and callable(args[0]) and not kwargs:
                return _Kernel(args[0].__name__)
            return _Any(f"{self._name}()")

    class _Kernel(_Any):
        def __getitem__(self, grid):
            def launch(*a, **k):
                raise RuntimeError(f"triton kernel {self._name} needs triton, which is absent")

            return launch

    def _module_getattr(name: str):
        def getattr_(attr: str) -> _Any:
            if attr.startswith("__"):  # module machinery (inspect, pickle) probes these
                raise AttributeError(attr)
            return _Any(f"{name}.{attr}")

        return getattr_

    for name in ("triton", "triton.language"):
        mod = types.ModuleType(name)
        mod.__getattr__ = _module_getattr(name)
        mod.__path__ = []
        mod.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        sys.modules[name] = mod
    sys.modules["triton"].language = sys.modules["triton.language"]


def _cpu_device() -> None:
    import torchtitan.tools.utils as tt_utils

    props = types.SimpleNamespace(name="cpu", total_memory=1 << 40)
    cpu = types.SimpleNamespace(
        set_device=lambda device: None,
        device_count=lambda: 1,
        current_device=lambda: 0,
        synchronize=lambda device=None: None,
        get_device_name=lambda device=None: "cpu",
        get_device_properties=lambda device=None: props,
        reset_peak_memory_stats=lambda device=None: None,
        empty_cache=lambda: None,
        memory_stats=lambda device=None: {},
    )
    tt_utils.device_type, tt_utils.device_module = "cpu", cpu

    import torch.distributed.fsdp._fully_shard._fsdp_collectives as fsdp_coll

    factors = fsdp_coll._get_gradient_divide_factors

    def sum_then_divide(rs_group, ar_group, reduce_dtype, device_type="", factor=None, *_):
        return factors(rs_group, ar_group, reduce_dtype, device_type, factor, True)

    fsdp_coll._get_gradient_divide_factors = sum_then_divide


def _set_timeout_compat() -> None:
    import torch.distributed as dist

    if not hasattr(dist, "set_timeout"):
        from torch.distributed.distributed_c10d import _set_pg_timeout

        dist.set_timeout = _set_pg_timeout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("tpu", "cpu"), required=True)
    ours, titan_args = parser.parse_known_args()
    if titan_args[:1] == ["--"]:
        titan_args = titan_args[1:]
    _placeholder_triton()
    _set_timeout_compat()
    if ours.device == "tpu":
        import torchtpu  # noqa: F401  (registers the device; TorchTitan finds it)
    else:
        _cpu_device()
    import torchtitan.tools.utils as tt_utils

    assert tt_utils.device_type == ours.device, tt_utils.device_type
    sys.argv = ["torchtitan.train", *titan_args]
    runpy.run_module("torchtitan.train", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
