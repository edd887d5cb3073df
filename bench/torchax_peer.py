"""Optional peer for the GPT step table (issue 21): the same GPT, seed and batches as
bench/run.py's Trainer, trained by torchax (PyTorch on JAX) with one jitted step
(forward, backward, global-norm clip at 1.0, optax AdamW) whose parameters and optimizer
state are donated. Installed by `make bench` (the `peer` extra).

Standalone: `python bench/torchax_peer.py --rounds 6 --steps 10` prints one JSON line
(median ms/step, the correctness check against torch CPU eager).
`--serve`: for bench/run.py's interleaved rounds; after warm-up it prints a JSON line,
then for each line "N" on stdin runs N timed steps and prints their times as JSON.

Never import torchtpu here: torchax renames the PrivateUse1 backend to "jax", and two
XLA runtimes should not share a process, so bench/run.py runs this in a child.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from models import GPT, copy_task_batch

# bench/run.py's Trainer: AdamW(lr=1e-3) with torch's defaults for the rest.
LR, BETAS, EPS, WEIGHT_DECAY, MAX_NORM = 1e-3, (0.9, 0.999), 1e-8, 0.01, 1.0
CHECK_STEPS = 5


@contextlib.contextmanager
def removed_overloads_tolerated(missing: list[str]):
    """torchax 0.0.13's op tables (autocast policies, decompositions) name 22 overloads
    (Dimname/names variants) that torch 2.13 removed; looking one up raises AttributeError
    at import. While this is active such a lookup yields an inert placeholder key that no
    real op equals, so those table entries are dead and the rest works. Done at run time
    because site-packages must stay as pip installed it."""
    packet = torch._ops.OpOverloadPacket
    original = packet.__getattr__

    def lookup(self, key):
        try:
            return original(self, key)
        except AttributeError:
            if key.startswith("__"):
                raise
            missing.append(f"{self._qualified_op_name}.{key}")
            return _Removed(missing[-1])

    packet.__getattr__ = lookup
    try:
        yield
    finally:
        packet.__getattr__ = original


class _Removed:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<overload removed from torch: {self.name}>"


def import_torchax():
    """(torchax, optax, list of the removed overloads its tables named)."""
    missing: list[str] = []
    with removed_overloads_tolerated(missing):
        import optax
        import torchax
        import torchax.decompositions  # its table is built at import
        import torchax.train

        torchax.default_env()
    return torchax, optax, missing


def batches() -> list:
    gen = torch.Generator().manual_seed(0)
    return [copy_task_batch(gen, 8, 32, 64) for _ in range(4)]


def torch_eager_losses(data, steps: int) -> list[float]:
    """Losses of bench/run.py's Trainer step on the CPU (the reference)."""
    torch.manual_seed(0)
    model = GPT()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    out = []
    for i in range(steps):
        x, y = data[i % len(data)]
        opt.zero_grad(set_to_none=True)
        loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        opt.step()
        out.append(loss.item())
    return out


class PeerTrainer:
    """GPT trained by torchax.train.make_train_step, jitted with donated weights and
    optimizer state."""

    def __init__(self, torchax, optax, data) -> None:
        import jax
        from torchax import interop

        self.jax, self.data, self.i = jax, data, 0
        env = torchax.default_env()
        torch.manual_seed(0)
        module = interop.JittableModule(GPT())  # drops the tied head.weight duplicate
        with env:
            self.weights = {k: v.detach().to("jax") for k, v in module.params.items()}
            self.buffers = {k: v.to("jax") for k, v in module.buffers.items()}
        # The clip is an optax transform ahead of AdamW, as torch clips before step().
        optimizer = optax.chain(
            optax.clip_by_global_norm(MAX_NORM),
            optax.adamw(LR, b1=BETAS[0], b2=BETAS[1], eps=EPS, weight_decay=WEIGHT_DECAY),
        )
        self.opt_state = interop.call_jax(optimizer.init, self.weights)

        def model_fn(weights, buffers, args):
            return module.functional_call("forward", weights, buffers, *args)

        # GPT's forward already returns the cross-entropy loss.
        step = torchax.train.make_train_step(model_fn, lambda loss, _: loss, optimizer)
        self.step = interop.jax_jit(step, kwargs_for_jax_jit={"donate_argnums": (0, 2)})
        with env:
            self.inputs = [(x.to("jax"), y.to("jax")) for x, y in data]

    def run(self, steps: int) -> tuple[list[float], list[float]]:
        """(seconds per step, loss per step); each step ends when its loss is on the host."""
        times, losses = [], []
        for _ in range(steps):
            x, y = self.inputs[self.i % len(self.inputs)]
            self.i += 1
            t0 = time.perf_counter()
            loss, self.weights, self.opt_state = self.step(
                self.weights, self.buffers, self.opt_state, (x, y), y
            )
            value = float(self.jax.device_get(loss.jax()))
            times.append(time.perf_counter() - t0)
            losses.append(value)
        return times, losses


def check(ref: list[float], got: list[float]) -> dict:
    """The peer's first and last losses against torch CPU eager's, both from fresh models."""
    first = abs(got[0] - ref[0]) / abs(ref[0])
    last = abs(got[-1] - ref[-1]) / abs(ref[-1])
    return {
        "torch_losses": ref,
        "torchax_losses": got,
        "first_rel_err": first,
        f"step{len(ref)}_rel_err": last,
        "first_ok": first <= 1e-4,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=10, help="timed steps per round")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--serve", action="store_true", help="timed steps on request (stdin)")
    ap.add_argument("--no-check", action="store_true", help="skip the torch CPU comparison")
    args = ap.parse_args()
    torchax, optax, missing = import_torchax()
    import jax

    data = batches()
    info = {
        "torchax": torchax.__version__,
        "jax": jax.__version__,
        "removed_overloads": len(missing),
    }
    trainer = PeerTrainer(torchax, optax, data)
    # The checked steps are also warm-up: the first one compiles.
    _, losses = trainer.run(max(args.warmup, 0 if args.no_check else CHECK_STEPS))
    if not args.no_check:
        info.update(check(torch_eager_losses(data, CHECK_STEPS), losses[:CHECK_STEPS]))
    if args.serve:
        print(json.dumps(info), flush=True)
        for line in sys.stdin:
            if not line.strip():
                break
            times, _ = trainer.run(int(line))
            print(json.dumps({"times": times}), flush=True)
        return
    times: list[float] = []
    for _ in range(args.rounds):
        times += trainer.run(args.steps)[0]
    if times:  # --rounds 0: warm-up only (e.g. to dump the step's HLO)
        info["median_ms"] = statistics.median(times) * 1e3
        info["steps"] = len(times)
    print(json.dumps(info))


if __name__ == "__main__":
    main()
