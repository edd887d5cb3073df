"""Eager mode selection: a global setter that is also a thread-local context manager."""

from __future__ import annotations

from typing import Self

from . import _C
from ._logging import log

_MODES = ("strict", "debug", "fused")


def get_eager_mode() -> str:
    """The mode ops run in on this thread: 'strict' (default), 'debug' or 'fused'."""
    return _C.get_mode()


class thread_mode:
    """Sets the eager mode for this thread only while entered, never touching the
    global one: for the package's own threads (thread ranks, compiled graphs), where
    ``eager_mode``'s brief global change would race with other threads'."""

    def __init__(self, mode: str) -> None:
        if mode not in _MODES:
            raise ValueError(f"unknown eager mode {mode!r}; expected one of {_MODES}")
        self.mode = mode

    def __enter__(self) -> Self:
        # Kept in PyTorch's thread-local state, so autograd's backward threads
        # see it too.
        _C.push_thread_mode(self.mode)
        return self

    def __exit__(self, *exc: object) -> None:
        _C.pop_thread_mode()


class eager_mode(thread_mode):
    """``torchtpu.eager_mode("fused")`` sets the mode globally; used as a context
    manager it sets it for this thread only, restoring the previous one on exit
    (the innermost context wins). Between the call and the ``with`` taking it over,
    the global mode is briefly ``mode``: threads that enter ``with eager_mode(...)``
    at the same moment can leave the global mode changed, so set one global mode
    before starting threads."""

    def __init__(self, mode: str) -> None:
        super().__init__(mode)
        self._global_prev = _C.get_global_mode()
        _C.set_mode(mode)
        log.debug("eager_mode(%r): the global mode until a `with` makes it thread-local", mode)

    def __enter__(self) -> Self:
        # Undo the global change made by the constructor: a `with` is thread-local.
        _C.set_mode(self._global_prev)
        super().__enter__()
        log.debug("eager mode %s entered on this thread", self.mode)
        return self

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        log.debug("eager mode %s left; now %s", self.mode, _C.get_mode())
