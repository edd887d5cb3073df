"""Runs PyTorch's device-generic op and module tests on tpu (tests/device/test_ops_device.py)
and writes the report docs/DEVICE_TESTS.md.  A report, not a gate: failures are listed, not
hidden.

    python tests/device/run.py                         # everything, writes the report
    python tests/device/run.py -k "add_tpu or mul_tpu"   # some tests (no report unless --out)
    python tests/device/run.py --render                # the report again from the last log

pytest runs in a subprocess with a plugin (devtests_plugin.py) that logs every outcome as it
happens.  A test that crashes the process (abort, segfault) or runs longer than
``--timeout-per-test`` is recorded as "crash" / "timeout" and pytest restarts with the tests
already done deselected, so one bad op costs one test.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
MODULE = HERE / "test_ops_device.py"
DEFAULT_LOG = ROOT / "build" / "device-tests" / "results.jsonl"
DEFAULT_DOC = ROOT / "docs" / "DEVICE_TESTS.md"

sys.path.insert(0, str(ROOT / "tests" / "conformance"))
from harness import BACKEND_ENV, signal_name

# Test kinds in report order: (class prefix, test name prefix, label).
KINDS = (
    ("TestOpsDevice", "test_compare_cpu", "ops: test_compare_cpu"),
    ("TestOpsDevice", "test_noncontiguous_samples", "ops: test_noncontiguous_samples"),
    ("TestOpsDevice", "test_out", "ops: test_out"),
    ("TestOpsDevice", "test_variant_consistency_eager", "ops: test_variant_consistency_eager"),
    ("TestOpsDevice", "test_grad_compare_cpu", "ops: test_grad_compare_cpu"),
    ("TestModulesDevice", "test_forward_compare_cpu", "modules: test_forward_compare_cpu"),
    ("TestModulesDevice", "test_grad_compare_cpu", "modules: test_grad_compare_cpu"),
)
OUTCOMES = ("passed", "failed", "skipped", "error", "crash", "timeout")
SUFFIX = "_tpu_float32"


# --------------------------------------------------------------------------- running


def parse_nodeid(nodeid: str) -> tuple[str, str]:
    """(kind label, subject) of a node id, e.g. ("ops: test_out", "nn_functional_conv2d")."""
    cls = nodeid.split("::")[-2] if "::" in nodeid else ""
    name = nodeid.split("::")[-1]
    for prefix, test, label in sorted(KINDS, key=lambda k: -len(k[1])):
        if cls.startswith(prefix) and name.startswith(test + "_"):
            subject = name[len(test) + 1 :]
            return label, subject.removesuffix(SUFFIX)
    return "other", name


def cache_totals(path: Path) -> dict:
    """Compile cache counters added up over the pytest processes of a log (the last
    snapshot of each process; a process starts with a "collected" event)."""
    totals: Counter = Counter()
    last: dict = {}
    if path.exists():
        with open(path) as f:
            for line in f:
                try:
                    ev = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if ev["event"] == "collected":
                    totals.update(last)
                    last = {}
                elif ev["event"] == "cache":
                    last = ev["stats"]
    totals.update(last)
    return dict(totals)


def read_log(path: Path) -> tuple[list[str], dict[str, dict], list[str]]:
    """(collected node ids, results by node id, started-but-unfinished node ids in order)."""
    collected: list[str] = []
    results: dict[str, dict] = {}
    started: list[str] = []
    if not path.exists():
        return collected, results, started
    with open(path) as f:
        for line in f:
            try:
                ev = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by a crash
            if ev["event"] == "collected" and not collected:
                collected = ev["nodeids"]
            elif ev["event"] == "start":
                started.append(ev["nodeid"])
            elif ev["event"] == "result":
                results[ev["nodeid"]] = ev
    return collected, results, [n for n in started if n not in results]


# Lines of a crashed process's output that say why it died (abseil / glog fatal lines,
# C++ exceptions, Python's faulthandler); faulthandler's stack itself is left out.
FATAL_MARKERS = (
    "Fatal Python error",
    "terminate called",
    "what():",
    "Check failed",
    "*** SIG",
)
GLOG_FATAL = re.compile(r"\bF\d{4} \d\d:\d\d:\d\d")


def _log_tail(path: Path, start: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(start)
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    keep = []
    for ln in text.splitlines():
        # A fatal message may follow pytest's progress characters on the same line.
        hits = [ln.find(m) for m in FATAL_MARKERS if m in ln]
        glog = GLOG_FATAL.search(ln)
        if glog:
            hits.append(glog.start())
        if hits:
            keep.append(ln[min(hits) :].strip())
    return " | ".join(keep[-3:])[-400:]


def run(args, save) -> None:
    """Runs pytest until every collected test has a result; ``save(seconds, processes)``
    records the progress after each pytest process (an interrupted run keeps it)."""
    log = Path(args.log)
    log.parent.mkdir(parents=True, exist_ok=True)
    out_log = log.with_suffix(".pytest.log")
    if not args.resume:
        log.unlink(missing_ok=True)
        out_log.unlink(missing_ok=True)
    skip_file = log.with_suffix(".done")
    env = {k: v for k, v in os.environ.items() if k not in BACKEND_ENV}
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT / "python"), str(HERE), env.get("PYTHONPATH", "")) if p
    )
    if args.max_samples:
        env["TORCHTPU_DEVTESTS_MAX_SAMPLES"] = str(args.max_samples)
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        str(args.module),
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "devtests_plugin",
        "--devtests-log",
        str(log),
        "--devtests-skip",
        str(skip_file),
        "-o",
        "addopts=",
    ]
    if args.k:
        cmd += ["-k", args.k]
    t0 = time.monotonic()
    processes = 0
    while True:
        collected, results, _ = read_log(log)
        skip_file.write_text("\n".join(results) + "\n")
        if collected and all(n in results for n in collected):
            break
        processes += 1
        start = out_log.stat().st_size if out_log.exists() else 0
        with open(out_log, "ab") as out:
            proc = subprocess.Popen(
                cmd, cwd=ROOT, env=env, stdout=out, stderr=out, start_new_session=True
            )
            try:
                rc, hung = _watch(proc, log, args.timeout_per_test)
            finally:
                # pytest runs in its own session: stop it with the runner (e.g. on SIGTERM).
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                save(time.monotonic() - t0, processes)
        collected, results, pending = read_log(log)
        current = pending[-1] if pending else None
        if hung and current:
            _append(log, current, "timeout", f"no result after {args.timeout_per_test:.0f} s")
        elif rc not in (0, 1, 5) and current:
            _append(log, current, "crash", f"{signal_name(rc)}: {_log_tail(out_log, start)}")
        elif rc not in (0, 1, 5) or (rc in (0, 1) and not collected):
            raise SystemExit(f"pytest failed ({signal_name(rc)}); see {out_log}")
        else:
            # Finished normally: tests it did not report (none expected) are left as they are.
            break
        print(f"[devtests] restarting after {current}", file=sys.stderr, flush=True)


def _watch(proc, log: Path, limit: float) -> tuple[int, bool]:
    """Waits for pytest; kills it when one test has run longer than ``limit`` seconds."""
    last_size, last_change = -1, time.monotonic()
    while True:
        try:
            return proc.wait(timeout=5), False
        except subprocess.TimeoutExpired:
            pass
        size = log.stat().st_size if log.exists() else 0
        if size != last_size:
            last_size, last_change = size, time.monotonic()
        _, _, pending = read_log(log) if time.monotonic() - last_change > limit else ([], {}, [])
        if pending:
            os.killpg(proc.pid, signal.SIGKILL)
            return proc.wait(), True


def _append(log: Path, nodeid: str, outcome: str, message: str) -> None:
    with open(log, "a") as f:
        f.write(
            json.dumps(
                {"event": "result", "nodeid": nodeid, "outcome": outcome, "message": message}
            )
            + "\n"
        )


# --------------------------------------------------------------------------- report


_KIND_RE = re.compile(
    r"^AssertionError: ([\w.]+): (\d+)/(\d+) samples failed; first: (.*)$", re.DOTALL
)


def cause(res: dict) -> str:
    """A failure's cause: mismatch / the exception type of the first failing sample /
    CPUFallback / crash / timeout."""
    if res["outcome"] in ("crash", "timeout"):
        return res["outcome"]
    msg = res.get("message", "")
    m = _KIND_RE.match(msg)
    if m:
        return m.group(1)
    if msg.startswith("AssertionError: CPUFallback"):
        return "CPUFallback"
    head = msg.split(":", 1)[0].strip()
    return f"{head} (outside the samples)" if head else "unknown"


def first_line(res: dict, limit: int = 220) -> str:
    msg = res.get("message", "") or ""
    m = _KIND_RE.match(msg)
    text = f"{m.group(2)}/{m.group(3)} samples; first: {m.group(4)}" if m else msg
    text = text.split("\n")[0]
    text = " ".join(text.split()).replace("|", "\\|")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _message_pattern(res: dict) -> str:
    """The first failure's message with numbers, shapes and quoted names blurred, for
    grouping similar failures."""
    m = _KIND_RE.match(res.get("message", "") or "")
    text = m.group(4) if m else (res.get("message", "") or "")
    text = text.split("\n")[0]
    text = re.sub(r"^sample #\d+: ", "", text)
    text = re.sub(r"^[\w.]+ \(alias\): |^[\w.]+\.(method|inplace)_variant: ", "", text)
    text = re.sub(r"\[[^\]]*\]", "[..]", text)
    text = re.sub(r"\([^)]*\)", "(..)", text)
    text = re.sub(r"-?\d+(\.\d+)?(e-?\d+)?", "N", text)
    return " ".join(text.split())[:160].replace("|", "\\|")


def upstream_expectations() -> dict[tuple[str, str], str]:
    """{(formatted op name, test name): "xfail"|"skip"} for the expected failures and skips
    op_db declares for PyTorch's own TestCommon test of the same name on every device."""
    import torch
    import torchtpu  # noqa: F401
    from torch.testing._internal.common_methods_invocations import op_db
    from torch.testing._internal.opinfo.core import DecorateInfo

    out = {}
    for op in op_db:
        for info in op.decorators:
            if not isinstance(info, DecorateInfo) or info.cls_name != "TestCommon":
                continue
            if info.device_type is not None:
                continue
            if info.dtypes is not None and torch.float32 not in info.dtypes:
                continue
            for dec in info.decorators:
                kind = getattr(dec, "__name__", "") or ""
                qual = getattr(dec, "__qualname__", "") or ""
                tag = "xfail" if kind == "expectedFailure" else "skip" if "skip" in qual else None
                if tag:
                    out[(op.formatted_name, info.test_name or "*")] = tag
    return out


