"""Op conformance sweep: PyTorch's OpInfo database (op_db) on tpu against the CPU.

    python tests/conformance/run.py                      # every op, writes docs/OP_COVERAGE.md
    python tests/conformance/run.py --ops add,mul,cat    # some ops (no doc unless --out)
    python tests/conformance/run.py --subset             # the representative subset

Ops run in worker subprocesses (one op at a time, ``--jobs`` workers): a worker that
crashes or exceeds ``--timeout-per-op`` is recorded as "crash"/"timeout" for that op and
replaced.  Results go to ``--json`` (default build/conformance/results.json) and, for a full
sweep or with ``--out``, to the Markdown report.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import queue
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

import harness

DEFAULT_JSON = ROOT / "build" / "conformance" / "results.json"
DEFAULT_DOC = ROOT / "docs" / "OP_COVERAGE.md"
# Compile cache counters (torchtpu.cache_stats) summed over the sweep.
CACHE_KEYS = ("misses", "memory_hits", "disk_hits", "shared_hits", "compile_seconds")
# A Python that has imported torchtpu but not yet answered is given this long to start.
STARTUP_TIMEOUT = 180


# --------------------------------------------------------------------------- worker side


def worker_main(cfg: dict) -> int:
    """Reads op keys (one JSON object a line) from stdin; writes events, one JSON object a
    line, to the pipe ``cfg["fd"]`` the driver passed."""
    proto = os.fdopen(cfg["fd"], "w", buffering=1)
    os.dup2(2, 1)  # anything printed goes to the log, never into the protocol
    import warnings

    warnings.simplefilter("ignore")
    for name in harness.BACKEND_ENV:
        os.environ.pop(name, None)
    os.environ.update(harness.OP_TEST_ENV)

    def emit(msg: dict) -> None:
        proto.write(json.dumps(msg) + "\n")

    ops, _ = harness.load_ops()
    import torchtpu  # registers the device

    def cache_counts() -> dict:
        stats = getattr(torchtpu, "cache_stats", dict)()
        return {k: stats.get(k, 0) for k in CACHE_KEYS}

    emit({"event": "ready"})
    for line in sys.stdin:
        req = json.loads(line)
        op = ops[req["op"]]
        t0 = time.monotonic()
        cache0 = cache_counts()
        # Fault injection for the harness's own tests (tests/python/test_conformance_subset.py).
        if req["op"] == cfg.get("inject_crash"):
            emit({"event": "stage", "stage": "injected crash"})
            os.abort()
        if req["op"] == cfg.get("inject_hang"):
            emit({"event": "stage", "stage": "injected hang"})
            time.sleep(3600)
        try:
            res = harness.run_op(
                op,
                dtypes=tuple(cfg["dtypes"]),
                backward=cfg["backward"],
                cap=cfg["samples"],
                max_numel=cfg["max_numel"],
                emit=emit,
            )
        except Exception as e:  # noqa: BLE001 - reported, the sweep goes on
            res = {"phases": {}, "fallback_ops": {}, "error": harness._describe_error(e)}
        res["seconds"] = round(time.monotonic() - t0, 3)
        res["cache"] = {k: v - cache0[k] for k, v in cache_counts().items()}
        emit({"event": "done", "result": res})
    return 0


# --------------------------------------------------------------------------- driver side


class Worker:
    """One worker subprocess; events arrive on a queue filled by a reader thread."""

    def __init__(self, cfg: dict, log_path: Path, pythonpath: str) -> None:
        self.events: queue.Queue = queue.Queue()
        r, w = os.pipe()
        env = {k: v for k, v in os.environ.items() if k not in harness.BACKEND_ENV}
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (pythonpath, os.environ.get("PYTHONPATH", "")) if p
        )
        self.log = open(log_path, "ab")  # noqa: SIM115 - closed in kill()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(Path(__file__).resolve()),
                "--worker",
                json.dumps({**cfg, "fd": w}),
            ],
            stdin=subprocess.PIPE,
            stdout=self.log,
            stderr=self.log,
            pass_fds=(w,),
            env=env,
            start_new_session=True,
            text=True,
        )
        os.close(w)
        self.log_path = log_path
        self.log_start = log_path.stat().st_size if log_path.exists() else 0
        self.reader = threading.Thread(target=self._read, args=(r,), daemon=True)
        self.reader.start()
        self.ops_done = 0

    def _read(self, fd: int) -> None:
        with os.fdopen(fd) as f:
            for line in f:
                try:
                    self.events.put(json.loads(line))
                except json.JSONDecodeError:
                    continue
        self.events.put(None)  # EOF: the worker is gone

    def wait_ready(self) -> str | None:
        """None when ready, else what went wrong."""
        try:
            ev = self.events.get(timeout=STARTUP_TIMEOUT)
        except queue.Empty:
            self.kill()
            return "worker did not start"
        if ev is None or ev.get("event") != "ready":
            self.proc.wait()
            return f"worker failed to start: {self.log_tail()}"
        return None

    def send(self, key: str) -> None:
        self.proc.stdin.write(json.dumps({"op": key}) + "\n")
        self.proc.stdin.flush()

    def log_tail(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self.log_start)
                text = f.read().decode(errors="replace")
        except OSError:
            return ""
        lines = [
            ln
            for ln in text.splitlines()
            if ln.strip() and "absl::InitializeLog" not in ln and "cpu_device_count" not in ln
        ]
        return harness._one_line(" | ".join(lines[-2:]), 300)

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        self.log.close()


def _snapshot_package(dest: Path) -> str:
    """Copies python/torchtpu into ``dest`` so a rebuild of the extension by someone else
    during the sweep cannot change the library under a running worker.  Returns the
    PYTHONPATH entry."""
    src = ROOT / "python" / "torchtpu"
    target = dest / "torchtpu"
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(src, target, ignore=shutil.ignore_patterns("__pycache__"))
    return str(dest)


def run_sweep(
    keys: list[str],
    cfg: dict,
    json_path: str | Path = DEFAULT_JSON,
    *,
    jobs: int = 1,
    timeout_per_op: float = 60.0,
    ops_per_worker: int = 200,
    snapshot: bool = False,
    quiet: bool = True,
) -> dict:
    """Runs the op_db entries ``keys`` through ``jobs`` worker subprocesses; returns
    {key: record}.  ``cfg``: dtypes, backward, samples, max_numel (see worker_main).
    Worker logs go next to ``json_path``, which also gets partial results as they come."""
    work = Path(json_path).resolve().parent
    work.mkdir(parents=True, exist_ok=True)
    pythonpath = str(ROOT / "python")
    if snapshot:
        pythonpath = _snapshot_package(work / "snapshot")
    results: dict[str, dict] = {}
    todo: queue.Queue = queue.Queue()
    for k in keys:
        todo.put(k)
    lock = threading.Lock()
    n_total = len(keys)
    t_start = time.monotonic()

    def log(msg: str) -> None:
        if not quiet:
            with lock:
                print(msg, flush=True)

    def start_worker(idx: int) -> Worker:
        for attempt in range(5):
            w = Worker(cfg, work / f"worker-{idx}.log", pythonpath)
            err = w.wait_ready()
            if err is None:
                return w
            w.kill()
            log(f"[worker {idx}] {err}; retrying in 30 s")
            time.sleep(30)
            if snapshot and attempt >= 1:
                _snapshot_package(work / "snapshot")
        raise RuntimeError(f"could not start a conformance worker: {err}")

    def drive(idx: int) -> None:
        w = None
        while True:
            try:
                key = todo.get_nowait()
            except queue.Empty:
                break
            if w is None or w.ops_done >= ops_per_worker:
                if w is not None:
                    w.kill()
                w = start_worker(idx)
            rec: dict = {"phases": {}, "fallback_ops": {}}
            stage = "starting"
            deadline = time.monotonic() + timeout_per_op
            t0 = time.monotonic()
            w.send(key)
            w.ops_done += 1
            while True:
                try:
                    ev = w.events.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    rec["status"] = "timeout"
                    rec["error"] = f"timed out after {timeout_per_op:g} s in {stage}"
                    w.kill()
                    w = None
                    break
                if ev is None:
                    rc = w.proc.wait()
                    rec["status"] = "crash"
                    rec["error"] = harness._one_line(
                        f"worker died ({harness.signal_name(rc)}) in {stage}: {w.log_tail()}", 300
                    )
                    w.kill()
                    w = None
                    break
                kind = ev["event"]
                if kind == "start":
                    rec["supported"] = ev["supported"]
                    rec["values_unchecked"] = ev["values_unchecked"]
                elif kind == "stage":
                    stage = ev["stage"]
                elif kind == "phase":
                    rec["phases"][ev["key"]] = ev["rec"]
                    rec["fallback_ops"] = ev["fallback_ops"]
                elif kind == "done":
                    rec.update(ev["result"])
                    break
            rec.setdefault("seconds", round(time.monotonic() - t0, 3))
            rec["class"] = harness.classify(rec)
            with lock:
                results[key] = rec
                done = len(results)
            elapsed = time.monotonic() - t_start
            log(
                f"[{done}/{n_total} {elapsed:6.0f}s] {key}: {rec['class']} "
                f"{_cell(rec, 'fwd float32')} bwd {_cell(rec, 'bwd float32')} "
                f"({rec['seconds']:.1f}s)"
            )
            if done % 25 == 0:
                _write_json(json_path, {"partial": True, "results": results})
        if w is not None:
            w.kill()

    threads = [threading.Thread(target=drive, args=(i,)) for i in range(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def _write_json(path, data: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    tmp.replace(path)


# --------------------------------------------------------------------------- report


def _cell(rec: dict, key: str) -> str:
    """'passed/total' of a phase (+N via fallback), '-' when the op does not have it."""
    p = rec.get("phases", {}).get(key)
    if p is None:
        if key in rec.get("supported", []) and rec.get("status") in ("crash", "timeout"):
            return rec["status"]
        return "-"
    text = f"{p['passed']}/{p['total']}"
    if p.get("fallback_passed"):
        text += f" (+{p['fallback_passed']} fb)"
    return text


def summarize(results: dict, excluded: dict) -> dict:
    n = len(results)
    s = {
        "ops_in_op_db": n + len(excluded),
        "excluded": len(excluded),
        "ops": n,
        "with_f32": 0,
        "fwd_f32_native": 0,
        "fwd_f32_decomposed": 0,
        "fwd_primary_native": 0,
        "bwd_ops": 0,
        "bwd_pass": 0,
        "classes": {},
        "dtypes": {},
        "fallback_ops": {},
        "values_unchecked": 0,
        "cache": dict.fromkeys(CACHE_KEYS, 0),
    }
    for rec in results.values():
        cls = rec["class"] = harness.classify(rec)
        s["classes"][cls] = s["classes"].get(cls, 0) + 1
        phases = rec.get("phases", {})
        supported = rec.get("supported", [])
        if rec.get("values_unchecked"):
            s["values_unchecked"] += 1
        for k, v in rec.get("cache", {}).items():
            if k in s["cache"]:
                s["cache"][k] += v
        if "fwd float32" in supported:
            s["with_f32"] += 1
            if harness.phase_ok(phases.get("fwd float32")):
                s["fwd_f32_native"] += 1
                s["fwd_f32_decomposed"] += bool(phases["fwd float32"].get("decomposed"))
        prim = harness.primary_dtype(rec)
        if prim and harness.phase_ok(phases.get(f"fwd {prim}")):
            s["fwd_primary_native"] += 1
        if "bwd float32" in supported:
            s["bwd_ops"] += 1
            if harness.phase_ok(phases.get("bwd float32")):
                s["bwd_pass"] += 1
        for d in harness.DTYPE_NAMES:
            key = f"fwd {d}"
            if key in supported:
                entry = s["dtypes"].setdefault(d, [0, 0])
                entry[1] += 1
                if harness.phase_ok(phases.get(key)):
                    entry[0] += 1
        for name, count in rec.get("fallback_ops", {}).items():
            s["fallback_ops"].setdefault(name, [0, 0])
            s["fallback_ops"][name][0] += 1
            s["fallback_ops"][name][1] += count
    return s


def _cache_line(s: dict) -> str:
    c = s["cache"]
    hits = c["memory_hits"] + c["disk_hits"] + c["shared_hits"]
    return (
        f"{c['misses']} programs compiled ({c['compile_seconds']:.0f} s), {hits} from the cache"
        f" ({c['disk_hits'] + c['shared_hits']} from disk); a cold cache makes the sweep slower"
    )


def _pct(a: int, b: int) -> str:
    return f"{a}/{b} ({100.0 * a / b:.1f}%)" if b else "0/0"


def _md(text: str | None) -> str:
    if not text:
        return ""
    return harness._one_line(text, 150).replace("|", "\\|").replace("`", "'")


def _first_failure(rec: dict) -> str:
    if rec.get("error"):
        return rec["error"]
    for key in rec.get("supported", []):
        p = rec.get("phases", {}).get(key)
        if p and p.get("first_failure"):
            return p["first_failure"]
        if p and p.get("error_samples"):
            return f"{key}: sample generation failed: {p['error_samples']}"
    return ""


def render(results: dict, excluded: dict, meta: dict) -> str:
    s = summarize(results, excluded)
    cls = s["classes"]
    lines = [
        "# Op coverage (PyTorch OpInfo conformance)",
        "",
        (
            "Generated by the conformance harness (`tests/conformance/run.py`, `make conformance`);"
            " do not edit by hand. Every entry of PyTorch's own op database"
            " (`torch.testing._internal.common_methods_invocations.op_db`) runs its sample inputs"
            " on `tpu` and on the CPU and the results are compared."
        ),
        "",
        "## Summary",
        "",
        f"- Command: `{meta['command']}`",
        (
            f"- Date: {meta['date']}; torch {meta['torch']}; sweep time {meta['duration']}"
            f" ({meta['jobs']} worker(s), {meta['machine']}); compile cache: {_cache_line(s)}"
        ),
        (
            f"- op_db entries: {s['ops_in_op_db']}; excluded {s['excluded']} (sparse, quantized,"
            f" CUDA-only, float8-only, storage-layout dependent; listed at the end); tested **{s['ops']}**"
        ),
        (
            f"- **Forward float32, native (no CPU fallback), every sample matching the CPU:"
            f" {_pct(s['fwd_f32_native'], s['ops'])}** of tested ops"
            f" ({_pct(s['fwd_f32_native'], s['with_f32'])} of the {s['with_f32']} ops with a float32"
            f" CPU kernel; {s['fwd_f32_decomposed']} of them use a `torch._decomp` decomposition)"
        ),
        (
            f"- Forward in the op's primary dtype (float32, or its first supported dtype among"
            f" int64/int32/bool/complex64 for ops without one), native: {_pct(s['fwd_primary_native'], s['ops'])}"
        ),
        (
            f"- **Backward float32 (gradients of every differentiable input), native, matching:"
            f" {_pct(s['bwd_pass'], s['bwd_ops'])}** of ops that support autograd"
            f" ({_pct(s['bwd_pass'], s['ops'])} of tested ops)"
        ),
        (
            f"- **Crashes: {cls.get('crash', 0)}; timeouts: {cls.get('timeout', 0)}**"
            f" (per-op timeout {meta['timeout']} s)"
        ),
        (
            f"- Status of the tested ops: native {cls.get('native', 0)}, decomposed"
            f" {cls.get('decomposed', 0)}, fallback"
            f" {cls.get('fallback', 0)}, unsupported {cls.get('unsupported', 0)}, error"
            f" {cls.get('error', 0)}, crash"
            f" {cls.get('crash', 0)}, timeout {cls.get('timeout', 0)}, no samples"
            f" {cls.get('no-samples', 0)}"
        ),
        (
            f"- Values not compared (PyTorch's own test_compare_cpu skips them: random,"
            f" uninitialised or undefined outputs; shape, dtype and device are still checked):"
            f" {s['values_unchecked']} ops"
        ),
        "",
        (
            "Targets (issue 4): >= 90% forward float32 native, >= 80% backward, zero crashes,"
            " full sweep < 30 min."
        ),
        "",
        (
            "Forward pass rate by dtype (ops whose every sample ran natively and matched / ops"
            " with a CPU kernel for that dtype):"
        ),
        "",
        "| dtype | ops passing |",
        "|---|---|",
    ]
    for d in harness.DTYPE_NAMES:
        a, b = s["dtypes"].get(d, [0, 0])
        lines.append(f"| {d} | {_pct(a, b)} |")
    lines += [
        "",
        "### Method",
        "",
        (
            f"- Samples: the first {meta['samples']} of `op.sample_inputs('cpu', dtype)` per op and"
            f" dtype, skipping samples with more than {meta['max_numel']} input elements; dtypes"
            f" {', '.join(harness.DTYPE_NAMES)} where `op.supported_dtypes('cpu')` has them."
        ),
        (
            "- Forward: `op(sample)` on the CPU and on copies of the inputs on `tpu`;"
            " `torch.testing.assert_close(equal_nan=True)` with rtol/atol by output dtype:"
            " float32 1.3e-6/1e-5, bfloat16 and float16 1.6e-2/1e-2, integers and bool exact,"
            " loosened where the op's OpInfo carries a `toleranceOverride` for PyTorch's own"
            " TestCommon tests on the CPU (the loosest one). Samples whose CPU reference raises"
            " are not counted; the same seed precedes both runs."
        ),
        (
            f"- Backward (float32, ops with `supports_autograd`): `torch.autograd.grad` of the"
            f" sample's differentiable outputs under a fixed random cotangent with respect to every"
            f" input that requires grad, tpu vs CPU, rtol/atol {harness.BACKWARD_F32_TOL[0]}/"
            f"{harness.BACKWARD_F32_TOL[1]}."
        ),
        (
            "- Status: **native** every sample ran with the CPU fallback off (failures may still be"
            " mismatches or errors); **fallback** some sample raised `NotImplementedError` and"
            " ran when rerun with `TORCHTPU_CPU_FALLBACK=1`; **unsupported** some sample raised"
            " `NotImplementedError` with the fallback on too (e.g. PyTorch's"
            " `convolution_overrideable` stub, which the fallback cannot reach); **decomposed**"
            " everything ran on the device, some op through its `torch._decomp` decomposition"
            " (the op has no rule; counted in `metrics()['decomposed']`); **error** no"
            " fallback needed but every forward sample of the primary dtype raised; **crash**/"
            "**timeout** the worker process died or exceeded the per-op limit (the op's remaining"
            " samples are lost, the sweep goes on with a new worker)."
        ),
        (
            "- Cells: `passed/total` on the device (native or decomposed); `(+N fb)` samples"
            " that needed the CPU fallback."
        ),
        (
            "- Raw results: `build/conformance/results.json` (per sample-set counts, fallback ops,"
            " timings); `python tests/conformance/run.py --render build/conformance/results.json`"
            " re-renders this file; `--ops a,b` reruns some ops."
        ),
        "",
    ]
    fb = sorted(s["fallback_ops"].items(), key=lambda kv: (-kv[1][0], kv[0]))
    if fb:
        lines += [
            "### ATen ops that needed the CPU fallback",
            "",
            (
                "ATen operators that ran through `TORCHTPU_CPU_FALLBACK` in the fallback reruns, by"
                " number of op_db entries needing them (lowering these unlocks the most entries):"
            ),
            "",
            "| aten op | op_db entries | calls |",
            "|---|---|---|",
        ]
        lines += [f"| {name} | {a} | {b} |" for name, (a, b) in fb[:60]]
        if len(fb) > 60:
            lines.append(f"| ... {len(fb) - 60} more | | |")
        lines.append("")
    lines += [
        "## Per op",
        "",
        "| op | status | fwd f32 | other dtypes | bwd f32 | first failure |",
        "|---|---|---|---|---|---|",
    ]
    for key in sorted(results):
        rec = results[key]
        others = " ".join(
            f"{harness.SHORT[d]} {_cell(rec, f'fwd {d}')}"
            for d in harness.DTYPE_NAMES[1:]
            if f"fwd {d}" in rec.get("supported", [])
        )
        status = rec.get("class", "")
        if rec.get("values_unchecked"):
            status += " (values unchecked)"
        lines.append(
            f"| {key} | {status} | {_cell(rec, 'fwd float32')} | {others} |"
            f" {_cell(rec, 'bwd float32')} | {_md(_first_failure(rec))} |"
        )
    lines += ["", "## Excluded op_db entries", "", "| op | reason |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in sorted(excluded.items())]
    lines.append("")
    return "\n".join(lines)


# --------------------------------------------------------------------------- main


def _fmt_duration(seconds: float) -> str:
    m, s = divmod(round(seconds), 60)
    return f"{m} min {s:02d} s"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", help="comma-separated op keys (name or name.variant)")
    ap.add_argument("--subset", action="store_true", help="the representative subset")
    ap.add_argument("--out", help="Markdown report (default for a full sweep: docs/OP_COVERAGE.md)")
    ap.add_argument("--json", default=str(DEFAULT_JSON), help="results file")
    ap.add_argument("--timeout-per-op", type=float, default=60.0)
    ap.add_argument("--jobs", type=int, default=1, help="worker processes")
    ap.add_argument("--samples", type=int, default=harness.MAX_SAMPLES, help="per op and dtype")
    ap.add_argument("--max-numel", type=int, default=harness.MAX_NUMEL)
    ap.add_argument("--dtypes", default=",".join(harness.DTYPE_NAMES))
    ap.add_argument("--no-backward", action="store_true")
    ap.add_argument("--ops-per-worker", type=int, default=200, help="restart workers after N")
    ap.add_argument(
        "--no-snapshot",
        dest="snapshot",
        action="store_false",
        help="run the live python/torchtpu instead of a copy taken at the start",
    )
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument(
        "--render",
        metavar="JSON",
        help="only re-render the report (--out, default docs/OP_COVERAGE.md) from a results file",
    )
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.worker:
        return worker_main(json.loads(args.worker))
    if args.render:
        data = json.loads(Path(args.render).read_text())
        out = args.out or str(DEFAULT_DOC)
        Path(out).write_text(render(data["results"], data.get("excluded", {}), data["meta"]))
        print(f"report: {out}")
        return 0

    ops, excluded = harness.load_ops()
    if args.ops:
        keys = [k.strip() for k in args.ops.split(",") if k.strip()]
    elif args.subset:
        keys = list(harness.SUBSET)
    else:
        keys = list(ops)
    unknown = [k for k in keys if k not in ops]
    if unknown:
        ap.error(f"not in op_db (or excluded): {', '.join(unknown)}")
    full = not args.ops and not args.subset
    out = args.out or (str(DEFAULT_DOC) if full else None)

    cfg = {
        "dtypes": [d for d in args.dtypes.split(",") if d],
        "backward": not args.no_backward,
        "samples": args.samples,
        "max_numel": args.max_numel,
    }
    import torch

    t0 = time.monotonic()
    results = run_sweep(
        keys,
        cfg,
        args.json,
        jobs=args.jobs,
        timeout_per_op=args.timeout_per_op,
        ops_per_worker=args.ops_per_worker,
        snapshot=args.snapshot,
        quiet=args.quiet,
    )
    duration = time.monotonic() - t0
    cmd = " ".join(shlex.quote(a) for a in sys.argv[1:])
    meta = {
        "command": f"python tests/conformance/run.py {cmd}".strip(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "torch": torch.__version__,
        "duration": _fmt_duration(duration),
        "seconds": round(duration, 1),
        "jobs": args.jobs,
        "machine": f"{os.cpu_count()} CPU cores",
        "timeout": args.timeout_per_op,
        "samples": args.samples,
        "max_numel": args.max_numel,
        "config": cfg,
    }
    _write_json(args.json, {"meta": meta, "excluded": excluded if full else {}, "results": results})
    s = summarize(results, excluded if full else {})
    cls = s["classes"]
    print(
        f"\n{s['ops']} ops in {meta['duration']}: forward f32 native"
        f" {_pct(s['fwd_f32_native'], s['ops'])}, backward {_pct(s['bwd_pass'], s['bwd_ops'])},"
        f" crashes {cls.get('crash', 0)}, timeouts {cls.get('timeout', 0)},"
        f" fallback {cls.get('fallback', 0)}, unsupported {cls.get('unsupported', 0)}"
        f"\nresults: {args.json}"
    )
    if out:
        Path(out).write_text(render(results, excluded if full else {}, meta))
        print(f"report: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
