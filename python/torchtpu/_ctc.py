"""CTC loss on the device: ``_ctc_loss`` and ``_ctc_loss_backward`` as tpu kernels
made of lowered ops, so ``F.ctc_loss`` and its gradient stay on the device.

The alpha (forward) and beta (backward) recursions run over time in Python, one step
of a few ops per frame, vectorized over the batch and the extended label sequence
(blanks between labels); Fused Eager records the whole recursion as one program. The
gradient is PyTorch's own formula, ``exp(lp) - exp(log(sum alpha*beta) + nll - lp)``,
which is the gradient with respect to the logits of a ``log_softmax`` (as on CPU and
CUDA). Lengths are read on the host (they size the recursion).
"""

from __future__ import annotations

import torch

_NEG_INF = float("-inf")


def _lengths(x) -> list[int]:
    return x.tolist() if isinstance(x, torch.Tensor) else [int(v) for v in x]


def _finite_max(x: torch.Tensor, dim: int) -> torch.Tensor:
    """x's max over dim (kept), 0 where it is not finite: the shift of a safe logsumexp."""
    m = x.amax(dim, keepdim=True)
    return torch.where(torch.isfinite(m), m, torch.zeros_like(m))


def _log_plus(s: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """log(s) + m for sums s >= 0 of exp(x - m); -inf where s is 0."""
    return torch.where(s > 0, torch.log(torch.where(s > 0, s, torch.ones_like(s))) + m, _NEG_INF)


def _lse(*xs: torch.Tensor) -> torch.Tensor:
    """logsumexp of same-shaped tensors that may all be -inf (then -inf)."""
    x = torch.stack(xs)
    m = _finite_max(x, 0)
    return _log_plus(torch.exp(x - m).sum(0, keepdim=True), m)[0]


def _shift(x: torch.Tensor, k: int) -> torch.Tensor:
    """x[..., s - k] along the last dim, -inf where s < k."""
    k = min(k, x.shape[-1])  # a one-blank sequence (every target empty) has nothing to shift
    pad = torch.full((*x.shape[:-1], k), _NEG_INF, dtype=x.dtype, device=x.device)
    return torch.cat([pad, x[..., : x.shape[-1] - k]], -1)


def _unshift(x: torch.Tensor, k: int) -> torch.Tensor:
    """x[..., s + k] along the last dim, -inf past the end."""
    k = min(k, x.shape[-1])
    pad = torch.full((*x.shape[:-1], k), _NEG_INF, dtype=x.dtype, device=x.device)
    return torch.cat([x[..., k:], pad], -1)


class _Problem:
    """The extended labels and masks shared by the forward and backward."""

    def __init__(self, log_probs, targets, input_lengths, target_lengths, blank):
        self.T, self.N, self.C = log_probs.shape
        dev = log_probs.device
        self.il, self.tl = _lengths(input_lengths), _lengths(target_lengths)
        s_max = max(self.tl, default=0)
        self.L = 2 * s_max + 1
        if targets.dim() == 1:  # concatenated targets
            offsets = [sum(self.tl[:n]) for n in range(self.N)]
            idx = [[min(o + j, max(targets.numel() - 1, 0)) for j in range(s_max)] for o in offsets]
            padded = targets[torch.tensor(idx, dtype=torch.long, device=dev)] if s_max else None
        else:
            padded = targets[:, :s_max]
        ext = torch.full((self.N, self.L), blank, dtype=torch.long, device=dev)
        if s_max:
            ext[:, 1::2] = padded.long()
        self.ext = ext
        skip = torch.zeros(self.N, self.L, dtype=torch.bool, device=dev)
        skip[:, 2:] = (ext[:, 2:] != blank) & (ext[:, 2:] != ext[:, :-2])
        self.skip = skip
        s = torch.arange(self.L, device=dev)
        self.s = s
        tl = torch.tensor(self.tl, device=dev)
        self.valid = s[None, :] < (2 * tl + 1)[:, None]  # [N, L]
        # The two positions a path may end at: the last label and the blank after it.
        end = (2 * tl)[:, None]
        self.last = (s[None, :] == end) | ((s[None, :] == end - 1) & (tl[:, None] > 0))
        self.neg = torch.full((self.N, self.L), _NEG_INF, dtype=log_probs.dtype, device=dev)
        self.il_t = torch.tensor(self.il, device=dev)
        self.tl_t = tl
        # lp at the extended labels: [T, N, L]
        self.lp = log_probs.gather(2, ext.unsqueeze(0).expand(self.T, self.N, self.L))


def _ctc_forward(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    p = _Problem(log_probs, targets, input_lengths, target_lengths, blank)
    neg, s = p.neg, p.s
    first = (s[None, :] == 0) | ((s[None, :] == 1) & (p.tl_t[:, None] > 0))
    alpha = torch.where(first & (p.il_t[:, None] > 0), p.lp[0], neg)
    alphas = [alpha]
    for t in range(1, p.T):
        step = _lse(alpha, _shift(alpha, 1), torch.where(p.skip, _shift(alpha, 2), neg))
        new = torch.where(p.valid, step + p.lp[t], neg)
        alpha = torch.where((t < p.il_t)[:, None], new, neg)
        alphas.append(alpha)
    log_alpha = torch.stack(alphas, 1)  # [N, T, L]
    last = (p.il_t - 1).clamp(min=0)
    at_end = log_alpha[torch.arange(p.N, device=log_probs.device), last]  # [N, L]
    ends = torch.where(p.last, at_end, neg)
    nll = -_lse(*ends.unbind(1)) if p.L > 1 else -ends[:, 0]
    if zero_infinity:
        nll = torch.where(torch.isinf(nll), torch.zeros_like(nll), nll)
    return nll, log_alpha


def _ctc_backward(
    grad,
    log_probs,
    targets,
    input_lengths,
    target_lengths,
    nll,
    log_alpha,
    blank,
    zero_infinity=False,
):
    p = _Problem(log_probs, targets, input_lengths, target_lengths, blank)
    dev, dt, neg = log_probs.device, log_probs.dtype, p.neg
    # skip into s + 2 from s: the label at s + 2 differs from the one at s
    skip_up = _unshift(p.skip.to(dt), 2) > 0
    betas = [neg] * p.T
    beta = neg
    for t in range(p.T - 1, -1, -1):
        init = torch.where(p.last, p.lp[t], neg)
        step = _lse(beta, _unshift(beta, 1), torch.where(skip_up, _unshift(beta, 2), neg))
        rec = torch.where(p.valid, step + p.lp[t], neg)
        is_last = (t == p.il_t - 1)[:, None]
        before = (t < p.il_t - 1)[:, None]
        beta = torch.where(is_last, init, torch.where(before, rec, neg))
        betas[t] = beta
    log_beta = torch.stack(betas, 0)  # [T, N, L]
    lcab = log_alpha.transpose(0, 1) + log_beta  # [T, N, L]
    m = _finite_max(lcab, 2)
    onehot = torch.nn.functional.one_hot(p.ext, p.C).to(dt)  # [N, L, C]
    log_sum = _log_plus(torch.einsum("tnl,nlc->tnc", torch.exp(lcab - m), onehot), m)
    res = torch.exp(log_probs) - torch.exp(log_sum + nll[None, :, None] - log_probs)
    t_ok = torch.arange(p.T, device=dev)[:, None] < p.il_t[None, :]  # [T, N]
    if zero_infinity:
        t_ok = t_ok & ~torch.isinf(nll)[None, :]
    res = torch.where(t_ok[:, :, None], res, torch.zeros_like(res))
    return res * grad[None, :, None]


_LIB: torch.library.Library | None = None


def install() -> None:
    global _LIB
    if _LIB is not None:
        return
    _LIB = torch.library.Library("aten", "IMPL")
    for name in ("_ctc_loss", "_ctc_loss.Tensor"):
        _LIB.impl(name, _ctc_forward, "PrivateUse1")
    for name in ("_ctc_loss_backward", "_ctc_loss_backward.Tensor"):
        _LIB.impl(name, _ctc_backward, "PrivateUse1")
