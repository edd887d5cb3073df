"""Which ops with a lowering rule bounded dynamism cannot run at padded sizes, against
the committed list in docs/BUCKETING.md: adding or removing a bucket rule (or a lowering
rule) without regenerating the doc fails here. Run this file to regenerate it. The list
depends on torch's op set, so it is checked only under the torch release it names."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch
import torchtpu
from torchtpu._bucket_plan import ops_without_bucket_rule

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "BUCKETING.md"
COMMAND = "PYTHONPATH=python .venv/bin/python tests/python/test_bucket_coverage.py"
TORCH = torch.__version__.split("+")[0]


def render(ops: list[str]) -> str:
    """docs/BUCKETING.md for the given ops without a bucket rule."""
    lines = [
        "# Ops that run at exact sizes under bounded dynamism",
        "",
        'Under bounded dynamism (`options={"bounded_dynamism": True}`, see "Bounded dynamism"',
        "in docs/ARCHITECTURE.md) a symbolic dim is padded to its bucket size, and",
        "`python/torchtpu/_bucket_plan.py` lays out every value of the graph. The ops below",
        "have a lowering rule but neither a bucket rule (`@bucket_rule`) nor a generic",
        "category of the planner (pointwise ops, views that keep their input's layout,",
        "creation ops, neutral-padded reductions and scans, softmax), or they draw random",
        "values: when a padded dim reaches one of them the planner raises `Unsupported` and",
        "the graph runs unbucketed, at its exact sizes (one compile per size). Ops that only",
        "ever see unpadded values are not affected.",
        "",
        f"Generated under torch {TORCH} by `{COMMAND}`;",
        "`tests/python/test_bucket_coverage.py` fails when this list is out of date.",
        "",
        f"{len(ops)} ops:",
        "",
        *[f"- `{op}`" for op in ops],
        "",
    ]
    return "\n".join(lines)


def current() -> str:
    return render(ops_without_bucket_rule(torchtpu._C.lowered_ops()))


def test_doc_lists_the_ops_without_bucket_rule():
    text = DOC.read_text()
    named = re.search(r"Generated under torch (\S+) by", text)
    if named and named.group(1) != TORCH:
        pytest.skip(f"docs/BUCKETING.md lists torch {named.group(1)}'s ops; this is {TORCH}")
    assert text == current(), f"docs/BUCKETING.md is out of date: run {COMMAND}"


def test_categories_match_the_planner():
    ops = ["view", "_unsafe_view", "mm", "add.Tensor", "sum.dim_IntList", "cumsum", "_softmax"]
    assert ops_without_bucket_rule(ops) == []  # a rule, pointwise, reduce, scan, softmax
    assert ops_without_bucket_rule(["bernoulli.p", "convolution", "sort"]) == [
        "bernoulli.p",  # random
        "convolution",
        "sort",
    ]
    assert ops_without_bucket_rule(["no_such_op", "add.no_such_overload"]) == []


if __name__ == "__main__":
    DOC.write_text(current())
    print(f"wrote {DOC.relative_to(REPO)}", file=sys.stderr)
