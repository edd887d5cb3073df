"""Bounded dynamism: an ATen graph with symbolic sizes runs at bucket sizes.

A symbol (a dynamic size, e.g. the sequence length ``s0``) of real value ``n`` runs at
the smallest bucket ``B >= n``: inputs are zero-padded to ``B`` on the host, the graph
runs at ``B`` (so its program is keyed by ``B``, not ``n``), and outputs are sliced back
to ``n``. Positions past ``n`` hold garbage; every op that mixes values along a padded
dim (reductions, contractions, softmax, losses, embedding gradients) first replaces
them with its neutral element, using a mask ``arange(B) < n`` in which ``n`` is a
runtime scalar of the program. Graphs are planned before they run: an op that mixes a
padded dim and has no rule here makes the whole graph (forward and backward) run at
exact sizes instead, and the op is reported.

A *layout* describes a tensor's dims in terms of symbols: each dim is a tuple of factors
in row-major order, an ``int`` (unpadded) or a ``sympy.Symbol`` (padded), so a view that
merges ``[2, s0]`` into ``[2*s0]`` keeps where the valid elements are.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sympy
import torch
from torch.fx import Graph, GraphModule, Node

from ._bucket_layout import (
    Layout,
    Unsupported,
    _dim_size,
    _exact_dim,
    _expr,
    _is_sym,
    _key,
    _number,
    _padded,
    _subs,
    _val,
)
from ._bucket_plan import Planner

# --------------------------------------------------------------------------- graphs


def graph_symbols(graph: Graph) -> set:
    """Symbols of the graph's inputs (tensor sizes and SymInt inputs)."""
    syms: set = set()
    for node in graph.nodes:
        if node.op != "placeholder":
            continue
        v = _val(node)
        if isinstance(v, torch.Tensor):
            for s in v.shape:
                syms |= _expr(s).free_symbols
        elif isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            syms |= _expr(v).free_symbols
    return syms


def shape_env_of(graph: Graph) -> Any:
    for node in graph.nodes:
        v = _val(node)
        for s in getattr(v, "shape", ()) if isinstance(v, torch.Tensor) else [v]:
            if isinstance(s, torch.SymInt):
                return s.node.shape_env
    return None


def input_layouts(
    graph: Graph, syms: set, saved: dict | None = None, outputs: Sequence = ()
) -> dict:
    """Layouts of the placeholders: exact from their sizes; for saved values of a
    backward graph, the forward's layout (they stay padded between the two); for a
    tangent whose sizes are not plain symbols, the one forward output layout with its
    sizes."""
    out = {}
    for node in graph.nodes:
        if node.op != "placeholder":
            continue
        if saved is not None and node.name in saved:
            out[node.name] = saved[node.name]
            continue
        v = _val(node)
        if not isinstance(v, torch.Tensor):
            continue
        try:
            lay = tuple(_exact_dim(s, syms) for s in v.shape)
        except Unsupported:
            sizes = [_expr(s) for s in v.shape]
            same = {o for o in outputs if [_dim_size(d) for d in o] == sizes}
            if not node.name.startswith("tangents") or len(same) != 1:
                raise
            lay = same.pop()
        out[node.name] = lay if _padded(lay) else None
    return out


class GraphPlan:
    """One ATen graph planned for padding: the rewritten graph module and what to do
    with each input and output at run time."""

    def __init__(
        self,
        gm: GraphModule,
        syms: set,
        given: dict,
        pad_inputs: set,
        saved_outputs: int,
    ) -> None:
        graph = Graph()
        graph.output(graph.graph_copy(gm.graph, {}))
        placeholders = [n for n in graph.nodes if n.op == "placeholder"]
        planner = Planner(graph, syms, given)
        self.layouts = planner.layouts
        # Inputs: how to read each symbol's real size, what to pad.
        self.sources: dict = {}
        self.inputs: list = []
        for i, node in enumerate(placeholders):
            v = _val(node)
            lay = planner.layouts.get(node)
            if isinstance(v, (torch.SymInt, torch.SymBool, torch.SymFloat)):
                e = _expr(v)
                if _is_sym(e) and e in syms:
                    self.sources.setdefault(e, (i, None))
                self.inputs.append(("sym", e))
            elif _padded(lay):
                for d, dim in enumerate(lay):
                    if len(dim) == 1 and _is_sym(dim[0]) and node.name in pad_inputs:
                        self.sources.setdefault(dim[0], (i, d))
                self.inputs.append(("pad" if node.name in pad_inputs else "keep", lay))
            else:
                self.inputs.append(("keep", None))
        # Masks live where the padded inputs do (other inputs may be CPU constants).
        self.device = next(
            (_val(n).device for n in placeholders if _padded(planner.layouts.get(n))),
            torch.device("tpu"),
        )
        missing = syms - set(self.sources)
        if missing:
            raise Unsupported(f"cannot read {sorted(map(str, missing))} from the graph inputs")
        # Outputs: unpad user-visible tensors, give real values for SymInts.
        out_node = next(n for n in graph.nodes if n.op == "output")
        outs = out_node.args[0]
        outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
        n_user = len(outs) - saved_outputs
        self.outputs: list = []
        for j, o in enumerate(outs):
            v = _val(o)
            if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
                self.outputs.append(("sym", _expr(v)))
            elif j < n_user and _padded(planner.layouts.get(o)):
                self.outputs.append(("unpad", planner.layouts[o]))
            else:
                self.outputs.append(("keep", None))
        self.user_layouts = [info for kind, info in self.outputs if kind == "unpad"]
        self.saved_layouts = {
            o.name: planner.layouts.get(o) for o in outs[n_user:] if isinstance(o, Node)
        }
        # Rewrite: replaced ops take the per-call context first.
        with graph.inserting_after(placeholders[-1] if placeholders else None):
            ctx = graph.placeholder("_bucket_ctx")
        for node, fn in planner.actions.items():
            node.target = fn
            node.args = (ctx, *node.args)
        graph.lint()
        self.gm = GraphModule(gm, graph)

    def read_ns(self, args: Sequence) -> dict:
        return {
            s: int(args[i]) if d is None else int(args[i].shape[d])
            for s, (i, d) in self.sources.items()
        }

    def prepare(self, args: list, ns: dict, bs: dict) -> list:
        out = []
        for (kind, info), a in zip(self.inputs, args):
            if kind == "sym":
                out.append(_number(info, _key(bs)))
            elif kind == "pad" and isinstance(a, torch.Tensor):
                out.append(_pad(a, info, ns, bs))
            else:
                out.append(a)
        return out

    def finish(self, outs: Any, ns: dict, bs: dict) -> Any:
        single = not isinstance(outs, (list, tuple))
        seq = [outs] if single else list(outs)
        for j, (kind, info) in enumerate(self.outputs):
            if kind == "sym":
                seq[j] = _number(info, _key(ns))
            elif kind == "unpad" and isinstance(seq[j], torch.Tensor):
                seq[j] = _unpad(seq[j], info, ns, bs)
        if single:
            return seq[0]
        return type(outs)(seq) if isinstance(outs, tuple) else seq


