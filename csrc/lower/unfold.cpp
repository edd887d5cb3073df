// Sliding-window copies: unfold's backward (Tensor.unfold), im2col (nn.Unfold) and
// col2im (nn.Fold), as strided slices and pads of the input.
#include <algorithm>
#include <vector>

#include "lower/helpers.h"
#include "lower/types.h"

namespace torchtpu::lower {
namespace {

using V = std::vector<Value>;

TPU_LOWERING(unfold) {
  // unfold_backward(grad_in, input_sizes, dim, size, step): window element k
  // of window w came from input position w * step + k.
  reg("unfold_backward", [](Ctx& c) -> V {
    Builder& b = c.b;
    DType t = math_dtype(c);
    Value g = b.convert(c.in(0), t);
    const Shape& in = c.out(0).shape;
    int64_t r = static_cast<int64_t>(in.size()), dim = wrap_dim(c.i64(2), std::max<int64_t>(r, 1));
    int64_t size = c.i64(3), step = c.i64(4);
    if (r == 0) return {b.reshape(g, {})};
    int64_t windows = g.shape()[dim], n = in[dim];
    Ex out(b, b.splat(0, Type{t, in}));
    for (int64_t k = 0; k < size && windows > 0; ++k) {
      Shape lo(g.rank(), 0), hi = g.shape();
      lo[g.rank() - 1] = k;
      hi[g.rank() - 1] = k + 1;
      Value gk = b.reshape(b.slice(g, lo, hi, {}), Shape(g.shape().begin(), g.shape().end() - 1));
      Shape plo(r, 0), phi(r, 0), pin(r, 0);
      plo[dim] = k;
      pin[dim] = step - 1;
      phi[dim] = n - (k + (windows - 1) * step + 1);
      out = out + Ex(b, b.pad(gk, b.constant(0, t), plo, phi, pin));
    }
    return {out};
  });
  // im2col(self, kernel_size, dilation, padding, stride): [N, C*kh*kw, L]
  // with L the output positions, one strided slice of the padded input per
  // kernel offset.
  reg("im2col", [](Ctx& c) -> V {
    Builder& b = c.b;
    Value x = c.in(0);
    bool batched = x.rank() == 4;
    if (!batched)
      x = b.reshape(x, [&] {
        Shape s = x.shape();
        s.insert(s.begin(), 1);
        return s;
      }());
    auto k = c.ints(1), d = c.ints(2), p = c.ints(3), st = c.ints(4);
    int64_t n = x.shape()[0], ch = x.shape()[1], h = x.shape()[2], w = x.shape()[3];
    int64_t oh = (h + 2 * p[0] - d[0] * (k[0] - 1) - 1) / st[0] + 1;
    int64_t ow = (w + 2 * p[1] - d[1] * (k[1] - 1) - 1) / st[1] + 1;
    Value xp =
        b.pad(x, b.constant(0, x.dtype()), {0, 0, p[0], p[1]}, {0, 0, p[0], p[1]}, {0, 0, 0, 0});
    std::vector<Value> cols;
    for (int64_t i = 0; i < k[0]; ++i)
      for (int64_t j = 0; j < k[1]; ++j) {
        Shape lo{0, 0, i * d[0], j * d[1]};
        Shape hi{n, ch, i * d[0] + (oh - 1) * st[0] + 1, j * d[1] + (ow - 1) * st[1] + 1};
        cols.push_back(b.reshape(b.slice(xp, lo, hi, {1, 1, st[0], st[1]}), {n, ch, 1, oh * ow}));
      }
    Value out =
        cols.empty() ? b.splat(0, Type{x.dtype(), {n, ch, 0, oh * ow}}) : b.concatenate(cols, 2);
    return {b.reshape(out, c.out(0).shape)};
  });
  // col2im(self, output_size, kernel_size, dilation, padding, stride): the
  // adjoint of im2col, each kernel offset's block added back where it came from.
  reg("col2im", [](Ctx& c) -> V {
    Builder& b = c.b;
    DType t = math_dtype(c);
    Value x = b.convert(c.in(0), t);
    if (x.rank() == 2) x = b.reshape(x, {1, x.shape()[0], x.shape()[1]});
    auto o = c.ints(1), k = c.ints(2), d = c.ints(3), p = c.ints(4), st = c.ints(5);
    int64_t n = x.shape()[0], ch = x.shape()[1] / (k[0] * k[1]);
    int64_t hp = o[0] + 2 * p[0], wp = o[1] + 2 * p[1];
    int64_t oh = (hp - d[0] * (k[0] - 1) - 1) / st[0] + 1,
            ow = (wp - d[1] * (k[1] - 1) - 1) / st[1] + 1;
    Value blocks = b.reshape(x, {n, ch, k[0], k[1], oh, ow});
    Ex acc(b, b.splat(0, Type{t, {n, ch, hp, wp}}));
    for (int64_t i = 0; i < k[0] && oh > 0 && ow > 0; ++i)
      for (int64_t j = 0; j < k[1]; ++j) {
        Value blk =
            b.reshape(b.slice(blocks, {0, 0, i, j, 0, 0}, {n, ch, i + 1, j + 1, oh, ow}, {}),
                      {n, ch, oh, ow});
        Shape lo{0, 0, i * d[0], j * d[1]};
        Shape hi{0, 0, hp - (i * d[0] + (oh - 1) * st[0] + 1),
                 wp - (j * d[1] + (ow - 1) * st[1] + 1)};
        acc = acc + Ex(b, b.pad(blk, b.constant(0, t), lo, hi, {0, 0, st[0] - 1, st[1] - 1}));
      }
    return {b.slice(acc.v, {0, 0, p[0], p[1]}, {n, ch, p[0] + o[0], p[1] + o[1]}, {})};
  });
}

}  // namespace
}  // namespace torchtpu::lower
