"""The planner of bounded dynamism (see ``_bucket``): the layout of every value of an
ATen graph, and the ops rewritten to mask padded positions first."""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.fx import Graph, Node

from ._bucket_layout import (
    Ctx,
    Layout,
    Unsupported,
    _dim_padded,
    _dim_size,
    _exact_dim,
    _expr,
    _neutral,
    _norm_dim,
    _padded,
    _reshape,
    _val,
    aten,
)

# --------------------------------------------------------------------------- planning


def _bind(op: torch._ops.OpOverload, node: Node) -> dict:
    """Schema argument name -> (position, value); position is an index into node.args
    or the kwarg name."""
    out = {}
    for i, a in enumerate(op._schema.arguments):
        if i < len(node.args) and not a.kwarg_only:
            out[a.name] = (i, node.args[i])
        elif a.name in node.kwargs:
            out[a.name] = (a.name, node.kwargs[a.name])
        else:
            out[a.name] = (a.name, a.default_value if a.has_default_value() else None)
    return out


def _with_values(inner: Callable | None, op: Callable, values: list) -> Callable:
    """``inner`` (a rewritten op taking the context) or ``op``, with the size arguments
    that are values replaced by their real values."""

    def call(ctx: Ctx, *args: Any, **kwargs: Any) -> Any:
        args = list(args)
        for pos, e in values:
            if isinstance(pos, int):
                args[pos] = ctx.value(e)
            else:
                kwargs[pos] = ctx.value(e)
        return inner(ctx, *args, **kwargs) if inner is not None else op(*args, **kwargs)

    call.__name__ = f"real_sizes_{getattr(op, '__name__', 'op').replace('.', '_')}"
    return call


def _masking_call(op: Callable, slots: list) -> Callable:
    """``op`` with some tensor arguments masked first: slots are (position, layout,
    neutral value)."""

    def call(ctx: Ctx, *args: Any, **kwargs: Any) -> Any:
        args = list(args)
        for pos, layout, value in slots:
            if isinstance(pos, int):
                args[pos] = ctx.fill(args[pos], layout, value)
            else:
                kwargs[pos] = ctx.fill(kwargs[pos], layout, value)
        return op(*args, **kwargs)

    call.__name__ = f"masked_{getattr(op, '__name__', 'op').replace('.', '_')}"
    return call


_VIEWS_SAME = {
    "alias",
    "detach",
    "clone",
    "_to_copy",
    "lift_fresh_copy",
    "contiguous",
    "_conj",
    "resolve_conj",
    "resolve_neg",
}
_SYM_OPS = {
    "sym_size",
    "sym_numel",
    "sym_stride",
    "sym_storage_offset",
    "_assert_scalar",
    "sym_constrain_range",
    "sym_constrain_range_for_size",
    "_assert_async",
}
_SIZE_OPS = {
    "view",
    "_unsafe_view",
    "reshape",
    "expand",
    "slice",
    "full",
    "zeros",
    "ones",
    "empty",
    "empty_strided",
    "new_zeros",
    "new_ones",
    "new_full",
    "new_empty",
}
_CREATE = {"full", "zeros", "ones", "empty", "empty_strided", "scalar_tensor"}
_CREATE_NEW = {"new_zeros", "new_ones", "new_full", "new_empty"}
_CREATE_LIKE = {"zeros_like", "ones_like", "full_like", "empty_like"}
_REDUCE_NEUTRAL = {
    "sum": "zero",
    "nansum": "zero",
    "amax": "low",
    "amin": "high",
    "prod": "one",
    "any": "zero",
    "all": "one",
    "logsumexp": "low",
    "max": "low",
    "min": "high",
    "argmax": "low",
    "argmin": "high",
}
_SCAN_NEUTRAL = {"cumsum": "zero", "cumprod": "one", "logcumsumexp": "low"}
_SOFTMAX = {"_softmax", "_log_softmax", "_safe_softmax"}

# Op name (overload packet) -> the Planner method that lays out its output when a
# padded value reaches it; filled by @bucket_rule.
_RULES: dict[str, Callable] = {}


def bucket_rule(*names: str) -> Callable:
    """Registers the decorated Planner method as the rule of ops ``names``."""

    def register(method: Callable) -> Callable:
        for name in names:
            if name in _RULES:
                raise ValueError(f"two bucket rules for {name}")
            _RULES[name] = method
        return method

    return register


