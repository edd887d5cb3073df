#!/usr/bin/env python3
"""Checks the include layering of csrc/ (run by `make lint`; standard library only).

1. The runtime and the StableHLO builder know nothing of torch or Python: files in the
   torch-free folders include no ATen/, torch/, c10/, pybind11/ header nor Python.h.
2. Folders depend one way: a folder includes project headers only from itself and the
   folders DEPENDS lists for it.
3. Inside csrc/aten, files are ranked from registration (top) down to the runtime; a file
   includes only aten headers of its own rank or below (x.h and x.cpp share x's rank).

Prints every violation as `file:line: what, and why it is not allowed`; exits 1 if any.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

TORCH_FREE = ("pjrt", "hlo", "cache", "graph", "common")
TORCH_PREFIXES = ("ATen/", "torch/", "c10/", "pybind11/")
TORCH_HEADERS = ("Python.h",)

# Folder -> the other folders whose headers it may include.
DEPENDS = {
    "bindings": ("dist", "aten", "lower", "graph", "cache", "hlo", "pjrt", "common"),
    "dist": ("aten", "lower", "hlo", "pjrt", "common"),
    "aten": ("lower", "graph", "cache", "hlo", "pjrt", "common"),
    "lower": ("hlo", "common"),
    "graph": ("common",),
    "cache": ("pjrt", "common"),
    "hlo": ("common",),
    "pjrt": ("common",),
    "common": (),
}

# csrc/aten files by rank, top (0) to bottom: (rank name, file stems).
ATEN_RANKS = (
    ("registration", ("ops", "dynamic_ops", "meta_kernels", "device", "autocast", "attention")),
    ("mode decided", ("dispatch",)),
    ("runners", (
        "strict", "fused", "fused_record", "fused_run", "fused_graph", "copy", "host_ops", "replay",
        "bucketed",
    )),
    ("program", ("program", "output_meta", "foreach", "op_info")),
    ("launcher", ("launch", "async_runs")),
    ("runtime", ("runtime", "events", "generator")),
)
RANK = {stem: i for i, (_, stems) in enumerate(ATEN_RANKS) for stem in stems}

SOURCE_SUFFIXES = {".h", ".hpp", ".cpp", ".cc", ".cxx", ".inc"}
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')
THIS = "tools/check_layers.py"


def rank_text(stem: str) -> str:
    return f"rank {RANK[stem]} ({ATEN_RANKS[RANK[stem]][0]})"


def project_target(csrc: Path, src: Path, quote: str, inc: str) -> tuple[str, str] | None:
    """(folder, path under csrc) of a project header, or None for an outside one."""
    first = inc.split("/", 1)[0]
    if "/" in inc and (first in DEPENDS or (csrc / first).is_dir()):
        return first, inc
    if quote == '"' and (src.parent / inc).is_file():  # a sibling, named without its folder
        rel = (src.parent / inc).resolve().relative_to(csrc.resolve()).as_posix()
        return rel.split("/", 1)[0], rel
    return None


def check_file(csrc: Path, src: Path, root: Path) -> list[str]:
    rel = src.relative_to(root).as_posix()
    parts = src.relative_to(csrc).parts
    folder = parts[0] if len(parts) > 1 else ""
    problems = []
    if folder not in DEPENDS:
        where = f"folder csrc/{folder}" if folder else "a file directly in csrc/"
        return [f"{rel}:1: {where} is not in the folder table; add it to DEPENDS in {THIS}"]
    stem = src.name.split(".", 1)[0]
    if folder == "aten" and stem not in RANK:
        problems.append(
            f"{rel}:1: aten file '{stem}' is not in the aten rank table; add it to "
            f"ATEN_RANKS in {THIS} at the rank it belongs to"
        )
    text = src.read_text(encoding="utf-8", errors="replace")
    for n, line in enumerate(text.splitlines(), start=1):
        m = INCLUDE.match(line)
        if not m:
            continue
        quote, inc = m.groups()
        shown = f'"{inc}"' if quote == '"' else f"<{inc}>"
        if folder in TORCH_FREE and (inc.startswith(TORCH_PREFIXES) or inc in TORCH_HEADERS):
            problems.append(
                f"{rel}:{n}: includes {shown}, and {folder} must stay torch-free "
                f"({', '.join(TORCH_FREE)} build without torch and Python)"
            )
            continue
        target = project_target(csrc, src, quote, inc)
        if target is None:
            continue
        to_folder, to_path = target
        if to_folder != folder and to_folder not in DEPENDS[folder]:
            allowed = ", ".join(DEPENDS[folder]) or "no other folder"
            problems.append(
                f"{rel}:{n}: includes {shown}, and {folder} may include only {allowed} "
                f"(folders depend one way)"
            )
            continue
        to_stem = Path(to_path).name.split(".", 1)[0]
        ranked = folder == "aten" == to_folder and stem in RANK and to_stem in RANK
        if ranked and RANK[to_stem] < RANK[stem]:
            problems.append(
                f"{rel}:{n}: includes {shown}, a {rank_text(to_stem)} header, and {stem} is "
                f"{rank_text(stem)}: an aten file includes only aten headers of its own "
                "rank or below"
            )
    return problems


def check(root: Path) -> list[str]:
    csrc = root / "csrc"
    problems = []
    for src in sorted(csrc.rglob("*")):
        if src.is_file() and src.suffix in SOURCE_SUFFIXES:
            problems += check_file(csrc, src, root)
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--root",
        type=Path,
        default=Path(__file__).resolve().parents[1],
        help="tree whose csrc/ is checked (default: this repository)",
    )
    args = parser.parse_args(argv)
    if not (args.root / "csrc").is_dir():
        print(f"{args.root}/csrc: no such directory", file=sys.stderr)
        return 2
    problems = check(args.root)
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} layering violation(s)", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
