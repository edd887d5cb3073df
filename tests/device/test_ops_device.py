"""PyTorch's op and module databases on ``tpu``: every float32 OpInfo of ``op_db`` and
ModuleInfo of ``module_db`` through the device-generic templates of ``opinfo_suite``.

This is a report, not a gate: ``python tests/device/run.py`` (``make device-tests``) runs it
and writes docs/DEVICE_TESTS.md.  ``make test`` does not collect this directory; the
representative subset in tests/python/test_device_suite.py does run there.

    pytest tests/device/test_ops_device.py -k "add_tpu"       # some tests by name

Run directly, every test takes all of its samples; TORCHTPU_DEVTESTS_MAX_SAMPLES=N (what
run.py's --max-samples sets) takes the first N.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from opinfo_suite import instantiate, module_test_class, op_test_class
from torch.testing._internal.common_methods_invocations import op_db
from torch.testing._internal.common_modules import module_db

TestOpsDevice = op_test_class(op_db)
TestModulesDevice = module_test_class(module_db)

instantiate(TestOpsDevice, globals())
instantiate(TestModulesDevice, globals())
