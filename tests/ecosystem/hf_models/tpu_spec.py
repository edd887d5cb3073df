"""transformers' device spec for out-of-tree devices (TRANSFORMERS_TEST_DEVICE_SPEC).

transformers imports this file by name from the working directory, so
tests/ecosystem/hf_model_tests.py copies it next to the tests it runs.
"""

import atexit
import json
import os

import torch
import torchtpu  # registers the PrivateUse1 "tpu" device and torch.tpu

DEVICE_NAME = "tpu"
MANUAL_SEED_FN = torch.tpu.manual_seed
EMPTY_CACHE_FN = torch.tpu.empty_cache
DEVICE_COUNT_FN = torch.tpu.device_count

# hf_model_tests.py reports how much ran on the device (and how much fell back to CPU).
if os.environ.get("TORCHTPU_METRICS_OUT"):

    def _write_metrics(path=os.environ["TORCHTPU_METRICS_OUT"]):
        m = torchtpu.metrics()
        keys = ("ops", "executions", "compiles", "fallbacks", "fallback_ops")
        with open(path, "w") as f:
            json.dump({k: m[k] for k in keys if k in m}, f, default=str)

    atexit.register(_write_metrics)
