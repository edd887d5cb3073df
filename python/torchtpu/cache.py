"""The compile cache from the command line::

    python -m torchtpu.cache stats            # entries and bytes of the cache directories
    python -m torchtpu.cache clear [--shared] # remove every entry no process is reading
    python -m torchtpu.cache prune [--max-bytes 512M] [--shared]

Directories come from TORCHTPU_CACHE_DIR (default ~/.cache/torchtpu, "off" disables) and
TORCHTPU_SHARED_CACHE_DIR; the cap from TORCHTPU_CACHE_MAX_BYTES. In a program,
``torchtpu.cache_stats()`` gives this process's hits, misses and compile time.
"""

from __future__ import annotations

import argparse
import sys

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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m torchtpu.cache", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("command", choices=["stats", "clear", "prune"])
    ap.add_argument("--shared", action="store_true", help="act on TORCHTPU_SHARED_CACHE_DIR")
    ap.add_argument("--max-bytes", type=_parse_bytes, help="prune target (default: the cap)")
    args = ap.parse_args(argv)
    info = cache_stats()
    if args.command == "stats":
        print(f"cap: {_human(info['max_bytes'])} ({info['max_bytes']} bytes)")
        for label, path in (("local", info["dir"]), ("shared", info["shared_dir"])):
            if not path:
                print(f"{label}: off")
                continue
            entries, size = _C._cache_usage(path)
            print(f"{label}: {path}: {entries} entries, {_human(size)} ({size} bytes)")
        return 0
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


if __name__ == "__main__":
    sys.exit(main())
