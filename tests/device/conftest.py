"""The device suite runs with none of the backend's behaviour-changing environment
variables set (the CPU fallback off: an op without a lowering fails its test)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "conformance"))
from harness import BACKEND_ENV

for _name in BACKEND_ENV:
    os.environ.pop(_name, None)
