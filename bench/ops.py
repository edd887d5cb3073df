"""Single ops on tpu against torch CPU eager: microseconds per call and the ratio.

Each call's result is kept alive until the round ends; a tpu round ends in
torch.tpu.synchronize(), so every run is waited for. Warm-up runs first and lets
background tier-up compiles finish, so steady-state programs are timed.

    PYTHONPATH=python .venv/bin/python bench/ops.py [--mode strict|fused] [--ops sort,cumsum]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torchtpu


def _inputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "x": torch.randn(512, 512, generator=g),
        "y": torch.randn(512, 512, generator=g),
        "wide": torch.randn(64, 4096, generator=g),
        "long": torch.randn(1 << 20, generator=g),
        "idx": torch.randint(0, 512, (512,), generator=g),
        "table": torch.randn(8192, 768, generator=g),
        "tokens": torch.randint(0, 8192, (8, 1024), generator=g),
        "grad": torch.randn(8, 1024, 768, generator=g),
    }


# name -> (inputs it takes, the call)
OPS = {
    # Baselines: an elementwise op's time is mostly the per-call cost.
    "add": (("x", "y"), lambda x, y: x + y),
    "sum_all": (("x",), lambda x: x.sum()),
    "sort_rows": (("x",), lambda x: torch.sort(x, -1)),
    "sort_rows_descending": (("x",), lambda x: torch.sort(x, -1, descending=True)),
    "sort_columns": (("x",), lambda x: torch.sort(x, 0)),
    "sort_wide_rows": (("wide",), lambda x: torch.sort(x, -1)),
    "sort_1d": (("long",), lambda x: torch.sort(x)),
    "argsort_rows": (("x",), lambda x: torch.argsort(x, -1)),
    "median_all": (("x",), lambda x: x.median()),
    "median_rows": (("x",), lambda x: x.median(-1)),
    "kthvalue5_rows": (("x",), lambda x: x.kthvalue(5, -1)),
    "nanmedian_rows": (("x",), lambda x: x.nanmedian(-1)),
    "mode_wide_rows": (("wide",), lambda x: (x * 8).round().mode(-1)),
    "topk8_rows": (("x",), lambda x: torch.topk(x, 8, -1)),
    "index_select_rows": (("x", "idx"), lambda x, i: x.index_select(0, i)),
    "index_select_columns": (("x", "idx"), lambda x, i: x.index_select(1, i)),
    "embedding": (("table", "tokens"), lambda w, t: torch.nn.functional.embedding(t, w)),
    "embedding_backward": (
        ("grad", "tokens"),
        lambda g, t: torch.ops.aten.embedding_dense_backward(g, t, 8192, -1, False),
    ),
    "index_add_rows": (("x", "idx", "y"), lambda x, i, y: x.index_add(0, i, y)),
    "gather_columns": (("x", "idx"), lambda x, i: x.gather(1, i.view(1, -1).expand(512, -1))),
    "scatter_add_columns": (
        ("x", "idx", "y"),
        lambda x, i, y: x.scatter_add(1, i.view(1, -1).expand(512, -1), y),
    ),
    "cat_rows": (("x", "y"), lambda x, y: torch.cat([x, y], 0)),
    "cat_columns": (("x", "y"), lambda x, y: torch.cat([x, y], 1)),
    "cumsum_rows": (("x",), lambda x: x.cumsum(-1)),
    "cumsum_columns": (("x",), lambda x: x.cumsum(0)),
    "sum_rows": (("x",), lambda x: x.sum(-1)),
    "transpose_copy": (("x",), lambda x: x.t().contiguous()),
}


def _time(fn, args: list[torch.Tensor], device: str, calls: int, rounds: int) -> float:
    """Median microseconds per call over `rounds` rounds of `calls` calls."""
    args = [a.to(device) for a in args]

    def sync() -> None:
        if device == "tpu":
            torch.tpu.synchronize()

    for _ in range(3):
        fn(*args)
    sync()
    if device == "tpu":
        torchtpu._C.wait_tier_ups()
        for _ in range(2):
            fn(*args)
        sync()
    per_call = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        kept = [fn(*args) for _ in range(calls)]
        sync()
        per_call.append((time.perf_counter() - t0) / calls * 1e6)
        del kept
    return statistics.median(per_call)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", default="strict", choices=["strict", "fused"])
    ap.add_argument("--ops", default="", help="comma-separated names (default: all)")
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    names = a.ops.split(",") if a.ops else list(OPS)
    unknown = [n for n in names if n not in OPS]
    if unknown:
        ap.error(f"unknown ops {unknown}; choose from {sorted(OPS)}")
    inputs = _inputs()
    print(f"| op ({a.mode}) | torch CPU eager, us | tpu, us | ratio |")
    print("|---|---:|---:|---:|")
    with torchtpu.eager_mode(a.mode):
        for name in names:
            keys, fn = OPS[name]
            args = [inputs[k] for k in keys]
            cpu = _time(fn, args, "cpu", a.calls, a.rounds)
            tpu = _time(fn, args, "tpu", a.calls, a.rounds)
            print(f"| {name} | {cpu:.0f} | {tpu:.0f} | {tpu / cpu:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
