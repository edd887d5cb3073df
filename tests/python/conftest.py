"""Shared helpers of the TorchTPU Python tests.

The tests compare every tpu result with PyTorch's CPU result.  Behaviours
that depend on environment variables read at start-up (plugin path, number of
devices, eager mode, CPU fallback, NaN checks) run in a subprocess through
``run_py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

# Environment variables that change the backend's behaviour (one list, kept by
# the conformance harness): the test process itself always runs with none of
# them (subprocess tests set them explicitly). The harness imports no torch.
# The platform under test is kept: bench/device.sh runs the suite with
# TORCHTPU_PLATFORM=cuda, and subprocess tests run there too.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "conformance"))
from harness import BACKEND_ENV as _ALL_BACKEND_ENV
from harness import OP_TEST_ENV as _OP_TEST_ENV

_BACKEND_ENV = tuple(
    n for n in _ALL_BACKEND_ENV if n not in ("TORCHTPU_PLATFORM", "TORCHTPU_PJRT_PLUGIN")
)
for _name in _BACKEND_ENV:
    os.environ.pop(_name, None)
os.environ.update(_OP_TEST_ENV)
# A fresh compile cache per test session (subprocesses inherit it), so results
# never depend on what an earlier run left in ~/.cache/torchtpu.
os.environ["TORCHTPU_CACHE_DIR"] = tempfile.mkdtemp(prefix="torchtpu-test-cache-")
os.environ.pop("TORCHTPU_SHARED_CACHE_DIR", None)

import pytest
import torch
import torchtpu

PYTHON_DIR = Path(__file__).resolve().parents[2] / "python"

# float32 tolerances of the suite (rows relax them only with a stated reason).
F32_TOL = {"rtol": 1e-5, "atol": 1e-5}


_LIBRARIES: list[torch.library.Library] = []


def lasting_library(ns: str, kind: str) -> torch.library.Library:
    """A torch.library.Library kept for the process: a namespace whose library died
    breaks torch.export's walk of every namespace, which torch.compile runs, in every
    later test of the worker."""
    lib = torch.library.Library(ns, kind)
    _LIBRARIES.append(lib)
    return lib


def run_py(code: str, env: dict | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    """Runs ``code`` in a fresh interpreter with the backend's environment
    variables cleared and then ``env`` applied.  Returns the completed process
    (stdout/stderr as text)."""
    full_env = {k: v for k, v in os.environ.items() if k not in _BACKEND_ENV}
    full_env.update(_OP_TEST_ENV)
    full_env.update(env or {})
    full_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(PYTHON_DIR), os.environ.get("PYTHONPATH", "")) if p
    )
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def check_py(
    code: str, env: dict | None = None, timeout: float = 180
) -> subprocess.CompletedProcess:
    """``run_py`` that fails the test (showing the subprocess output) unless the
    code exits with status 0."""
    proc = run_py(code, env, timeout)
    assert proc.returncode == 0, (
        f"subprocess exited with {proc.returncode}\n"
        f"--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    )
    return proc


def tpu(t: torch.Tensor) -> torch.Tensor:
    """A tpu copy of a CPU tensor (keeps requires_grad as a fresh leaf)."""
    out = t.detach().to("tpu")
    return out.requires_grad_(t.requires_grad)


def assert_tpu_close(actual, expected, **tol) -> None:
    """``actual`` (tpu tensors, possibly nested in tuples/lists) matches the CPU
    ``expected``: same structure, dtype, shape and values."""
    if isinstance(expected, (tuple, list)):
        assert isinstance(actual, (tuple, list)), f"expected a sequence, got {type(actual)}"
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert_tpu_close(a, e, **tol)
        return
    if not isinstance(expected, torch.Tensor):
        assert actual == pytest.approx(
            expected, rel=tol.get("rtol", 1e-5), abs=tol.get("atol", 1e-5)
        )
        return
    assert isinstance(actual, torch.Tensor), f"expected a tensor, got {type(actual)}"
    assert actual.device.type == "tpu", f"result on {actual.device}, expected tpu"
    if not tol and expected.dtype == torch.float32:
        tol = F32_TOL
    torch.testing.assert_close(actual.detach().cpu(), expected.detach(), **tol)


def check_against_cpu(fn, inputs) -> None:
    """``fn(device, *leaves)`` on CPU and tpu copies of ``inputs``: same values, and
    the same gradients (random cotangent) for the inputs that require grad."""
    ref_in = [t.detach().requires_grad_(t.requires_grad) for t in inputs]
    dev_in = [t.detach().to("tpu").requires_grad_(t.requires_grad) for t in inputs]
    ref, out = fn("cpu", *ref_in), fn("tpu", *dev_in)
    assert_tpu_close(out, ref)
    wrt = [k for k, t in enumerate(inputs) if t.requires_grad]
    if not wrt:
        return
    grad = torch.randn(ref.shape)
    ref_g = torch.autograd.grad(ref, [ref_in[k] for k in wrt], grad)
    dev_g = torch.autograd.grad(out, [dev_in[k] for k in wrt], grad.to("tpu"))
    assert_tpu_close(list(dev_g), list(ref_g))


@pytest.fixture(autouse=True)
def _clean_state():
    """Every test starts in strict mode on device 0 with a fixed CPU seed."""
    torchtpu.eager_mode("strict")
    torch.tpu.set_device(0)
    torch.manual_seed(0)
    yield
    torchtpu.eager_mode("strict")


@pytest.fixture(params=["strict", "debug", "fused"])
def eager(request):
    """Runs the test body inside ``torchtpu.eager_mode(<mode>)``."""
    with torchtpu.eager_mode(request.param):
        assert torchtpu.get_eager_mode() == request.param
        yield request.param


@pytest.fixture
def fresh_dynamo():
    """Dynamo's caches emptied before and after the test (torch.compile tests)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
