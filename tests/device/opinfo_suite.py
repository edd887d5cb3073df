"""Device-generic tests on ``tpu`` built on PyTorch's own test machinery.

The torch wheel ships ``torch.testing._internal.common_device_type`` (device-generic test
classes, the ``@ops`` / ``@modules`` parametrizers, ``instantiate_device_type_tests``), the
OpInfo database ``op_db`` and the ModuleInfo database ``module_db``, but not PyTorch's
``test/test_ops.py``.  This module writes test templates in that spirit; the factories
return generic classes that a test module turns into ``...TPU`` classes with::

    TestOpsDevice = op_test_class(op_db)
    instantiate_device_type_tests(TestOpsDevice, globals(), only_for="tpu")

Every test compares ``tpu`` with PyTorch's CPU: the sample inputs are generated on the CPU
(so both sides see the same values), copied to ``tpu``, and the results compared with
``TestCase.assertEqual`` at rtol = atol = 1e-3, the tolerance PyTorch's own
test_compare_cpu uses between devices (loosened where the op's OpInfo carries a looser
toleranceOverride for PyTorch's TestCommon tests).  Summation order differs between XLA and
PyTorch's CPU kernels, so tighter bounds flag rounding, not bugs; the conformance sweep
(docs/OP_COVERAGE.md) is the tight check.  A test runs
all of an op's samples and reports how many failed and the first failure; samples whose
CPU reference itself raises are not counted.  A test whose op has nothing to check (no
out= variant, no differentiable sample) is skipped with that reason.

The templates deliberately use class names of their own (not ``TestCommon``), so the
expected failures and skips PyTorch's op_db declares for its own tests do not apply:
every failure shows up as one.  The runner (tests/device/run.py) marks the failures that
PyTorch's own TestCommon also expects to fail on every device.
"""

from __future__ import annotations

import contextlib
import copy
import os
import sys
import unittest
import warnings
from pathlib import Path

import torch
import torch.utils._pytree as pytree
import torchtpu  # registers the ``tpu`` device before common_device_type looks for it

# The conformance harness's rules: TestCommon tolerance overrides, random-output ops.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "conformance"))
import harness
from torch.testing._internal import common_device_type, common_utils
from torch.testing._internal.common_device_type import (
    PrivateUse1TestBase,
    instantiate_device_type_tests,
    ops,
)
from torch.testing._internal.common_modules import modules
from torch.testing._internal.common_utils import TestCase

# The @ops wrapper appends "Caused by sample input at index N" naming the last sample the
# generator produced; these tests consume every sample first and name the failing one.
common_device_type.PRINT_REPRO_ON_FAILURE = False
common_utils.PRINT_REPRO_ON_FAILURE = False

DTYPES = (torch.float32,)
# (rtol, atol) of every tpu-vs-CPU comparison: PyTorch's test_compare_cpu bound.
TOL = (1e-3, 1e-3)
# Default cap on samples per test (all when unset): TORCHTPU_DEVTESTS_MAX_SAMPLES=N.
MAX_SAMPLES = int(os.environ.get("TORCHTPU_DEVTESTS_MAX_SAMPLES", "0")) or None


def instantiate(generic_cls: type, scope: dict) -> None:
    """``instantiate_device_type_tests(generic_cls, scope, only_for="tpu")``.

    PrivateUse1TestBase says "privateuse1" until its setUpClass has run once (the first
    instantiation runs it); running it first makes every class ``<Name>TPU`` and lets op
    decorators see the device type "tpu" from the first op on.  ``only_for`` accepts the
    backend's name ("tpu") or "privateuse1" alike.
    """
    PrivateUse1TestBase.setUpClass()
    instantiate_device_type_tests(generic_cls, scope, only_for="tpu")


# --------------------------------------------------------------------------- helpers


def _to_tpu(device):
    def move(x):
        if isinstance(x, torch.Tensor):
            t = x.detach().to(device)
            return t.requires_grad_() if x.requires_grad else t
        if isinstance(x, torch.device) and x.type == "cpu":
            return torch.device(device)
        if isinstance(x, str) and x == "cpu":
            return device
        return x

    return move


