"""TorchTitan's llama3 debug model through its own trainer, on tpu and on CPU: the
commands, the launcher (torchrun on loopback, every rank killed at a timeout) and the loss
curves they log. Used by tests/ecosystem/run.py (the report) and tests/python/test_titan.py.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
RUNNER = HERE / "titan_run.py"
sys.path.insert(0, str(REPO / "tests" / "python" / "dist"))
from launch import free_port, run_bounded

# TorchTitan options on top of its llama3_debugmodel config: a short, small run on the
# locally built tokenizer and dataset, deterministic, no validation.
SEQ_LEN, LOCAL_BATCH = 64, 2


@dataclass
class Run:
    label: str
    command: list[str]
    returncode: int
    losses: list[float]
    seconds: float
    output: str

    def ok(self) -> bool:
        return self.returncode == 0 and bool(self.losses)


def titan_args(assets: dict, dump: Path, steps: int, seed_ckpt: Path | None,
               extra: tuple[str, ...] = ()) -> list[str]:
    args = [
        "--module", "llama3", "--config", "llama3_debugmodel",
        "--override.imports", "titan_overrides.causal_sdpa",
        "--hf-assets-path", assets["tokenizer"],
        "--dataloader.dataset", "c4_test", "--dataloader.dataset-path", assets["dataset"],
        "--training.seq-len", str(SEQ_LEN), "--training.local-batch-size", str(LOCAL_BATCH),
        "--training.steps", str(steps), "--debug.seed", "0", "--debug.deterministic",
        "--validator.no-enable", "--dump-folder", str(dump),
    ]
    if seed_ckpt is not None:
        # Every run starts from one CPU-made seed checkpoint (TorchTitan's own way to
        # give differently parallelized runs the same initial weights).
        args += ["--checkpoint.enable", "--checkpoint.load-only",
                 "--checkpoint.initial-load-path", str(seed_ckpt),
                 "--checkpoint.initial-load-model-only"]
    args += list(extra)
    # A tyro subcommand: must come last.
    return args + ["activation-checkpoint:none"]


def command(device: str, nproc: int, args: list[str]) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
            "--master-addr=127.0.0.1", f"--master-port={free_port()}", "--max-restarts=0",
            str(RUNNER), "--device", device, "--", *args]


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_STEP = re.compile(r"step:\s+(\d+)\s+loss:\s+([-+0-9.eE]+|nan|inf)")


def parse_losses(output: str) -> list[float]:
    """One loss per step (every rank logs the same reduced loss; the first is kept)."""
    seen: dict[int, float] = {}
    for m in _STEP.finditer(_ANSI.sub("", output)):
        seen.setdefault(int(m.group(1)), float(m.group(2)))
    return [seen[s] for s in sorted(seen)]


def launch(label: str, device: str, nproc: int, args: list[str], timeout: float,
           env: dict | None = None) -> Run:
    cmd = command(device, nproc, args)
    full_env = dict(os.environ)
    full_env.update(env or {})
    full_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO / "python"), str(HERE), os.environ.get("PYTHONPATH", "")) if p)
    full_env.setdefault("OMP_NUM_THREADS", "1")
    res = run_bounded(cmd, full_env, timeout, cwd=str(REPO), tag="titan")
    return Run(label, cmd, res.returncode, parse_losses(res.output), res.seconds, res.output)


def make_seed_checkpoint(assets: dict, root: Path, timeout: float) -> Path:
    """The initial weights, made once on CPU by TorchTitan (--checkpoint.create-seed-checkpoint)."""
    dump = root / "seed"
    ckpt = dump / "seed" / "step-0"
    if ckpt.exists():
        return ckpt
    args = titan_args(assets, dump, 1, None, (
        "--checkpoint.enable", "--checkpoint.create-seed-checkpoint",
        "--checkpoint.folder", "seed"))
    run = launch("seed", "cpu", 1, args, timeout)
    if run.returncode != 0 or not ckpt.exists():
        raise RuntimeError(f"seed checkpoint failed (rc {run.returncode}):\n{run.output[-4000:]}")
    return ckpt


def shell(cmd: list[str]) -> str:
    """The command as one would type it (python/port spelled generically)."""
    words = ["python" if w == sys.executable else w for w in cmd]
    words = [re.sub(r"--master-port=\d+", "--master-port=29500", w) for w in words]
    words = [str(Path(w).relative_to(REPO)) if w.startswith(str(REPO)) else w for w in words]
    return shlex.join(words)
