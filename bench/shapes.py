"""Cold start and changing shapes (issue 20): Hugging Face tiny models whose shapes change
from call to call, each run in a fresh process with an empty compile cache.

    PYTHONPATH=python .venv/bin/python bench/shapes.py [--long 64] [--longest 256]

Needs the `transformers` extra; prints a markdown table. Compile counts are exact;
seconds are rough on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

_GENERATE = r"""
import json, sys, time, torch, torchtpu
from transformers import GPT2Config, GPT2LMHeadModel, LogitsProcessor, LogitsProcessorList
mode, cache, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
torchtpu.eager_mode(mode)
torch.manual_seed(0)
cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=100, n_positions=512)
cpu = GPT2LMHeadModel(cfg).eval()
ids = torch.randint(0, 100, (1, 5))
kw = dict(do_sample=False, pad_token_id=0, max_new_tokens=n)
if cache == "static":
    kw["cache_implementation"] = "static"

class Count(LogitsProcessor):
    def __init__(self):
        self.seen = []
    def __call__(self, input_ids, scores):
        self.seen.append(torchtpu.metrics()["compiles"])
        return scores

def timed(model, x, **extra):
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model.generate(x, **kw, **extra)
    out.cpu()
    return time.perf_counter() - t0, out

m = GPT2LMHeadModel(cfg).eval()
m.load_state_dict(cpu.state_dict())
m = m.to("tpu")
c = Count()
cold, out = timed(m, ids.to("tpu"), logits_processor=LogitsProcessorList([c]))
compiles = torchtpu.metrics()["compiles"]
per_token = [b - a for a, b in zip(c.seen, c.seen[1:] + [compiles])]
warm = min(timed(m, ids.to("tpu"))[0] for _ in range(3))
cpu_s = min(timed(cpu, ids)[0] for _ in range(3))
same = torch.equal(out.cpu(), timed(cpu, ids)[1])
print(json.dumps({"compiles": compiles, "per_token": per_token, "cold": cold, "warm": warm,
                  "cpu": cpu_s, "same": same, "host_ops": sum(torchtpu.metrics()["host_ops"].values()),
                  "bucketed": torchtpu.metrics()["bucketed_calls"]}))
"""

_MIXTRAL = r"""
import json, statistics, sys, time, torch, torchtpu, transformers
mode, steps, warmup = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torchtpu.eager_mode(mode)

def run(dev):
    torch.manual_seed(0)
    cfg = transformers.MixtralConfig(
        vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
        num_experts_per_tok=2, max_position_embeddings=64, output_router_logits=True)
    m = transformers.MixtralForCausalLM(cfg).to(dev)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    times, compiles = [], []
    for _ in range(steps):
        ids = torch.randint(0, 96, (4, 16), generator=g).to(dev)
        c0, t0 = torchtpu.metrics()["compiles"], time.perf_counter()
        r = m(input_ids=ids, labels=ids)
        r.loss.backward()
        opt.step()
        opt.zero_grad()
        r.loss.item()
        times.append(time.perf_counter() - t0)
        compiles.append(torchtpu.metrics()["compiles"] - c0)
    return times[warmup:], compiles[warmup:]

tpu_t, tpu_c = run("tpu")
cpu_t, _ = run("cpu")
print(json.dumps({"quiet": sum(c == 0 for c in tpu_c), "steps": len(tpu_c),
                  "compiles": sum(tpu_c), "tpu": statistics.median(tpu_t),
                  "cpu": statistics.median(cpu_t)}))
"""


def child(code: str, *args: str, env: dict | None = None) -> dict:
    with tempfile.TemporaryDirectory(prefix="torchtpu-shapes-") as cache:
        full = dict(os.environ, TORCHTPU_CACHE_DIR=cache, **(env or {}))
        full.pop("TORCHTPU_CACHE_PACKS", None)
        full.pop("TORCHTPU_SHARED_CACHE_DIR", None)
        r = subprocess.run(
            [sys.executable, "-c", code, *args],
            env=full,
            capture_output=True,
            text=True,
            timeout=3600,
            check=False,
        )
    if r.returncode != 0:
        raise RuntimeError(r.stderr[-3000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--short", type=int, default=16, help="new tokens, short generate")
    ap.add_argument("--long", type=int, default=64, help="new tokens, long generate")
    ap.add_argument("--longest", type=int, default=256, help="new tokens, longest generate")
    ap.add_argument("--mixtral-steps", type=int, default=30)
    args = ap.parse_args()
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("bench/shapes.py: transformers is not installed (pip install '.[hf]'); skipped")
        return
    print(
        "\n| GPT-2 tiny `generate` (fresh process, empty cache) | mode | new tokens | compiles "
        "| compiles per token, last 4 | cold s | warm s | CPU s | warm / CPU | equal to CPU "
        "| bucketed calls |"
    )
    print("|---|---|---:|---:|---|---:|---:|---:|---:|---|---:|")
    off = {"TORCHTPU_EAGER_BUCKETS": "0"}
    optimized = {"TORCHTPU_SMALL_QUICK": "0"}  # small programs compiled optimized
    sync = {"TORCHTPU_ASYNC_COMPILE": "0"}  # each compile waited for where it is needed
    one = {"TORCHTPU_COMPILE_THREADS": "1"}
    for cache, mode, n, env in (
        ("dynamic", "strict", 8, None),
        ("dynamic", "strict", 8, sync),
        ("dynamic", "strict", 8, one),
        ("dynamic", "strict", 8, optimized),
        ("dynamic", "strict", args.short, None),
        ("dynamic", "strict", args.long, None),
        ("dynamic", "strict", args.longest, None),
        ("dynamic", "fused", 8, None),
        ("dynamic", "fused", 8, sync),
        ("dynamic", "fused", 8, optimized),
        ("dynamic", "fused", args.short, None),
        ("dynamic", "fused", args.longest, None),
        ("dynamic", "strict", args.short, off),
        ("dynamic", "strict", args.long, off),
        ("static", "strict", args.short, None),
        ("static", "strict", args.long, None),
        ("static", "fused", args.short, None),
        ("static", "strict", args.short, {"TORCHTPU_HOST_CHURN": "0"}),
    ):
        r = child(_GENERATE, mode, cache, str(n), env=env)
        label = f"{cache} cache" + "".join(f" (`{k}={v}`)" for k, v in (env or {}).items())
        print(
            f"| {label} | {mode} | {n} | {r['compiles']} | {r['per_token'][-4:]} "
            f"| {r['cold']:.2f} | {r['warm']:.3f} | {r['cpu']:.3f} "
            f"| {r['warm'] / r['cpu']:.1f}x | {r['same']} | {r['bucketed']} |"
        )
    print(
        "\n| Mixtral tiny training step (MoE routing) | mode | steps after 10 warm-up "
        "| steps with 0 compiles | compiles | tpu ms | CPU ms | tpu / CPU |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for mode in ("strict", "fused"):
        r = child(_MIXTRAL, mode, str(args.mixtral_steps), "10")
        print(
            f"| 4x16 tokens, 4 experts, top-2 | {mode} | {r['steps']} | {r['quiet']} "
            f"| {r['compiles']} | {r['tpu'] * 1e3:.0f} | {r['cpu'] * 1e3:.0f} "
            f"| {r['tpu'] / r['cpu']:.1f}x |"
        )


if __name__ == "__main__":
    main()