def render(log: Path, meta: dict, out: Path) -> None:
    collected, results, _ = read_log(log)
    import torch

    by_kind: dict[str, Counter] = defaultdict(Counter)
    for nid in collected:
        label, _ = parse_nodeid(nid)
        res = results.get(nid)
        by_kind[label]["collected"] += 1
        by_kind[label][res["outcome"] if res else "not run"] += 1
    failures = [
        (parse_nodeid(nid), results[nid])
        for nid in collected
        if nid in results and results[nid]["outcome"] in ("failed", "error", "crash", "timeout")
    ]
    skips = Counter(
        (parse_nodeid(nid)[0], results[nid].get("message", "").split("\n")[0][:120])
        for nid in collected
        if nid in results and results[nid]["outcome"] == "skipped"
    )
    upstream = upstream_expectations()
    labels = [k[2] for k in KINDS if k[2] in by_kind] + (["other"] if "other" in by_kind else [])
    total = Counter()
    for lb in labels:
        total.update(by_kind[lb])

    L = []
    L.append("# Device tests: PyTorch's op and module databases on tpu")
    L.append("")
    L.append(
        "Generated by `tests/device/run.py` (`make device-tests`); do not edit by hand. "
        "Device-generic test templates (`tests/device/opinfo_suite.py`) in the spirit of "
        "PyTorch's `test/test_ops.py` are instantiated for the `tpu` device with PyTorch's "
        "own machinery (`torch.testing._internal.common_device_type."
        'instantiate_device_type_tests(..., only_for="tpu")`, which picks '
        "`PrivateUse1TestBase`) over every float32 entry of `op_db` (`@ops`) and "
        "`module_db` (`@modules`). Every test compares tpu with PyTorch's CPU. "
        "This is a report, not a gate: `make test` runs only a representative subset "
        "(`tests/python/test_device_suite.py`), which must pass."
    )
    L.append("")
    L.append("## Summary")
    L.append("")
    L.append(f"- Command: `{meta.get('command', 'python tests/device/run.py')}`")
    L.append(
        f"- Date: {meta.get('date', '?')}; torch {torch.__version__}; "
        f"run time {_duration(meta.get('seconds', 0))} on {os.cpu_count()} CPU core(s), "
        f"{meta.get('processes', 1)} pytest process(es) (one more after each crash or timeout)"
        f"; samples per test: {meta.get('max_samples') or 'all'}"
    )
    cache = cache_totals(log)
    if cache:
        loaded = cache.get("disk_hits", 0) + cache.get("shared_hits", 0)
        L.append(
            f"- Compile cache (`torchtpu.cache_stats`, about: snapshots every 200 tests): "
            f"{cache.get('misses', 0)} programs compiled "
            f"({_duration(cache.get('compile_seconds', 0))}), {loaded} loaded from disk, "
            f"{cache.get('memory_hits', 0)} from memory; the run time depends on it (a cold "
            "cache compiles every program once)"
        )
    L.append(
        f"- **Tests collected: {total['collected']}; passed {total['passed']}, "
        f"failed {total['failed']}, skipped {total['skipped']}, errors {total['error']}, "
        f"crashes {total['crash']}, timeouts {total['timeout']}**"
        + (f", not run {total['not run']}" if total["not run"] else "")
    )
    ran = total["collected"] - total["skipped"] - total["not run"]
    if ran:
        L.append(f"- Pass rate of the tests that ran (not skipped): {_pct(total['passed'], ran)}")
    L.append("")
    bad = [(lab, res) for lab, res in failures if res["outcome"] in ("crash", "timeout")]
    if bad:
        L.append(
            "Crashes and timeouts (the process died or hung; the runner restarted pytest after "
            "the test, so only that test is lost):"
        )
        L.append("")
        for (label, subject), res in bad:
            L.append(f"- {subject}, {label}: {res['outcome']}: {first_line(res)}")
        L.append("")
    L.append("| test kind | collected | passed | failed | skipped | error | crash | timeout |")
    L.append("|---|---|---|---|---|---|---|---|")
    for lb in labels + ["total"]:
        c = total if lb == "total" else by_kind[lb]
        name = f"**{lb}**" if lb == "total" else lb
        L.append(f"| {name} | {c['collected']} | " + " | ".join(str(c[o]) for o in OUTCOMES) + " |")
    L.append("")

    L.append("### Failure causes")
    L.append("")
    L.append(
        "The cause is the first failing sample's: `mismatch` (a tpu result differs from "
        "the CPU's beyond the tolerance, or in dtype/shape/device), or the exception type the "
        "tpu side raised (`NotImplementedError`: no lowering, the CPU fallback being off). "
        "A test runs all its samples; the count of failing samples is in each row below."
    )
    L.append("")
    causes = Counter()
    cause_kind: dict[str, Counter] = defaultdict(Counter)
    for (label, _), res in failures:
        c = cause(res)
        causes[c] += 1
        cause_kind[c][label] += 1
    hdr = " | ".join(lb.replace(": test_", " ") for lb in labels)
    L.append(f"| cause | {hdr} | total |")
    L.append("|---|" + "---|" * (len(labels) + 1))
    for c, n in causes.most_common():
        L.append(f"| {c} | " + " | ".join(str(cause_kind[c][lb]) for lb in labels) + f" | {n} |")
    L.append("")
    L.append("Most frequent first-failure messages (numbers and shapes blurred):")
    L.append("")
    L.append("| count | cause | message |")
    L.append("|---|---|---|")
    pats = Counter((cause(res), _message_pattern(res)) for _, res in failures)
    for (c, p), n in pats.most_common(25):
        L.append(f"| {n} | {c} | {p} |")
    L.append("")
    L.append("### Skips")
    L.append("")
    L.append(
        "Tests skip only when there is nothing to check: no out= variant, no "
        "method/in-place/alias variant, no differentiable sample, or no sample the CPU "
        "itself runs (PyTorch's own skip decorators, e.g. `onlyCUDA`, also apply)."
    )
    L.append("")
    L.append("| reason | count | by test kind |")
    L.append("|---|---|---|")
    by_reason: dict[str, Counter] = defaultdict(Counter)
    for (lb, reason), n in skips.items():
        by_reason[reason][lb] += n
    for reason, kinds in sorted(by_reason.items(), key=lambda kv: -sum(kv[1].values())):
        detail = ", ".join(f"{lb.replace(': test_', ' ')} {n}" for lb, n in kinds.most_common())
        L.append(f"| {reason.replace('|', '/')} | {sum(kinds.values())} | {detail} |")
    L.append("")
    L.append("### Method")
    L.append("")
    L.append(
        "- Samples: `op.reference_inputs('cpu', float32)` for test_compare_cpu, "
        "`op.sample_inputs('cpu', float32)` for the other op tests (`requires_grad=True` "
        "for gradients), `module_info.module_inputs_func` for modules: "
        + (
            f"the first {meta['max_samples']} of each (`--max-samples`; most ops have fewer, "
            "a few have hundreds)"
            if meta.get("max_samples")
            else "all of them"
        )
        + "; samples without a tensor are left out. Inputs are made on the CPU and copied to "
        "tpu, so both sides see the same values."
    )
    L.append(
        "- Comparison: `TestCase.assertEqual(tpu result, CPU result, rtol=1e-3, atol=1e-3)` "
        "(PyTorch's own test_compare_cpu bound; looser where the OpInfo carries a looser "
        "toleranceOverride for TestCommon), after `sample.output_process_fn_grad`; every "
        "output tensor must be on tpu. Random or uninitialised outputs (ops PyTorch's "
        "test_compare_cpu skips for that, dropout in training mode, FractionalMaxPool) are "
        "compared by structure, shape and dtype only. A test fails if any op ran on the CPU "
        "fallback (it is off, so normally the op raises instead). The tight tolerance check "
        "is the conformance sweep, docs/OP_COVERAGE.md."
    )
    L.append(
        "- test_compare_cpu: the op on tpu vs the CPU. test_noncontiguous_samples: inputs "
        "made non-contiguous on tpu (`noncontiguous_like`: every other element of a buffer "
        "twice as large) vs the CPU on contiguous ones. test_out: the out= variant with an "
        "out tensor of the right shape (pre-filled with NaN / 7) and with an empty one it "
        "must resize; it must return the out tensor. test_variant_consistency_eager: method, "
        "in-place, operator and alias variants on tpu vs the same variant on the CPU; "
        "in-place ones must return their input. test_grad_compare_cpu: outputs and "
        "`torch.autograd.grad` of every input requiring grad under a fixed random "
        "cotangent. Modules: built on the CPU (seed 0), deep-copied to tpu, forward outputs "
        "plus `state_dict()` afterwards (running statistics), and gradients of inputs and "
        "parameters; train and eval mode where they differ."
    )
    L.append(
        "- Samples whose CPU reference raises are not counted; a test reports "
        "`failed/total` samples and the first failure."
    )
    L.append(
        "- Column *upstream* in the table below: `xfail`/`skip` when op_db declares an "
        "expected failure/skip on every device for PyTorch's own TestCommon test of that "
        "name (PyTorch's own kernels fail or cannot run that test too); the templates here "
        "do not apply those declarations."
    )
    L.append(
        "- Raw outcomes: `build/device-tests/results.jsonl` (one JSON object a line); "
        "`python tests/device/run.py --render` rewrites this file from it; "
        "`pytest tests/device/test_ops_device.py -k <name>` reruns one test."
    )
    L.append("")
    L.append("## Failures by op or module")
    L.append("")
    L.append("| op / module | test | cause | upstream | first failure |")
    L.append("|---|---|---|---|---|")
    for (label, subject), res in sorted(failures, key=lambda f: (f[0][1], f[0][0])):
        test = label.split(": ")[-1]
        up = upstream.get((subject, test)) or upstream.get((subject, "*")) or ""
        kind = "" if label.startswith("ops") else " (module)"
        L.append(f"| {subject}{kind} | {test} | {cause(res)} | {up} | {first_line(res)} |")
    L.append("")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(L))
    print(f"[devtests] wrote {out}", file=sys.stderr)


