"""Printing tpu tensors: format the host copy, keep the device suffix."""

from __future__ import annotations

import torch
import torch._tensor_str as _ts

_installed = False


def install() -> None:
    global _installed
    if _installed:
        return
    original = _ts._str

    def _str(self: torch.Tensor, *, tensor_contents: str | None = None) -> str:
        if self.device.type != "tpu" or self.is_meta:
            return original(self, tensor_contents=tensor_contents)
        with torch.no_grad():
            host = self.detach().to("cpu")
        text = original(host, tensor_contents=tensor_contents)
        suffix = f"device='{self.device}'"
        grad = ""
        if self.grad_fn is not None:
            grad = f", grad_fn=<{type(self.grad_fn).__name__}>"
        elif self.requires_grad:
            grad = ", requires_grad=True"
        body = text.removesuffix(")")
        return f"{body}, {suffix}{grad})"

    _ts._str = _str
    _installed = True
