"""The persistent compile cache across processes: concurrent writers, a second wave
that compiles nothing, damaged entries, both eager modes, the command line, and kernel
packs (a cold process compiles nothing; damaged and foreign packs are refused)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torchtpu
from torchtpu import cache as cache_cli

PYTHON_DIR = Path(__file__).resolve().parents[2] / "python"

PROGRAM = """
import json, torch, torchtpu
x = torch.arange(12, dtype=torch.float32).reshape(3, 4).to("tpu")
w = torch.linspace(-1, 1, 8).reshape(4, 2).to("tpu")
y = torch.relu(x @ w) + 1.0
z = (y.sum(0) * 0.5).exp()
print(json.dumps({"y": y.cpu().tolist(), "z": z.cpu().tolist(),
                  "stats": torchtpu.cache_stats()}))
"""


def expected() -> dict:
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    w = torch.linspace(-1, 1, 8).reshape(4, 2)
    y = torch.relu(x @ w) + 1.0
    return {"y": y.tolist(), "z": (y.sum(0) * 0.5).exp().tolist()}


def clean_env(cache_dir: Path, **extra: str) -> dict:
    """This process's environment without backend settings, using `cache_dir`."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("TORCHTPU_", "TPU_", "TORCH_TPU_"))
    }
    env.update(PYTHONPATH=str(PYTHON_DIR), TORCHTPU_CACHE_DIR=str(cache_dir), **extra)
    return env


def run_python(args: list[str], env: dict, timeout: int) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args],
        env=env,
        text=True,
        check=False,
        capture_output=True,
        timeout=timeout,
    )


