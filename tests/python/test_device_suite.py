"""A representative subset of the device-generic suite (tests/device): PyTorch's own
test machinery (``instantiate_device_type_tests`` over ``op_db`` / ``module_db``) with the
templates of tests/device/opinfo_suite.py, restricted to common ops and modules of real
models.  Unlike the full suite (a report, docs/DEVICE_TESTS.md), every test here must pass.

Each template compares tpu with the CPU; test_templates_catch_wrong_results checks that they
do fail on an op or module whose tpu result is off.
"""

from __future__ import annotations

import sys
import unittest
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "device"))
from opinfo_suite import instantiate, module_test_class, op_test_class
from torch.testing._internal.common_methods_invocations import op_db
from torch.testing._internal.common_modules import (
    ModuleInfo,
    module_db,
    module_inputs_torch_nn_Linear,
)
from torch.testing._internal.opinfo.core import OpInfo, SampleInput

OPS = (
    "add",
    "mul",
    "matmul",
    "nn.functional.linear",
    "softmax",
    "sum",
    "nn.functional.conv2d",
    "nn.functional.layer_norm",
    "nn.functional.gelu",
    "index_select",
    "where",
    "cat",
)
MODULES = ("nn.Linear", "nn.LayerNorm", "nn.Embedding")
# Samples per test: the first few keep the subset well under a minute on a cold compile
# cache (each new shape compiles a program); the full suite takes all.
SAMPLES = 4

_ops = [op for op in op_db if op.name in OPS and not op.variant_test_name]
_modules = [m for m in module_db if m.name in MODULES]
assert {op.name for op in _ops} == set(OPS), "an op of the subset left op_db"
assert {m.name for m in _modules} == set(MODULES), "a module of the subset left module_db"

TestOpsDeviceSubset = op_test_class(_ops, "TestOpsDeviceSubset", max_samples=SAMPLES)
TestModulesDeviceSubset = module_test_class(
    _modules, "TestModulesDeviceSubset", max_samples=SAMPLES
)
instantiate(TestOpsDeviceSubset, globals())
instantiate(TestModulesDeviceSubset, globals())


# --------------------------------------------------------------------------- the referee


def _off_on_tpu(t: torch.Tensor) -> torch.Tensor:
    """1% off on tpu: beyond the suite's 1e-3 tolerance, in values and gradients."""
    return t * 1.01 if t.device.type == "tpu" else t


def _wrong_add(x, y, *, out=None):
    r = _off_on_tpu(torch.add(x, y))
    if out is None:
        return r
    out.resize_(r.shape).copy_(r)
    return out


def _wrong_add_samples(op_info, device, dtype, requires_grad, **kwargs):
    def mk(shape):
        return torch.randn(shape, dtype=dtype, device=device).requires_grad_(requires_grad)

    for shape in ((3, 4), (2, 3, 5)):
        yield SampleInput(mk(shape), args=(mk(shape),))


class _WrongLinear(torch.nn.Linear):
    def forward(self, x):
        return _off_on_tpu(super().forward(x))


def test_templates_catch_wrong_results():
    """Every template fails on an op (function, out= and method variants) and a module
    whose tpu result is 1% off."""
    wrong_op = OpInfo(
        "wrong_add",
        op=_wrong_add,
        method_variant=_wrong_add,
        inplace_variant=None,
        dtypes=(torch.float32,),
        sample_inputs_func=_wrong_add_samples,
        supports_out=True,
        supports_autograd=True,
    )
    wrong_module = ModuleInfo(
        _WrongLinear, module_inputs_func=module_inputs_torch_nn_Linear, dtypes=(torch.float32,)
    )
    scope = {
        "Broken": op_test_class([wrong_op], "Broken"),
        "BrokenModules": module_test_class([wrong_module], "BrokenModules"),
    }
    instantiate(scope["Broken"], scope)
    instantiate(scope["BrokenModules"], scope)
    result = unittest.TestResult()
    for cls in (scope["BrokenTPU"], scope["BrokenModulesTPU"]):
        unittest.defaultTestLoader.loadTestsFromTestCase(cls).run(result)
    failed = sorted(t.id().split(".")[-1] for t, _ in result.failures + result.errors)
    assert result.testsRun == 7
    assert failed == [
        "test_compare_cpu_wrong_add_tpu_float32",
        "test_forward_compare_cpu__WrongLinear_tpu_float32",
        "test_grad_compare_cpu__WrongLinear_tpu_float32",
        "test_grad_compare_cpu_wrong_add_tpu_float32",
        "test_noncontiguous_samples_wrong_add_tpu_float32",
        "test_out_wrong_add_tpu_float32",
        "test_variant_consistency_eager_wrong_add_tpu_float32",
    ], [(t.id(), e[-300:]) for t, e in result.failures + result.errors]
    for _, err in result.failures:
        assert "mismatch" in err, err[-500:]
