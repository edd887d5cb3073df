// segment_reduce and its backward: consecutive segments along `axis`, given
// by lengths or offsets (runtime tensors; only their count is static). Each
// element's segment comes from the segment ends; reductions run over an
// [segments, elements] membership mask.
#include <string>
#include <vector>

#include "lower/helpers.h"
#include "lower/types.h"

namespace torchtpu::lower {
namespace {

using hlo::Cmp;
using hlo::Reducer;
using V = std::vector<Value>;

// x with `axis` moved to the front, and back.
std::vector<int64_t> front_perm(int64_t r, int64_t axis) {
  std::vector<int64_t> p{axis};
  for (int64_t i = 0; i < r; ++i)
    if (i != axis) p.push_back(i);
  return p;
}

struct Segments {
  Ex member;  // bool [S, n]: element j is in segment s
  Ex len;     // [S] segment lengths (compute dtype)
  int64_t count;
};
// (lengths at arg li | offsets at arg oi) -> membership of n elements.
Segments segments(Ctx& c, int li, int oi, int64_t n, DType t) {
  Builder& b = c.b;
  if (c.in(c.is_none(li) ? oi : li).rank() != 1)
    throw hlo::BuildError("[lower] segment_reduce: only 1-d lengths/offsets are supported");
  Ex starts(b, b.constant_int(0, DType::I64)), ends = starts;
  int64_t s;
  if (!c.is_none(li)) {
    Ex lens(b, b.convert(c.in(li), DType::I64));
    s = lens.v.shape().back();
    lens = Ex(b, b.reshape(lens.v, {s}));
    ends = Ex(b, b.reduce_window(lens.v, b.constant_int(0, DType::I64), Reducer::Add, {s}, {1},
                                 {s - 1}, {0}));
    starts = ends - lens;
  } else {
    Ex offs(b, b.convert(c.in(oi), DType::I64));
    int64_t k = offs.v.shape().back();
    s = k - 1;
    offs = Ex(b, b.reshape(offs.v, {k}));
    starts = Ex(b, b.slice(offs.v, {0}, {s}, {1}));
    ends = Ex(b, b.slice(offs.v, {1}, {k}, {1}));
  }
  Type mt{DType::I64, {s, n}};
  Ex j(b, b.iota(mt, 1));
  Ex st(b, b.broadcast_in_dim(starts.v, mt.shape, {0})),
      en(b, b.broadcast_in_dim(ends.v, mt.shape, {0}));
  Ex member = j.cmp(Cmp::GE, st).bin("and", j.cmp(Cmp::LT, en));
  return {member, (ends - starts).to(t), s};
}

// Reduces x [n, rest...] into [S, rest...] over the membership mask.
Ex seg_reduce(const Segments& sg, const Ex& x, const std::string& red, Ctx& c, int init_arg) {
  Builder& b = c.b;
  DType t = x.v.dtype();
  int64_t r = x.v.rank();
  Shape big{sg.count};
  big.insert(big.end(), x.v.shape().begin(), x.v.shape().end());  // [S, n, rest...]
  std::vector<int64_t> xd;
  for (int64_t i = 0; i < r; ++i) xd.push_back(i + 1);
  Ex xb(b, b.broadcast_in_dim(x.v, big, xd)), mb(b, b.broadcast_in_dim(sg.member.v, big, {0, 1}));
  bool has_init = !c.is_none(init_arg);
  Ex init = has_init ? Ex(b, c.scalar(init_arg, t)) : Ex(b, b.constant(0, t));
  Shape lens_shape(r, 1);
  lens_shape[0] = sg.count;
  Ex len(b, b.reshape(sg.len.v, lens_shape));
  if (red == "sum" || red == "mean") {
    Ex sum(b, reduce_sum(b, where(mb, xb, xb.k(0)).v, {1}, false));
    sum = sum + init;
    if (red == "sum") return sum;
    Ex mean = where(len.cmp(Cmp::GT, len.k(0)), sum / len, sum);
    return has_init ? mean : where(len.cmp(Cmp::EQ, len.k(0)), mean.k(NAN), mean);
  }
  Reducer rd = red == "max" ? Reducer::Max : red == "min" ? Reducer::Min : Reducer::Mul;
  double ident = red == "max" ? -INFINITY : red == "min" ? INFINITY : 1.0;
  Ex out(b, b.reduce(where(mb, xb, xb.k(ident)).v, b.constant(ident, t), {1}, rd));
  if (!has_init) return out;
  return red == "max"   ? Ex(b, b.binary("maximum", out.v, broadcast_to(b, init.v, out.v.shape())))
         : red == "min" ? Ex(b, b.binary("minimum", out.v, broadcast_to(b, init.v, out.v.shape())))
                        : out * init;
}

TPU_LOWERING(segment_reduce) {
  // (data, reduce, *, lengths?, indices?, offsets?, axis, unsafe, initial?)
  reg("segment_reduce", [](Ctx& c) -> V {
    Builder& b = c.b;
    DType t = compute_dtype(c.out(0).dtype);
    Value x = b.convert(c.in(0), t);
    int64_t r = x.rank(), axis = wrap_dim(c.i64(5), r);
    auto p = front_perm(r, axis);
    Ex xf(b, b.transpose(x, p));
    Segments sg = segments(c, 2, 4, xf.v.shape()[0], t);
    Ex out = seg_reduce(sg, xf, c.arg(1).toStringRef(), c, 7);
    return {b.transpose(out.v, inverse_permutation(p))};
  });
  // (grad, output, data, reduce, *, lengths?, offsets?, axis, initial?)
  reg("_segment_reduce_backward", [](Ctx& c) -> V {
    Builder& b = c.b;
    DType t = compute_dtype(c.out(0).dtype);
    Value x = b.convert(c.in(2), t);
    int64_t r = x.rank(), axis = wrap_dim(c.i64(6), r);
    auto p = front_perm(r, axis);
    Ex xf(b, b.transpose(x, p));
    Ex g(b, b.transpose(b.convert(c.in(0), t), p)), out(b, b.transpose(b.convert(c.in(1), t), p));
    int64_t n = xf.v.shape()[0];
    Segments sg = segments(c, 4, 5, n, t);
    std::string red = c.arg(3).toStringRef();
    // Per element: its segment's grad/output (zero for elements in no segment).
    Shape big{sg.count};
    big.insert(big.end(), xf.v.shape().begin(), xf.v.shape().end());
    std::vector<int64_t> sd{0}, xd;
    for (int64_t i = 1; i < r; ++i) sd.push_back(i + 1);
    for (int64_t i = 0; i < r; ++i) xd.push_back(i + 1);
    Ex mb(b, b.broadcast_in_dim(sg.member.v, big, {0, 1}));
    auto per_elem = [&](const Ex& v) {
      Ex vb(b, b.broadcast_in_dim(v.v, big, sd));
      return Ex(b, reduce_sum(b, where(mb, vb, vb.k(0)).v, {0}, false));
    };
    Shape ls(r, 1);
    ls[0] = sg.count;
    Ex len(b, b.reshape(sg.len.v, ls));
    Ex ge = per_elem(g), oe = per_elem(out);
    Ex gx = ge;
    if (red == "mean") {
      gx = per_elem(g / where(len.cmp(Cmp::GT, len.k(0)), len, len.k(1)));
    } else if (red == "max" || red == "min") {
      // Shared evenly among the elements equal to the result.
      Ex hit = xf.cmp(Cmp::EQ, oe).to(t);
      Ex xb(b, b.broadcast_in_dim(hit.v, big, xd));
      Ex cnt(b, reduce_sum(b, where(mb, xb, xb.k(0)).v, {1}, true));
      Shape cs = cnt.v.shape();
      cs.erase(cs.begin() + 1);
      cnt = Ex(b, b.reshape(cnt.v, cs));
      gx = hit * per_elem(g / where(cnt.cmp(Cmp::GT, cnt.k(0)), cnt, cnt.k(1)));
    } else if (red == "prod") {
      // Product of the other members of the segment: pairwise, skipping self.
      Shape pb{n};
      pb.insert(pb.end(), big.begin(), big.end());  // [n(self), S, n, rest...]
      Type it{DType::I64, {n, sg.count, n}};
      Ex self(b, b.iota(it, 0)), other(b, b.iota(it, 2));
      Ex keep = self.cmp(Cmp::NE, other)
                    .bin("and", Ex(b, b.broadcast_in_dim(sg.member.v, it.shape, {1, 2})));
      std::vector<int64_t> kd{0, 1, 2}, xd2;
      for (int64_t i = 0; i < r; ++i) xd2.push_back(i + 2);
      Ex xb(b, b.broadcast_in_dim(xf.v, pb, xd2)), kb(b, b.broadcast_in_dim(keep.v, pb, kd));
      Ex others(b, b.reduce(where(kb, xb, xb.k(1)).v, b.constant(1, t), {2},
                            Reducer::Mul));  // [n, S, rest]
      Ex mine(b, b.broadcast_in_dim(sg.member.v, others.v.shape(), {1, 0}));
      Ex po(b, b.reduce(where(mine, others, others.k(1)).v, b.constant(1, t), {1}, Reducer::Mul));
      if (!c.is_none(7)) po = po * Ex(b, c.scalar(7, t));
      gx = ge * po;
    }
    return {b.transpose(gx.v, inverse_permutation(p))};
  });
}

}  // namespace
}  // namespace torchtpu::lower