def _generic(name: str, op: Any) -> str | None:
    """The generic category that lays out op (overload packet ``name``) at padded sizes
    when it has no rule of its own, or None."""
    if torch.Tag.pointwise in op.tags:  # before reductions: max.other is pointwise
        return "pointwise"
    if name in _VIEWS_SAME:
        return "same"
    if name in _CREATE or name in _CREATE_NEW:
        return "create"
    if name in _CREATE_LIKE:
        return "like"
    if name in _REDUCE_NEUTRAL:
        return "reduce"
    if name in _SCAN_NEUTRAL:
        return "scan"
    if name in _SOFTMAX:
        return "softmax"
    return None


def _random(op: Any) -> bool:
    return torch.Tag.nondeterministic_seeded in op.tags


def _plannable(op: Any) -> bool:
    """Whether the planner lays out op's output when a padded value reaches it (the
    checks ``Planner._plan`` and ``Planner._rule`` make, in their order)."""
    name = op.overloadpacket.__name__
    if name in _SYM_OPS:
        return True
    return not _random(op) and (name in _RULES or _generic(name, op) is not None)


def ops_without_bucket_rule(names: Iterable[str]) -> list[str]:
    """Of the ATen ops ``names`` ("add.Tensor", "gelu"), sorted, those no padded value
    may reach: the planner raises ``Unsupported`` and the graph runs unbucketed. Names
    PyTorch does not define are left out."""
    out = []
    for n in names:
        base, _, overload = n.partition(".")
        packet = getattr(torch.ops.aten, base, None)
        op = getattr(packet, overload or "default", None) if packet is not None else None
        if op is not None and not _plannable(op):
            out.append(n)
    return sorted(out)


