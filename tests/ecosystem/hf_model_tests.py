"""transformers' own model tests for GPT-2, Llama, BERT and T5, run on tpu through
transformers' hook for out-of-tree devices (TRANSFORMERS_TEST_DEVICE_SPEC); writes the pass
rates and every failure, grouped by cause, into docs/ECOSYSTEM.md. A report, not a gate.

    python tests/ecosystem/hf_model_tests.py [--models gpt2 llama bert t5] [--timeout 300]
    python tests/ecosystem/hf_model_tests.py --tests-dir /path/to/transformers/tests

By default the tests come from the PyPI sdist of the installed transformers version
(`pip download --no-binary :all:`): it ships tests/test_modeling_common.py (the
ModelTesterMixin every model's test class inherits) but not tests/models/, so the four
models' testers (tiny configs and inputs) are tests/ecosystem/hf_models/model_testers.py.
With --tests-dir (the tests/ folder of a transformers checkout matching the installed
version) the real tests/models/<model>/test_modeling_<model>.py files run instead.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
MODELS = ("gpt2", "llama", "bert", "t5")
# Test classes of model_testers.py per model (T5 has an encoder-only class too).
CLASSES = {
    "gpt2": ("GPT2ModelTest",),
    "llama": ("LlamaModelTest",),
    "bert": ("BertModelTest",),
    "t5": ("T5ModelTest", "T5EncoderOnlyModelTest"),
}
# Test-only packages test_modeling_common.py imports that are not transformers'
# dependencies; installed with --target into the work folder, never into the venv.
TEST_DEPS = ("parameterized==0.9.0", "pytest-timeout==2.4.0")
# Modules test_modeling_common.py imports from tests/ folders the sdist leaves out; their
# mixins only add tests (generate, torch.export), so empty ones leave those tests out.
STAND_INS = {
    "exporters/test_export.py": "class ExportTesterMixin:\n    pass\n",
    "generation/test_utils.py": "class GenerationTesterMixin:\n    pass\n",
}
SECTION = "## transformers' model tests on tpu ({} eager)"


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "-q", *args], check=True)


def sdist_tree(work: Path, version: str) -> Path:
    """tests/ of the pinned sdist plus the stand-ins and our testers; returns the root."""
    sdist = work / f"transformers-{version}.tar.gz"
    if not sdist.exists():
        pip("download", "--no-binary", ":all:", "--no-deps", f"transformers=={version}",
            "-d", str(work))
    root = work / "tree"
    tests = root / "tests"
    shutil.rmtree(tests, ignore_errors=True)
    with tarfile.open(sdist) as tar:
        prefix = f"transformers-{version}/tests/"
        members = [m for m in tar.getmembers() if m.name.startswith(prefix) and m.isfile()]
        if not any(m.name.endswith("/test_modeling_common.py") for m in members):
            raise SystemExit(f"{sdist.name} has no tests/test_modeling_common.py; "
                             "pass --tests-dir")
        for m in members:
            m.name = "tests/" + m.name[len(prefix):]
            tar.extract(m, root, filter="data")
    for rel, text in STAND_INS.items():
        path = tests / rel
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    models = tests / "models" / "tpu"
    models.mkdir(parents=True, exist_ok=True)
    for d in (tests, tests / "models", models, tests / "exporters", tests / "generation"):
        (d / "__init__.py").touch()
    shutil.copy(HERE / "hf_models" / "model_testers.py", models / "test_models_tpu.py")
    return root


def targets(model: str, tests_dir: Path | None) -> list[str]:
    if tests_dir is not None:
        return [f"tests/models/{model}/test_modeling_{model}.py"]
    return [f"tests/models/tpu/test_models_tpu.py::{c}" for c in CLASSES[model]]


def run_model(model: str, device: str, root: Path, deps: Path, tests_dir: Path | None,
              opts) -> dict:
    tag = f"{model}.{device}.{opts.eager}"
    xml = root / f"{tag}.xml"
    metrics_file = root / f"{tag}.metrics.json"
    xml.unlink(missing_ok=True)
    metrics_file.unlink(missing_ok=True)
    env = dict(os.environ)
    env.update(
        TRANSFORMERS_TEST_DEVICE=device,
        PYTHONPATH=os.pathsep.join([str(root), str(deps), env.get("PYTHONPATH", "")]),
        HF_HUB_OFFLINE="1",
    )
    if device == "tpu":
        env.update(
            # transformers imports the backend module before it checks the device exists
            TRANSFORMERS_TEST_BACKEND="torchtpu",
            # transformers imports the spec by its file name from the working directory
            TRANSFORMERS_TEST_DEVICE_SPEC="tpu_spec.py",
            TORCHTPU_METRICS_OUT=str(metrics_file),
            TORCHTPU_EAGER=opts.eager,
        )
    select = ["-k", opts.keyword] if opts.keyword else []
    cmd = [sys.executable, "-m", "pytest", *targets(model, tests_dir), *select, "-q", "-rN",
           "-p", "no:cacheprovider", f"--timeout={opts.timeout}",
           f"--junitxml={xml}", "-o", "junit_family=xunit1"]
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True,
                              timeout=opts.suite_timeout, check=False)
        rc, tail = proc.returncode, (proc.stdout + proc.stderr)[-2000:]
    except subprocess.TimeoutExpired as e:
        rc, tail = "timeout", str(e.stdout or "")[-2000:]
    seconds = time.monotonic() - start
    cases = parse(xml) if xml.exists() else {}
    metrics = json.loads(metrics_file.read_text()) if metrics_file.exists() else {}
    print(f"{model} on {device}: rc {rc}, {seconds:.0f} s, {len(cases)} tests", flush=True)
    if not cases:
        print(tail, file=sys.stderr)
    command = " ".join(cmd).replace(str(root), "$TREE").replace(sys.executable, "python")
    return {"model": model, "rc": rc, "seconds": seconds, "cases": cases, "tail": tail,
            "command": command, "metrics": metrics}


def parse(xml: Path) -> dict[str, tuple[str, str]]:
    """test id -> (outcome, message); a test failing in call and teardown counts once."""
    out = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            el = case.find(tag)
            if el is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                message = el.get("message") or ""
                # collection errors carry a generic message; the exception is the last E line
                errors = [ln[1:].strip() for ln in (el.text or "").splitlines()
                          if ln.startswith("E ")]
                if errors and (not message or message == "collection failure"):
                    message = errors[-1]
                break
        if out.get(name, ("passed",))[0] == "passed":
            out[name] = (outcome, message)
    return out


def cause(message: str) -> str:
    """The failure's exception line without run-specific numbers, to group by."""
    line = next((ln for ln in message.strip().splitlines() if ln.strip()), "")
    line = re.sub(r"0x[0-9a-f]+", "0x…", line)
    line = re.sub(r"\d+\.\d+(e[-+]?\d+)?", "N", line)
    return line[:300]


