"""Optimized HLO of the GPT training step, torchtpu against the torchax peer (issue 21).

`python bench/hlo_compare.py` (torchtpu importable, the `peer` extra installed) dumps
both with `XLA_FLAGS=--xla_dump_to=DIR --xla_dump_hlo_as_text`, each in its own process:
- torchtpu (Fused Eager by default, `--compile` for torch.compile(backend="tpu") with
  Fused around, `--flatten` for torchtpu.optim.flatten(optimizer)): six steps of
  bench/run.py's Trainer step; the modules the third step runs are those compiled in
  steps 1-3 less the ones a later step replaced (see dump_ours);
- torchax: bench/torchax_peer.py's jitted step (the one module named jit_call_torch).
Then prints per-module counts: top-level kernels (what XLA:CPU launches), fusions by
kind, dots with shapes, custom-calls, copies, transposes, reduces.
`--stats FILE...` prints the counts of given dumps only.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

# Ops that take no kernel at run time in XLA:CPU (buffer aliasing or bookkeeping).
FREE = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast"}

_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+) = (.+?) ([a-z][a-z0-9\-]*)\((.*)$")
_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*\(.*\)\s*->\s*.*\{\s*$")


def parse(path: str) -> tuple[str, dict[str, list[dict]]]:
    """(entry name, computation -> instructions) of an HLO text dump."""
    comps: dict[str, list[dict]] = {}
    entry, cur = "", None
    with open(path) as fh:
        lines = fh.readlines()
    for line in lines:
        h = _HEADER.match(line)
        if h:
            cur = h.group(2)
            comps[cur] = []
            if h.group(1):
                entry = cur
            continue
        if line.startswith("}"):
            cur = None
            continue
        m = _INSTR.match(line) if cur else None
        if m:
            name, shape, op, rest = m.groups()
            depth, end = 1, 0
            for end, ch in enumerate(rest):  # the operand list ends at its matching ")"
                depth += ch == "("
                depth -= ch == ")"
                if depth == 0:
                    break
            attrs = rest[end + 1 :]
            calls = re.findall(r"(?:calls|to_apply|body|condition)=%?([\w.\-]+)", attrs)
            comps[cur].append(
                {
                    "name": name,
                    "shape": shape.split("{")[0] if not shape.startswith("(") else shape,
                    "op": op,
                    "operands": re.findall(r"%([\w.\-]+)", rest[:end]),
                    "attrs": attrs,
                    "calls": calls,
                    "kind": (re.search(r"kind=(k\w+)", attrs) or [None, None])[1],
                    "target": (re.search(r'custom_call_target="([^"]+)"', attrs) or [None, None])[
                        1
                    ],
                    "meta": (re.search(r'op_name="([^"]*)"', attrs) or [None, ""])[1],
                }
            )
    return entry, comps


def stats(path: str) -> dict:
    """Counts for one optimized module."""
    entry, comps = parse(path)
    shapes = {(c, i["name"]): i["shape"] for c, ins in comps.items() for i in ins}
    owner = {}  # computation -> the fusion/call that uses it (one level is enough here)
    for c, ins in comps.items():
        for i in ins:
            for callee in i["calls"]:
                owner[callee] = (c, i)

    # Top-level: the entry and the bodies of control flow it calls (not fusion bodies
    # or reducers), i.e. what the runtime launches one by one.
    top, todo = [], [entry]
    while todo:
        c = todo.pop()
        for i in comps.get(c, []):
            top.append(i)
            if i["op"] in ("while", "call", "conditional"):
                todo += i["calls"]
    kernels = [i for i in top if i["op"] not in FREE]
    fusion_kinds = collections.Counter(i["kind"] for i in top if i["op"] == "fusion")
    inside = collections.Counter()  # ops inside fusion bodies
    for i in top:
        if i["op"] == "fusion":
            for callee in i["calls"]:
                inside.update(j["op"] for j in comps.get(callee, []))

    def where(c: str) -> str:
        if c == entry:
            return "top"
        o = owner.get(c)
        if not o:
            return c
        return f"{o[1]['op']}:{o[1]['kind'] or o[1]['target'] or ''}"

    dots = []
    for c, ins in comps.items():
        for i in ins:
            if i["op"] in ("dot", "convolution") or (
                i["op"] == "custom-call" and "matmul" in (i["target"] or "").lower()
            ):
                ops = [shapes.get((c, o), "?") for o in i["operands"]]
                dims = re.findall(
                    r"(lhs_batch_dims=\{[\d,]*\}|lhs_contracting_dims=\{[\d,]*\})", i["attrs"]
                )
                dots.append(
                    {
                        "out": i["shape"],
                        "in": ops,
                        "dims": " ".join(dims),
                        "where": where(c),
                        "meta": i["meta"],
                    }
                )
    module_ops = collections.Counter(i["op"] for ins in comps.values() for i in ins)
    return {
        "file": os.path.basename(path),
        "parameters": sum(1 for i in comps[entry] if i["op"] == "parameter"),
        "instructions": sum(len(v) for v in comps.values()),
        "computations": len(comps),
        "top_level": len(top),
        "kernels": len(kernels),
        "kernel_ops": dict(collections.Counter(i["op"] for i in kernels).most_common()),
        "fusions": dict(fusion_kinds),
        "ops_in_fusions": dict(inside.most_common(12)),
        "dots": dots,
        "custom_calls": dict(
            collections.Counter(i["target"] for ins in comps.values() for i in ins if i["target"])
        ),
        "copies": module_ops["copy"],
        "top_copies": sum(1 for i in top if i["op"] == "copy"),
        "transposes": module_ops["transpose"],
        "reduces": module_ops["reduce"],
        "module_ops": dict(module_ops.most_common()),
    }


def print_stats(s: dict, show_dots: bool = True) -> None:
    print(f"\n## {s['file']}")
    for k in (
        "parameters",
        "instructions",
        "computations",
        "kernels",
        "kernel_ops",
        "fusions",
        "ops_in_fusions",
        "custom_calls",
        "copies",
        "top_copies",
        "transposes",
        "reduces",
    ):
        print(f"- {k}: {s[k]}")
    print(f"- dots: {len(s['dots'])}")
    if show_dots:
        by = collections.Counter(
            (d["where"], f"{d['out']} = {' x '.join(d['in'])} {d['dims']}") for d in s["dots"]
        )
        for (w, d), n in sorted(by.items(), key=lambda kv: (kv[0][0], kv[0][1])):
            print(f"  - {n} x [{w}] {d}")


# torchtpu's steps: prints, per step, the optimized modules compiled during it.
_OURS = """
import glob, json, os, sys
import torch, torchtpu
sys.path.insert(0, sys.argv[1])
from models import GPT, copy_task_batch
dump, mode, how = sys.argv[2], sys.argv[3], sys.argv[4]
gen = torch.Generator().manual_seed(0)
batches = [copy_task_batch(gen, 8, 32, 64) for _ in range(4)]
torch.manual_seed(0)
model = GPT().to("tpu")
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
if "flat" in how:
    torchtpu.optim.flatten(opt)
