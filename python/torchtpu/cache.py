"""The compile cache from the command line::

    python -m torchtpu.cache stats            # entries and bytes of the cache directories
    python -m torchtpu.cache clear [--shared] # remove every entry no process is reading
    python -m torchtpu.cache prune [--max-bytes 512M] [--shared]
    python -m torchtpu.cache pack OUT.pack [--from DIR]          # a directory's entries
    python -m torchtpu.cache pack OUT.pack --run script.py [args] # the programs a run used
    python -m torchtpu.cache inspect X.pack   # entries, runtimes and sizes of a pack
    python -m torchtpu.cache run script.py [args]  # runs it, then prints what it compiled

Directories come from TORCHTPU_CACHE_DIR (default ~/.cache/torchtpu, "off" disables) and
TORCHTPU_SHARED_CACHE_DIR; the cap from TORCHTPU_CACHE_MAX_BYTES; read-only kernel packs
from TORCHTPU_CACHE_PACKS (a.pack:b.pack). In a program, ``torchtpu.cache_stats()`` gives
this process's hits, misses and compile time.
"""

from __future__ import annotations

import argparse
import os
import runpy
import shutil
import subprocess
import sys
import tempfile
from collections import Counter

from . import _C
from ._C import cache_stats

__all__ = ["cache_stats", "main"]

_UNITS = {"": 0, "K": 10, "M": 20, "G": 30}


def _parse_bytes(text: str) -> int:
    unit = text[-1:].upper() if text[-1:].isalpha() else ""
    number = text[: len(text) - len(unit)]
    if unit not in _UNITS or not number.isdigit():
        raise argparse.ArgumentTypeError(f"'{text}' is not a byte count such as 1073741824 or 512M")
    return int(number) << _UNITS[unit]


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _dir_command(args: argparse.Namespace, info: dict) -> int:
    path = info["shared_dir"] if args.shared else info["dir"]
    if not path:
        which = "TORCHTPU_SHARED_CACHE_DIR" if args.shared else "TORCHTPU_CACHE_DIR"
        print(f"[tpu cache] {which} is not set or off: nothing to {args.command}", file=sys.stderr)
        return 1
    target = (
        0
        if args.command == "clear"
        else (args.max_bytes if args.max_bytes is not None else info["max_bytes"])
    )
    removed = _C._cache_evict(path, target)
    entries, size = _C._cache_usage(path)
    print(f"{path}: removed {removed} entries; {entries} left, {_human(size)}")
    return 0


def _stats(info: dict) -> int:
    print(f"cap: {_human(info['max_bytes'])} ({info['max_bytes']} bytes)")
    for label, path in (("local", info["dir"]), ("shared", info["shared_dir"])):
        if not path:
            print(f"{label}: off")
            continue
        entries, size = _C._cache_usage(path)
        print(f"{label}: {path}: {entries} entries, {_human(size)} ({size} bytes)")
    for path in info["packs"]:
        print(f"pack: {path}")
    return 0


def _run_into(directory: str, run: list[str], info: dict) -> int:
    """Runs `run` (a script and its arguments) with `directory` as its cache directory,
    so that it ends up holding exactly the programs the run used: the usual cache
    directory becomes its shared root (hits are copied in, compiles written back)."""
    env = dict(os.environ, TORCHTPU_CACHE_DIR=directory)
    env.pop("TORCHTPU_CACHE_PACKS", None)  # pack hits would not be copied in
    source = info["dir"] or info["shared_dir"]
    if source:
        env["TORCHTPU_SHARED_CACHE_DIR"] = source
    else:
        env.pop("TORCHTPU_SHARED_CACHE_DIR", None)
    return subprocess.run([sys.executable, *run], env=env, check=False).returncode


