"""Every failure is a Python exception with an actionable message, never a
crash; the process keeps working afterwards."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import torchtpu
from conftest import assert_tpu_close, check_py, run_py

# An ATen op without a tpu lowering (unique_dim: unique rows along a dim).
UNSUPPORTED_OP = "unique_dim"


def _unsupported(x: torch.Tensor) -> torch.Tensor:
    return torch.unique(x, dim=0)


def _still_works():
    assert_tpu_close(torch.arange(3.0, device="tpu") * 2, torch.tensor([0.0, 2.0, 4.0]))


def test_unsupported_op_raises_not_implemented():
    x = torch.randn(10, device="tpu")
    with pytest.raises(NotImplementedError) as info:
        _unsupported(x)
    msg = str(info.value)
    assert f"aten::{UNSUPPORTED_OP}" in msg
    assert "Float[10]" in msg  # the call's dtypes and shapes
    assert "TORCHTPU_CPU_FALLBACK=1" in msg
    assert torchtpu.metrics()["fallback_ops"].get(UNSUPPORTED_OP) is None
    _still_works()


def test_unsupported_op_cpu_fallback():
    proc = check_py(
        """
        import warnings, torch, torchtpu
        x = torch.linspace(-3, 3, 13)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            a = torch.unique(x.to("tpu"), dim=0)
            b = torch.unique(x.to("tpu") * 1, dim=0)
        assert a.device.type == "tpu", a.device
        ref = torch.unique(x, dim=0)
        torch.testing.assert_close(a.cpu(), ref)
        torch.testing.assert_close(b.cpu(), ref)
        msgs = [str(w.message) for w in caught if "unique_dim" in str(w.message)]
        assert len(msgs) == 1, msgs  # warns once per op
        assert "TORCHTPU_CPU_FALLBACK" in msgs[0], msgs[0]
        m = torchtpu.metrics()
        assert m["fallbacks"] >= 2, m
        assert m["fallback_ops"].get("unique_dim") == 2, m["fallback_ops"]
        assert "unique_dim" in torchtpu.metrics_report()
        print("ok")
        """,
        env={"TORCHTPU_CPU_FALLBACK": "1"},
    )
    assert "ok" in proc.stdout


def test_missing_plugin():
    proc = check_py(
        """
        import torch, torchtpu
        assert torch.tpu.device_count() == 0
        assert not torch.tpu.is_available()
        try:
            torch.ones(2, device="tpu")
        except RuntimeError as err:
            msg = str(err)
        else:
            raise AssertionError("creating a tensor without a plugin did not raise")
        assert "TORCHTPU_PJRT_PLUGIN" in msg and "/nonexistent.so" in msg, msg
        try:
            torch.tpu.init()
        except RuntimeError as err:
            assert "/nonexistent.so" in str(err), err
        else:
            raise AssertionError("torch.tpu.init() without a plugin did not raise")
        print("ok")
        """,
        env={"TORCHTPU_PJRT_PLUGIN": "/nonexistent.so"},
    )
    assert "ok" in proc.stdout


def test_plugin_not_installed_has_install_hint():
    # No libtpu in this environment: the message says how to install it.
    proc = check_py(
        """
        import torch, torchtpu
        assert torch.tpu.device_count() == 0
        try:
            torch.zeros(3, device="tpu")
        except RuntimeError as err:
            msg = str(err)
        else:
            raise AssertionError("no error without the tpu plugin")
        assert "pip install libtpu" in msg, msg
        assert "TORCHTPU_PJRT_PLUGIN" in msg, msg
        print("ok")
        """,
        env={"TORCHTPU_PLATFORM": "tpu"},
    )
    assert "ok" in proc.stdout


def test_unknown_platform():
    proc = check_py(
        """
        import torch, torchtpu
        assert not torch.tpu.is_available()
        try:
            torch.ones(1, device="tpu")
        except RuntimeError as err:
            msg = str(err)
        else:
            raise AssertionError("unknown platform did not raise")
        assert "TORCHTPU_PLATFORM" in msg and "quantum" in msg, msg
        assert "cpu" in msg and "tpu" in msg, msg
        print("ok")
        """,
        env={"TORCHTPU_PLATFORM": "quantum"},
    )
    assert "ok" in proc.stdout


def test_plugin_that_is_not_a_plugin(tmp_path):
    bogus = tmp_path / "bogus.so"
    bogus.write_bytes(b"not an ELF file")
    proc = run_py(
        """
        import torch, torchtpu
        assert torch.tpu.device_count() == 0
        try:
            torch.ones(1, device="tpu")
        except RuntimeError as err:
            assert "bogus.so" in str(err), err
            print("raised")
        """,
        env={"TORCHTPU_PJRT_PLUGIN": str(bogus)},
    )
    assert proc.returncode == 0, proc.stderr
    assert "raised" in proc.stdout


def test_device_index_out_of_range():
    with pytest.raises((IndexError, RuntimeError)) as info:
        torch.ones(1, device="tpu:5")
    msg = str(info.value)
    assert "5" in msg and "out of range" in msg and "TORCHTPU_NUM_DEVICES" in msg
    with pytest.raises((IndexError, RuntimeError)):
        torch.tpu.set_device(3)
    assert torch.tpu.current_device() == 0
    with pytest.raises((IndexError, RuntimeError)):
        torch.arange(3.0).to("tpu:1")
    with pytest.raises((IndexError, RuntimeError)):
        torch.tpu.get_rng_state("tpu:2")
    _still_works()


MIXED = {
    "add": lambda d, c: d + c,
    "radd": lambda d, c: c + d,
    "mul_": lambda d, c: d.mul_(c),
    "mm": lambda d, c: d @ c.t(),
    "cat": lambda d, c: torch.cat([d, c]),
    "where": lambda d, c: torch.where(d > 0, d, c),
    "index_select_cpu_index": lambda d, c: d.index_select(0, torch.tensor([0, 1])),
}


@pytest.mark.parametrize("name", list(MIXED), ids=str)
def test_mixed_devices_raise(name):
    d = torch.randn(2, 3, device="tpu")
    c = torch.randn(2, 3)
    with pytest.raises(RuntimeError) as info:
        MIXED[name](d, c)
    msg = str(info.value)
    assert "cpu" in msg and ("tpu" in msg or "same device" in msg), msg
    _still_works()


def test_cpu_scalar_tensor_is_allowed():
    d = torch.arange(3.0, device="tpu")
    assert_tpu_close(d * torch.tensor(2.0), torch.tensor([0.0, 2.0, 4.0]))
    assert_tpu_close(d + torch.tensor(1), torch.tensor([1.0, 2.0, 3.0]))


@pytest.mark.parametrize("dtype", [torch.complex32, torch.float8_e5m2], ids=str)
def test_unsupported_dtype(dtype):
    name = {torch.complex32: "ComplexHalf", torch.float8_e5m2: "Float8_e5m2"}[dtype]
    with pytest.raises(TypeError) as info:
        torch.ones(2, dtype=dtype, device="tpu")
    assert name in str(info.value) and "float32" in str(info.value)
    with pytest.raises(TypeError) as info:
        torch.zeros(2, dtype=dtype).to("tpu")
    assert name in str(info.value)
    with pytest.raises(TypeError):
        torch.ones(2, device="tpu").to(dtype)
    _still_works()


# Ops whose kernels (the CPU's and CUDA's too) are not defined for these dtypes
# raise a TypeError naming the op while it is lowered, not an invalid program
# the compiler rejects.
BAD_DTYPE = {
    "silu_int": (F.silu, torch.arange(4), "aten::silu"),
    "softmax_int": (lambda x: torch.softmax(x, 0), torch.arange(4), "aten::_softmax"),
    "glu_bool": (lambda x: F.glu(x, 0), torch.tensor([True, False]), "aten::glu"),
    "remainder_bool": (lambda x: torch.remainder(x, x), torch.tensor([True]), "aten::remainder"),
    "bilinear_int32": (
        lambda x: F.interpolate(x, size=(3, 3), mode="bilinear"),
        torch.arange(16, dtype=torch.int32).view(1, 1, 4, 4),
        "aten::upsample_bilinear2d",
    ),
}


@pytest.mark.parametrize("name", list(BAD_DTYPE))
def test_op_undefined_for_dtype_raises_type_error(name, eager):
    fn, x, op = BAD_DTYPE[name]
    with pytest.raises(TypeError) as info:
        fn(x.to("tpu")).cpu()
    msg = str(info.value)
    assert op in msg and "not defined for these dtypes" in msg and ".float()" in msg, msg
    _still_works()


def test_allocation_too_large():
    for make in (torch.zeros, torch.empty):
        with pytest.raises(RuntimeError) as info:
            make(1 << 50, device="tpu").fill_(1.0)
        msg = str(info.value)
        assert "out of memory" in msg.lower() and "4503599627370496" in msg, msg
    _still_works()


def test_shape_errors_come_from_meta():
    a = torch.ones(3, device="tpu")
    b = torch.ones(4, device="tpu")
    with pytest.raises(RuntimeError, match="must match the size"):
        a + b
    with pytest.raises(RuntimeError):
        torch.ones(2, 3, device="tpu") @ torch.ones(2, 3, device="tpu")
    with pytest.raises(RuntimeError):
        torch.ones(6, device="tpu").view(4)
    with pytest.raises(IndexError):
        torch.ones(2, 3, device="tpu").sum(5)
    _still_works()


def test_bad_rng_state_and_mode():
    with pytest.raises((RuntimeError, ValueError)):
        torch.tpu.set_rng_state(torch.zeros(3, dtype=torch.uint8))
    with pytest.raises(ValueError):
        torchtpu.eager_mode("fast")
    assert torchtpu.get_eager_mode() == "strict"


def test_nan_check_in_debug_mode():
    proc = check_py(
        """
        import torch, torchtpu
        x = torch.tensor([-1.0], device="tpu")
        ok = torch.log(torch.tensor([2.0], device="tpu")).cpu()  # finite: fine
        try:
            torch.log(x)
        except RuntimeError as err:
            msg = str(err)
        else:
            raise AssertionError("log(-1) did not raise with TORCHTPU_CHECK_NANS=1")
        assert "aten::log" in msg and "NaN" in msg, msg
        assert "TORCHTPU_CHECK_NANS" in msg, msg
        try:
            torch.tensor([1.0], device="tpu") / 0
        except RuntimeError as err:
            assert "aten::div" in str(err), err
        else:
            raise AssertionError("1/0 did not raise with TORCHTPU_CHECK_NANS=1")
        with torchtpu.eager_mode("strict"):  # the check is a debug-mode feature
            assert torch.log(x).isnan().all().item()
        print("ok")
        """,
        env={"TORCHTPU_EAGER": "debug", "TORCHTPU_CHECK_NANS": "1"},
    )
    assert "ok" in proc.stdout


def test_nan_passes_without_check():
    with torchtpu.eager_mode("debug"):
        out = torch.log(torch.tensor([-1.0], device="tpu"))
    assert out.isnan().all().item()


def _idx(*v):
    return torch.tensor(v, device="tpu")


OOB = {
    "index": lambda x: x[_idx(7)],
    "index_negative": lambda x: x[_idx(-4)],
    "index_select": lambda x: x.index_select(0, _idx(5)),
    "gather": lambda x: x.gather(1, _idx([9])),
    "embedding": lambda x: torch.nn.functional.embedding(_idx(10), x),
    "index_put_": lambda x: x.index_put_((_idx(3),), torch.tensor(1.0, device="tpu")),
    "scatter": lambda x: x.scatter(1, _idx([4]), 1.0),
    # torch takes negative indices only in advanced indexing and index_fill.
    "index_select_negative": lambda x: x.index_select(0, _idx(-1)),
    "gather_negative": lambda x: x.gather(1, _idx([-1])),
    "scatter_add_negative": lambda x: x.scatter_add(1, _idx([-2]), torch.ones(1, 1, device="tpu")),
    "index_add_negative": lambda x: x.index_add(0, _idx(-1), torch.ones(1, 4, device="tpu")),
    "scatter_reduce_negative": lambda x: x.scatter_reduce(
        1, _idx([-1]), torch.ones(1, 1, device="tpu"), "amax"
    ),
}


def test_negative_indices_where_torch_takes_them():
    x = torch.arange(12.0).reshape(3, 4)
    with torchtpu.eager_mode("debug"):
        assert torch.equal(x.to("tpu")[_idx(-1)].cpu(), x[torch.tensor([-1])])
        got = x.to("tpu").index_fill(0, _idx(-1), 7.0).cpu()
        assert torch.equal(got, x.index_fill(0, torch.tensor([-1]), 7.0))


@pytest.mark.parametrize("name", list(OOB), ids=str)
def test_index_out_of_bounds_in_debug_mode(name):
    x = torch.arange(12.0).reshape(3, 4).to("tpu")
    with torchtpu.eager_mode("debug"), pytest.raises(IndexError) as info:
        OOB[name](x).cpu()
    assert "out of bounds" in str(info.value)
    assert "aten::" in str(info.value)
    _still_works()