fwd = torch.compile(model, backend="tpu") if "compile" in how else model
torchtpu.eager_mode(mode)
seen, per_step = set(), []
for i in range(6):
    x, y = (t.to("tpu") for t in batches[i % 4])
    opt.zero_grad(set_to_none=True)
    loss = fwd(x, y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    loss.item()
    torchtpu._C.wait_tier_ups()
    now = set(glob.glob(os.path.join(dump, "*after_optimizations.txt")))
    per_step.append(sorted(now - seen))
    seen = now
print(json.dumps(per_step))
"""


def dump_ours(dump: str, mode: str, how: str) -> list[str]:
    env = {**os.environ, "XLA_FLAGS": f"--xla_dump_to={dump} --xla_dump_hlo_as_text"}
    out = subprocess.run(
        [sys.executable, "-c", _OURS, os.path.join(HERE, "..", "examples"), dump, mode, how],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    per_step = json.loads(out.strip().splitlines()[-1])
    if any(per_step[3:]):
        print(f"note: steps 4-6 compiled {per_step[3:]}")
    # A module that a later step (up to the third) recompiled with the same number of
    # results is not run again: step 1's backward + AdamW program, built before AdamW had
    # state, is replaced in step 2.
    kept: dict[int, str] = {}
    for f in (f for s in per_step[:3] for f in s):
        kept[_results(f)] = f
    return sorted(kept.values())


def _results(path: str) -> int:
    """Number of results of a dumped module's entry computation."""
    with open(path) as fh:
        head = fh.readline()
    layout = head.split("entry_computation_layout=", 1)[1]
    return layout.split(")->", 1)[1].count("[")


def dump_peer(dump: str) -> list[str]:
    env = {**os.environ, "XLA_FLAGS": f"--xla_dump_to={dump} --xla_dump_hlo_as_text"}
    subprocess.run(
        [sys.executable, os.path.join(HERE, "torchax_peer.py"), "--rounds", "0", "--no-check"],
        env=env,
        check=True,
        capture_output=True,
    )
    return sorted(glob.glob(os.path.join(dump, "*jit_call_torch.cpu_after_optimizations.txt")))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--stats", nargs="*", help="only print the counts of these dumps")
    ap.add_argument("--mode", default="fused")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--flatten", action="store_true", help="torchtpu.optim.flatten(opt)")
    ap.add_argument("--keep", help="dump into this folder (kept)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.stats:
        files = args.stats
    else:
        root = args.keep or tempfile.mkdtemp(prefix="torchtpu-hlo-")
        ours = dump_ours(
            os.path.join(root, "torchtpu"),
            args.mode,
            ("compile" if args.compile else "eager") + ("+flat" if args.flatten else ""),
        )
        peer = dump_peer(os.path.join(root, "torchax"))
        print(
            f"dumps in {root}; torchtpu modules up to step 3: {[os.path.basename(f) for f in ours]}"
        )
        files = ours + peer
    all_stats = [stats(f) for f in files]
    if args.json:
        print(json.dumps(all_stats))
        return
    for s in all_stats:
        print_stats(s)


if __name__ == "__main__":
    main()
