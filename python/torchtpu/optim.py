"""Optimizer helpers for the tpu device.

``flatten(optimizer)`` keeps each parameter group's tpu parameters, and the optimizer
state shaped like them (AdamW's ``exp_avg`` and ``exp_avg_sq``, SGD's momentum), as
views of one flat storage per group, state key, device and dtype. A foreach op whose
in-place list tiles such a storage writes it once, so XLA runs an optimizer update
over all parameters as one kernel instead of one per parameter, and a program takes
one buffer instead of one per parameter. Values, ``state_dict()`` and checkpoints are
unchanged; only where the tensors live changes.
"""

from __future__ import annotations

from collections import Counter

import torch

__all__ = ["flatten"]


def _flat_views(ts: list[torch.Tensor]) -> list[torch.Tensor]:
    """The tensors' values as contiguous views of one new storage, in order."""
    with torch.no_grad():
        flat = torch.cat([t.detach().reshape(-1) for t in ts])
    views, at = [], 0
    for t in ts:
        views.append(flat[at : at + t.numel()].view(t.shape))
        at += t.numel()
    return views


def _groups(ts: list[torch.Tensor]) -> list[list[int]]:
    """Indices of the tpu tensors to flatten, grouped by device and dtype. Tensors that
    share a storage with another (tied weights, or already flattened) stay put."""
    users = Counter(t.untyped_storage().data_ptr() for t in ts if t.device.type == "tpu")
    groups: dict[tuple, list[int]] = {}
    for i, t in enumerate(ts):
        if t.device.type == "tpu" and t.numel() > 0 and users[t.untyped_storage().data_ptr()] == 1:
            groups.setdefault((t.device, t.dtype), []).append(i)
    return [g for g in groups.values() if len(g) > 1]


def _replacements(ts: list[torch.Tensor]) -> list[tuple[int, torch.Tensor]]:
    """(i, flat view that replaces ts[i]) for every tensor that gets flattened."""
    return [(i, v) for idx in _groups(ts) for i, v in zip(idx, _flat_views([ts[i] for i in idx]))]


def _flatten_params(optimizer: torch.optim.Optimizer) -> None:
    for group in optimizer.param_groups:
        params = group["params"]
        for i, v in _replacements(params):
            params[i].data = v


def _flatten_state(optimizer: torch.optim.Optimizer) -> None:
    for group in optimizer.param_groups:
        params = [p for p in group["params"] if p in optimizer.state]
        keys = {
            k
            for p in params
            for k, v in optimizer.state[p].items()
            if isinstance(v, torch.Tensor) and v.shape == p.shape and v.dim() > 0
        }
        for k in sorted(keys):
            owners = [p for p in params if isinstance(optimizer.state[p].get(k), torch.Tensor)]
            for i, v in _replacements([optimizer.state[p][k] for p in owners]):
                optimizer.state[owners[i]][k] = v


def flatten(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """Puts the optimizer's tpu parameters, and (now or after its first step, which
    creates it) its state shaped like them, into flat storages; returns the optimizer.

    Call it after the model is on the device and before training; a later
    ``load_state_dict`` replaces the state with tensors of its own (call ``flatten``
    again then). Parameters tied to another tensor's storage are left in place."""
    _flatten_params(optimizer)
    if optimizer.state:
        _flatten_state(optimizer)
        return optimizer

    def after_first_step(opt: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        handle.remove()
        _flatten_state(opt)

    handle = optimizer.register_step_post_hook(after_first_step)
    return optimizer
