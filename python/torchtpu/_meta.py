"""Meta kernels for ATen ops we implement that some torch releases ship without one.

torch.compile traces on fake tensors, which need an op's Meta kernel. torch 2.13 has one
for the overrideable attention backward (the op our fused attention answers); torch 2.11,
the PyTorch of the GPU image, has none, so every compiled model with attention failed
there ("..._backward not implemented", seen on an H100). Each kernel here is registered
only where torch has none of its own, so a torch that has one keeps it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

_LIB: torch.library.Library | None = None


def _attention_backward(
    grad_out,
    query,
    key,
    value,
    attn_bias,
    grad_input_mask,
    out,
    logsumexp,
    cum_seq_q,
    cum_seq_k,
    max_q,
    max_k,
    dropout_p,
    is_causal,
    philox_seed,
    philox_offset,
    *,
    scale=None,
):
    # As aten/attention.cpp's kernel returns them: each gradient in its input's
    # layout, absent where grad_input_mask leaves it out; no bias gradient.
    grads = [
        torch.empty_like(t) if want else None
        for t, want in zip((query, key, value), grad_input_mask)
    ]
    return (*grads, None)


KERNELS: dict[str, Callable] = {
    "aten::_scaled_dot_product_fused_attention_overrideable_backward": _attention_backward,
}


def register_missing(lib: torch.library.Library, kernels: dict[str, Callable]) -> list[str]:
    """Registers each kernel as its op's Meta kernel on `lib` where the op has none;
    returns the names registered."""
    done = []
    for name, fn in kernels.items():
        if torch._C._dispatch_has_kernel_for_dispatch_key(name, "Meta"):
            continue
        lib.impl(name.split("::", 1)[1], fn, "Meta")
        done.append(name)
    return done


def install() -> list[str]:
    global _LIB
    if _LIB is not None:
        return []
    _LIB = torch.library.Library("aten", "IMPL")
    return register_missing(_LIB, KERNELS)