def _pad(t: torch.Tensor, layout: Layout, ns: dict, bs: dict) -> torch.Tensor:
    """Zero-pads each padded factor from n to B on the host: a device-side pad would be
    a program keyed by the real size."""
    full = [_number(_dim_size(d), _key(bs)) for d in layout]
    if list(t.shape) == full:
        return t
    real, padded, keep = [], [], []
    for dim in layout:
        for f in dim:
            real.append(ns[f] if _is_sym(f) else f)
            padded.append(bs[f] if _is_sym(f) else f)
            keep.append(slice(0, ns[f]) if _is_sym(f) else slice(None))
    host = t.cpu().reshape(real)
    out = host.new_zeros(padded)
    out[tuple(keep)] = host
    return out.reshape(full).to(t.device)


def _unpad(t: torch.Tensor, layout: Layout, ns: dict, bs: dict) -> torch.Tensor:
    """Keeps the valid elements of a padded result (on the host, see _pad)."""
    sizes, keep = [], []
    for dim in layout:
        for f in dim:
            sizes.append(bs[f] if _is_sym(f) else f)
            keep.append(slice(0, ns[f]) if _is_sym(f) else slice(None))
    real = [_subs(_dim_size(d), ns) for d in layout]
    host = t.cpu().reshape(sizes)[tuple(keep)]
    return host.reshape(real).contiguous().to(t.device)


class Buckets:
    """Chooses the bucket of every symbol for a set of real sizes, and checks that the
    graph's shape guards hold at the bucket sizes (else the call runs at exact sizes)."""

    def __init__(self, buckets: Sequence[int] | None, shape_env: Any, syms: set) -> None:
        self.buckets = sorted(buckets) if buckets else None
        self.shape_env = shape_env
        self.syms = syms
        self._cache: dict = {}

    def _bucket(self, s: sympy.Symbol, n: int) -> int | None:
        if self.buckets is None:
            b = 1 << max(n - 1, 0).bit_length()
        else:
            b = next((x for x in self.buckets if x >= n), None)
            if b is None:
                return None
        vr = self.shape_env.var_to_range.get(s) if self.shape_env is not None else None
        if vr is not None and vr.upper.is_Integer and b > int(vr.upper):
            b = max(int(vr.upper), n)
        return b

    def _conditions(self) -> list:
        env = self.shape_env
        if env is None:
            return []
        exprs = [g.expr for g in env.guards]
        for ras in env.deferred_runtime_asserts.values():
            exprs += [ra.expr for ra in ras]
        return [e for e in exprs if e.free_symbols and e.free_symbols <= self.syms]

    def choose(self, ns: dict) -> tuple[dict | None, str]:
        key = tuple(sorted((str(s), n) for s, n in ns.items()))
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        bs: dict | None = {}
        why = ""
        for s, n in ns.items():
            b = self._bucket(s, n)
            if b is None:
                bs, why = None, f"{s}={n} is above the largest bucket"
                break
            bs[s] = b
        if bs is not None:
            sub = {s: sympy.Integer(b) for s, b in bs.items()}
            for cond in self._conditions():
                if cond.xreplace(sub) is not sympy.true:
                    bs, why = None, f"guard {cond} fails at the bucket sizes"
                    break
        self._cache[key] = (bs, why)
        return bs, why
