"""Meta kernels for ATen ops we implement that some torch releases ship without one.

torch.compile traces on fake tensors, which need an op's Meta kernel. torch 2.13 has one
for the overrideable attention backward (the op our fused attention answers); torch 2.11,
the PyTorch of the GPU image, has none, so every compiled model with attention failed
there ("..._backward not implemented", seen on an H100). Each kernel here is registered
only where torch has none of its own, so a torch that has one keeps it.

Some releases ship a Meta kernel that fails: torch 2.11's `addmm.dtype` passes `beta`
twice to its decomposition, so every call raised `TypeError` on tpu (and on meta). Those
are replaced only where a probe on meta tensors shows the shipped one failing.
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


def _addmm_dtype(self, mat1, mat2, out_dtype, *, beta=1, alpha=1):
    torch._check(mat1.dim() == 2 and mat2.dim() == 2, lambda: "addmm: matrices expected")
    torch._check(
        mat1.shape[1] == mat2.shape[0],
        lambda: (
            f"addmm: mat1 and mat2 shapes cannot be multiplied "
            f"({mat1.shape[0]}x{mat1.shape[1]} and {mat2.shape[0]}x{mat2.shape[1]})"
        ),
    )
    out = (mat1.shape[0], mat2.shape[1])
    torch._check(
        torch.broadcast_shapes(self.shape, out) == out,
        lambda: f"addmm: self of shape {tuple(self.shape)} does not broadcast to {out}",
    )
    return mat1.new_empty(out, dtype=out_dtype)


def _probe_addmm_dtype():
    m = torch.empty(2, 2, dtype=torch.bfloat16, device="meta")
    torch.ops.aten.addmm.dtype(torch.empty(2, 2, device="meta"), m, m, torch.float32, beta=0.5)


KERNELS: dict[str, Callable] = {
    "aten::_scaled_dot_product_fused_attention_overrideable_backward": _attention_backward,
    "aten::addmm.dtype": _addmm_dtype,
}
# Ops whose shipped Meta kernel is replaced where its probe (a call on meta tensors) raises.
PROBES: dict[str, Callable[[], object]] = {"aten::addmm.dtype": _probe_addmm_dtype}


def _raises(probe: Callable[[], object]) -> bool:
    try:
        probe()
    except Exception:  # noqa: BLE001 - however the shipped kernel fails, it is replaced
        return True
    return False


def register_missing(
    lib: torch.library.Library,
    kernels: dict[str, Callable],
    probes: dict[str, Callable[[], object]] | None = None,
) -> list[str]:
    """Registers each kernel as its op's Meta kernel on `lib` where the op has none, or
    where the op has a probe and the probe raises with the one it has; returns the names
    registered."""
    done = []
    for name, fn in kernels.items():
        probe = (probes or {}).get(name)
        if torch._C._dispatch_has_kernel_for_dispatch_key(name, "Meta") and (
            probe is None or not _raises(probe)
        ):
            continue
        lib.impl(name.split("::", 1)[1], fn, "Meta", allow_override=True)
        done.append(name)
    return done


def install() -> list[str]:
    global _LIB
    if _LIB is not None:
        return []
    _LIB = torch.library.Library("aten", "IMPL")
    return register_missing(_LIB, KERNELS, PROBES)
