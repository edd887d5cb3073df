"""Every Python snippet of docs/GUIDE.md runs as written: each in a fresh process,
the ones marked `<!-- guide: torchrun N -->` under torchrun with N ranks."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from conftest import check_py

sys.path.insert(0, str(Path(__file__).resolve().parent / "dist"))
from launch import torchrun

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "GUIDE.md"
BLOCK = re.compile(r"(?:<!-- guide: torchrun (\d+) -->\n)?```python\n(.*?)```", re.DOTALL)


def _snippets() -> list:
    text = GUIDE.read_text()
    out = []
    for m in BLOCK.finditer(text):
        heading = re.findall(r"^## (.+)$", text[: m.start()], re.MULTILINE)[-1]
        line = text[: m.start()].count("\n") + 1
        out.append(pytest.param(m.group(2), int(m.group(1) or 0), id=f"L{line}-{heading[:24]}"))
    return out


SNIPPETS = _snippets()


def test_the_guide_has_snippets_for_every_section():
    headings = {p.id.split("-", 1)[1] for p in SNIPPETS}
    for want in ("First steps", "Distributed", "Custom kernels in JAX and", "Troubleshooting"):
        assert want[:24] in headings, f"no snippet under '{want}'"


@pytest.mark.parametrize("code,ranks", SNIPPETS)
def test_snippet_runs(code, ranks, tmp_path):
    if not ranks:
        check_py(code, timeout=240)
        return
    script = tmp_path / "snippet.py"
    script.write_text(code)
    res = torchrun(str(script), nproc=ranks, timeout=240)
    assert res.returncode == 0, res.output