def _cpu_leaf(x):
    """A fresh CPU leaf (keeps requires_grad) so CPU and tpu graphs never share nodes."""
    if isinstance(x, torch.Tensor):
        t = x.detach()
        return t.requires_grad_() if x.requires_grad else t
    return x


def _clone(x):
    return x.clone() if isinstance(x, torch.Tensor) else x


def _move_sample(op, sample, device):
    """(input, args, kwargs) of ``sample`` on ``device``; None device means fresh CPU
    leaves.  tensor_split's index tensor must stay on the CPU (a documented requirement)."""
    conv = _cpu_leaf if device is None else _to_tpu(device)
    inp = pytree.tree_map(conv, sample.input)
    if device is not None and op.name in harness.CPU_ARGS_OPS:
        args = pytree.tree_map(lambda x: x if isinstance(x, torch.Tensor) else conv(x), sample.args)
    else:
        args = pytree.tree_map(conv, sample.args)
    kwargs = pytree.tree_map(conv, sample.kwargs)
    return inp, args, kwargs


def _reaches_device(sample) -> bool:
    """A tensor argument, or a device one (factory functions): else the sample runs the
    same on the CPU whatever the test does."""
    leaves = pytree.tree_leaves((sample.input, sample.args, sample.kwargs))
    return any(isinstance(t, torch.Tensor) for t in leaves) or "device" in sample.kwargs


def _samples(op, dtype, cap, requires_grad=False, reference=False):
    """The op's first ``cap`` (None: all) samples made on the CPU that reach the device."""
    torch.manual_seed(0)
    gen = (op.reference_inputs if reference else op.sample_inputs)(
        "cpu", dtype, requires_grad=requires_grad
    )
    n = 0
    for sample in gen:
        if cap is not None and n >= cap:
            return
        if _reaches_device(sample):
            n += 1
            yield sample


def _fallbacks() -> int:
    return torchtpu.metrics()["fallbacks"]


class _SampleLog:
    """Counts samples and keeps the first failure; ``finish`` raises one error for all."""

    def __init__(self, test):
        self.test = test
        self.seen = 0
        self.total = 0
        self.failed = 0
        self.first = None
        self.fallbacks0 = _fallbacks()

    def run(self, index, sample, fn) -> None:
        """Runs ``fn()`` for one sample; ``fn`` returns False when the sample is not
        applicable (e.g. the CPU reference raised)."""
        self.seen += 1
        try:
            counted = fn()
        except unittest.SkipTest:
            raise
        except Exception as e:  # noqa: BLE001 - a failing sample is a result
            self.total += 1
            self.failed += 1
            if self.first is None:
                self.first = (index, sample, e)
            return
        if counted is not False:
            self.total += 1

    def finish(self, nothing: str) -> None:
        fb = _fallbacks() - self.fallbacks0
        if self.first is not None:
            i, sample, e = self.first
            kind = "mismatch" if isinstance(e, AssertionError) else type(e).__name__
            summary = harness._one_line(getattr(sample, "summary", lambda: repr(sample))(), 300)
            raise AssertionError(
                f"{kind}: {self.failed}/{self.total} samples failed; first: sample #{i}: "
                f"{harness._describe_error(e)}\n  sample: {summary}"
            ) from e
        if fb:
            raise AssertionError(f"CPUFallback: {fb} op(s) ran on the CPU fallback")
        if self.total == 0:
            self.test.skipTest(nothing if self.seen else "no sample with a tensor or device")


def _check_on(test, actual, device_type: str) -> None:
    for i, t in enumerate(pytree.tree_leaves(actual)):
        if isinstance(t, torch.Tensor):
            test.assertEqual(t.device.type, device_type, msg=f"output {i} is on {t.device}")


def _meta(x):
    return (tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor) else x


