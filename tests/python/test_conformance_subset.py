"""A representative subset of the op conformance sweep (tests/conformance): common ops of
real models, from PyTorch's own OpInfo database, on tpu against the CPU.

Each op must pass forward float32 natively (no CPU fallback, every sample matching the CPU)
and, where it supports autograd, float32 backward.  The whole subset runs through the
harness's driver in one worker subprocess (so a crash fails the op's tests, not pytest);
the harness's own crash and timeout handling is checked with injected faults.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

_DIR = Path(__file__).resolve().parents[1] / "conformance"
sys.path.insert(0, str(_DIR))
_spec = importlib.util.spec_from_file_location("torchtpu_conformance_run", _DIR / "run.py")
conformance = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(conformance)
harness = conformance.harness

# Known gaps: (op, "fwd"|"bwd") -> reason. They are left out of the pass tests and
# checked to still fail by test_known_gaps_still_fail (drop the entry once fixed).
KNOWN_GAPS: dict[tuple[str, str], str] = {}

CFG = {"dtypes": ["float32"], "backward": True, "samples": 4, "max_numel": harness.MAX_NUMEL}


@pytest.fixture(scope="module")
def subset_results(tmp_path_factory):
    path = tmp_path_factory.mktemp("conformance") / "results.json"
    return conformance.run_sweep(list(harness.SUBSET), CFG, path, timeout_per_op=120)


def _explain(rec: dict, phase: str) -> str:
    p = rec.get("phases", {}).get(phase)
    if rec.get("status") in ("crash", "timeout"):
        return f"{rec['status']}: {rec.get('error')}"
    if p is None:
        return f"no {phase} results: {rec.get('error')}"
    return (
        f"{phase}: {p['passed']}/{p['total']} passed natively, {p['fallback_passed']} needed the"
        f" CPU fallback, {p['mismatch']} mismatched, {p['error']} errors;"
        f" first failure: {p['first_failure']}"
    )


def _without_gaps(kind: str) -> list[str]:
    ops = [op for op in harness.SUBSET if (op, kind) not in KNOWN_GAPS]
    if kind == "bwd":  # only ops op_db marks differentiable
        db, _ = harness.load_ops()
        ops = [op for op in ops if op in db and db[op].supports_autograd]
    return ops


@pytest.mark.parametrize(("op", "kind"), sorted(KNOWN_GAPS))
def test_known_gaps_still_fail(subset_results, op, kind):
    rec = subset_results[op]
    p = rec.get("phases", {}).get("fwd float32" if kind == "fwd" else "bwd float32")
    assert p is not None and not harness.phase_ok(p), (
        f"{op} {kind} passes now: remove it from KNOWN_GAPS ({KNOWN_GAPS[(op, kind)]})"
    )


@pytest.mark.parametrize("op", _without_gaps("fwd"))
def test_forward_float32_native(subset_results, op):
    rec = subset_results[op]
    p = rec.get("phases", {}).get("fwd float32")
    assert p is not None and p["total"] > 0, _explain(rec, "fwd float32")
    # phase_ok: every sample ran natively (the CPU fallback off) and matched the CPU.
    assert harness.phase_ok(p), _explain(rec, "fwd float32")


@pytest.mark.parametrize("op", _without_gaps("bwd"))
def test_backward_float32(subset_results, op):
    rec = subset_results[op]
    p = rec.get("phases", {}).get("bwd float32")
    assert p is not None and p["total"] > 0, _explain(rec, "bwd float32")
    assert harness.phase_ok(p), _explain(rec, "bwd float32")


def test_subset_is_in_op_db():
    ops, _ = harness.load_ops()
    assert not [k for k in harness.SUBSET if k not in ops]
    assert len(harness.SUBSET) >= 40


def test_compare_detects_wrong_results():
    """The referee itself: a wrong value, dtype, shape or device is a mismatch."""
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    harness.compare(x.to("tpu"), x)
    for bad in (x + 1e-3, x.double(), x.reshape(3, 2)):
        with pytest.raises(AssertionError):
            harness.compare(bad.to("tpu"), x)
    with pytest.raises(AssertionError, match="expected tpu"):
        harness.compare(x.clone(), x)
    with pytest.raises(AssertionError):
        harness.compare((x.to("tpu"),), (x, x))


def test_crash_and_hang_do_not_stop_the_sweep(tmp_path):
    """A worker that dies (abort) or hangs costs only its op: the next op runs on a fresh
    worker."""
    cfg = {**CFG, "backward": False, "samples": 1, "inject_crash": "add", "inject_hang": "sub"}
    res = conformance.run_sweep(["add", "sub", "mul"], cfg, tmp_path / "r.json", timeout_per_op=10)
    assert res["add"]["class"] == "crash"
    assert "SIGABRT" in res["add"]["error"]
    assert res["sub"]["class"] == "timeout"
    assert res["mul"]["class"] == "native"
    assert harness.phase_ok(res["mul"]["phases"]["fwd float32"])