class Planner:
    """Computes the layout of every value of one graph and the ops to replace."""

    def __init__(self, graph: Graph, syms: set, given: dict) -> None:
        self.syms = syms
        self.layouts: dict[Node, Any] = {}
        self.actions: dict[Node, Callable] = {}
        for node in graph.nodes:
            if node.op == "placeholder":
                self.layouts[node] = given.get(node.name)
            elif node.op == "call_function":
                try:
                    self.layouts[node] = self._plan(node)
                except Unsupported as e:
                    raise Unsupported(f"{_name(node)}: {e}") from None
                self._check(node)
            elif node.op == "get_attr":
                self.layouts[node] = None

    # Full layout of a tensor argument (unpadded dims from its sizes).
    def L(self, node: Any) -> Layout:
        layout = self.layouts.get(node) if isinstance(node, Node) else None
        if isinstance(layout, tuple) and (not layout or isinstance(layout[0], tuple)):
            return layout
        val = _val(node)
        return tuple(_exact_dim(s, self.syms) for s in val.shape)

    def _store(self, layout: Any) -> Any:
        if isinstance(layout, list):
            return [self._store(x) for x in layout]
        if layout is None:
            return None
        layout = tuple(_norm_dim(d) for d in layout)
        return layout if _padded(layout) else None

    def _check(self, node: Node) -> None:
        """Safety net: the layout must multiply out to the value's symbolic sizes."""
        val, layout = _val(node), self.layouts.get(node)
        vals = val if isinstance(val, (list, tuple)) else [val]
        lays = layout if isinstance(layout, list) else [layout]
        for v, lay in zip(vals, lays):
            if not isinstance(v, torch.Tensor):
                continue
            if lay is None:
                if any(not _expr(s).is_Integer for s in v.shape):
                    raise Unsupported(f"{_name(node)}: no layout for sizes {list(v.shape)}")
                continue
            if len(lay) != v.dim() or any(_dim_size(d) != _expr(s) for d, s in zip(lay, v.shape)):
                raise Unsupported(f"{_name(node)}: layout {lay} does not match {list(v.shape)}")

    def _plan(self, node: Node) -> Any:
        target = node.target
        if target is operator.getitem:
            parent, idx = node.args
            lay = self.layouts.get(parent)
            return lay[idx] if isinstance(lay, list) else None
        if not isinstance(target, torch._ops.OpOverload):
            # SymInt arithmetic runs with bucket sizes; anything else must not see padding.
            outs = [v for v in pytree.tree_leaves(_val(node)) if isinstance(v, torch.Tensor)]
            if any(_padded(self.layouts.get(a)) for a in node.all_input_nodes) or any(
                not _expr(s).is_Integer for v in outs for s in v.shape
            ):
                raise Unsupported("no bucketing rule for this call")
            return None
        op = target
        name = op.overloadpacket.__name__
        if name in _SYM_OPS:
            return None
        b = _bind(op, node)
        tensors = [
            v for _, v in b.values() if isinstance(v, Node) and isinstance(_val(v), torch.Tensor)
        ] + [
            x
            for _, v in b.values()
            if isinstance(v, (list, tuple))
            for x in v
            if isinstance(x, Node) and isinstance(_val(x), torch.Tensor)
        ]
        padded_in = any(_padded(self.layouts.get(t)) for t in tensors)
        out = _val(node)
        outs = out if isinstance(out, (list, tuple)) else [out]
        sym_out = any(
            isinstance(v, torch.Tensor) and any(not _expr(s).is_Integer for s in v.shape)
            for v in outs
        )
        values = self._value_uses(op, b)
        layout = None
        if padded_in or sym_out:
            if _random(op):
                raise Unsupported("random values at the bucket size would differ from eager")
            try:
                layout = self._rule(node, op, name, b, tensors)
            except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
                raise Unsupported(f"cannot plan it ({type(e).__name__}: {e})") from None
        if values:
            self.actions[node] = _with_values(self.actions.get(node), op, values)
        return layout

    def _rule(self, node: Node, op: Any, name: str, b: dict, tensors: list) -> Any:
        out = _val(node)
        rule = _RULES.get(name)
        if rule is not None:
            return rule(self, node, op, b)
        kind = _generic(name, op)
        if kind == "pointwise":
            return self._pointwise(node, tensors)
        if kind == "same":
            return self._same(node, op, b)
        if kind == "create":
            return self._store(tuple(_exact_dim(s, self.syms) for s in out.shape))
        if kind == "like":
            return self.layouts.get(b["self"][1])
        if kind == "reduce":
            return self._reduce(node, op, b, _REDUCE_NEUTRAL[name])
        if kind == "scan":
            return self._scan(node, op, b, _SCAN_NEUTRAL[name])
        if kind == "softmax":
            return self._softmax(node, op, b)
        raise Unsupported("no bucketing rule for this op on padded dims")

    def _value_uses(self, op: Any, b: dict) -> list:
        """Sizes used as values (``x.sum(1) / x.shape[1]``, a mean's backward) must be
        the real sizes, not the buckets: (position, expression) of each such argument.
        Sizes that size things (view, creation, slice bounds checked by their rules)
        keep the bucket value."""
        name = op.overloadpacket.__name__
        out = []
        for a in op._schema.arguments:
            pos, v = b[a.name]
            # SymInt prints as int in schema types.
            if name in _SIZE_OPS and "int" in str(a.type) or (name == "arange" and a.name == "end"):
                continue
            for x in v if isinstance(v, (list, tuple)) else [v]:
                x = _val(x)
                if not isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
                    continue
                if not (_expr(x).free_symbols & self.syms):
                    continue
                if x is not _val(v):
                    raise Unsupported(f"uses the size {_expr(x)} inside a list")
                out.append((pos, _expr(x)))
        return out

    # ---- shape-only ops

    def _same(self, node, op, b):
        return self.layouts.get(b["self"][1])

    @bucket_rule("view", "_unsafe_view", "reshape")
    def _view(self, node, op, b):
        return self._store(_reshape(self.L(b["self"][1]), _val(node).shape))

    @bucket_rule("permute")
    def _permute(self, node, op, b):
        lay = self.L(b["self"][1])
        return self._store(tuple(lay[d % len(lay)] for d in b["dims"][1]))

    @bucket_rule("transpose")
    def _transpose(self, node, op, b):
        lay = list(self.L(b["self"][1]))
        d0, d1 = b["dim0"][1] % len(lay), b["dim1"][1] % len(lay)
        lay[d0], lay[d1] = lay[d1], lay[d0]
        return self._store(tuple(lay))

    @bucket_rule("t")
    def _t(self, node, op, b):
        return self._store(tuple(reversed(self.L(b["self"][1]))))

    @bucket_rule("unsqueeze")
    def _unsqueeze(self, node, op, b):
        lay = list(self.L(b["self"][1]))
        lay.insert(b["dim"][1] % (len(lay) + 1), (1,))
        return self._store(tuple(lay))

    @bucket_rule("squeeze")
    def _squeeze(self, node, op, b):
        x = b["self"][1]
        lay = self.L(x)
        if "dim" in b and b["dim"][1] is not None:
            dims = b["dim"][1]
            dims = {d % max(len(lay), 1) for d in (dims if isinstance(dims, list) else [dims])}
        else:
            dims = set(range(len(lay)))
        return self._store(tuple(d for i, d in enumerate(lay) if not (i in dims and d == (1,))))

    @bucket_rule("expand")
    def _expand(self, node, op, b):
        lay = self.L(b["self"][1])
        sizes = _val(node).shape
        lead = len(sizes) - len(lay)
        dims = [_exact_dim(s, self.syms) for s in sizes[:lead]]
        for d, s in zip(lay, sizes[lead:]):
            dims.append(_exact_dim(s, self.syms) if d == (1,) else d)
        return self._store(tuple(dims))

    @bucket_rule("slice")
    def _slice(self, node, op, b):
        lay = list(self.L(b["self"][1]))
        d = b["dim"][1] % len(lay)
        size = _val(node).shape[d]
        if _dim_padded(lay[d]):
            if (
                b["step"][1] != 1
                or _val(b["start"][1]) not in (0, None)
                or _expr(size) != _dim_size(lay[d])
            ):
                raise Unsupported("slices a padded dim")
        else:
            lay[d] = _exact_dim(size, self.syms)
        return self._store(tuple(lay))

    @bucket_rule("select")
    def _select(self, node, op, b):
        lay = list(self.L(b["self"][1]))
        d = b["dim"][1] % len(lay)
        if _dim_padded(lay[d]):
            raise Unsupported("selects from a padded dim")
        del lay[d]
        return self._store(tuple(lay))

    def _split_dim(self, node, op, b, drop: bool = False):
        lay = self.L(b["self"][1])
        d = b["dim"][1] % len(lay)
        if _dim_padded(lay[d]):
            raise Unsupported("splits a padded dim")
        outs = []
        for v in _val(node):
            parts = list(lay)
            if drop:
                del parts[d]
            else:
                parts[d] = _exact_dim(v.shape[d], self.syms)
            outs.append(self._store(tuple(parts)))
        return outs

    @bucket_rule("split", "split_with_sizes", "chunk")
    def _split(self, node, op, b):
        return self._split_dim(node, op, b)

    @bucket_rule("unbind")
    def _unbind(self, node, op, b):
        return self._split_dim(node, op, b, drop=True)

    @bucket_rule("cat")
    def _cat(self, node, op, b):
        tensors = [
            t for t in b["tensors"][1] if _val(t).numel() != 0 or _padded(self.layouts.get(t))
        ]
        out = _val(node)
        d = b["dim"][1] % out.dim()
        lays = [self.L(t) for t in tensors]
        if any(_dim_padded(lay[d]) for lay in lays):
            raise Unsupported("concatenates along a padded dim")
        ref = [x for i, x in enumerate(lays[0]) if i != d]
        if any([x for i, x in enumerate(lay) if i != d] != ref for lay in lays):
            raise Unsupported("concatenates tensors with different padding")
        lay = list(lays[0])
        lay[d] = _exact_dim(out.shape[d], self.syms)
        return self._store(tuple(lay))

    def _pointwise(self, node, tensors):
        out = _val(node)
        rank = out.dim()
        dims = []
        for j in range(rank):
            found = set()
            for t in tensors:
                lay = self.L(t)
                k = j - (rank - len(lay))
                if k >= 0 and lay[k] != (1,):
                    found.add(_norm_dim(lay[k]))
            padded = {d for d in found if _dim_padded(d)}
            if len(padded) > 1 or (padded and len(found) > 1):
                raise Unsupported("combines values with different padding")
            dims.append(next(iter(found)) if found else (1,))
        return self._store(tuple(dims))

    @bucket_rule("tril", "triu")
    def _positional(self, node, op, b):
        lay = self.L(b["self"][1])
        if any(len(d) != 1 for d in lay[-2:]):
            raise Unsupported("triangular mask over a merged padded dim")
        return self._store(lay)

    @bucket_rule("arange")
    def _arange(self, node, op, b):
        start = b["start"][1] if "start" in b else 0
        step = b["step"][1] if "step" in b else 1
        if _val(start) != 0 or _val(step) != 1:
            raise Unsupported("arange with a start or step over a padded size")
        return self._store(tuple(_exact_dim(s, self.syms) for s in _val(node).shape))

    @bucket_rule("embedding")
    def _embedding(self, node, op, b):
        if _padded(self.layouts.get(b["weight"][1])):
            raise Unsupported("padded embedding table")
        idx = self.L(b["indices"][1])
        return self._store(idx + (_exact_dim(_val(node).shape[-1], self.syms),))

    @bucket_rule("index_select")
    def _index_select(self, node, op, b):
        lay = list(self.L(b["self"][1]))
        d = b["dim"][1] % len(lay)
        if _dim_padded(lay[d]):
            raise Unsupported("index_select along a padded dim")
        lay[d] = self.L(b["index"][1])[0] if _val(b["index"][1]).dim() else (1,)
        return self._store(tuple(lay))

    @bucket_rule("flip")
    def _flip(self, node, op, b):
        lay = self.L(b["self"][1])
        if any(_dim_padded(lay[d % len(lay)]) for d in b["dims"][1]):
            raise Unsupported("flips a padded dim")
        return self._store(lay)

    @bucket_rule("gather")
    def _gather(self, node, op, b):
        # Index values are positions < n, the same in the padded layout when the dim is
        # one factor; garbage index entries only fill garbage positions.
        lay = self.L(b["self"][1])
        d = b["dim"][1] % max(len(lay), 1)
        if lay and len(lay[d]) != 1:
            raise Unsupported("gathers along a merged padded dim")
        idx = self.L(b["index"][1])
        if any(_dim_padded(x) and x != y for i, (x, y) in enumerate(zip(idx, lay)) if i != d):
            raise Unsupported("index with different padding")
        return self._store(idx)

    @bucket_rule("scatter", "scatter_add")
    def _scatter(self, node, op, b):
        # Only an unpadded index and source: a garbage index could write into valid
        # positions.
        lay = self.L(b["self"][1])
        d = b["dim"][1] % max(len(lay), 1)
        srcs = [b["index"][1]] + ([b["src"][1]] if "src" in b else [])
        if any(_padded(self.layouts.get(t)) for t in srcs) or (lay and len(lay[d]) != 1):
            raise Unsupported("scatter with a padded index or source")
        return self._store(lay)

    # ---- ops that mix values along a dim

    def _dims(self, b: dict, rank: int, key: str = "dim") -> list[int]:
        dims = b[key][1] if key in b else None
        if dims is None or dims == []:
            return list(range(rank))
        dims = dims if isinstance(dims, (list, tuple)) else [dims]
        return sorted({d % max(rank, 1) for d in dims})

    def _reduced(self, lay: Layout, dims: list[int], keepdim: bool) -> Layout:
        return tuple(
            (1,) if i in dims else d for i, d in enumerate(lay) if keepdim or i not in dims
        )

    def _reduce(self, node, op, b, kind):
        x = b["self"][1]
        lay = self.L(x)
        name = op.overloadpacket.__name__
        dims = self._dims(b, len(lay))
        keepdim = bool(b["keepdim"][1]) if "keepdim" in b else False
        mixes = any(_dim_padded(lay[d]) for d in dims)
        indexed = name in ("argmax", "argmin") or isinstance(_val(node), (list, tuple))
        if (
            indexed
            and mixes
            and (b.get("dim", (0, None))[1] is None or any(len(lay[d]) != 1 for d in dims))
        ):
            raise Unsupported("index of an element in a merged padded dim")
        if mixes:
            self.actions[node] = _masking_call(
                op, [(b["self"][0], lay, _neutral(kind, _val(x).dtype))]
            )
        out = self._reduced(lay, dims, keepdim)
        if isinstance(_val(node), (list, tuple)):
            return [self._store(out)] * len(_val(node))
        return self._store(out)

    @bucket_rule("mean")
    def _mean(self, node, op, b):
        x = b["self"][1]
        lay = self.L(x)
        dims = self._dims(b, len(lay))
        keepdim = bool(b["keepdim"][1]) if "keepdim" in b else False
        if any(_dim_padded(lay[d]) for d in dims):
            dtype = b["dtype"][1] if "dtype" in b else None
            red = [lay[d] for d in dims]

            def mean(ctx: Ctx, *args: Any, **kwargs: Any) -> torch.Tensor:
                v = ctx.fill(args[0], lay, 0)
                s = torch.sum(v, dims, keepdim=keepdim, dtype=dtype)
                # A Scalar argument: a runtime input, the program stays keyed by B.
                return aten.div.Scalar(s, ctx.real(red))

            self.actions[node] = mean
        return self._store(self._reduced(lay, dims, keepdim))

    @bucket_rule("var", "std", "var_mean", "std_mean")
    def _var_std(self, node, op, b):
        name = op.overloadpacket.__name__
        std, with_mean = name.startswith("std"), name.endswith("_mean")
        x = b["self"][1]
        lay = self.L(x)
        dims = self._dims(b, len(lay))
        keepdim = bool(b["keepdim"][1]) if "keepdim" in b else False
        out = self._store(self._reduced(lay, dims, keepdim))
        if any(_dim_padded(lay[d]) for d in dims):
            if "correction" in b:
                corr = b["correction"][1]
                corr = 1 if corr is None else corr
            else:
                corr = 1 if b["unbiased"][1] in (None, True) else 0
            red = [lay[d] for d in dims]

            def var(ctx: Ctx, *args: Any, **kwargs: Any) -> Any:
                count = ctx.real(red)
                v = ctx.fill(args[0], lay, 0)
                mean = aten.div.Scalar(torch.sum(v, dims, keepdim=True), count)
                dev = ctx.fill(args[0] - mean, lay, 0)
                r = aten.div.Scalar(
                    torch.sum(dev * dev, dims, keepdim=keepdim), max(count - corr, 0)
                )
                r = r.sqrt() if std else r
                if not with_mean:
                    return r
                return r, mean if keepdim else mean.squeeze(dims)

            self.actions[node] = var
        return [out, out] if with_mean else out

    @bucket_rule("linalg_vector_norm")
    def _linalg_vector_norm(self, node, op, b):
        order = b["ord"][1]
        if order is not None and not (order > 0):
            raise Unsupported(f"norm of order {order}")
        return self._reduce(node, op, b, "zero")

    def _mask_along_dim(self, node, op, b, key, fills):
        """Ops that mix values along b["dim"] of b[key]: when that dim is padded, each
        (argument, fill) pair is masked with its fill first. The output keeps key's layout."""
        lay = self.L(b[key][1])
        if _dim_padded(lay[b["dim"][1] % len(lay)]):
            self.actions[node] = _masking_call(
                op, [(b[k][0], self.L(b[k][1]), fill) for k, fill in fills]
            )
        return self._store(lay)

    def _scan(self, node, op, b, kind):
        return self._mask_along_dim(
            node, op, b, "self", [("self", _neutral(kind, _val(b["self"][1]).dtype))]
        )

    def _softmax(self, node, op, b):
        return self._mask_along_dim(node, op, b, "self", [("self", -math.inf)])

    @bucket_rule("_softmax_backward_data")
    def _softmax_backward_data(self, node, op, b):
        fills = [("grad_output", 0), ("output", 0)]
        return self._mask_along_dim(node, op, b, "grad_output", fills)

    @bucket_rule("_log_softmax_backward_data")
    def _log_softmax_backward_data(self, node, op, b):
        return self._mask_along_dim(node, op, b, "grad_output", [("grad_output", 0)])

    def _contract(self, node, op, b, a_key, b_key, ka, kb, out_dims, bias_key=None):
        A, B = b[a_key][1], b[b_key][1]
        la, lb = self.L(A), self.L(B)
        if _norm_dim(la[ka]) != _norm_dim(lb[kb]):
            raise Unsupported("contracts dims with different padding")
        slots = []
        if _dim_padded(la[ka]):
            slots = [(b[a_key][0], la, 0), (b[b_key][0], lb, 0)]
        out = tuple(out_dims(la, lb))
        if bias_key is not None and _padded(self.layouts.get(b[bias_key][1])):
            lbias = self.L(b[bias_key][1])
            for j in range(1, len(lbias) + 1):
                if lbias[-j] != (1,) and _norm_dim(lbias[-j]) != _norm_dim(out[-j]):
                    raise Unsupported("bias with different padding")
        if slots:
            self.actions[node] = _masking_call(op, slots)
        return self._store(out)

    @bucket_rule("mm")
    def _mm(self, node, op, b):
        return self._contract(node, op, b, "self", "mat2", 1, 0, lambda a, c: (a[0], c[1]))

    @bucket_rule("addmm")
    def _addmm(self, node, op, b):
        return self._contract(
            node, op, b, "mat1", "mat2", 1, 0, lambda a, c: (a[0], c[1]), bias_key="self"
        )

    def _batched(self, a, c):
        if _norm_dim(a[0]) != _norm_dim(c[0]):
            raise Unsupported("batch dims with different padding")
        return (a[0], a[1], c[2])

    @bucket_rule("bmm")
    def _bmm(self, node, op, b):
        return self._contract(node, op, b, "self", "mat2", 2, 1, self._batched)

    @bucket_rule("baddbmm")
    def _baddbmm(self, node, op, b):
        return self._contract(node, op, b, "batch1", "batch2", 2, 1, self._batched, bias_key="self")

    @bucket_rule("mv")
    def _mv(self, node, op, b):
        return self._contract(node, op, b, "self", "vec", 1, 0, lambda a, c: (a[0],))

    @bucket_rule("dot")
    def _dot(self, node, op, b):
        return self._contract(node, op, b, "self", "tensor", 0, 0, lambda a, c: ())

    @bucket_rule("nll_loss_forward", "nll_loss2d_forward")
    def _nll_loss_forward(self, node, op, b):
        x, t = b["self"][1], b["target"][1]
        lx, lt = self.L(x), self.L(t)
        # Input [N, C, d1...] (or [C]), target [N, d1...].
        if len(lx) > 1 and (_dim_padded(lx[1]) or lx[:1] + lx[2:] != lt):
            raise Unsupported("padded class dim, or input and target padded differently")
        ignore = b["ignore_index"][1]
        self.actions[node] = _masking_call(
            op, [(b["target"][0], lt, ignore), (b["self"][0], lx, 0)]
        )
        reduction = b["reduction"][1]
        return [self._store(lt) if reduction == 0 else None, None]

    @bucket_rule("nll_loss_backward", "nll_loss2d_backward")
    def _nll_loss_backward(self, node, op, b):
        x, t, g = b["self"][1], b["target"][1], b["grad_output"][1]
        lx, lt = self.L(x), self.L(t)
        if len(lx) > 1 and (_dim_padded(lx[1]) or lx[:1] + lx[2:] != lt):
            raise Unsupported("padded class dim, or input and target padded differently")
        ignore = b["ignore_index"][1]
        self.actions[node] = _masking_call(
            op, [(b["target"][0], lt, ignore), (b["grad_output"][0], self.L(g), 0)]
        )
        return self._store(lx)

    @bucket_rule("embedding_dense_backward")
    def _embedding_dense_backward(self, node, op, b):
        g = b["grad_output"][1]
        if b["scale_grad_by_freq"][1]:
            raise Unsupported("scale_grad_by_freq counts padded indices")
        self.actions[node] = _masking_call(op, [(b["grad_output"][0], self.L(g), 0)])

    def _layer_norm_layout(self, b) -> tuple:
        """The input's layout and the number of normalized dims, none of them padded."""
        lay = self.L(b["input"][1])
        k = len(b["normalized_shape"][1])
        if any(_dim_padded(d) for d in lay[len(lay) - k :]):
            raise Unsupported("normalizes over a padded dim")
        return lay, k

    @bucket_rule("native_layer_norm")
    def _native_layer_norm(self, node, op, b):
        lay, k = self._layer_norm_layout(b)
        stat = lay[: len(lay) - k] + ((1,),) * k
        return [self._store(lay), self._store(stat), self._store(stat)]

    @bucket_rule("native_layer_norm_backward")
    def _native_layer_norm_backward(self, node, op, b):
        lay, _ = self._layer_norm_layout(b)
        # The weight and bias gradients sum over the padded rows.
        self.actions[node] = _masking_call(
            op,
            [(b[key][0], self.L(b[key][1]), 0) for key in ("grad_out", "input", "mean", "rstd")],
        )
        return [self._store(lay), None, None]


def _name(node: Node) -> str:
    t = node.target
    return str(t) if isinstance(t, torch._ops.OpOverload) else getattr(t, "__name__", str(t))
