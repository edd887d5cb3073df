"""TorchTitan's llama3 debug model, trained by TorchTitan's own trainer on tpu, follows the
same loss curve as on CPU from the same seed checkpoint (the small subset of
`make ecosystem`, which also runs FSDP2 over 2 ranks: tests/ecosystem/run.py)."""

import importlib.util
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torchtitan") is None,
    reason="torchtitan not installed (pyproject's `titan` extra; `make test` installs it)")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ecosystem"))

STEPS = 4


def test_titan_llama3_debugmodel_single_process_matches_cpu(tmp_path):
    import titan
    import titan_assets

    assets = titan_assets.build(tmp_path / "assets")
    seed = titan.make_seed_checkpoint(assets, tmp_path, timeout=300)
    runs = {}
    for device in ("cpu", "tpu"):
        args = titan.titan_args(assets, tmp_path / device, STEPS, seed)
        runs[device] = run = titan.launch(device, device, 1, args, timeout=400)
        assert run.ok(), f"{device} run failed (rc {run.returncode}):\n{run.output[-6000:]}"
        assert len(run.losses) == STEPS, run.losses
    cpu, tpu = runs["cpu"].losses, runs["tpu"].losses
    assert tpu[-1] < tpu[0] - 0.2, f"loss did not fall on tpu: {tpu}"
    for step, (c, t) in enumerate(zip(cpu, tpu), 1):
        assert t == pytest.approx(c, rel=1e-3), f"step {step}: cpu {cpu} vs tpu {tpu}"
