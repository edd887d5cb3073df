"""tools/check_layers.py (`make lint`) on small synthetic csrc/ trees: each kind of
layering violation is reported with its file and line, and a clean tree passes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[2] / "tools" / "check_layers.py"

# A tree that follows every rule: path under csrc -> include lines.
CLEAN = {
    "common/status.h": ["<string>"],
    "pjrt/pjrt.cpp": ['"pjrt/pjrt.h"', '"pjrt_c_api.h"', '"common/status.h"'],
    "pjrt/pjrt.h": ["<memory>"],
    "hlo/builder.h": ['"common/status.h"', "<vector>"],
    "cache/store.cpp": ['"pjrt/pjrt.h"'],
    "graph/node.h": ['"common/status.h"'],
    "lower/registry.h": ["<ATen/core/ivalue.h>", '"hlo/builder.h"'],
    "lower/elementwise.cpp": ['"lower/registry.h"', '"helpers.h"'],
    "lower/helpers.h": ['"lower/registry.h"'],
    "aten/ops.cpp": ['"aten/dispatch.h"', '"aten/runtime.h"', '"lower/registry.h"'],
    "aten/dispatch.h": ['"aten/strict.h"', "<ATen/core/Tensor.h>"],
    "aten/strict.h": ['"aten/program.h"', '"graph/node.h"'],
    "aten/program.h": ['"aten/launch.h"', '"cache/store.h"'],
    "aten/launch.h": ['"aten/runtime.h"'],
    "aten/runtime.h": ['"pjrt/pjrt.h"'],
    "aten/runtime.cpp": ['"aten/runtime.h"', '"aten/events.h"', '"generator.h"'],
    "aten/events.h": [],
    "aten/generator.h": [],
    "bindings/module.cpp": ["<pybind11/pybind11.h>", '"aten/ops.h"', '"lower/registry.h"'],
}


def make_tree(root: Path, files: dict[str, list[str]]) -> Path:
    for rel, includes in files.items():
        path = root / "csrc" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = ["// test file", "#pragma once"] + [f"#include {inc}" for inc in includes]
        path.write_text("\n".join(lines + ["int x;", ""]))
    return root


def run(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(TOOL), "--root", str(root)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_clean_tree_passes(tmp_path):
    r = run(make_tree(tmp_path, CLEAN))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout == ""


# name -> (extra files, "file:line" the report names, words the report gives)
VIOLATIONS = {
    "torch_in_hlo": (
        {"hlo/lower_rank.cpp": ['"hlo/builder.h"', "<ATen/core/Tensor.h>"]},
        "csrc/hlo/lower_rank.cpp:4",
        "torch-free",
    ),
    "c10_in_pjrt": (
        {"pjrt/device.h": ["<c10/util/Exception.h>"]},
        "csrc/pjrt/device.h:3",
        "torch-free",
    ),
    "python_in_cache": ({"cache/py.cpp": ['"Python.h"']}, "csrc/cache/py.cpp:3", "torch-free"),
    "pybind_in_common": (
        {"common/b.h": ["<pybind11/pybind11.h>"]},
        "csrc/common/b.h:3",
        "torch-free",
    ),
    "lower_includes_aten": (
        {"lower/bad.cpp": ['"lower/registry.h"', '"aten/executor.h"']},
        "csrc/lower/bad.cpp:4",
        "lower may include only hlo, common",
    ),
    "hlo_includes_pjrt": ({"hlo/run.cpp": ['"pjrt/pjrt.h"']}, "csrc/hlo/run.cpp:3", "one way"),
    "common_includes_hlo": ({"common/x.h": ['"hlo/builder.h"']}, "csrc/common/x.h:3", "no other"),
    "runtime_includes_launch": (
        {"aten/events.cpp": ['"aten/events.h"', '"aten/launch.h"']},
        "csrc/aten/events.cpp:4",
        "rank 4 (launcher)",
    ),
    "runtime_includes_sibling_runner": (
        {"aten/generator.cpp": ['"generator.h"', '"fused.h"'], "aten/fused.h": []},
        "csrc/aten/generator.cpp:4",
        "rank 2 (runners)",
    ),
    "unknown_aten_file": (
        {"aten/executor.cpp": ['"aten/runtime.h"']},
        "csrc/aten/executor.cpp:1",
        "ATEN_RANKS",
    ),
    "unknown_folder": ({"jit/trace.cpp": ['"common/status.h"']}, "csrc/jit/trace.cpp:1", "DEPENDS"),
}


@pytest.mark.parametrize("name", sorted(VIOLATIONS))
def test_violation_is_reported(tmp_path, name):
    extra, where, words = VIOLATIONS[name]
    r = run(make_tree(tmp_path, {**CLEAN, **extra}))
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 1, r.stdout
    assert lines[0].startswith(where + ": "), r.stdout
    assert words in lines[0], r.stdout


def test_every_violation_is_reported(tmp_path):
    extra = {}
    for files, _, _ in VIOLATIONS.values():
        extra.update(files)
    r = run(make_tree(tmp_path, {**CLEAN, **extra}))
    assert r.returncode == 1
    reported = {line.split(": ", 1)[0] for line in r.stdout.splitlines()}
    assert reported == {where for _, where, _ in VIOLATIONS.values()}


def test_missing_csrc_is_an_error(tmp_path):
    r = run(tmp_path)
    assert r.returncode == 2
    assert "csrc" in r.stderr