def _assert_matches(test, actual, expected, tol, values=True, grads=False) -> None:
    """``actual`` (tpu) equals the CPU ``expected`` in structure, dtype, shape and (when
    ``values``) values within ``tol`` = (rtol, atol).
    For gradients a None on one side equals zeros on the other."""
    _check_on(test, actual, "tpu")
    if grads:
        actual = [
            torch.zeros_like(e) if a is None and e is not None else a
            for a, e in zip(actual, expected)
        ]
        expected = [
            torch.zeros_like(a, device="cpu") if e is None and a is not None else e
            for a, e in zip(actual, expected)
        ]
    actual = pytree.tree_map(
        lambda x: x.detach().cpu() if isinstance(x, torch.Tensor) else x, actual
    )
    expected = pytree.tree_map(lambda x: x.detach() if isinstance(x, torch.Tensor) else x, expected)
    if not values:
        test.assertEqual(pytree.tree_map(_meta, actual), pytree.tree_map(_meta, expected))
        return
    test.assertEqual(actual, expected, exact_device=False, rtol=tol[0], atol=tol[1])


def _tolerance(op, dtype):
    """(rtol, atol): TOL loosened by the op's toleranceOverride for PyTorch's TestCommon
    on the CPU, if any."""
    over = harness.tolerance_overrides(op).get(str(dtype).replace("torch.", ""))
    if over is None:
        return TOL
    return max(TOL[0], over[0]), max(TOL[1], over[1])


def _values_checked(op, sample) -> bool:
    """False for random / uninitialised outputs (PyTorch's test_compare_cpu skips those
    ops): then only structure, shape and dtype are compared."""
    return harness._unchecked_values_reason(op) is None and not harness._sample_is_random(
        op, sample
    )


def _run_both(fn_cpu, fn_tpu):
    """CPU reference first: None when it raises (the sample is not applicable)."""
    torch.manual_seed(0)
    try:
        expected = fn_cpu()
    except Exception:  # noqa: BLE001 - the CPU defines what is applicable
        return None
    torch.manual_seed(0)
    return expected, fn_tpu()


def _out_like(x, device, empty: bool):
    if not isinstance(x, torch.Tensor):
        raise TypeError("not a tensor")
    if empty:
        return torch.empty(0, dtype=x.dtype, device=device)
    # Filled with a value the op must overwrite (the check fails if it does not).
    fill = float("nan") if x.dtype.is_floating_point else (True if x.dtype == torch.bool else 7)
    return torch.full(x.shape, fill, dtype=x.dtype, device=device)