def _pack(args: argparse.Namespace, info: dict) -> int:
    if args.run is not None and args.source is not None:
        print("[tpu cache] pack: give --from or --run, not both", file=sys.stderr)
        return 2
    if args.run is not None:
        if not args.run:
            print("[tpu cache] pack --run needs a script", file=sys.stderr)
            return 2
        work = tempfile.mkdtemp(prefix="torchtpu-pack-")
        try:
            rc = _run_into(work, args.run, info)
            if rc != 0:
                print(
                    f"[tpu cache] {args.run[0]} exited with {rc}: no pack written", file=sys.stderr
                )
                return rc
            return _pack_dir(work, args.out, f"used by {' '.join(args.run)}")
        finally:
            shutil.rmtree(work, ignore_errors=True)
    source = args.source or info["dir"]
    if not source:
        print("[tpu cache] TORCHTPU_CACHE_DIR is off: give --from DIR", file=sys.stderr)
        return 1
    return _pack_dir(source, args.out, f"from {source}")


def _pack_dir(source: str, out: str, what: str) -> int:
    entries, skipped, size = _C._cache_pack(source, out)
    note = f" ({skipped} damaged entries skipped)" if skipped else ""
    print(f"{out}: {entries} programs {what}, {_human(size)}{note}")
    return 0


def _inspect(path: str) -> int:
    try:
        entries = _C._cache_pack_entries(path)
    except RuntimeError as e:
        print(f"[tpu cache] {e}", file=sys.stderr)
        return 1
    try:
        mine = _C._cache_identity()
    except RuntimeError:
        mine = None  # no plugin here: the pack is still described
    size = os.path.getsize(path)
    print(f"{path}: {len(entries)} programs, {_human(size)}, checksums ok")
    count = Counter(identity for _, identity, _ in entries)
    total = Counter()
    for _, identity, n in entries:
        total[identity] += n
    for identity, n in count.most_common():
        where = "this runtime" if identity == mine else "another runtime: refused here"
        print(f"  runtime {identity[:16]}: {n} programs, {_human(total[identity])} ({where})")
    return 0


def _run(run: list[str]) -> int:
    """Runs a script in this process, then prints what the cache did for it."""
    sys.argv = list(run)
    sys.path.insert(0, os.path.dirname(os.path.abspath(run[0])))
    code = 0
    try:
        runpy.run_path(run[0], run_name="__main__")
    except SystemExit as e:
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
        code = e.code if isinstance(e.code, int) else int(e.code is not None)
    s = cache_stats()
    print(
        f"[tpu cache] compiles={s['misses']} pack_hits={s['pack_hits']} "
        f"disk_hits={s['disk_hits']} shared_hits={s['shared_hits']} "
        f"pack_refused={s['pack_refused']} errors={s['errors']}"
    )
    return code


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m torchtpu.cache", description=__doc__.split("\n\n")[0]
    )
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("stats", help="entries and bytes of the cache directories")
    for name in ("clear", "prune"):
        p = sub.add_parser(name, help=f"{name} the cache directory")
        p.add_argument("--shared", action="store_true", help="act on TORCHTPU_SHARED_CACHE_DIR")
        p.add_argument("--max-bytes", type=_parse_bytes, help="prune target (default: the cap)")
    p = sub.add_parser("pack", help="write programs into one portable kernel pack")
    p.add_argument("out", help="the pack file to write")
    p.add_argument("--from", dest="source", help="cache directory (default: TORCHTPU_CACHE_DIR)")
    p.add_argument(
        "--run", nargs=argparse.REMAINDER, help="script and arguments: pack what this run used"
    )
    p = sub.add_parser("inspect", help="programs, runtimes and sizes of a kernel pack")
    p.add_argument("pack")
    p = sub.add_parser("run", help="run a script, then print its compiles and cache hits")
    p.add_argument("script", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    info = cache_stats()
    if args.command == "stats":
        return _stats(info)
    if args.command == "pack":
        return _pack(args, info)
    if args.command == "inspect":
        return _inspect(args.pack)
    if args.command == "run":
        if not args.script:
            ap.error("run needs a script")
        return _run(args.script)
    return _dir_command(args, info)


if __name__ == "__main__":
    sys.exit(main())
