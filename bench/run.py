"""Benchmarks (`make bench`): host overhead per op and training-step time, tpu Strict
Eager vs torch CPU eager, measured in one run. Prints a markdown table.

Timings on a shared 2-core machine are noisy: compare the ratios within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples")
sys.path.insert(0, EXAMPLES)
# Before torchtpu's import adds its XLA:CPU defaults: the torchax peer runs with the user's.
_USER_XLA_FLAGS = os.environ.get("XLA_FLAGS")
import torchtpu
from models import GPT, MLP, copy_task_batch


def add_chain(device: str, n: int) -> tuple[float, float]:
    """(host µs per op for n dependent adds, total µs per op including the final sync)."""
    x = torch.ones(8, device=device)
    y = torch.ones(8, device=device)
    for _ in range(50):  # warm-up: compile and cache
        x = x + y
    if device == "tpu":
        torch.tpu.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        x = x + y
    t1 = time.perf_counter()
    x.cpu()
    t2 = time.perf_counter()
    return (t1 - t0) / n * 1e6, (t2 - t0) / n * 1e6


def per_op_cost(rounds: int = 7, n: int = 5000) -> tuple[float, float]:
    """Host µs per cached op: `x + 1` on 16 floats in Strict Eager and in torch CPU eager,
    interleaved rounds in this process, medians (issue: at most 1.5x torch CPU)."""
    xs = {d: torch.ones(16, device=d) for d in ("cpu", "tpu")}
    for x in xs.values():
        for _ in range(200):  # warm-up: compile and cache
            x + 1
    torch.tpu.synchronize()
    res: dict[str, list[float]] = {"cpu": [], "tpu": []}
    for _ in range(rounds):
        for d, x in xs.items():
            t0 = time.perf_counter()
            for _ in range(n):
                x + 1
            res[d].append((time.perf_counter() - t0) / n * 1e6)
            if d == "tpu":
                torch.tpu.synchronize()
    return statistics.median(res["cpu"]), statistics.median(res["tpu"])


class Trainer:
    """A model and its AdamW optimizer on one device; `run` times training steps
    (forward, backward, clip, step, loss.item()). With `backend`, the model runs under
    torch.compile with that backend; with `flat`, torchtpu.optim.flatten(optimizer); with
    `compile_step`, clipping and the optimizer step run under torch.compile too (AdamW
    capturable: its step counts live on the device); with `graph`, the whole step is
    captured once by torch.tpu.graph (after two warm-up steps) and replayed, each batch
    copied into the static input tensors first."""

    def __init__(
        self,
        model_fn,
        batches,
        device: str,
        backend: str | None = None,
        flat: bool = False,
        compile_step: bool = False,
        graph: bool = False,
    ) -> None:
        torch.manual_seed(0)
        self.model = model_fn().to(device)
        self.opt = torch.optim.AdamW(
            self.model.parameters(), lr=1e-3, capturable=compile_step or graph
        )
        self.graph = torch.tpu.TPUGraph() if graph else None
        self.static_in: list[torch.Tensor] = []  # the captured step's inputs
        self.static_loss: torch.Tensor | None = None  # its loss, once captured
        if flat:
            torchtpu.optim.flatten(self.opt)
        self.fwd = torch.compile(self.model, backend=backend) if backend else self.model
        self.step = torch.compile(self._step, backend=backend) if compile_step else self._step
        self.batches, self.device, self.i = batches, device, 0

    def _step(self) -> None:
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()

    def _train_step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self.opt.zero_grad(set_to_none=True)
        if isinstance(self.model, GPT):
            out = self.fwd(x, y)
        else:
            out = torch.nn.functional.cross_entropy(self.fwd(x), y)
        out.backward()
        self.step()
        return out

    def _graph_step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if not self.static_in:
            self.static_in = [x.clone(), y.clone()]
        sx, sy = self.static_in
        sx.copy_(x)
        sy.copy_(y)
        if self.static_loss is not None:
            self.graph.replay()
        elif self.i <= 2:
            return self._train_step(sx, sy)
        else:
            with torch.tpu.graph(self.graph):
                self.static_loss = self._train_step(sx, sy)
        return self.static_loss

    def run(self, steps: int) -> list[tuple[float, float]]:
        """(seconds per step, host seconds per step before the loss.item() sync)."""
        out_times = []
        for _ in range(steps):
            x, y = (t.to(self.device) for t in self.batches[self.i % len(self.batches)])
            self.i += 1
            t0 = time.perf_counter()
            if self.graph is None:
                out = self._train_step(x, y)
            else:
                out = self._graph_step(x, y)
            t1 = time.perf_counter()
            out.item()
            out_times.append((time.perf_counter() - t0, t1 - t0))
        return out_times


def _medians(times: list[tuple[float, float]]) -> tuple[float, float]:
    total = sorted(t for t, _ in times)
    host = sorted(h for _, h in times)
    return total[len(total) // 2], host[len(host) // 2]


def step_time(
    model_fn, batches, device: str, steps: int, warmup: int = 3, backend: str | None = None
) -> tuple[float, float]:
    """Median seconds per training step and median host seconds per step."""
    t = Trainer(model_fn, batches, device, backend)
    t.run(warmup)
    settle(device)
    return _medians(t.run(steps))


def settle(device: str) -> None:
    """Lets background compiles of optimized builds finish (tiered compiles), so
    steady-state timings never include them."""
    if device == "tpu":
        torchtpu._C.wait_tier_ups()


def eager_modes(model_fn, batches, rounds: int, steps: int) -> dict[str, tuple[float, float]]:
    """Median (step, host) seconds of torch CPU eager, tpu Strict and tpu Fused, run in
    `rounds` interleaved rounds of `steps` steps (after warm-up), so that the machine's
    swings hit all three alike."""
    runs = {
        "cpu": ("strict", Trainer(model_fn, batches, "cpu")),
        "strict": ("strict", Trainer(model_fn, batches, "tpu")),
        "fused": ("fused", Trainer(model_fn, batches, "tpu")),
    }
    times: dict[str, list] = {name: [] for name in runs}
    for r in range(rounds):
        for name, (mode, trainer) in runs.items():
            with torchtpu.eager_mode(mode):
                trainer.run(3 if r == 0 else 1)  # warm-up; a mode switch flushes
                settle(trainer.device)
                times[name] += trainer.run(steps)
    return {name: _medians(t) for name, t in times.items()}


# One process of the cold/warm compile cache benchmark: GPT training steps as in
# examples/train_gpt.py, eager or with the model under torch.compile(backend="tpu").
# Times the first step alone and with model/optimizer setup (AdamW's first
# construction alone takes ~2 s of Python imports, cached or not).
_CACHE_CHILD = """
import json, sys, time
import torch, torchtpu
sys.path.insert(0, sys.argv[1])
from models import GPT, copy_task_batch
t0 = time.perf_counter()
gen = torch.Generator().manual_seed(0)
batches = [copy_task_batch(gen, 8, 32, 64) for _ in range(2)]
torch.manual_seed(0)
model = GPT().to("tpu")
opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
fwd = torch.compile(model, backend="tpu") if sys.argv[2] == "compile" else model
t1 = time.perf_counter()
first = None
for step in range(3):
    x, y = (t.to("tpu") for t in batches[step % 2])
    opt.zero_grad(set_to_none=True)
    loss = fwd(x, y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    loss.item()
    first = first or time.perf_counter()
print(json.dumps({"first_step_s": first - t1, "setup_and_first_step_s": first - t0,
                  "stats": torchtpu.cache_stats()}))
"""


def cold_vs_warm(how: str = "eager") -> tuple[dict, dict]:
    """Runs _CACHE_CHILD (``how``: "eager" or "compile") twice in fresh processes sharing
    one empty TORCHTPU_CACHE_DIR."""
    with tempfile.TemporaryDirectory(prefix="torchtpu-bench-cache-") as cache_dir:
        return _run_child(_CACHE_CHILD, [how], cache_dir), _run_child(
            _CACHE_CHILD, [how], cache_dir
        )


def _run_child(code: str, args: list[str], cache_dir: str, **env: str) -> dict:
    """Runs ``code`` (argv: the examples folder, then ``args``) in a fresh process whose
    only compile cache is ``cache_dir`` (no shared root, no kernel packs), with ``env``
    added; returns its last output line, a JSON object."""
    full = {**os.environ, "TORCHTPU_CACHE_DIR": cache_dir, **env}
    full.pop("TORCHTPU_SHARED_CACHE_DIR", None)
    full.pop("TORCHTPU_CACHE_PACKS", None)
    out = subprocess.run(
        [sys.executable, "-c", code, EXAMPLES, *args],
        env=full,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def print_cold_vs_warm(how: str = "eager") -> None:
    cold, warm = cold_vs_warm(how)
    what = "GPT" if how == "eager" else 'GPT under torch.compile(backend="tpu")'
    print(f"\n| compile cache ({what}, fresh process) | cold | warm | cold / warm |")
    print("|---|---:|---:|---:|")
    for key, label in (
        ("first_step_s", "first training step, s"),
        ("setup_and_first_step_s", "model + AdamW setup + first step, s"),
    ):
        c, w = cold[key], warm[key]
        print(f"| {label} | {c:.2f} | {w:.2f} | {c / w:.1f}x |")
    print(f"| compiles (cache misses) | {cold['stats']['misses']} | {warm['stats']['misses']} | |")
    print(
        f"| compile seconds | {cold['stats']['compile_seconds']:.2f} "
        f"| {warm['stats']['compile_seconds']:.2f} | |"
    )
    print(
        f"| cache load seconds (read + deserialize) | {cold['stats']['load_seconds']:.2f} "
        f"| {warm['stats']['load_seconds']:.2f} | |"
    )
    if warm["stats"]["misses"] != 0:
        print(f"WARNING: the warm run compiled {warm['stats']['misses']} programs (expected 0)")


PEER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torchax_peer.py")


class TorchaxPeer:
    """bench/torchax_peer.py in a child process (two XLA runtimes never share a process),
    serving timed GPT steps on request so that its rounds interleave with the other rows.
    `run` matches Trainer.run; the child idles on its stdin between rounds."""

    device = "peer"

    def __init__(self) -> None:
        env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
        # stderr to a file (a full pipe would stall the child); it lives until close().
        self.err = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115
        if _USER_XLA_FLAGS is not None:
            env["XLA_FLAGS"] = _USER_XLA_FLAGS
        self.proc = subprocess.Popen(
            [sys.executable, PEER, "--serve"],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.err,
            text=True,
        )
        self.info: dict | None = None

    @staticmethod
    def start() -> TorchaxPeer | None:
        """The peer, or None with a line saying why it is skipped."""
        import importlib.util

        if not all(importlib.util.find_spec(m) for m in ("torchax", "optax", "jax")):
            print(
                "torchax peer skipped: torchax/optax/jax not installed "
                "(`make bench` installs the `peer` extra of pyproject.toml)"
            )
            return None
        return TorchaxPeer()

    def ready(self) -> bool:
        """Waits for the child's warm-up and correctness check."""
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            err = self._stderr().strip().splitlines()[-3:]
            print(f"torchax peer skipped: it exited with {self.proc.returncode}: {err}")
            self.err.close()
            return False
        self.info = json.loads(line)
        return True

    def run(self, steps: int) -> list[tuple[float, float]]:
        self.proc.stdin.write(f"{steps}\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"torchax peer died: {self._stderr()[-2000:]}")
        return [(t, t) for t in json.loads(line)["times"]]

    def _stderr(self) -> str:
        self.err.seek(0)
        return self.err.read()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)
        self.err.close()

    def summary(self) -> str:
        i = self.info
        return (
            f"torchax {i['torchax']} on jax {i['jax']} (make_train_step, optax clip + AdamW, "
            f"donated weights and state; {i['removed_overloads']} op-table entries naming "
            f"overloads torch {torch.__version__.split('+')[0]} removed were tolerated): "
            f"first loss {i['torchax_losses'][0]:.6f} vs torch CPU eager "
            f"{i['torch_losses'][0]:.6f} (rel. err {i['first_rel_err']:.1e}), "
            f"step {len(i['torch_losses'])} rel. err {i['step5_rel_err']:.1e}"
        )


COMPILED = 'torch.compile(backend="tpu")'
STEP_TOO = f"{COMPILED} of the model and of clip + AdamW step"
GRAPH_ROW = "tpu, whole step captured once and replayed (torch.tpu.graph)"


def training_rows(model_fn, batches, all_rows: bool) -> dict:
    """Row name -> (eager mode around it, Trainer): eager and compiled training steps;
    `all_rows` adds the Strict-around and optim.flatten variants."""
    rows = {
        "torch CPU eager": ("strict", Trainer(model_fn, batches, "cpu")),
        "torch.compile, Inductor (CPU)": ("strict", Trainer(model_fn, batches, "cpu", "inductor")),
        "tpu Strict Eager": ("strict", Trainer(model_fn, batches, "tpu")),
        "tpu Fused Eager": ("fused", Trainer(model_fn, batches, "tpu")),
    }
    if all_rows:
        rows[f"{COMPILED}, Strict around"] = ("strict", Trainer(model_fn, batches, "tpu", "tpu"))
    rows[f"{COMPILED}, Fused around"] = ("fused", Trainer(model_fn, batches, "tpu", "tpu"))
    if all_rows:
        rows["tpu Fused Eager, optim.flatten"] = (
            "fused",
            Trainer(model_fn, batches, "tpu", flat=True),
        )
        for mode in ("strict", "fused"):
            rows[f"{COMPILED}, {mode.capitalize()} around, optim.flatten"] = (
                mode,
                Trainer(model_fn, batches, "tpu", "tpu", flat=True),
            )
    for mode in ("strict", "fused"):
        rows[f"{STEP_TOO}, {mode.capitalize()} around"] = (
            mode,
            Trainer(model_fn, batches, "tpu", "tpu", compile_step=True),
        )
    rows[GRAPH_ROW] = ("fused", Trainer(model_fn, batches, "tpu", graph=True))
    return rows


def interleaved(rows: dict, rounds: int, steps: int) -> dict:
    """Median seconds per step of every row, timed in interleaved rounds."""
    times: dict[str, list] = {name: [] for name in rows}
    for r in range(rounds):
        for name, (mode, trainer) in rows.items():
            with torchtpu.eager_mode(mode):
                trainer.run(3 if r == 0 else 1)  # warm-up (compiles); a mode switch flushes
                settle(trainer.device)
                times[name] += trainer.run(steps)
    return {name: _medians(t)[0] for name, t in times.items()}


def print_compiled(batches, rounds: int, steps: int) -> None:
    """GPT step under torch.compile (tpu backend with Strict or Fused Eager around the
    compiled model, and Inductor on the CPU) next to eager, in interleaved rounds; with
    the torchax peer installed, its jitted step too (a child process, same rounds)."""
    peer = TorchaxPeer.start()  # its startup overlaps the setup below, not the timing
    runs = training_rows(GPT, batches, all_rows=True)
    peer_row = None
    if peer is not None and peer.ready():
        peer_row = f"torchax jitted step (jax {peer.info['jax']})"
        runs[peer_row] = ("strict", peer)
    t0 = time.perf_counter()
    med = interleaved(runs, rounds, steps)
    cpu = med["torch CPU eager"]
    # The peer is an XLA:CPU step too: a ratio to it moves less when other work on the
    # machine slows torch's CPU threads (issue 21's target: at most 1.0x).
    peer_t = med[peer_row] if peer_row else None
    extra = " vs torchax |" if peer_t else ""
    print(f"\n| GPT training step (AdamW), interleaved rounds | ms | vs torch CPU eager |{extra}")
    print("|---|---:|---:|" + ("---:|" if peer_t else ""))
    for name, t in med.items():
        ratio = f" {t / peer_t:.2f}x |" if peer_t else ""
        print(f"| {name} | {t * 1e3:.2f} | {t / cpu:.2f}x |{ratio}")
    print(
        f"\n{rounds} rounds of {steps} steps each, medians; {time.perf_counter() - t0:.1f} s "
        f"including compilation; graph replays: {torchtpu.metrics()['graph_replays']}"
    )
    if peer is not None and peer.info is not None:
        peer.close()
        print(peer.summary())


def print_compiled_small(batches_of: dict, rounds: int, steps: int) -> None:
    """The MLP and the MobileNet-style CNN: eager and compiled rows in interleaved rounds
    (issue 21 asks for them next to the GPT)."""
    for name, (model_fn, batches) in batches_of.items():
        med = interleaved(training_rows(model_fn, batches, all_rows=False), rounds, steps)
        cpu = med["torch CPU eager"]
        print(f"\n| {name} training step (AdamW), interleaved rounds | ms | vs torch CPU eager |")
        print("|---|---:|---:|")
        for row, t in med.items():
            print(f"| {row} | {t * 1e3:.2f} | {t / cpu:.2f}x |")


def depthwise_us(c: int, h: int, stride: int, device: str, n: int = 50) -> tuple[float, float]:
    """(forward, forward + backward) µs per call of a 3x3 depthwise conv on [8, c, h, h]
    (MobileNet's blocks), synchronized at the end of the n calls."""
    import torch.nn.functional as F

    x = torch.randn(8, c, h, h, device=device, requires_grad=True)
    w = torch.randn(c, 1, 3, 3, device=device, requires_grad=True)

    def fwd():
        return F.conv2d(x, w, None, stride, 1, 1, c)

    g = torch.randn_like(fwd())

    def both():
        gx, gw = torch.autograd.grad(fwd(), (x, w), g)
        return gx.sum() + gw.sum()

    out = []
    for f in (fwd, both):
        for _ in range(5):
            f()
        t0 = time.perf_counter()
        for _ in range(n):
            r = f()
        r.cpu()
        out.append((time.perf_counter() - t0) / n * 1e6)
    return out[0], out[1]


def print_depthwise() -> None:
    print(
        "\n| 3x3 depthwise conv, [8, C, H, H], Strict | CPU fwd µs | tpu fwd µs | CPU fwd+bwd µs "
        "| tpu fwd+bwd µs |"
    )
    print("|---|---:|---:|---:|---:|")
    for c, h, s in ((16, 32, 2), (24, 16, 2), (40, 8, 1), (48, 8, 2)):
        (cf, cb), (tf, tb) = depthwise_us(c, h, s, "cpu"), depthwise_us(c, h, s, "tpu")
        print(f"| C={c}, H={h}, stride {s} | {cf:.0f} | {tf:.0f} | {cb:.0f} | {tb:.0f} |")


# One process of the small-program table: Strict programs of a decode step's kinds
# (pointwise, gelu, softmax, a gemv, a sum) at one size, compiled into an empty cache;
# prints the compile time per program and the warm time of the step.
_SMALL_CHILD = """
import json, statistics, sys, time
import torch, torch.nn.functional as F, torchtpu
n = int(sys.argv[2])
torchtpu.eager_mode("strict")
torch.manual_seed(0)
x, w = torch.randn(n // 64, 64).to("tpu"), torch.randn(64, 64).to("tpu")

def step():
    return (F.gelu(x * 2 + 1).softmax(-1) @ w).sum(-1)

m0 = torchtpu.metrics()
step().cpu()
m1 = torchtpu.metrics()
times = []
for _ in range(7):
    torch.tpu.synchronize()
    t0 = time.perf_counter()
    for _ in range(100):
        step()
    torch.tpu.synchronize()
    times.append((time.perf_counter() - t0) / 100)
print(json.dumps({"compiles": m1["compiles"] - m0["compiles"],
                  "quick": m1["quick_compiles"] - m0["quick_compiles"],
                  "compile_s": m1["compile_seconds"] - m0["compile_seconds"],
                  "step": statistics.median(times)}))
"""


def print_small_programs(rounds: int = 3) -> None:
    """Small programs' compile settings (TORCHTPU_SMALL_QUICK, on by default) against the
    optimized build: compile ms per program and warm µs per step, medians of `rounds`
    alternating fresh processes."""
    print(
        "\n| Strict step of 6 small programs (x: [n/64, 64]) | elements | build "
        "| compiled quick | compile ms per program | warm µs per step |"
    )
    print("|---|---:|---|---:|---:|---:|")
    for n in (64, 512, 2048):
        res: dict[str, list[dict]] = {"1": [], "0": []}
        for _ in range(rounds):
            for flag, runs in res.items():
                with tempfile.TemporaryDirectory(prefix="torchtpu-bench-small-") as cache_dir:
                    runs.append(
                        _run_child(_SMALL_CHILD, [str(n)], cache_dir, TORCHTPU_SMALL_QUICK=flag)
                    )
        for flag, label in (("1", "small (default)"), ("0", "optimized")):
            rs = res[flag]
            per = statistics.median(r["compile_s"] / max(r["compiles"], 1) for r in rs)
            step = statistics.median(r["step"] for r in rs)
            print(
                f"| gelu, softmax, gemv | {n} | {label} | {rs[0]['quick']} / {rs[0]['compiles']} "
                f"| {per * 1e3:.1f} | {step * 1e6:.0f} |"
            )


def small_models(gen: torch.Generator) -> dict:
    """The MLP's and the CNN's models and batches (as the eager tables use)."""
    from models import MobileCNN

    mlp = [
        (torch.randn(64, 32, generator=gen), torch.randint(0, 10, (64,), generator=gen))
        for _ in range(4)
    ]
    cnn = [
        (torch.randn(8, 3, 64, 64, generator=gen), torch.randint(0, 10, (8,), generator=gen))
        for _ in range(4)
    ]
    return {"MLP": (MLP, mlp), "MobileNet-style CNN": (MobileCNN, cnn)}


# One process of the cold-start benchmark: a fresh compile cache, `model` trained in
# `mode` for 4 steps (the first timed alone; each step until all its work is done,
# which with async compiles can be after `loss.item()`), then, once the background compiles
# are done, 4 more. Mode "cpu" is the torch CPU eager reference (same steps on CPU).
# MobileNetV3-Small runs the ImageNet model (1000 classes) at its own 224x224
# resolution, so its programs have the shapes a user of the real model compiles;
# batch 2 keeps its steps short on 2 cores.
_COLD_CHILD = """
import json, statistics, sys, time
import torch, torch.nn.functional as F, torchtpu
sys.path.insert(0, sys.argv[1])
from models import GPT, MobileCNN, MobileNetV3Small, copy_task_batch
device = "cpu" if sys.argv[3] == "cpu" else "tpu"
if device == "tpu":
    torchtpu.eager_mode(sys.argv[3])
torch.manual_seed(0)
gen = torch.Generator().manual_seed(0)
if sys.argv[2] == "gpt":
    model, batch = GPT().to(device), copy_task_batch(gen, 8, 32, 64)
    loss_of = lambda x, y: model(x, y)
elif sys.argv[2] == "mnv3":
    model = MobileNetV3Small().to(device)
    batch = (torch.randn(2, 3, 224, 224, generator=gen), torch.randint(0, 1000, (2,), generator=gen))
    loss_of = lambda x, y: F.cross_entropy(model(x), y)
else:
    model = MobileCNN().to(device)
    batch = (torch.randn(8, 3, 64, 64, generator=gen), torch.randint(0, 10, (8,), generator=gen))
    loss_of = lambda x, y: F.cross_entropy(model(x), y)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x, y = (t.to(device) for t in batch)

def steps(n):
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = loss_of(x, y)
        loss.backward()
        opt.step()
        loss.item()
        if device == "tpu":
            torch.tpu.synchronize()  # the step's work is done, not only the loss
        out.append(time.perf_counter() - t0)
    return out

cold = steps(4)
m = torchtpu.metrics()
t0 = time.perf_counter()
torchtpu._C.wait_tier_ups()
waited = time.perf_counter() - t0
warm = steps(4)
print(json.dumps({"first": cold[0], "next": statistics.median(cold[1:]), "waited": waited,
                  "after": statistics.median(warm), "compiles": m["compiles"],
                  "compile_s": m["compile_seconds"], "quick": m["quick_compiles"],
                  "fallbacks": m["fallbacks"], "tier_ups": torchtpu.metrics()["tier_ups"]}))
"""

# TORCHTPU_TIERED_COMPILE's values, as the cold-start table names them.
_TIERS = {"1": "all", "": "exact (default)", "0": "none"}

COLD_MODELS = {
    "cnn": "MobileNet-style CNN",
    "gpt": "GPT",
    "mnv3": "MobileNetV3-Small, 2x3x224x224",
}


def print_cold_start(models: tuple[str, ...] = ("cnn", "gpt", "mnv3")) -> None:
    """First training step in a fresh process with an empty compile cache, with tiered
    compiles for every program (TORCHTPU_TIERED_COMPILE=1: quick builds first), for
    exact programs only (the default) and for none (=0), and without async compiles
    (TORCHTPU_ASYNC_COMPILE=0: each compile waited for where it is needed).
    MobileNetV3-Small also gets the torch CPU eager reference and rows
    with one compile thread (TORCHTPU_COMPILE_THREADS=1; the default is the cores), so
    the speed-up from more cores shows."""
    cores = os.cpu_count() or 1
    print(
        "\n| cold start (empty cache) | mode | tiered | async | compile threads | first step s "
        "| compiles | compile s | steps 2-4 ms | background wait s | after tier-up ms |"
    )
    print("|---|---|---|---|---|---:|---:|---:|---:|---:|---:|")
    for model in models:
        rows = [
            (mode, tiered, "1", None) for mode in ("strict", "fused") for tiered in ("1", "", "0")
        ]
        rows += [(mode, "", "0", None) for mode in ("strict", "fused")]
        if model == "mnv3":
            rows = [("cpu", "0", "1", None)] + rows
            if cores > 1:
                rows += [(mode, "1", "1", "1") for mode in ("strict", "fused")]
        for mode, tiered, async_on, threads in rows:
            env = {"TORCHTPU_TIERED_COMPILE": tiered, "TORCHTPU_ASYNC_COMPILE": async_on}
            if threads is not None:
                env["TORCHTPU_COMPILE_THREADS"] = threads
            with tempfile.TemporaryDirectory(prefix="torchtpu-bench-cold-") as cache_dir:
                r = _run_child(_COLD_CHILD, [model, mode], cache_dir, **env)
            if mode == "cpu":
                print(
                    f"| {COLD_MODELS[model]} | torch CPU eager | | | | {r['first']:.2f} | | "
                    f"| {r['next'] * 1e3:.1f} | | {r['after'] * 1e3:.1f} |"
                )
                continue
            fallbacks = f" ({r['fallbacks']} CPU fallbacks)" if r["fallbacks"] else ""
            print(
                f"| {COLD_MODELS[model]} | {mode} | {_TIERS[tiered]} "
                f"| {'yes' if async_on == '1' else 'no'} | {threads or f'default ({cores})'} "
                f"| {r['first']:.2f} | {r['compiles']}{fallbacks} "
                f"| {r['compile_s']:.2f} | {r['next'] * 1e3:.1f} | {r['waited']:.2f} "
                f"| {r['after'] * 1e3:.1f} |"
            )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--adds", type=int, default=10_000)
    ap.add_argument("--steps", type=int, default=10, help="steps per round")
    ap.add_argument("--rounds", type=int, default=6, help="interleaved rounds per eager mode")
    ap.add_argument("--cache-only", action="store_true", help="only the cold/warm cache runs")
    ap.add_argument("--cold-only", action="store_true", help="only the cold-start runs")
    ap.add_argument(
        "--cold-models",
        default=",".join(COLD_MODELS),
        help=f"comma-separated cold-start models ({', '.join(COLD_MODELS)})",
    )
    ap.add_argument(
        "--compiled-only", action="store_true", help="only the compiled training step tables"
    )
    ap.add_argument("--depthwise-only", action="store_true", help="only the depthwise conv table")
    ap.add_argument(
        "--small-only", action="store_true", help="only the small programs' compile table"
    )
    args = ap.parse_args()
    if args.cache_only:
        print_cold_vs_warm()
        print_cold_vs_warm("compile")
        return
    cold_models = tuple(args.cold_models.split(","))
    if unknown := set(cold_models) - set(COLD_MODELS):
        ap.error(f"unknown --cold-models: {', '.join(sorted(unknown))}")
    if args.cold_only:
        print_cold_start(cold_models)
        return
    if args.compiled_only:
        gen = torch.Generator().manual_seed(0)
        print_compiled([copy_task_batch(gen, 8, 32, 64) for _ in range(4)], args.rounds, args.steps)
        print_compiled_small(small_models(gen), args.rounds, args.steps)
        return
    if args.depthwise_only:
        print_depthwise()
        return
    if args.small_only:
        print_small_programs()
        return
    torch.set_num_threads(max(1, torch.get_num_threads()))

    rows = []
    rows.append(("x + 1 on 16 floats: host µs/op (median of 7)", *per_op_cost()))
    cpu_host, cpu_total = add_chain("cpu", args.adds)
    tpu_host, tpu_total = add_chain("tpu", args.adds)
    rows.append(("add chain: host µs/op", cpu_host, tpu_host))
    rows.append(("add chain: total µs/op (incl. sync)", cpu_total, tpu_total))

    gen = torch.Generator().manual_seed(0)
    mlp_batches = [
        (torch.randn(64, 32, generator=gen), torch.randint(0, 10, (64,), generator=gen))
        for _ in range(4)
    ]
    gpt_batches = [copy_task_batch(gen, 8, 32, 64) for _ in range(4)]
    steps = []
    for name, fn, batches in (("MLP", MLP, mlp_batches), ("GPT", GPT, gpt_batches)):
        before = torchtpu.metrics()
        res = eager_modes(fn, batches, args.rounds, args.steps)
        after = torchtpu.metrics()
        graphs = after["fused_graphs"] - before["fused_graphs"]
        per_graph = (after["fused_ops"] - before["fused_ops"]) / max(graphs, 1)
        (c, _), (s, s_host), (f, f_host) = res["cpu"], res["strict"], res["fused"]
        rows.append((f"{name} train step ms (Strict)", c * 1e3, s * 1e3))
        steps.append((name, c, s, f, s_host, f_host, per_graph))

    m = torchtpu.metrics()
    print(
        f"platform: {torch.tpu.get_device_name()}, torch {torch.__version__}, "
        f"{os.cpu_count()} CPU cores"
    )
    print("| benchmark | torch CPU eager | tpu Strict Eager | tpu / CPU |")
    print("|---|---:|---:|---:|")
    for name, c, t in rows:
        print(f"| {name} | {c:.1f} | {t:.1f} | {t / c:.2f}x |")
    print(
        "\n| training step (AdamW) | torch CPU eager ms | Strict ms | Fused ms "
        "| Fused speedup over Strict | Fused / CPU | host ms/step Strict | host ms/step Fused "
        "| ops per fused graph |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, c, s, f, sh, fh, per in steps:
        print(
            f"| {name} | {c * 1e3:.2f} | {s * 1e3:.2f} | {f * 1e3:.2f} | {s / f:.2f}x "
            f"| {f / c:.2f}x | {sh * 1e3:.2f} | {fh * 1e3:.2f} | {per:.0f} |"
        )
    print_compiled(gpt_batches, args.rounds, args.steps)
    print_compiled_small(small_models(gen), args.rounds, args.steps)
    print_depthwise()
    print_small_programs()
    print(
        f"\ncompiles: {m['compiles']}, cache hits: {m['cache_hits']}, "
        f"compile seconds: {m['compile_seconds']:.1f}, fused graphs: {m['fused_graphs']} "
        f"({m['fused_cache_hits']} from the graph cache), donated MB: "
        f"{m['donated_bytes'] / 1e6:.1f}"
    )
    print_cold_vs_warm()
    print_cold_vs_warm("compile")
    print_cold_start(cold_models)


if __name__ == "__main__":
    main()
