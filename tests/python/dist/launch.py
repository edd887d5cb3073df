"""Runs a worker script under torchrun on loopback, bounded by a timeout that kills
every rank (a hang is a failed test, never a stuck CI)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
PYTHON_DIR = HERE.parents[2] / "python"


@dataclass
class Result:
    returncode: int
    output: str
    seconds: float


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(script: str, nproc: int = 2, env: dict | None = None, timeout: float = 300,
             args: tuple = ()) -> Result:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
        "--master-addr=127.0.0.1", f"--master-port={free_port()}", "--max-restarts=0",
        str(HERE / script), *map(str, args),
    ]
    full_env = dict(os.environ)
    full_env.update(env or {})
    full_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(PYTHON_DIR), os.environ.get("PYTHONPATH", "")) if p)
    full_env.setdefault("OMP_NUM_THREADS", "1")
    return run_bounded(cmd, full_env, timeout)


def run_bounded(cmd: list[str], env: dict, timeout: float, cwd: str | None = None,
                tag: str = "launch") -> Result:
    """Runs `cmd` in its own process group; at `timeout` the whole group is killed."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True, cwd=cwd)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        out += f"\n[{tag}] killed after {timeout} s"
    return Result(proc.returncode, out, time.monotonic() - start)


@dataclass
class RankResult:
    rank: int
    returncode: int
    output: str


def spawn_ranks(script: str, nproc: int = 2, env: dict | None = None, timeout: float = 120,
                args: tuple = (), watch: tuple[int, ...] | None = None
                ) -> tuple[list[RankResult], float]:
    """Starts the ranks as plain processes with torch.distributed's env:// variables
    (no torchrun agent, which would stop every rank at the first failure): each rank's
    own exit status and output are kept. Ranks still running at `timeout`, or once every
    rank in `watch` has exited, are killed."""
    port = free_port()
    procs, logs = [], []
    start = time.monotonic()
    for r in range(nproc):
        full_env = dict(os.environ)
        full_env.update(env or {})
        full_env.update(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(nproc),
                        LOCAL_WORLD_SIZE=str(nproc), MASTER_ADDR="127.0.0.1",
                        MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        full_env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(PYTHON_DIR), os.environ.get("PYTHONPATH", "")) if p)
        log = tempfile.TemporaryFile("w+")  # noqa: SIM115 (closed below); a pipe could fill
        procs.append(subprocess.Popen(
            [sys.executable, str(HERE / script), *map(str, args)], env=full_env,
            stdout=log, stderr=subprocess.STDOUT, text=True, start_new_session=True))
        logs.append(log)
    watched = [procs[r] for r in (watch if watch is not None else range(nproc))]
    while time.monotonic() - start < timeout and any(p.poll() is None for p in watched):
        time.sleep(0.1)
    seconds = time.monotonic() - start
    results = []
    for r, p in enumerate(procs):
        note = ""
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            note = f"\n[launch] rank {r} killed after {seconds:.0f} s"
        p.wait()
        logs[r].seek(0)
        results.append(RankResult(r, p.returncode, logs[r].read() + note))
        logs[r].close()
    return results, seconds