def counts(cases: dict) -> dict:
    n = defaultdict(int)
    for outcome, _ in cases.values():
        n[outcome] += 1
    return n


def report(results: list[tuple[dict, dict | None]], version: str, tests_dir: Path | None,
           opts) -> str:
    source = (f"the transformers checkout at `{tests_dir}`" if tests_dir else
              f"the PyPI sdist `transformers-{version}.tar.gz` "
              "(tests/test_modeling_common.py, transformers' own test bodies) with "
              "the testers in tests/ecosystem/hf_models/model_testers.py")
    intro = (
        "Generated by `make ecosystem` (tests/ecosystem/hf_model_tests.py). transformers "
        f"{version}, torch {md.version('torch')}; tests from {source}; run with "
        "`TRANSFORMERS_TEST_BACKEND=torchtpu TRANSFORMERS_TEST_DEVICE=tpu "
        "TRANSFORMERS_TEST_DEVICE_SPEC=tpu_spec.py` (tests/ecosystem/hf_models/tpu_spec.py: "
        "device name, manual_seed, empty_cache, device_count), "
        f"`TORCHTPU_EAGER={opts.eager}`, `--timeout={opts.timeout}` per test. The same "
        "tests with `TRANSFORMERS_TEST_DEVICE=cpu` are the reference: a failure that CPU "
        "shares is the test's or the tester's, not the backend's."
    )
    header = ("| model | passed | failed | errors | skipped | pass rate (of run) | wall | "
              "CPU: passed / failed+errors / skipped | ops on tpu | executions | "
              "CPU fallbacks |")
    lines = [SECTION.format(opts.eager), "", intro, "", header,
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for tpu, cpu in results:
        n, m = counts(tpu["cases"]), tpu["metrics"]
        ran = n["passed"] + n["failed"] + n["error"]
        rate = f"{100 * n['passed'] / ran:.1f}%" if ran else "-"
        extra = "" if tpu["cases"] else f" (no results: rc {tpu['rc']})"
        ref = "-"
        if cpu is not None:
            c = counts(cpu["cases"])
            ref = f"{c['passed']} / {c['failed'] + c['error']} / {c['skipped']}"
        lines.append(f"| {tpu['model']}{extra} | {n['passed']} | {n['failed']} | "
                     f"{n['error']} | {n['skipped']} | {rate} | {tpu['seconds']:.0f} s | "
                     f"{ref} | {m.get('ops', '-')} | {m.get('executions', '-')} | "
                     f"{m.get('fallbacks', '-')} |")
    fallback_ops = sorted({op for tpu, _ in results for op in tpu["metrics"].get("fallback_ops",
                                                                                 {})})
    lines += ["", "Ops that fell back to CPU: " + (", ".join(f"`{o}`" for o in fallback_ops)
                                                  if fallback_ops else "none") + "."]
    lines += ["", "### Failures on tpu by cause", ""]
    groups = defaultdict(list)
    for tpu, cpu in results:
        for name, (outcome, message) in tpu["cases"].items():
            if outcome in ("failed", "error"):
                on_cpu = cpu["cases"].get(name, ("not run", ""))[0] if cpu else "not run"
                groups[cause(message)].append(f"{tpu['model']}: {name} (CPU: {on_cpu})")
    if not groups:
        lines.append("None.")
    for why, names in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        lines += [f"- **{len(names)}×** `{why}`", ""]
        lines += [f"  - {n}" for n in sorted(names)]
        lines.append("")
    lines += ["", "### Skips on tpu by reason", ""]
    skips = defaultdict(int)
    for tpu, _ in results:
        for outcome, message in tpu["cases"].values():
            if outcome == "skipped":
                # one line per reason, whichever model class it names
                why = re.sub(r"<class '[\w.]+'>|\b[A-Z]\w*Model\b", "<model>", cause(message))
                skips[why] += 1
    for why, count in sorted(skips.items(), key=lambda kv: -kv[1]):
        lines.append(f"- {count}× {why}")
    lines += ["", NOTES]
    lines += ["", ("Commands (run in `$TREE`, the assembled test tree, with "
                   "`PYTHONPATH=$TREE:<deps>:python`; the CPU reference drops the tpu "
                   "variables and sets `TRANSFORMERS_TEST_DEVICE=cpu`):"), ""]
    for tpu, _ in results:
        lines += ["```", tpu["command"], "```"]
    return "\n".join(lines) + "\n"


NOTES = """### What runs, and what the failures are

- **Test bodies**: transformers' `ModelTesterMixin` (tests/test_modeling_common.py of the
  pinned sdist, 121 tests, some parametrized) for every class listed in
  tests/ecosystem/hf_models/model_testers.py: GPT-2 (base, LM head, sequence/token
  classification, QA), Llama (the same), BERT (base, LM head, masked LM, multiple choice,
  next sentence, pretraining, QA, sequence/token classification), T5 (base, conditional
  generation, QA; encoder-only: base, token classification). Each test builds tiny models on
  `torch_device` (tpu) and checks outputs, gradients, save/load, SDPA vs eager attention in
  fp32/fp16/bf16 and so on.
- **Not run**: the PyPI sdist has no tests/models/ and no tests/generation/ or
  tests/exporters/, so the model files' own extra tests, `GenerationTesterMixin` (generate)
  and `ExportTesterMixin` (torch.export) tests are absent (empty stand-ins let
  test_modeling_common.py import). `--tests-dir <transformers checkout>/tests` runs the real
  tests/models/*/test_modeling_*.py files instead. Skipped: tests for CUDA-only kernels
  (Flash Attention 2/3/4, `kernels`), deepspeed, multi-device, MPS, `@slow` (hub
  checkpoints), and features these models lack.
- **More tests run on tpu than on CPU**: tests marked `require_torch_accelerator`
  (fp16/bf16 SDPA-vs-eager, offloading, ...) skip on CPU and run on tpu.
- **flex attention** (`test_flex_attention_with_grads`): transformers compiles
  `flex_attention` with `torch.compile`'s default backend, inductor, and torch 2.13's
  inductor generates Pallas code for a device named `tpu`, importing Google's `torch_tpu`
  package (as with TorchTitan above). The test is skipped on CPU (it needs an accelerator).
  Making it pass needs flex attention lowered by TorchTPU itself (its `torch.compile`
  backend or a decomposition for the `flex_attention` higher-order op): not done.
- **`T5ModelTest::test_model_base_model_prefix`** fails on CPU the same way: it asserts a
  generative model's `base_model` is a submodule, and `T5ForConditionalGeneration` has none
  (it holds encoder and decoder itself). Not a device matter.
"""


def write_section(path: Path, text: str, section: str) -> None:
    old = path.read_text() if path.exists() else ""
    start = old.find(section)
    if start < 0:
        new = old.rstrip("\n") + "\n\n" + text
    else:
        nxt = old.find("\n## ", start + len(section))
        new = old[:start] + text + (old[nxt:] if nxt >= 0 else "")
    path.write_text(new)
    print(f"wrote {path}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--tests-dir", type=Path, help="tests/ of a transformers checkout")
    parser.add_argument("--work", type=Path, default=REPO / "build" / "hf-tests")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per test")
    parser.add_argument("--no-cpu", action="store_true", help="skip the CPU reference runs")
    parser.add_argument("--eager", default="strict", choices=("strict", "debug", "fused"))
    parser.add_argument("--suite-timeout", type=int, default=3600, help="seconds per model")
    parser.add_argument("-k", dest="keyword", help="pytest -k expression")
    parser.add_argument("--out", type=Path, help="report file (default docs/ECOSYSTEM.md; "
                        "with -k no report unless given)")
    opts = parser.parse_args()

    version = md.version("transformers")
    opts.work.mkdir(parents=True, exist_ok=True)
    deps = opts.work / "deps"
    if not (deps / "parameterized").exists():
        pip("install", "--no-deps", "--target", str(deps), *TEST_DEPS)
    tests_dir = opts.tests_dir.resolve() if opts.tests_dir else None
    root = tests_dir.parent if tests_dir else sdist_tree(opts.work, version)
    shutil.copy(HERE / "hf_models" / "tpu_spec.py", root / "tpu_spec.py")
    if tests_dir is None:
        # keeps pytest from taking our repository's pyproject.toml as its configuration
        (root / "pytest.ini").write_text("[pytest]\n")
    results = []
    for m in opts.models:
        tpu = run_model(m, "tpu", root, deps, tests_dir, opts)
        cpu = None if opts.no_cpu else run_model(m, "cpu", root, deps, tests_dir, opts)
        results.append((tpu, cpu))
    if opts.out or not opts.keyword:
        out = opts.out or REPO / "docs" / "ECOSYSTEM.md"
        write_section(out, report(results, version, tests_dir, opts), SECTION.format(opts.eager))
    return 0 if all(tpu["cases"] for tpu, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
