"""Exit safely after a backward pass on tpu.

PyTorch runs a tpu backward on its autograd device thread, and that thread may drop
the finished task just after ``backward()`` returns. The task holds Python objects
(the ``contextvars`` context each backward stashes, the tensors it returns). If the
interpreter is finalizing by then, their decref cannot take the GIL, and the thread
unwinds through a noexcept destructor: ``terminate called without an active
exception`` and SIGABRT, for a script that ends right after ``loss.backward()``.

At exit, one more backward on tpu, built in C++ so that it holds no Python object and
computes nothing, waits until the device thread has dropped every earlier task. Before
it, compiles still running on the compile pool and the launches queued behind them
finish (async compiles).
"""

from __future__ import annotations

import atexit

from . import _C


def install() -> None:
    atexit.register(_C._drain_autograd)
    # Runs first (atexit is last-in, first-out): compiles and queued launches end
    # while the interpreter and the runtime they use are still whole.
    atexit.register(_C._async_wait)
