"""torchtpu._C.lowering_of: where the rule an ATen op runs through is registered."""

from __future__ import annotations

from pathlib import Path

import pytest
import torchtpu

REPO = Path(__file__).resolve().parents[2]


def _line(path: str, line: int) -> str:
    return (REPO / path).read_text().splitlines()[line - 1]


@pytest.mark.parametrize(
    "op, file, name",
    [
        ("aten::gelu", "csrc/lower/activation.cpp", '"gelu"'),
        ("aten::add.Tensor", "csrc/lower/elementwise.cpp", '"add"'),
        ("aten::max_pool2d_with_indices", "csrc/lower/pool.cpp", '"max_pool2d_with_indices"'),
        ("aten::lgamma", "csrc/lower/special.cpp", '"lgamma"'),
    ],
)
def test_names_the_registering_line(op, file, name):
    path, line = torchtpu._C.lowering_of(op)
    assert path == file
    assert name in _line(path, line)


@pytest.mark.parametrize(
    "variant, functional",
    [
        ("aten::add_.Tensor", "aten::add.Tensor"),  # in place
        ("aten::add.out", "aten::add.Tensor"),  # out=
        ("aten::gelu.out", "aten::gelu"),
        ("aten::gelu_", "aten::gelu"),
    ],
)
def test_variants_share_their_functional_twin(variant, functional):
    assert torchtpu._C.lowering_of(variant) == torchtpu._C.lowering_of(functional)


def test_loop_registrations_point_at_the_reg_call():
    # `for (const char* n : {"mm", "bmm", ...}) reg(n, ...)`: the names are one line up.
    path, line = torchtpu._C.lowering_of("aten::bmm")
    assert path == "csrc/lower/nn.cpp"
    assert "reg(n," in _line(path, line) and '"bmm"' in _line(path, line - 1)


def test_aten_prefix_is_optional():
    assert torchtpu._C.lowering_of("gelu") == torchtpu._C.lowering_of("aten::gelu")


def test_every_rule_has_a_location_in_the_repo():
    for name in torchtpu._C.lowered_ops():
        if not torchtpu._C.has_lowering(f"aten::{name}"):
            continue  # a rule for an op this PyTorch does not define
        path, line = torchtpu._C.lowering_of(f"aten::{name}")
        assert path.startswith("csrc/lower/"), (name, path)
        assert 0 < line <= len((REPO / path).read_text().splitlines()), (name, path, line)


def test_missing_op_raises_key_error():
    with pytest.raises(KeyError, match="aten::no_such_op"):
        torchtpu._C.lowering_of("aten::no_such_op")
    with pytest.raises(KeyError, match="aten::gelu.no_such_overload"):
        torchtpu._C.lowering_of("aten::gelu.no_such_overload")


def test_op_without_rule_raises_value_error():
    assert not torchtpu._C.has_lowering("aten::miopen_batch_norm")
    with pytest.raises(ValueError, match="aten::miopen_batch_norm has no lowering rule"):
        torchtpu._C.lowering_of("aten::miopen_batch_norm")


def test_foreach_op_points_to_its_element_op():
    # A foreach op runs its element op's rule on each element: that rule's place.
    assert torchtpu._C.lowering_of("aten::_foreach_add.List") == torchtpu._C.lowering_of(
        "aten::add.Tensor"
    )
    assert torchtpu._C.lowering_of("aten::_foreach_sqrt_") == torchtpu._C.lowering_of("aten::sqrt")