def start(
    cache_dir: Path, mode: str = "strict", code: str = PROGRAM, **extra: str
) -> subprocess.Popen:
    """Starts PROGRAM in a fresh interpreter using `cache_dir` (no other backend env)."""
    env = clean_env(cache_dir, TORCHTPU_EAGER=mode, **extra)
    return subprocess.Popen(
        [sys.executable, "-c", code],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def finish(proc: subprocess.Popen, warning: str | None = None) -> dict:
    """Waits for a PROGRAM run, checks its results and returns its cache stats. Its
    stderr has no cache warning, or exactly one `[tpu cache]` line containing `warning`."""
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, f"exit {proc.returncode}\n--- stdout\n{out}\n--- stderr\n{err}"
    result = json.loads(out.strip().splitlines()[-1])
    want = expected()
    for name in ("y", "z"):
        torch.testing.assert_close(torch.tensor(result[name]), torch.tensor(want[name]))
    warned = [line for line in err.splitlines() if "[tpu cache]" in line]
    if warning is None:
        assert not warned, err
    else:
        assert len(warned) == 1 and warning in warned[0], err
    return result["stats"]


def entries(cache_dir: Path) -> list[Path]:
    return sorted(cache_dir.glob("*.entry"))


@pytest.fixture(scope="module")
def warm_dir(tmp_path_factory) -> tuple[Path, list[dict]]:
    """Wave 1: three processes (two strict, one debug) start cold at once on one
    directory. Returns the directory and their cache stats."""
    root = tmp_path_factory.mktemp("cache")
    procs = [start(root, mode) for mode in ("strict", "debug", "strict")]
    return root, [finish(p) for p in procs]


def copy_dir(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst / "cache")
    return dst / "cache"


def test_concurrent_processes_compile_each_program_once(warm_dir) -> None:
    root, wave1 = warm_dir
    n = len(entries(root))
    assert n >= 5
    # Each program was compiled by one process; the others loaded its entry.
    assert sum(s["misses"] for s in wave1) == n, wave1
    assert all(s["errors"] == 0 for s in wave1)
    assert sum(s["disk_hits"] for s in wave1) == 3 * wave1[0]["requests"] - n
    # Wave 2: strict and debug processes find everything on disk.
    wave2 = [finish(p) for p in (start(root, "strict"), start(root, "debug"))]
    for s in wave2:
        assert s["misses"] == 0, s
        assert s["disk_hits"] == s["requests"] == wave1[0]["requests"]
        assert s["compile_seconds_saved"] > 0
        assert s["entries"] == n
    assert len(entries(root)) == n


def test_damaged_entries_are_recompiled(warm_dir, tmp_path: Path) -> None:
    root = copy_dir(warm_dir[0], tmp_path)
    files = entries(root)
    n = len(files)
    sizes = {f: f.stat().st_size for f in files}
    truncated, flipped, killed, foreign, donor = files[:5]
    truncated.write_bytes(truncated.read_bytes()[:100])
    data = bytearray(flipped.read_bytes())
    data[len(data) // 2] ^= 0x01
    flipped.write_bytes(bytes(data))
    # A writer killed before its rename leaves a temp file and no entry.
    partial = killed.read_bytes()[:200]
    killed.unlink()
    (root / f".{killed.stem}.4242.0.tmp").write_bytes(partial)
    foreign.write_bytes(donor.read_bytes())  # another program's entry under this name

    stats = finish(start(root, "debug"))
    assert stats["errors"] == 3, stats
    assert stats["misses"] == 4, stats
    assert stats["disk_hits"] == n - 4
    # Rewritten: same names, and the same sizes as the first compile wrote.
    assert {f: f.stat().st_size for f in entries(root)} == sizes


def test_command_line(warm_dir, tmp_path: Path) -> None:
    # Each command runs in its own process: this one's cache keeps the directory
    # it started with, which is another one when an earlier test compiled.
    root = copy_dir(warm_dir[0], tmp_path)
    n = len(entries(root))
    env = {**clean_env(root), "PYTHONPATH": str(PYTHON_DIR)}

    def cli(*args: str) -> subprocess.CompletedProcess:
        proc = run_python(["-m", "torchtpu.cache", *args], env, 120)
        assert proc.returncode == 0, proc.stderr
        assert "Warning" not in proc.stderr, proc.stderr
        return proc

    assert f"{n} entries" in cli("stats").stdout
    count, total = torchtpu._C._cache_usage(str(root))
    assert count == n
    cli("prune", "--max-bytes", str(total - 1))
    assert 0 < len(entries(root)) < n
    cli("clear")
    assert entries(root) == []
    with pytest.raises(SystemExit):
        cache_cli.main(["prune", "--max-bytes", "lots"])


MANY_SHAPES = """
import json, torch, torchtpu
def maps():
    with open("/proc/self/maps") as f:
        return sum(1 for _ in f)
def run(n):
    torch.testing.assert_close((torch.ones(n, device="tpu") * 3 + 1).cpu(), torch.full((n,), 4.0))
for n in range(1, 11):
    run(n)
base = maps()
for n in range(11, 61):
    run(n)
print(json.dumps({"growth": maps() - base, "stats": torchtpu.cache_stats()}))
"""


def test_programs_of_many_shapes_are_released(tmp_path):
    # Each loaded executable holds memory mappings; a process that met tens of
    # thousands of shapes used to die at the kernel's mapping limit. With 8
    # programs kept per table, 50 more shapes leave the mapping count flat.
    # (Exact programs per shape: no bucketed calls.)
    env = clean_env(tmp_path, TORCHTPU_CACHE_MEMORY_ENTRIES="8", TORCHTPU_EAGER_BUCKETS="0")
    proc = run_python(["-c", MANY_SHAPES], env, 300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["stats"]["unloaded"] >= 100
    assert result["growth"] < 40, result  # unbounded: about 9 mappings per shape


LOOP_AMONG_SHAPES = """
import json, torch, torchtpu
w = torch.randn(16, 16)
x = torch.randn(4, 16)
tw, tx = w.to("tpu"), x.to("tpu")
for n in range(1, 61):  # a loop's fixed ops among ops at new shapes (an eval, a sequence)
    torch.testing.assert_close((tx @ tw).relu().cpu(), (x @ w).relu())
    torch.ones(n, device="tpu").exp()
print(json.dumps(torchtpu.metrics()["programs_by_op"]))
"""


def test_a_loops_programs_stay_in_the_program_table(tmp_path):
    # With 16 programs kept, the 60 programs of new shapes push out each other,
    # not the loop's mm and relu, which are built once.
    env = clean_env(
        tmp_path,
        TORCHTPU_CACHE_MEMORY_ENTRIES="16",
        TORCHTPU_EAGER_BUCKETS="0",
        TORCHTPU_HOST_CHURN="0",
    )
    proc = run_python(["-c", LOOP_AMONG_SHAPES], env, 300)
    assert proc.returncode == 0, proc.stderr
    built = json.loads(proc.stdout.strip().splitlines()[-1])
    assert built == {"exp.out": 60, "mm.out": 1, "relu": 1}, built


def cli_ok(env: dict, *args: str) -> str:
    proc = run_python(["-m", "torchtpu.cache", *args], env, 180)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.fixture(scope="module")
def run_pack(warm_dir, tmp_path_factory) -> tuple[Path, int]:
    """A pack of the programs one PROGRAM run used (`pack --run`), built over a copy of
    the warm directory, so the run itself loads everything. Returns it and its size."""
    root = tmp_path_factory.mktemp("packs")
    cache = copy_dir(warm_dir[0], root)
    script = root / "program.py"
    script.write_text(PROGRAM)
    pack = root / "run.pack"
    out = cli_ok(clean_env(cache), "pack", str(pack), "--run", str(script))
    n = len(entries(warm_dir[0]))
    assert f"{n} programs" in out, out
    assert len(entries(cache)) == n  # nothing new was compiled for the pack
    return pack, n


def test_pack_round_trip(run_pack, tmp_path: Path) -> None:
    pack, n = run_pack
    stats = finish(start(tmp_path / "empty", TORCHTPU_CACHE_PACKS=str(pack)))
    assert stats["misses"] == 0, stats
    assert stats["pack_hits"] == n == stats["pack_entries"], stats
    assert stats["pack_refused"] == stats["errors"] == 0, stats
    assert entries(tmp_path / "empty") == []  # pack hits are not copied to disk
    out = cli_ok(clean_env(tmp_path), "inspect", str(pack))
    assert f"{n} programs" in out and "(this runtime)" in out and "another" not in out, out


def test_corrupted_pack_is_refused(run_pack, tmp_path: Path) -> None:
    pack, n = run_pack
    data = bytearray(pack.read_bytes())
    data[len(data) // 2] ^= 0x01
    bad = tmp_path / "bad.pack"
    bad.write_bytes(bytes(data))
    stats = finish(
        start(tmp_path / "empty", TORCHTPU_CACHE_PACKS=str(bad)),
        warning=f"refused kernel pack {bad}",
    )
    assert stats["misses"] == n, stats
    assert stats["pack_hits"] == stats["pack_entries"] == 0, stats
    assert stats["errors"] == 1, stats
    proc = run_python(["-m", "torchtpu.cache", "inspect", str(bad)], clean_env(tmp_path), 120)
    assert proc.returncode == 1 and "checksum mismatch" in proc.stderr, proc.stderr


def rewrite_identities(src: Path, dst: Path, which: set[int]) -> None:
    """Copies a pack, claiming entries `which` for another runtime with valid checksums
    (layout: docs/ARCHITECTURE.md, "Compile cache")."""
    data = bytearray(src.read_bytes())
    count, at = int.from_bytes(data[16:24], "little"), 24
    for i in range(count):
        size = int.from_bytes(data[at + 48 : at + 56], "little")
        if i in which:
            data[at + 64 : at + 96] = hashlib.sha256(b"another plugin").digest()
            body = bytes(data[at : at + 96] + data[at + 128 : at + 128 + size])
            data[at + 96 : at + 128] = hashlib.sha256(body).digest()
        at += 128 + size
    data[-32:] = hashlib.sha256(data[:-32]).digest()
    dst.write_bytes(bytes(data))


def test_foreign_pack_entries_are_refused(run_pack, tmp_path: Path) -> None:
    pack, n = run_pack
    foreign = tmp_path / "foreign.pack"
    rewrite_identities(pack, foreign, {0, 2})
    stats = finish(
        start(tmp_path / "empty", TORCHTPU_CACHE_PACKS=f"{foreign}"),
        warning=f"refused 2 of {n} entries",
    )
    assert stats["pack_refused"] == 2, stats
    assert stats["misses"] == 2 and stats["pack_hits"] == n - 2, stats
    assert stats["errors"] == 0, stats
    out = cli_ok(clean_env(tmp_path), "inspect", str(foreign))
    assert f"{n - 2} programs" in out and "2 programs" in out, out
    assert "(another runtime: refused here)" in out, out
