"""Recurrent layers on tpu against the CPU, in every eager mode.

On a non-CPU device PyTorch's LSTM/GRU cells call the fused pointwise ops
``_thnn_fused_lstm_cell`` / ``_thnn_fused_gru_cell`` (and their backward ops),
which have no CPU kernel: the cell table compares them with the unfused formula
run on the CPU. The module table compares whole layers with the CPU's own path.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_tpu_close

B, H = 3, 5
TOL = {"rtol": 1e-5, "atol": 1e-5}


def _lstm_ref(ig, hg, cx, bi=None, bh=None):
    g = ig + hg + (bi + bh if bi is not None else 0)
    i, f, c, o = g.chunk(4, 1)
    i, f, c, o = i.sigmoid(), f.sigmoid(), c.tanh(), o.sigmoid()
    cy = f * cx + i * c
    return o * cy.tanh(), cy, torch.cat([i, f, c, o], 1)


def _gru_ref(ig, hg, hx, bi=None, bh=None):
    if bi is not None:
        ig, hg = ig + bi, hg + bh
    ir, iz, in_ = ig.chunk(3, 1)
    hr, hz, hn = hg.chunk(3, 1)
    r, z = (ir + hr).sigmoid(), (iz + hz).sigmoid()
    n = (in_ + r * hn).tanh()
    return n + z * (hx - n), torch.cat([r, z, n, hx, hn], 1)


def _lstm(ig, hg, cx, bi=None, bh=None):
    return torch.ops.aten._thnn_fused_lstm_cell(ig, hg, cx, bi, bh)


def _gru(ig, hg, hx, bi=None, bh=None):
    return torch.ops.aten._thnn_fused_gru_cell(ig, hg, hx, bi, bh)


def _t(rows, cols):  # a non-contiguous [rows, cols] (transposed storage)
    return torch.randn(cols, rows).t()


# name: (tpu fn, CPU reference, inputs, which outputs get a cotangent)
CELLS = {
    "lstm": (
        _lstm,
        _lstm_ref,
        lambda: (
            [_t(B, 4 * H), _t(B, 4 * H), torch.randn(B, H)]
            + [torch.randn(4 * H), torch.randn(4 * H)]
        ),
        (0, 1),
    ),
    "lstm_no_bias": (
        _lstm,
        _lstm_ref,
        lambda: [torch.randn(B, 4 * H), torch.randn(B, 4 * H), torch.randn(B, H)],
        (0, 1),
    ),
    # only hy is used (the last layer's cy): grad_cy arrives undefined
    "lstm_hy_only": (
        _lstm,
        _lstm_ref,
        lambda: [
            torch.randn(B, 4 * H),
            torch.randn(B, 4 * H),
            torch.randn(B, H),
            torch.randn(4 * H),
            torch.randn(4 * H),
        ],
        (0,),
    ),
    "lstm_cy_only": (
        _lstm,
        _lstm_ref,
        lambda: [torch.randn(B, 4 * H), torch.randn(B, 4 * H), torch.randn(B, H)],
        (1,),
    ),
    "gru": (
        _gru,
        _gru_ref,
        lambda: [
            _t(B, 3 * H),
            torch.randn(B, 3 * H),
            _t(B, H),
            torch.randn(3 * H),
            torch.randn(3 * H),
        ],
        (0,),
    ),
    "gru_no_bias": (
        _gru,
        _gru_ref,
        lambda: [torch.randn(B, 3 * H), torch.randn(B, 3 * H), torch.randn(B, H)],
        (0,),
    ),
}


@pytest.mark.parametrize("name", list(CELLS))
def test_fused_cell(name, eager):
    fn, ref_fn, make, graded = CELLS[name]
    inputs = make()
    ref_in = [t.detach().requires_grad_(True) for t in inputs]
    dev_in = [t.detach().to("tpu").requires_grad_(True) for t in inputs]
    ref, out = ref_fn(*ref_in), fn(*dev_in)
    assert_tpu_close(list(out), list(ref), **TOL)  # the workspace too: backward reads it
    gs = [torch.randn(ref[k].shape) for k in graded]
    rg = torch.autograd.grad([ref[k] for k in graded], ref_in, gs)
    dg = torch.autograd.grad([out[k] for k in graded], dev_in, [g.to("tpu") for g in gs])
    assert_tpu_close(list(dg), list(rg), **TOL)


def _seq(batch_first=False):
    return torch.randn(2, 4, 3) if batch_first else torch.randn(4, 2, 3)


# name: (module factory, input factory (CPU tensors), extra state (h0 or (h0, c0)) or None)
MODULES = {
    "lstm_2layer": (lambda: torch.nn.LSTM(3, H, num_layers=2), _seq, None),
    "lstm_bidir_batch_first_state": (
        lambda: torch.nn.LSTM(3, H, batch_first=True, bidirectional=True),
        lambda: _seq(True),
        lambda: (torch.randn(2, 2, H), torch.randn(2, 2, H)),
    ),
    "lstm_proj_no_bias": (lambda: torch.nn.LSTM(3, H, proj_size=2, bias=False), _seq, None),
    "gru_2layer": (lambda: torch.nn.GRU(3, H, num_layers=2), _seq, None),
    "gru_bidir_state": (
        lambda: torch.nn.GRU(3, H, bidirectional=True),
        _seq,
        lambda: torch.randn(2, 2, H),
    ),
    "lstm_cell": (
        lambda: torch.nn.LSTMCell(3, H),
        lambda: torch.randn(2, 3),
        lambda: (torch.randn(2, H), torch.randn(2, H)),
    ),
    "lstm_cell_unbatched": (lambda: torch.nn.LSTMCell(3, H), lambda: torch.randn(3), None),
    "gru_cell": (
        lambda: torch.nn.GRUCell(3, H),
        lambda: torch.randn(2, 3),
        lambda: torch.randn(2, H),
    ),
    "gru_cell_no_bias": (
        lambda: torch.nn.GRUCell(3, H, bias=False),
        lambda: torch.randn(2, 3),
        None,
    ),
    "rnn_tanh": (lambda: torch.nn.RNN(3, H, num_layers=2), _seq, None),
    "rnn_relu": (lambda: torch.nn.RNN(3, H, nonlinearity="relu"), _seq, None),
}


def _run_module(m, x, state):
    out = m(x) if state is None else m(x, state)
    return [t for t in torch.utils._pytree.tree_leaves(out)]


@pytest.mark.parametrize("name", list(MODULES))
def test_rnn_module(name, eager):
    make_m, make_x, make_s = MODULES[name]
    ref_m = make_m()
    dev_m = make_m().to("tpu")
    dev_m.load_state_dict(ref_m.state_dict())
    x = make_x().requires_grad_(True)
    state = make_s() if make_s else None
    xd = x.detach().to("tpu").requires_grad_(True)
    sd = None if state is None else torch.utils._pytree.tree_map(lambda t: t.to("tpu"), state)
    ref, out = _run_module(ref_m, x, state), _run_module(dev_m, xd, sd)
    assert_tpu_close(out, ref, **TOL)
    gs = [torch.randn(t.shape) for t in ref]
    rw, dw = [x, *ref_m.parameters()], [xd, *dev_m.parameters()]
    rg = torch.autograd.grad(ref, rw, gs)
    dg = torch.autograd.grad(out, dw, [g.to("tpu") for g in gs])
    assert_tpu_close(list(dg), list(rg), **TOL)


class LstmLM(torch.nn.Module):
    def __init__(self, vocab=17, dim=8, hidden=12):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, dim)
        self.lstm = torch.nn.LSTM(dim, hidden, num_layers=2, batch_first=True)
        self.head = torch.nn.Linear(hidden, vocab)

    def forward(self, x, y):
        h, _ = self.lstm(self.emb(x))
        return F.cross_entropy(self.head(h).flatten(0, 1), y.flatten())


def _lm_losses(device, steps=5):
    torch.manual_seed(0)
    model = LstmLM().to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        seq = torch.randint(0, 17, (4, 7), generator=gen)
        x, y = seq[:, :-1].to(device), seq[:, 1:].to(device)
        opt.zero_grad()
        loss = model(x, y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_lstm_language_model_trains_like_cpu(eager):
    cpu = _lm_losses("cpu")
    tpu = _lm_losses("tpu")
    for step, (a, b) in enumerate(zip(tpu, cpu)):
        assert abs(a - b) <= 1e-5 * abs(b), f"step {step}: tpu {a} vs cpu {b}"
    assert tpu[-1] < tpu[0]