def _pct(a: int, b: int) -> str:
    return f"{a}/{b} ({100.0 * a / b:.1f}%)" if b else "0/0"


def _duration(s: float) -> str:
    s = round(s)
    return f"{s // 3600} h {s % 3600 // 60} min" if s >= 3600 else f"{s // 60} min {s % 60} s"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-k", default=None, help="pytest -k expression (no report unless --out)")
    ap.add_argument("--out", default=None, help=f"report path (default {DEFAULT_DOC})")
    ap.add_argument("--log", default=str(DEFAULT_LOG), help="JSON-lines outcome log")
    ap.add_argument("--timeout-per-test", type=float, default=300.0)
    # The first 32 samples: all of them for most ops; a few ops have hundreds to 1440
    # (max_pool2d), each shape compiling a program, which would multiply the run time.
    ap.add_argument("--max-samples", type=int, default=32, help="samples per test (0: all)")
    ap.add_argument("--resume", action="store_true", help="keep the log's outcomes, run the rest")
    ap.add_argument("--render", action="store_true", help="only rewrite the report from --log")
    ap.add_argument("--module", default=str(MODULE), help=argparse.SUPPRESS)  # runner self-test
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds through run()'s finally
    log = Path(args.log)
    meta_path = log.with_suffix(".meta.json")
    if args.render:
        meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
        render(log, meta, Path(args.out or DEFAULT_DOC))
        return 0
    meta = {
        "command": "python tests/device/run.py"
        + "".join(f" {a}" for a in map(shlex.quote, sys.argv[1:])),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "max_samples": args.max_samples or None,
        "seconds": 0.0,
        "processes": 0,
    }
    if args.resume and meta_path.exists():
        # A resumed run continues the earlier one: its date and command, times added up.
        meta = {**json.loads(meta_path.read_text()), "resumed": True}
    base = (meta["seconds"], meta["processes"])

    def save(seconds: float, processes: int) -> None:
        meta["seconds"], meta["processes"] = base[0] + seconds, base[1] + processes
        meta_path.write_text(json.dumps(meta))

    run(args, save)
    collected, results, _ = read_log(log)
    counts = Counter(r["outcome"] for n, r in results.items() if n in set(collected))
    print(f"[devtests] {len(collected)} collected: {dict(counts)}", file=sys.stderr)
    if args.out or not args.k:
        render(log, meta, Path(args.out or DEFAULT_DOC))
    return 0


if __name__ == "__main__":
    sys.exit(main())