@contextlib.contextmanager
def _quiet_resize():
    """PyTorch warns when an op resizes a non-empty out= tensor (some ops do for some
    samples, on the CPU too); the values are checked all the same."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*was resized", UserWarning)
        yield


def _returned_out(res, out) -> list:
    """For each leaf of an op's return value: whether it is the out= tensor in its place
    (None for a None return)."""
    if res is None:
        return [None]
    leaves = pytree.tree_leaves(res)
    return [r is o for r, o in zip(leaves, pytree.tree_leaves(out))] + [len(leaves)]


def _differentiable(out) -> list:
    return [
        t
        for t in pytree.tree_leaves(out)
        if isinstance(t, torch.Tensor) and t.requires_grad and t.dtype.is_floating_point
    ]


def _grads(outs, leaves, device):
    """Gradients of ``outs`` w.r.t. ``leaves`` under a fixed random cotangent."""
    g = torch.Generator().manual_seed(1234)
    cots = [torch.randn(o.shape, generator=g, dtype=o.dtype).to(device) for o in outs]
    return list(torch.autograd.grad(outs, leaves, cots, allow_unused=True))


def _grad_leaves(tree) -> list:
    return [t for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor) and t.requires_grad]


# --------------------------------------------------------------------------- op tests


def _compare_sample(test, op, sample, device, tol, prepare=None) -> bool:
    """One sample on the CPU and on ``device`` (its tensors passed through ``prepare``):
    the results match. False when the CPU cannot run the sample."""
    cpu = _move_sample(op, sample, None)
    dev = _move_sample(op, sample, device)
    if prepare is not None:
        dev = pytree.tree_map(prepare, dev)
    # output_process_fn_grad makes results comparable where the op's answer is not
    # unique (e.g. the signs of singular vectors).
    post = sample.output_process_fn_grad
    res = _run_both(
        lambda: post(op(cpu[0], *cpu[1], **cpu[2])),
        lambda: post(op(dev[0], *dev[1], **dev[2])),
    )
    if res is None:
        return False
    _assert_matches(test, res[1], res[0], tol, _values_checked(op, sample))
    return True


def op_test_class(op_list, name: str = "TestOpsDevice", max_samples=MAX_SAMPLES) -> type:
    """A generic test class over the OpInfos ``op_list`` (float32), for
    ``instantiate_device_type_tests``; each test takes the first ``max_samples`` samples
    (None: all)."""
    cap = max_samples

    class _Ops(TestCase):
        @ops(op_list, allowed_dtypes=DTYPES)
        def test_compare_cpu(self, device, dtype, op):
            """The op's reference inputs on tpu give the CPU's results."""
            log = _SampleLog(self)
            tol = _tolerance(op, dtype)
            for i, sample in enumerate(_samples(op, dtype, cap, reference=True)):
                log.run(i, sample, lambda s=sample: _compare_sample(self, op, s, device, tol))
            log.finish("no sample runs on the CPU")

        @ops(op_list, allowed_dtypes=DTYPES)
        def test_noncontiguous_samples(self, device, dtype, op):
            """Non-contiguous tpu inputs (every other element of a larger buffer, made on
            tpu) give the CPU's results for the contiguous inputs."""
            log = _SampleLog(self)
            tol = _tolerance(op, dtype)
            for i, sample in enumerate(_samples(op, dtype, cap)):

                def one(sample=sample):
                    return _compare_sample(self, op, sample, device, tol, _noncontiguous)

                log.run(i, sample, one)
            log.finish("no sample runs on the CPU")

        @ops(op_list, allowed_dtypes=DTYPES)
        def test_out(self, device, dtype, op):
            """The out= variant writes the CPU's result into a given tensor of the right
            shape and into an empty one it resizes, and returns that tensor."""
            if not op.supports_out:
                self.skipTest("no out= variant")
            log = _SampleLog(self)
            tol = _tolerance(op, dtype)
            for i, sample in enumerate(_samples(op, dtype, cap)):
                for empty in (False, True):

                    def one(sample=sample, empty=empty):
                        cpu = _move_sample(op, sample, None)
                        dev = _move_sample(op, sample, device)
                        torch.manual_seed(0)
                        try:
                            ref = op(cpu[0], *cpu[1], **cpu[2])
                            out_cpu = pytree.tree_map(lambda x: _out_like(x, "cpu", empty), ref)
                            if isinstance(out_cpu, list):
                                out_cpu = tuple(out_cpu)
                            torch.manual_seed(0)
                            with _quiet_resize():
                                ref = op(cpu[0], *cpu[1], out=out_cpu, **cpu[2])
                        except Exception:  # noqa: BLE001 - no out= form for this sample
                            return False
                        out = pytree.tree_map(lambda x: _out_like(x, device, empty), out_cpu)
                        torch.manual_seed(0)
                        with _quiet_resize():
                            res = op(dev[0], *dev[1], out=out, **dev[2])
                        # Returns its out tensors where the CPU does (ops writing a list of
                        # outputs return None).
                        self.assertEqual(
                            _returned_out(res, out),
                            _returned_out(ref, out_cpu),
                            msg="out= returns something else than on the CPU",
                        )
                        post = sample.output_process_fn_grad
                        values = _values_checked(op, sample)
                        _assert_matches(self, post(out), post(out_cpu), tol, values)
                        return True

                    log.run(i, sample, one)
            log.finish("no sample has an out= form on the CPU")

        @ops(op_list, allowed_dtypes=DTYPES)
        def test_variant_consistency_eager(self, device, dtype, op):
            """The method, in-place, operator and alias variants on tpu give the CPU's
            results for the same variant (in-place ones modify and return their input)."""
            variants = []
            for owner in (op, *op.aliases):
                tag = getattr(owner, "name", op.name)
                for kind in ("method_variant", "inplace_variant"):
                    fn = getattr(owner, kind, None)
                    if fn is not None:
                        variants.append((f"{tag}.{kind}", fn, kind == "inplace_variant"))
                if owner is not op and owner.op is not None:
                    variants.append((f"{tag} (alias)", owner.op, False))
            for kind in ("operator_variant", "inplace_operator_variant"):
                fn = getattr(op, kind, None)
                if fn is not None:
                    variants.append((kind, fn, kind.startswith("inplace")))
            if not variants:
                self.skipTest("no method, in-place, operator or alias variant")
            log = _SampleLog(self)
            tol = _tolerance(op, dtype)
            for i, sample in enumerate(_samples(op, dtype, cap)):
                for label, fn, inplace in variants:

                    def one(sample=sample, fn=fn, inplace=inplace, label=label):
                        cpu = _move_sample(op, sample, None)
                        dev = _move_sample(op, sample, device)
                        if inplace:
                            cpu = (pytree.tree_map(_clone, cpu[0]), *cpu[1:])
                            dev = (pytree.tree_map(_clone, dev[0]), *dev[1:])
                        res = _run_both(
                            lambda: fn(cpu[0], *cpu[1], **cpu[2]),
                            lambda: fn(dev[0], *dev[1], **dev[2]),
                        )
                        if res is None:
                            return False
                        values = _values_checked(op, sample)
                        post = sample.output_process_fn_grad
                        try:
                            if inplace and res[0] is cpu[0]:
                                self.assertTrue(res[1] is dev[0], "in-place returned a new tensor")
                                _assert_matches(self, dev[0], cpu[0], tol, values)
                            _assert_matches(self, post(res[1]), post(res[0]), tol, values)
                        except AssertionError as e:
                            raise AssertionError(f"{label}: {e}") from None
                        return True

                    log.run(i, sample, one)
            log.finish("no variant runs on the CPU")

        @ops(op_list, allowed_dtypes=DTYPES)
        def test_grad_compare_cpu(self, device, dtype, op):
            """Gradients of every differentiable input under a fixed random cotangent
            match the CPU's."""
            if not op.supports_autograd:
                self.skipTest("op does not support autograd")
            log = _SampleLog(self)
            tol = _tolerance(op, dtype)
            for i, sample in enumerate(_samples(op, dtype, cap, requires_grad=True)):

                def one(sample=sample):
                    cpu = _move_sample(op, sample, None)
                    dev = _move_sample(op, sample, device)

                    def grads(side, dev_name):
                        out = sample.output_process_fn_grad(op(side[0], *side[1], **side[2]))
                        outs, leaves = _differentiable(out), _grad_leaves(side)
                        if not outs or not leaves:
                            raise _NothingToDifferentiate
                        return outs, _grads(outs, leaves, dev_name)

                    try:
                        res = _run_both(lambda: grads(cpu, "cpu"), lambda: grads(dev, device))
                    except _NothingToDifferentiate:
                        raise AssertionError("no differentiable output on tpu") from None
                    if res is None:
                        return False
                    values = _values_checked(op, sample)
                    _assert_matches(self, res[1][0], res[0][0], tol, values)
                    _assert_matches(self, res[1][1], res[0][1], tol, values, grads=True)
                    return True

                log.run(i, sample, one)
            log.finish("no differentiable sample")

    _Ops.__name__ = _Ops.__qualname__ = name
    return _Ops


