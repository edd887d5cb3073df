"""Layouts and masks of bounded dynamism (see ``_bucket``).

A *layout* describes a tensor's dims in terms of symbols: each dim is a tuple of factors
in row-major order, an ``int`` (unpadded) or a ``sympy.Symbol`` (padded), so a view that
merges ``[2, s0]`` into ``[2*s0]`` keeps where the valid elements are. ``Ctx`` holds one
call's real and bucket sizes and the masks built from them.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import sympy
import torch
from torch.fx import Node

aten = torch.ops.aten

Dim = tuple  # of int | sympy.Symbol
Layout = tuple  # of Dim


class Unsupported(Exception):
    """The graph cannot run padded; the message names the op and why."""


# --------------------------------------------------------------------------- layouts


def _expr(v: Any) -> sympy.Expr:
    if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return v.node.expr
    return sympy.sympify(v)


def _subs(e: sympy.Expr, values: dict) -> int:
    return int(e.xreplace({s: sympy.Integer(v) for s, v in values.items()}))


def _is_sym(f: Any) -> bool:
    return isinstance(f, sympy.Symbol)


def _norm_dim(dim: Sequence) -> Dim:
    """Merges adjacent int factors and drops 1s; an unpadded dim becomes one int."""
    out: list = []
    for f in dim:
        if _is_sym(f):
            out.append(f)
        elif f != 1:
            if out and not _is_sym(out[-1]):
                out[-1] *= int(f)
            else:
                out.append(int(f))
    return tuple(out) if out else (1,)


def _dim_size(dim: Dim) -> sympy.Expr:
    return sympy.Mul(*[sympy.Integer(f) if not _is_sym(f) else f for f in dim])


def _dim_padded(dim: Dim) -> bool:
    return any(_is_sym(f) for f in dim)


def _padded(layout: Any) -> bool:
    return isinstance(layout, tuple) and any(
        isinstance(d, tuple) and _dim_padded(d) for d in layout
    )


def _exact_dim(size: Any, syms: set) -> Dim:
    e = _expr(size)
    if e.is_Integer:
        return (int(e),)
    if _is_sym(e) and e in syms:
        return (e,)
    raise Unsupported(f"size {e} is not a plain symbol")


def _monomial(q: sympy.Expr) -> bool:
    den = sympy.fraction(q)[1]
    return den == 1 and (not q.is_Number or (q.is_Integer and q > 0))


def _reshape(layout: Layout, sizes: Sequence) -> Layout:
    """Layout after a row-major reshape: groups of consecutive factors become dims;
    an unpadded factor may be split, a padded one may not."""
    atoms = [f for d in layout for f in d if f != 1]
    dims = []
    for size in sizes:
        rem = _expr(size)
        dim: list = []
        while rem != 1:
            if not atoms:
                raise Unsupported("reshape does not match the padded layout")
            f = atoms[0]
            q = rem / f
            if _monomial(q):
                dim.append(f)
                atoms.pop(0)
                rem = q
            elif not _is_sym(f) and rem.is_Integer and f % int(rem) == 0:
                dim.append(int(rem))
                atoms[0] = f // int(rem)
                rem = sympy.Integer(1)
            else:
                raise Unsupported("reshape splits a padded dim")
        dims.append(_norm_dim(dim))
    if atoms:
        raise Unsupported("reshape does not match the padded layout")
    return tuple(dims)


# --------------------------------------------------------------------------- runtime


class Ctx:
    """Per-call values: real size ``n`` and bucket ``B`` of every symbol, and masks built
    from them (cached for the call)."""

    def __init__(self, ns: dict, bs: dict, device: torch.device) -> None:
        self.ns, self.bs, self.device = ns, bs, device
        self._base: dict = {}
        self._masks: dict = {}

    def _sym_mask(self, s: sympy.Symbol) -> torch.Tensor:
        m = self._base.get(s)
        if m is None:
            # n is a Python number: a runtime scalar of the program, which stays keyed by B.
            m = torch.arange(self.bs[s], device=self.device) < self.ns[s]
            self._base[s] = m
        return m

    def _dim_mask(self, dim: Dim) -> torch.Tensor:
        if len(dim) == 1:
            return self._sym_mask(dim[0])
        sizes = [self.bs[f] if _is_sym(f) else f for f in dim]
        m = None
        for i, f in enumerate(dim):
            if _is_sym(f):
                shape = [1] * len(dim)
                shape[i] = sizes[i]
                part = self._sym_mask(f).view(shape)
                m = part if m is None else m & part
        return m.expand(sizes).reshape(-1)

    def mask(self, layout: Layout) -> torch.Tensor:
        """Bool tensor, broadcastable to the layout's shape: True at valid elements."""
        m = self._masks.get(layout)
        if m is None:
            rank = len(layout)
            for d, dim in enumerate(layout):
                if _dim_padded(dim):
                    shape = [1] * rank
                    shape[d] = -1
                    part = self._dim_mask(dim).view(shape)
                    m = part if m is None else m & part
            self._masks[layout] = m
        return m

    def fill(self, x: Any, layout: Any, value: Any) -> Any:
        if not _padded(layout) or not isinstance(x, torch.Tensor):
            return x
        return torch.where(self.mask(layout), x, value)

    def value(self, e: sympy.Expr) -> Any:
        """A size expression used as a value, at the real sizes."""
        return _number(e, _key(self.ns))

    def real(self, dims: Sequence[Dim]) -> int:
        """Number of valid elements in the given dims."""
        total = 1
        for dim in dims:
            for f in dim:
                total *= self.ns[f] if _is_sym(f) else f
        return total


def _key(values: dict) -> tuple:
    return tuple(sorted(values.items(), key=lambda kv: str(kv[0])))


@functools.lru_cache(maxsize=4096)
def _number(e: sympy.Expr, ns: tuple) -> Any:
    v = e.xreplace({s: sympy.Integer(n) for s, n in ns})
    if v is sympy.true or v is sympy.false:
        return bool(v)
    return int(v) if v.is_Integer else float(v)


def _neutral(kind: str, dtype: torch.dtype) -> Any:
    if kind == "zero":
        return False if dtype == torch.bool else 0
    if kind == "one":
        return True if dtype == torch.bool else 1
    low = kind == "low"  # identity of max: -inf
    if dtype == torch.bool:
        return not low
    if dtype.is_floating_point or dtype.is_complex:
        return -math.inf if low else math.inf
    info = torch.iinfo(dtype)
    return info.min if low else info.max


def _val(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, Node) else node
