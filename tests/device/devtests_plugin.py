"""pytest plugin of the device-test runner (tests/device/run.py): writes one JSON object a
line, flushed at once, so the driver keeps every outcome when the process crashes or hangs.

    --devtests-log PATH   events: "collected" (all node ids), "start", "result", "cache"
    --devtests-skip PATH  node ids (one a line) to deselect: those done before a restart
"""

from __future__ import annotations

import json
import sys
import time

import pytest

# Compile cache counters (torchtpu.cache_stats) the runner adds up over the processes; a
# snapshot every CACHE_EVERY tests, so a crashed process loses at most that many.
CACHE_KEYS = ("misses", "memory_hits", "disk_hits", "shared_hits", "compile_seconds")
CACHE_EVERY = 200


def pytest_addoption(parser):
    group = parser.getgroup("devtests")
    group.addoption("--devtests-log", default=None, help="JSON-lines outcome log")
    group.addoption("--devtests-skip", default=None, help="file of node ids to deselect")


class _Recorder:
    def __init__(self, path: str, skip_path: str | None) -> None:
        self.f = open(path, "a", buffering=1)  # noqa: SIM115 - closed at session end
        self.skip = set()
        if skip_path:
            with open(skip_path) as f:
                self.skip = {ln.strip() for ln in f if ln.strip()}
        self.seen: set[str] = set()
        self.t0: dict[str, float] = {}

    def write(self, msg: dict) -> None:
        self.f.write(json.dumps(msg) + "\n")
        self.f.flush()

    # trylast: after -k / -m deselection, so "collected" lists the selected tests.
    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config, items):
        self.write({"event": "collected", "nodeids": [it.nodeid for it in items]})
        keep = [it for it in items if it.nodeid not in self.skip]
        drop = [it for it in items if it.nodeid in self.skip]
        if drop:
            config.hook.pytest_deselected(items=drop)
            items[:] = keep

    def pytest_runtest_logstart(self, nodeid, location):
        self.t0[nodeid] = time.monotonic()
        self.write({"event": "start", "nodeid": nodeid})

    def pytest_runtest_logreport(self, report):
        # One result a test: the call phase, or setup when it failed or skipped there
        # (then no call phase runs); a teardown failure after a pass is an error.
        if report.when == "call" or (report.when == "setup" and not report.passed):
            outcome = report.outcome
            if report.when == "setup" and report.failed:
                outcome = "error"
        elif report.when == "teardown" and report.failed:
            outcome = "error"
        else:
            return
        if report.nodeid in self.seen and outcome != "error":
            return
        self.seen.add(report.nodeid)
        if len(self.seen) % CACHE_EVERY == 0:
            self._cache_snapshot()
        self.write(
            {
                "event": "result",
                "nodeid": report.nodeid,
                "outcome": outcome,
                "message": _message(report),
                "seconds": round(
                    time.monotonic() - self.t0.get(report.nodeid, time.monotonic()), 3
                ),
            }
        )

    def _cache_snapshot(self) -> None:
        """The compile cache's counters so far in this process (a directory scan: not at
        every test)."""
        tpu = sys.modules.get("torchtpu")
        stats = getattr(tpu, "cache_stats", None)
        if stats is not None:
            s = stats()
            self.write({"event": "cache", "stats": {k: s.get(k, 0) for k in CACHE_KEYS}})

    def pytest_sessionfinish(self, session, exitstatus):
        self._cache_snapshot()
        self.write({"event": "finished", "exitstatus": int(exitstatus)})
        self.f.close()


def _message(report) -> str:
    if report.passed:
        return ""
    if report.skipped:
        lr = report.longrepr
        if isinstance(lr, tuple) and len(lr) == 3:
            return str(lr[2]).removeprefix("Skipped: ")
        return str(lr)
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return crash.message
    return str(report.longrepr)[-2000:]


def pytest_configure(config):
    path = config.getoption("--devtests-log")
    if path:
        config.pluginmanager.register(
            _Recorder(path, config.getoption("--devtests-skip")), "devtests-recorder"
        )