class _NothingToDifferentiate(Exception):
    pass


def _noncontiguous(x):
    """A non-contiguous copy of a tpu tensor, made on tpu (PyTorch's noncontiguous_like:
    every other element of a buffer twice as large, the gaps filled with a sentinel)."""
    from torch.testing._internal.common_utils import noncontiguous_like

    if not isinstance(x, torch.Tensor) or x.numel() < 1:
        return x
    with torch.no_grad():
        t = noncontiguous_like(x.detach())
    return t.requires_grad_() if x.requires_grad else t


# --------------------------------------------------------------------------- module tests

# Modules whose output depends on random draws in training mode (dropout, random pooling
# regions): only structure, shape and dtype are compared there.
RANDOM_MODULES = {"nn.FractionalMaxPool2d", "nn.FractionalMaxPool3d"}


def _module_values_checked(module_info, module, training) -> bool:
    if module_info.name in RANDOM_MODULES:
        return False
    if training:
        for m in module.modules():
            if isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0:
                return False
            p = getattr(m, "dropout", 0.0)
            if isinstance(p, float) and p > 0:
                return False
    return True


def _module_inputs(module_info, dtype, training, requires_grad, cap):
    torch.manual_seed(0)
    items = module_info.module_inputs_func(
        module_info, device="cpu", dtype=dtype, requires_grad=requires_grad, training=training
    )
    return [m for m in items if m.forward_input is not None][:cap]


