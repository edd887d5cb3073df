"""Small models shared by the demo, the training-parity tests and the benchmarks."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class MLP(nn.Module):
    def __init__(self, d_in: int = 32, hidden: int = 64, d_out: int = 10) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(d_in, hidden),
            nn.GELU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, d_out),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class MobileCNN(nn.Module):
    """MobileNet-style: depthwise-separable conv blocks with batch norm and hardswish
    (many distinct small programs, so it shows cold-start compile cost)."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()

        def block(cin: int, cout: int, stride: int) -> nn.Sequential:
            return nn.Sequential(
                nn.Conv2d(cin, cin, 3, stride, 1, groups=cin, bias=False),
                nn.BatchNorm2d(cin),
                nn.Hardswish(),
                nn.Conv2d(cin, cout, 1, bias=False),
                nn.BatchNorm2d(cout),
                nn.ReLU(),
            )

        self.net = nn.Sequential(
            nn.Conv2d(3, 16, 3, 2, 1),
            nn.BatchNorm2d(16),
            nn.Hardswish(),
            block(16, 24, 2),
            block(24, 40, 2),
            block(40, 48, 1),
            block(48, 96, 2),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(96, classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def make_divisible(v: float, divisor: int = 8) -> int:
    """``v`` rounded to the nearest multiple of ``divisor`` (at least ``divisor``), never
    more than 10% below ``v``: MobileNet's channel rounding."""
    out = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return out + divisor if out < 0.9 * v else out


def conv_bn(cin: int, cout: int, k: int, stride: int = 1, groups: int = 1, act=None):
    """k x k convolution (same padding, no bias), batch norm, then ``act`` if given."""
    layers = [
        nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False),
        nn.BatchNorm2d(cout, eps=0.001, momentum=0.01),
    ]
    if act is not None:
        layers.append(act())
    return nn.Sequential(*layers)


class SqueezeExcite(nn.Module):
    """Channel gates: global average, 1x1 conv down, ReLU, 1x1 conv up, hardsigmoid."""

    def __init__(self, ch: int) -> None:
        super().__init__()
        mid = make_divisible(ch / 4)
        self.down = nn.Conv2d(ch, mid, 1)
        self.up = nn.Conv2d(mid, ch, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = F.adaptive_avg_pool2d(x, 1)
        return x * F.hardsigmoid(self.up(F.relu(self.down(s))))


class Bneck(nn.Module):
    """MobileNetV3's inverted residual: 1x1 expansion (skipped when it would keep the
    width), k x k depthwise, optional squeeze-excite, linear 1x1 projection; the input
    is added back when the shape is unchanged."""

    def __init__(self, cin: int, k: int, exp: int, cout: int, se: bool, act, stride: int):
        super().__init__()
        layers = [] if exp == cin else [conv_bn(cin, exp, 1, act=act)]
        layers.append(conv_bn(exp, exp, k, stride, groups=exp, act=act))
        if se:
            layers.append(SqueezeExcite(exp))
        layers.append(conv_bn(exp, cout, 1))
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(x)
        return x + y if self.residual else y


class MobileNetV3Small(nn.Module):
    """MobileNetV3-Small (Howard et al. 2019, "Searching for MobileNetV3", Table 2):
    a 3x3 stride-2 stem, eleven bneck blocks, a 1x1 conv to 576 channels, global
    average pooling, then a 1024-wide hidden layer and the classifier. About 2.54M
    parameters at 1000 classes and width 1.0."""

    # kernel, expansion, output channels, squeeze-excite, hardswish (else ReLU), stride
    CONFIG = (
        (3, 16, 16, True, False, 2),
        (3, 72, 24, False, False, 2),
        (3, 88, 24, False, False, 1),
        (5, 96, 40, True, True, 2),
        (5, 240, 40, True, True, 1),
        (5, 240, 40, True, True, 1),
        (5, 120, 48, True, True, 1),
        (5, 144, 48, True, True, 1),
        (5, 288, 96, True, True, 2),
        (5, 576, 96, True, True, 1),
        (5, 576, 96, True, True, 1),
    )

    def __init__(self, num_classes: int = 1000, width: float = 1.0, dropout: float = 0.2):
        super().__init__()

        def ch(c: int) -> int:
            return make_divisible(c * width)

        cin = ch(16)
        layers = [conv_bn(3, cin, 3, 2, act=nn.Hardswish)]
        for k, exp, cout, se, hs, stride in self.CONFIG:
            act = nn.Hardswish if hs else nn.ReLU
            layers.append(Bneck(cin, k, ch(exp), ch(cout), se, act, stride))
            cin = ch(cout)
        last = 6 * cin
        layers.append(conv_bn(cin, last, 1, act=nn.Hardswish))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(
            nn.Linear(last, 1024),
            nn.Hardswish(),
            nn.Dropout(dropout),
            nn.Linear(1024, num_classes),
        )
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out")
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0.0, 0.01)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.adaptive_avg_pool2d(self.features(x), 1).flatten(1)
        return self.classifier(x)


class Block(nn.Module):
    def __init__(self, d: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(
            nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"), nn.Linear(4 * d, d)
        )
        self.drop = nn.Dropout(dropout)
        self.dropout = dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
        )
        y = y.transpose(1, 2).contiguous().view(b, t, d)
        x = x + self.drop(self.proj(y))
        return x + self.drop(self.mlp(self.ln2(x)))


class GPT(nn.Module):
    """A small decoder-only transformer (token + position embeddings, pre-norm blocks,
    tied output head)."""

    def __init__(
        self,
        vocab: int = 64,
        d: int = 64,
        heads: int = 4,
        layers: int = 2,
        seq: int = 32,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads, dropout) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight
        for name, p in self.named_parameters():
            if name.endswith(("tok.weight", "pos.weight")):
                nn.init.normal_(p, std=0.02)
            elif name.endswith("proj.weight"):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * layers))

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.ln(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def copy_task_batch(gen: torch.Generator, batch: int, seq: int, vocab: int):
    """Sequences whose second half repeats the first: learnable by attention."""
    half = torch.randint(0, vocab, (batch, seq // 2 + 1), generator=gen)
    data = torch.cat([half, half], dim=1)[:, : seq + 1]
    return data[:, :-1].contiguous(), data[:, 1:].contiguous()


def train_losses(
    model_fn,
    batches,
    device: str,
    steps: int,
    lr: float = 3e-3,
    foreach: bool | None = None,
    clip: float | None = 1.0,
) -> list[float]:
    """Trains a fresh model on `device` with AdamW and returns the loss of every step."""
    torch.manual_seed(0)
    model = model_fn().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, foreach=foreach)
    losses = []
    for step in range(steps):
        inputs = [t.to(device) for t in batches[step % len(batches)]]
        opt.zero_grad(set_to_none=True)
        loss = model(*inputs) if len(inputs) == 2 and isinstance(model, GPT) else None
        if loss is None:
            loss = F.cross_entropy(model(inputs[0]), inputs[1])
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        losses.append(loss.item())
    return losses