def _build(module_info, module_input, dtype, training):
    c = module_input.constructor_input
    torch.manual_seed(0)
    m = module_info.module_cls(*c.args, **c.kwargs)
    m.to(dtype).train(training)
    if module_info.is_lazy:
        # A lazy module draws its parameters at the first forward: do that on the CPU so
        # the tpu copy gets the same ones.
        f = module_input.forward_input
        with torch.no_grad():
            m(*pytree.tree_map(_cpu_leaf, f.args), **pytree.tree_map(_cpu_leaf, f.kwargs))
    return m


def _module_pair(module_info, mi, dtype, training, device):
    """The CPU module, its copy on ``device``, and the forward (args, kwargs) for each."""
    m_cpu = _build(module_info, mi, dtype, training)
    m_dev = copy.deepcopy(m_cpu).to(device)
    f = mi.forward_input
    cpu_args = pytree.tree_map(_cpu_leaf, (f.args, f.kwargs))
    dev_args = pytree.tree_map(_to_tpu(device), (f.args, f.kwargs))
    return m_cpu, m_dev, cpu_args, dev_args


def module_test_class(
    module_list, name: str = "TestModulesDevice", max_samples=MAX_SAMPLES
) -> type:
    """A generic test class over the ModuleInfos ``module_list`` (float32); each test takes
    the first ``max_samples`` module inputs (None: all)."""
    cap = max_samples

    class _Modules(TestCase):
        @modules(module_list, allowed_dtypes=DTYPES)
        def test_forward_compare_cpu(self, device, dtype, module_info, training):
            """A module copied to tpu gives the CPU module's outputs, and its parameters
            and buffers (e.g. BatchNorm's running statistics) end up the same."""
            log = _SampleLog(self)
            for i, mi in enumerate(_module_inputs(module_info, dtype, training, False, cap)):

                def one(mi=mi):
                    m_cpu, m_dev, cpu_args, dev_args = _module_pair(
                        module_info, mi, dtype, training, device
                    )
                    res = _run_both(
                        lambda: m_cpu(*cpu_args[0], **cpu_args[1]),
                        lambda: m_dev(*dev_args[0], **dev_args[1]),
                    )
                    if res is None:
                        return False
                    values = _module_values_checked(module_info, m_cpu, training)
                    _assert_matches(self, res[1], res[0], TOL, values)
                    _assert_matches(self, m_dev.state_dict(), m_cpu.state_dict(), TOL, values)
                    return True

                log.run(i, mi.desc, one)
            log.finish("no module input runs on the CPU")

        @modules(module_list, allowed_dtypes=DTYPES)
        def test_grad_compare_cpu(self, device, dtype, module_info, training):
            """Gradients of the inputs and parameters under a fixed random cotangent match
            the CPU module's."""
            log = _SampleLog(self)
            for i, mi in enumerate(_module_inputs(module_info, dtype, training, True, cap)):

                def one(mi=mi):
                    m_cpu, m_dev, cpu_args, dev_args = _module_pair(
                        module_info, mi, dtype, training, device
                    )

                    def grads(m, args, dev_name):
                        out = m(*args[0], **args[1])
                        outs = _differentiable(out)
                        leaves = _grad_leaves(args) + [p for p in m.parameters() if p.requires_grad]
                        if not outs or not leaves:
                            raise _NothingToDifferentiate
                        return outs, _grads(outs, leaves, dev_name)

                    try:
                        res = _run_both(
                            lambda: grads(m_cpu, cpu_args, "cpu"),
                            lambda: grads(m_dev, dev_args, device),
                        )
                    except _NothingToDifferentiate:
                        raise AssertionError("no differentiable output on tpu") from None
                    if res is None:
                        return False
                    values = _module_values_checked(module_info, m_cpu, training)
                    _assert_matches(self, res[1][0], res[0][0], TOL, values)
                    _assert_matches(self, res[1][1], res[0][1], TOL, values, grads=True)
                    return True

                log.run(i, mi.desc, one)
            log.finish("no differentiable module input")

    _Modules.__name__ = _Modules.__qualname__ = name
    return _Modules
