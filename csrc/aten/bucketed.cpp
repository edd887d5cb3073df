#include "aten/bucketed.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/enum_tag.h>
#include <ATen/ops/empty.h>
#include <c10/core/WrapDimMinimal.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "aten/host_ops.h"
#include "aten/strict.h"
#include "lower/helpers.h"
#include "lower/types.h"

namespace torchtpu::aten {

using hlo::Type;
using hlo::Value;
using lower::to_dtype;

namespace {

bool enabled() { return env_default_on("TORCHTPU_EAGER_BUCKETS"); }

// A dim is bucketed once new sizes of it arrived between this many different
// host syncs: a model's warm-up meets all its shapes before its first reads,
// a generate loop meets a new length after every token's read.
constexpr int kChangesBeforeBucketing = 3;

enum class Kind { Pointwise, Reduce, Matmul, Cat, Attention };
struct OpKind {
  Kind kind;
  double neutral = 0;  // what a padded position holds for Reduce and Matmul
};

std::optional<OpKind> kind_of(const c10::OperatorHandle& op, const OpInfo& info) {
  const std::string base = info.name.substr(0, info.name.find('.'));
  constexpr double inf = std::numeric_limits<double>::infinity();
  if (base == "cat") return OpKind{Kind::Cat};
  if (base == "torchtpu::attention") return OpKind{Kind::Attention};
  if (base == "mm" || base == "bmm") return OpKind{Kind::Matmul, 0};
  if (base == "sum" || base == "_softmax_backward_data" || base == "_log_softmax_backward_data")
    return OpKind{Kind::Reduce, 0};
  if (base == "amax" || base == "_softmax" || base == "_log_softmax")
    return OpKind{Kind::Reduce, -inf};
  if (base == "amin") return OpKind{Kind::Reduce, inf};
  if (base == "all") return OpKind{Kind::Reduce, 1};
  if (base == "any") return OpKind{Kind::Reduce, 0};
  if (op.hasTag(at::Tag::pointwise) ||
      (info.functional && info.functional->hasTag(at::Tag::pointwise)))
    return OpKind{Kind::Pointwise};
  return std::nullopt;
}

// A tensor input of the call: argument `arg`, element `sub` of a list (or -1).
struct Pos {
  int arg, sub;
  at::Tensor t;
};

// Marks a position read through its runtime geometry although no dim of it
// is padded: a view whose offset or strides keep changing (a growing
// sequence's last column) in a storage a bucketed call wrote, whose size
// stays the bucket's capacity.
constexpr uint64_t kGeo = uint64_t{1} << 63;
constexpr int64_t kMaxDims = 63;

// Per call structure (op, dtypes, ranks): how each input dim's size moved,
// and, after the dims, how its place in its storage moved.
struct History {
  std::vector<std::vector<int64_t>> last;   // sizes at the previous miss
  std::vector<std::vector<int64_t>> epoch;  // host-sync count of the last change
  std::vector<std::vector<int>> changes;    // changes in distinct epochs
  bool failed = false;                      // a bucketed lowering raised
};
std::mutex history_mu;
std::unordered_map<std::string, History>& histories() {
  static auto& m = *new std::unordered_map<std::string, History>();
  return m;
}

// A tensor's sizes, then its offset and strides hashed into one value (the
// strides of size-1 dims do not move an element).
std::vector<int64_t> placement(const at::Tensor& t) {
  std::vector<int64_t> v = t.sizes().vec();
  uint64_t h = static_cast<uint64_t>(t.storage_offset());
  for (int64_t d = 0; d < t.dim(); ++d)
    if (t.size(d) != 1) h = h * 1000003 ^ static_cast<uint64_t>(t.stride(d));
  v.push_back(static_cast<int64_t>(h));
  return v;
}

// The dims of each position that keep changing (bit d set), or kGeo for a
// view that keeps moving in a capacity storage, noting this call.
std::vector<uint64_t> dynamic_dims(const std::string& sig, const std::vector<Pos>& pos,
                                   bool* failed) {
  const int64_t epoch = thread_host_syncs();
  std::lock_guard<std::mutex> lock(history_mu);
  History& h = histories()[sig];
  *failed = h.failed;
  std::vector<uint64_t> dyn(pos.size(), 0);
  if (h.last.size() != pos.size()) {
    h.last.clear();
    h.epoch.clear();
    h.changes.clear();
    for (const Pos& p : pos) {
      h.last.push_back(placement(p.t));
      h.epoch.emplace_back(p.t.dim() + 1, -1);
      h.changes.emplace_back(p.t.dim() + 1, 0);
    }
    return dyn;
  }
  for (size_t i = 0; i < pos.size(); ++i) {
    const std::vector<int64_t> now = placement(pos[i].t);
    const int64_t rank = pos[i].t.dim();
    for (int64_t d = 0; d <= rank && d < kMaxDims; ++d) {
      if (now[d] != h.last[i][d] && h.epoch[i][d] != epoch) {
        h.epoch[i][d] = epoch;
        h.changes[i][d]++;
      }
      h.last[i][d] = now[d];
      if (h.changes[i][d] < kChangesBeforeBucketing) continue;
      if (d < rank)
        dyn[i] |= uint64_t{1} << d;
      else if (device_storage(pos[i].t.storage()).bucketed())
        dyn[i] |= kGeo;
    }
  }
  return dyn;
}

// An exact call key that ran bucketed: the epoch (a read of the thread that
// runs the loop) of its last call and the run of consecutive epochs it came back in.
struct KeyEpochs {
  int64_t last = -1;
  int streak = 0;
};
// A key back in this many steps in a row (epochs at most kStepEpochs apart:
// a training step ends in a read or a few) is a loop's static shape: its dims looked changing only
// because other shapes of the op came first (a growing sequence, another model). It then gets its
// exact program, so Fused Eager keeps it inside the step's graph. A growing sequence's lengths each
// stay within one epoch (a token); run again, they come back only after many.
constexpr int kStaticEpochs = 4;
constexpr int64_t kStepEpochs = 4;
constexpr size_t kMaxKeys = 4096;

bool static_key(const std::string& key) {
  // Per thread: another thread's reads (a thread rank's) are not this loop's steps.
  thread_local std::unordered_map<std::string, KeyEpochs> seen;
  const int64_t epoch = thread_host_syncs();
  if (seen.size() >= kMaxKeys)  // a key out of its streak counts as unseen
    std::erase_if(seen, [&](const auto& kv) { return epoch - kv.second.last > kStepEpochs; });
  if (seen.size() >= kMaxKeys) seen.clear();
  KeyEpochs& k = seen[key];
  if (k.last != epoch) {
    k.streak = k.last >= 0 && epoch - k.last <= kStepEpochs ? k.streak + 1 : 1;
    k.last = epoch;
  }
  return k.streak >= kStaticEpochs;
}

// Exact call keys Strict built programs for (their dims were not changing yet,
// or they came back every step). The program table drops its programs when
// full; a key back after that runs exact again, where judging it afresh would
// bucket a loop's static shapes for steps and count a change of every op
// reading their outputs.
std::mutex exact_mu;
std::unordered_set<std::string>& exact_keys() {
  static auto& s = *new std::unordered_set<std::string>();
  return s;
}

bool ran_exact(const std::string& key) {
  std::lock_guard<std::mutex> lock(exact_mu);
  return exact_keys().contains(key);
}

}  // namespace

void note_exact_program(const std::string& key) {
  if (!enabled()) return;
  std::lock_guard<std::mutex> lock(exact_mu);
  if (exact_keys().size() >= kMaxKeys) exact_keys().clear();
  exact_keys().insert(key);
}

namespace {

void mark_failed(const std::string& sig) {
  std::lock_guard<std::mutex> lock(history_mu);
  histories()[sig].failed = true;
}

int64_t bucket(int64_t s) {
  if (s <= 1) return s;  // a size 1 broadcasts; padding it would not
  int64_t b = 8;
  while (b < s) b *= 2;
  return b;
}

std::vector<int64_t> box_of(const at::Tensor& t, uint64_t dyn) {
  std::vector<int64_t> box = t.sizes().vec();
  for (size_t d = 0; d < box.size(); ++d)
    if (dyn >> d & 1) box[d] = bucket(box[d]);
  return box;
}

// A runtime value of the program: an input's geometry or an output's size.
struct Geo {
  enum What : uint8_t { Offset, Size, Stride, OutSize } what;
  int arg, sub, dim;  // OutSize: arg = output index
};

struct BucketEntry : ProgramEntry {
  std::vector<Geo> geos;  // the extra scalars, in pack order
};

int64_t geo_value(const Geo& g, const torch::jit::Stack& stack, size_t first,
                  const std::vector<std::vector<int64_t>>& out_sizes) {
  if (g.what == Geo::OutSize) return out_sizes[g.arg][g.dim];
  const c10::IValue& v = stack[first + g.arg];
  const at::Tensor t = g.sub < 0 ? v.toTensor() : v.toTensorList().get(g.sub);
  switch (g.what) {
    case Geo::Offset: return t.storage_offset();
    case Geo::Size: return t.size(g.dim);
    default: return t.stride(g.dim);
  }
}

// What a rule sees of a bucketed call: the arguments with each bucketed
// tensor replaced by a meta tensor of its box, whose value is a gather of the
// real tensor over its runtime geometry (padding filled with the op's neutral
// element where the op mixes values along a dim). Everything else is read as
// Strict reads it.
class BucketCtx final : public lower::Ctx {
 public:
  BucketCtx(Program& p, const OpInfo& info, const torch::jit::Stack& boxed, CallCtx& real,
            const std::vector<Pos>& pos, const std::vector<uint64_t>& dyn, const SlotOf& slot_of,
            const CallOutputs& outs, OpKind kind, std::vector<Geo>& geos)
      : Ctx(p.b),
        p_(p),
        info_(info),
        boxed_(boxed),
        real_(real),
        pos_(pos),
        dyn_(dyn),
        slot_of_(slot_of),
        outs_(outs),
        kind_(kind),
        geos_(geos) {}

  const c10::IValue& arg(int i) const override { return boxed_[i]; }
  int num_args() const override { return real_.num_args(); }
  const Type& out(int k) const override { return outs_.types.at(k); }
  int num_outputs() const override { return static_cast<int>(outs_.types.size()); }
  const std::string& op_name() const override { return info_.name; }
  Value in(int i) override {
    if (int k = find(i, -1); k >= 0)
      return gather(k, kind_.kind != Kind::Pointwise && kind_.kind != Kind::Attention);
    return real_.in(i);
  }
  std::optional<Value> runtime_size(int i, int64_t dim) override {
    if (int k = find(i, -1); k >= 0 && (dyn_[k] >> dim & 1)) return size_of(k, dim);
    return std::nullopt;
  }
  std::vector<Value> list(int i) override {
    std::vector<Value> out;
    const auto l = real_.arg(i).toTensorList();
    for (size_t j = 0; j < l.size(); ++j) {
      int k = find(i, static_cast<int>(j));
      out.push_back(k >= 0 ? gather(k, false) : real_.load(l.get(j), i, static_cast<int>(j)));
    }
    return out;
  }
  bool tiles(int) override { return false; }
  Value scalar(int i, DType as) override { return real_.scalar(i, as); }
  Value scalar_at(int i, int e, DType as) override { return real_.scalar_at(i, e, as); }
  void update(int, Value) override { fail("writes its arguments"); }
  void update_at(int, int, Value) override { fail("writes its arguments"); }
  Value rng_state(int64_t) override { fail("draws random numbers"); }

  // A runtime value (an input's geometry, an output's size), as a scalar i64.
  Value extra(Geo g) {
    p_.scalars.push_back({0, -1, static_cast<int>(geos_.size()), DType::I64, true});
    geos_.push_back(g);
    return b.packed_scalar(DType::I64);
  }
  // Input position k's size along d: runtime when the dim is bucketed.
  Value size_of(size_t k, int64_t d) {
    if (dyn_[k] >> d & 1) return extra({Geo::Size, pos_[k].arg, pos_[k].sub, static_cast<int>(d)});
    return b.constant_int(pos_[k].t.size(d), DType::I64);
  }
  int find(int arg, int sub) const {
    for (size_t k = 0; k < pos_.size(); ++k)
      if (pos_[k].arg == arg && pos_[k].sub == sub && dyn_[k]) return static_cast<int>(k);
    return -1;
  }

  // Position k read as its box: element (i...) of the box is the tensor's
  // element (min(i, size - 1)...), so every read stays inside the view.
  Value gather(size_t k, bool neutral_fill) {
    const Pos& ps = pos_[k];
    const at::Tensor& t = ps.t;
    const DType d = to_dtype(t.scalar_type());
    const std::vector<int64_t> box = box_of(t, dyn_[k]);
    const Type idx_t{DType::I64, box};
    Value flat = b.reinterpret_flat(p_.storage(slot_of_(t), d), d);
    Value idx = b.broadcast_in_dim(extra({Geo::Offset, ps.arg, ps.sub, 0}), box, {});
    Value keep;
    for (int64_t dim = 0; dim < t.dim(); ++dim) {
      Value i = b.iota(idx_t, dim);
      if (dyn_[k] >> dim & 1) {
        Value n = b.broadcast_in_dim(size_of(k, dim), box, {});
        if (neutral_fill) {
          Value in_range = b.compare(hlo::Cmp::LT, i, n);
          keep = keep.valid() ? b.binary("and", keep, in_range) : in_range;
        }
        i = b.binary("minimum", i, b.binary("subtract", n, b.splat(1, idx_t)));
      }
      Value stride = extra({Geo::Stride, ps.arg, ps.sub, static_cast<int>(dim)});
      idx = b.binary("add", idx, b.binary("multiply", i, b.broadcast_in_dim(stride, box, {})));
    }
    Value v = b.gather_flat(flat, idx);
    if (keep.valid()) v = b.select(keep, v, b.splat(kind_.neutral, v.type));
    return v;
  }

 private:
  [[noreturn]] Value fail(const char* what) {
    TORCH_CHECK(false, "[tpu] ", info_.name, " ", what, ": not bucketed");
  }

  Program& p_;
  const OpInfo& info_;
  const torch::jit::Stack& boxed_;
  CallCtx& real_;
  const std::vector<Pos>& pos_;
  const std::vector<uint64_t>& dyn_;
  const SlotOf& slot_of_;
  const CallOutputs& outs_;
  OpKind kind_;
  std::vector<Geo>& geos_;
};

// Attention (torchtpu::attention: query [B, H, T, E], key [B, H, S, E],
// value [B, H, S, Ev], bias? broadcasting to [B, H, T, S]) is bucketed along
// T and S only, each dim in every input that has it, so the boxes agree; its
// rule masks the keys past the real S (runtime_size). cuDNN's calls take no
// such mask. False where the call cannot run so.
bool attention_dims(const torch::jit::Stack& s, size_t first, const std::vector<Pos>& pos,
                    std::vector<uint64_t>& dyn) {
  if (s[first + 7].toBool()) return false;
  constexpr int kT = 1, kS = 2;
  // Which length dim of the op dim d of a position is (the bias's dims count
  // from the end; a size 1 of it broadcasts).
  auto role = [](const Pos& p, int64_t d) {
    const int64_t aligned = d + 4 - p.t.dim();
    if (p.arg == 0) return aligned == 2 ? kT : 0;
    if (p.arg == 1 || p.arg == 2) return aligned == 2 ? kS : 0;
    if (p.arg == 3 && p.t.size(d) > 1) return aligned == 2 ? kT : aligned == 3 ? kS : 0;
    return 0;
  };
  int on = 0;
  for (size_t k = 0; k < pos.size(); ++k)
    for (int64_t d = 0; d < pos[k].t.dim(); ++d) {
      if (!(dyn[k] >> d & 1)) continue;
      if (!role(pos[k], d)) return false;
      on |= role(pos[k], d);
    }
  for (size_t k = 0; k < pos.size(); ++k)
    for (int64_t d = 0; d < pos[k].t.dim(); ++d)
      if (role(pos[k], d) & on) dyn[k] |= uint64_t{1} << d;
  return true;
}

// cat along a bucketed dim: each input box goes at the running sum of the
// real sizes before it, into a box long enough for all of them, which is
// then cut (or padded) to the output's bucket.
Value lower_cat(BucketCtx& ctx, const std::vector<Pos>& pos, const std::vector<uint64_t>& dyn,
                int list_arg, int64_t dim, const Type& out_box) {
  hlo::Builder& b = ctx.b;
  std::vector<Value> parts = ctx.list(list_arg);
  std::vector<int64_t> sum_box = out_box.shape;
  sum_box[dim] = 0;
  for (const Value& v : parts) sum_box[dim] += v.shape()[dim];
  Value acc = b.splat(0, Type{out_box.dtype, sum_box});
  Value at = b.constant_int(0, DType::I64);
  const Value zero = b.constant_int(0, DType::I64);
  for (size_t j = 0; j < parts.size(); ++j) {
    std::vector<Value> starts(sum_box.size(), zero);
    starts[dim] = at;
    acc = b.dynamic_update_slice(acc, b.convert(parts[j], out_box.dtype), starts);
    Value n;
    for (size_t k = 0; k < pos.size(); ++k)
      if (pos[k].arg == list_arg && pos[k].sub == static_cast<int>(j))
        n = dyn[k] >> dim & 1 ? ctx.size_of(k, dim)
                              : b.constant_int(pos[k].t.size(dim), DType::I64);
    at = b.binary("add", at, n);
  }
  if (sum_box[dim] >= out_box.shape[dim]) {
    std::vector<int64_t> start(sum_box.size(), 0), strides(sum_box.size(), 1);
    return b.slice(acc, start, out_box.shape, strides);
  }
  std::vector<int64_t> lo(sum_box.size(), 0), hi(sum_box.size(), 0), in(sum_box.size(), 0);
  hi[dim] = out_box.shape[dim] - sum_box[dim];
  return b.pad(acc, b.constant(0, out_box.dtype), lo, hi, in);
}

// floor(a / s) for 0 <= a < 2^50 and s >= 1, as a float64 multiply by 1/s:
// (a + 0.5) / s is at least 0.5 / s away from an integer, more than the
// rounding error. XLA:CPU vectorizes this; a 64-bit division by a runtime
// value is one scalar instruction per element, tens of cycles each.
Value floor_div(hlo::Builder& b, Value a, Value s) {
  const Type f_t{DType::F64, a.shape()};
  Value inv = b.binary("divide", b.constant(1, DType::F64), b.convert(s, DType::F64));
  Value q = b.binary("multiply", b.binary("add", b.convert(a, DType::F64), b.splat(0.5, f_t)),
                     b.broadcast_in_dim(inv, a.shape(), {}));
  return b.convert(b.unary("floor", q), DType::I64);
}

// A box-shaped result written densely at its exact (runtime) sizes, dims in
// the order `perm` (outermost first), into a flat buffer of the box's
// capacity; positions past the real elements repeat the last one.
Value compact(BucketCtx& ctx, Value v, size_t out_index, const std::vector<int64_t>& perm) {
  hlo::Builder& b = ctx.b;
  v = b.transpose(v, perm);
  const std::vector<int64_t> box = v.shape();
  const int64_t cap = v.type.numel();
  Value flat = b.reshape(v, {cap});
  if (box.empty()) return flat;
  const Type j_t{DType::I64, {cap}};
  Value j = b.iota(j_t, 0);
  Value pos = b.splat(0, j_t);
  Value stride = b.constant_int(1, DType::I64);  // exact dense stride, runtime
  int64_t box_stride = 1;
  for (int64_t d = static_cast<int64_t>(box.size()) - 1; d >= 0; --d) {
    Value n = ctx.extra({Geo::OutSize, static_cast<int>(out_index), -1, static_cast<int>(perm[d])});
    Value c = floor_div(b, j, stride);  // j's index along d and the dims outside it
    if (d == 0) {
      c = b.binary(
          "minimum", c,
          b.broadcast_in_dim(b.binary("subtract", n, b.constant_int(1, DType::I64)), {cap}, {}));
    } else {
      Value n_b = b.broadcast_in_dim(n, {cap}, {});
      c = b.binary("subtract", c, b.binary("multiply", floor_div(b, c, n), n_b));
    }
    pos = b.binary("add", pos,
                   b.binary("multiply", c, b.splat(static_cast<double>(box_stride), j_t)));
    stride = b.binary("multiply", stride, n);
    box_stride *= box[d];
  }
  return b.gather_flat(flat, pos);
}

// The dims of a dense tensor from outermost to innermost (by stride).
std::vector<int64_t> dim_order(const at::Tensor& t) {
  std::vector<int64_t> perm(t.dim());
  for (int64_t d = 0; d < t.dim(); ++d) perm[d] = d;
  std::stable_sort(perm.begin(), perm.end(),
                   [&](int64_t a, int64_t b) { return t.stride(a) > t.stride(b); });
  return perm;
}

// An out= tensor a bucketed call may write whole: dense from the storage's
// start and covering every real element (an unwritten storage, an exact one,
// or a bucketed result's real part), so the padding past it holds nothing.
bool writable_out(const at::Tensor& t) {
  if (!t.defined() || !t.device().is_privateuseone()) return false;
  const DeviceStorage& st = device_storage(t.storage());
  const size_t bytes = static_cast<size_t>(t.numel()) * t.element_size();
  const bool real_part = !st.pending && st.bucketed() && st.real_bytes == bytes;
  return t.storage_offset() == 0 && t.is_non_overlapping_and_dense() &&
         (st.nbytes == bytes || real_part);
}

// A storage grown or shrunk to hold `nbytes` whose whole value is replaced next.
void set_capacity(const c10::Storage& storage, size_t nbytes) {
  DeviceStorage& st = device_storage(storage);
  if (st.nbytes == nbytes) return;
  storage_resized(st, nbytes);
  storage.unsafeGetStorageImpl()->set_nbytes(nbytes);
}

// Wraps a flat buffer of `cap` elements as a contiguous tensor of `sizes`.
at::Tensor wrap_capacity(pjrt::BufferPtr buf, const std::vector<int64_t>& sizes,
                         c10::ScalarType dtype, int device) {
  const int64_t cap = buf->numel();
  at::Tensor t = wrap_buffer(std::move(buf), {cap}, dtype, device);
  t.unsafeGetTensorImpl()->set_sizes_contiguous(sizes);
  DeviceStorage& st = device_storage(t.storage());
  st.real_bytes = static_cast<size_t>(t.numel()) * t.element_size();
  st.real_of = st.buffer.get();
  return t;
}

// What a bucketed call is: its kind, tensor inputs and their bucketed dims,
// which arguments are out= tensors, and its exact output sizes.
struct Plan {
  OpKind kind;
  std::vector<bool> is_out;
  std::vector<Pos> pos;
  std::vector<uint64_t> dyn;
  int list_arg = -1;
  std::string sig;
  std::vector<std::vector<int64_t>> out_sizes;
  int64_t cat_dim = 0, cat_box = 0;
  bool padded = false;  // some dim is bucketed (else only kGeo positions)
};

// (run_bucketed, its one caller, has checked that bucketing is on.)
std::optional<Plan> plan_call(const c10::OperatorHandle& op, const OpInfo& info,
                              const torch::jit::Stack& s, const CallKey& call) {
  if (info.foreach || info.list_write_arg >= 0 || !info.rule) return std::nullopt;
  // An op that is not a bucketed kind may still read moving views (kGeo):
  // nothing is padded, so any rule sees exact values.
  const std::optional<OpKind> kind = kind_of(op, info);
  const OpKind exact{Kind::Pointwise};
  const size_t first = call.first, n = call.n;
  if (value_sized_call(call.storages)) return std::nullopt;
  Plan pl{kind.value_or(exact)};

  // Returns: fresh tensors, or out= tensors written whole (writable_out).
  pl.is_out.assign(n, false);
  for (int a : info.ret_alias_arg) {
    if (a < 0) continue;
    if (!s[first + a].isTensor() || !writable_out(s[first + a].toTensor())) return std::nullopt;
    pl.is_out[a] = true;
  }
  for (size_t i = 0; i < n; ++i) {
    const c10::IValue& v = s[first + i];
    if (v.isGenerator()) return std::nullopt;
    if (pl.is_out[i]) continue;
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (t.defined() && t.device().is_privateuseone() && t.dim() > 0)
        pl.pos.push_back({static_cast<int>(i), -1, t});
    } else if (v.isTensorList()) {
      if (!kind || kind->kind != Kind::Cat) return std::nullopt;
      pl.list_arg = static_cast<int>(i);
      auto l = v.toTensorList();
      for (size_t j = 0; j < l.size(); ++j) {
        const at::Tensor t = l.get(j);
        if (!t.device().is_privateuseone() || t.dim() == 0) return std::nullopt;
        pl.pos.push_back({static_cast<int>(i), static_cast<int>(j), t});
      }
    } else if (v.isList() && !v.isIntList()) {
      return std::nullopt;  // lists of optional tensors (index's), of scalars
    }
  }
  if (pl.pos.empty()) return std::nullopt;
  for (const Pos& p : pl.pos)
    if (p.t.numel() == 0) return std::nullopt;

  pl.sig = call_signature(info, s, first, n);
  bool failed = false;
  pl.dyn = dynamic_dims(pl.sig, pl.pos, &failed);
  if (failed || std::all_of(pl.dyn.begin(), pl.dyn.end(), [](uint64_t m) { return m == 0; }))
    return std::nullopt;
  const bool padded =
      std::any_of(pl.dyn.begin(), pl.dyn.end(), [](uint64_t m) { return (m & ~kGeo) != 0; });
  if (padded && !kind) return std::nullopt;
  if (!padded) pl.kind = exact;
  if (padded && pl.kind.kind == Kind::Attention && !attention_dims(s, first, pl.pos, pl.dyn))
    return std::nullopt;
  pl.padded = padded;
  // Integer padding cannot hold an infinite neutral element.
  if (pl.kind.kind == Kind::Matmul || (pl.kind.kind == Kind::Reduce && std::isinf(pl.kind.neutral)))
    for (const Pos& p : pl.pos)
      if (!c10::isFloatingType(p.t.scalar_type())) return std::nullopt;

  // The exact output sizes: the out= tensors' (Strict sized them), else the
  // meta kernel's (a meta call costs more than the rest of the plan).
  const bool all_out = !info.ret_alias_arg.empty() &&
                       std::all_of(info.ret_alias_arg.begin(), info.ret_alias_arg.end(),
                                   [](int a) { return a >= 0; });
  if (all_out) {
    for (int a : info.ret_alias_arg) pl.out_sizes.push_back(s[first + a].toTensor().sizes().vec());
  } else {
    CallOutputs exact = call_outputs(op, info, s, first, n);
    for (int r : exact.ret_lists)
      if (r >= 0) return std::nullopt;  // a Tensor[] return
    for (size_t k = 0; k < exact.types.size(); ++k) {
      if (exact.undefined[k]) return std::nullopt;
      pl.out_sizes.push_back(exact.types[k].shape);
    }
  }
  for (const auto& sizes : pl.out_sizes)
    for (int64_t z : sizes)
      if (z == 0) return std::nullopt;
  if (pl.kind.kind == Kind::Cat) {
    if (pl.list_arg < 0 || pl.out_sizes.size() != 1) return std::nullopt;
    const int64_t rank = static_cast<int64_t>(pl.out_sizes[0].size());
    pl.cat_dim = c10::maybe_wrap_dim(s[first + pl.list_arg + 1].toInt(), rank);
    pl.cat_box = bucket(pl.out_sizes[0][pl.cat_dim]);
  }
  return pl;
}

}  // namespace

bool run_bucketed(const c10::OperatorHandle& op, const OpInfo& info, torch::jit::Stack* stack,
                  const CallKey& call, c10::function_ref<bool()> before) {
  torch::jit::Stack& s = *stack;
  if (!enabled() || ran_exact(call.key)) return false;
  std::optional<Plan> plan = plan_call(op, info, s, call);
  if (!plan || static_key(call.key) || (before && !before())) return false;
  const size_t first = call.first, n = call.n;
  const OpKind kind = plan->kind;
  const std::vector<bool>& is_out = plan->is_out;
  const std::vector<Pos>& pos = plan->pos;
  const std::vector<uint64_t>& dyn = plan->dyn;
  const int list_arg = plan->list_arg;
  const std::vector<std::vector<int64_t>>& out_sizes = plan->out_sizes;
  const int64_t cat_dim = plan->cat_dim, cat_box = plan->cat_box;

  // The bucketed key: the op, bucketed inputs by box, dyn dims, storage and
  // capacity; every other argument as Strict keys it.
  std::string key = "B";
  put(key, &info);
  std::vector<DeviceStorage*> slots;
  size_t next = 0;
  for (size_t i = 0; i < n; ++i) {
    const c10::IValue& v = s[first + i];
    auto key_pos = [&](const at::Tensor& t, size_t k) {
      if (!dyn[k]) return key_value(key, t, false, slots);
      const DeviceStorage& st = device_storage(t.storage());
      key.push_back('Y');
      put(key, static_cast<int8_t>(t.scalar_type()));
      for (int64_t z : box_of(t, dyn[k])) put(key, z);
      put(key, dyn[k]);
      put(key, static_cast<int16_t>(slot_index(slots, const_cast<DeviceStorage*>(&st))));
      put(key, static_cast<uint64_t>(st.nbytes));
      put(key, st.has_value() ? static_cast<int8_t>(st.dtype) : int8_t(-1));
    };
    if (is_out[i]) {
      key.push_back('O');
      put(key, static_cast<int8_t>(v.toTensor().scalar_type()));
      for (int64_t d : dim_order(v.toTensor())) put(key, static_cast<int8_t>(d));
      slot_index(slots, &device_storage(v.toTensor().storage()));
    } else if (next < pos.size() && pos[next].arg == static_cast<int>(i) && pos[next].sub < 0) {
      key_pos(pos[next].t, next);
      ++next;
    } else if (static_cast<int>(i) == list_arg) {
      key.push_back('L');
      while (next < pos.size() && pos[next].arg == static_cast<int>(i)) {
        key_pos(pos[next].t, next);
        ++next;
      }
    } else {
      key_value(key, v, info.scalar_arg[i] != 0, slots);
    }
  }
  put(key, cat_box);
  TORCH_INTERNAL_ASSERT(slots.size() == call.storages.size());

  auto entry = std::static_pointer_cast<const BucketEntry>(find_program(key));
  if (entry) {
    metrics().cache_hits++;
  } else {
    try {
      auto made = std::make_shared<BucketEntry>();
      // The arguments as the rule sees them: bucketed tensors become boxes.
      torch::jit::Stack boxed(s.begin() + first, s.begin() + first + n);
      for (size_t k = 0; k < pos.size(); ++k) {
        if (!dyn[k]) continue;
        at::Tensor m = at::empty(box_of(pos[k].t, dyn[k]), pos[k].t.options().device(c10::kMeta));
        if (pos[k].sub < 0) {
          boxed[pos[k].arg] = m;
        } else {
          auto l = boxed[pos[k].arg].toTensorList().copy();
          l.set(pos[k].sub, m);
          boxed[pos[k].arg] = l;
        }
      }
      // Outputs take the box's sizes from the meta kernel; with nothing padded
      // they keep their own (an in-place op such as copy_ does not resize).
      for (size_t i = 0; i < n; ++i) {
        if (!is_out[i]) continue;
        const at::Tensor o = boxed[i].toTensor();
        const std::vector<int64_t> sizes = plan->padded ? std::vector<int64_t>{0} : o.sizes().vec();
        boxed[i] = at::empty(sizes, o.options().device(c10::kMeta));
      }
      CallOutputs outs = call_outputs(op, info, boxed, 0, n);
      if (kind.kind == Kind::Cat) outs.types[0].shape[cat_dim] = cat_box;
      made->ret_lists = outs.ret_lists;
      Program p;
      for (DeviceStorage* st : call.storages) p.add_slot({st->has_value(), st->dtype, st->nbytes});
      std::vector<DeviceStorage*> storages = call.storages;
      SlotOf slot_of = [&](const at::Tensor& t) {
        return t.device().is_privateuseone() ? slot_index(storages, &device_storage(t.storage()))
                                             : -1;
      };
      CallCtx real(p, 0, info, s, first, slot_of, outs);
      BucketCtx ctx(p, info, boxed, real, pos, dyn, slot_of, outs, kind, made->geos);
      std::vector<Value> vals;
      if (kind.kind == Kind::Cat && std::any_of(pos.begin(), pos.end(), [&](const Pos& q) {
            return q.arg == list_arg && (dyn[&q - pos.data()] >> cat_dim & 1);
          })) {
        vals.push_back(lower_cat(ctx, pos, dyn, list_arg, cat_dim, outs.types[0]));
      } else {
        vals = (*info.rule)(ctx);
      }
      TORCH_CHECK(vals.size() == outs.types.size() && p.written.empty(), "[tpu] ", info.name,
                  ": not a bucketed op");
      std::vector<Value> results;
      for (size_t k = 0; k < vals.size(); ++k) {
        Value v = lower::coerce(p.b, vals[k], outs.types[k]);
        const int a = k < info.ret_alias_arg.size() ? info.ret_alias_arg[k] : -1;
        std::vector<int64_t> perm(v.rank());
        for (int64_t d = 0; d < v.rank(); ++d) perm[d] = d;
        if (a >= 0) perm = dim_order(s[first + a].toTensor());
        results.push_back(compact(ctx, v, k, perm));
        made->outs.push_back({false, -1, outs.types[k].dtype, {v.type.numel()}});
      }
      p.finish(results, *made);
      made->what = "aten::" + info.name + " (bucketed)";
      count_program(info.name + " (bucketed)");
      entry = made;
      add_program(key, entry);
    } catch (const std::exception& e) {
      // Not expressible at bucket sizes: the op runs at its exact sizes.
      if (std::getenv("TORCHTPU_DEBUG_BUCKETS"))
        std::fprintf(stderr, "[tpu] %s not bucketed: %s\n", info.name.c_str(), e.what());
      mark_failed(plan->sig);
      return false;
    }
  }
  std::vector<int64_t> extras;
  extras.reserve(entry->geos.size());
  for (const Geo& g : entry->geos) extras.push_back(geo_value(g, s, first, out_sizes));
  const int device = call.storages[0]->device;
  StackFeed feed(*entry, call, s, device, std::move(extras));
  std::vector<pjrt::BufferPtr> bufs;
  {
    TraceScope trace([&] { return "torchtpu::execute aten::" + info.name + " (bucketed)"; });
    bufs = launch(*entry, gather_inputs(*entry, feed, device), device,
                  [&] { return describe(info.name, s, first, n); });
  }
  // Outputs: into the out= tensors (their storages grown to the capacity),
  // or fresh tensors over capacity storages.
  c10::SmallVector<at::Tensor, 4> fresh;
  size_t k = 0;
  for (size_t r = 0; r < entry->ret_lists.size(); ++r, ++k) {
    const int a = r < info.ret_alias_arg.size() ? info.ret_alias_arg[r] : -1;
    const c10::ScalarType dt = lower::to_scalar_type(entry->outs[k].dtype);
    if (a >= 0) {
      const at::Tensor& out = s[first + a].toTensor();
      TORCH_INTERNAL_ASSERT(out.scalar_type() == dt);
      set_capacity(out.storage(), static_cast<size_t>(bufs[k]->numel()) * out.element_size());
      DeviceStorage& st = device_storage(out.storage());
      st.dtype = bufs[k]->dtype();
      st.buffer = std::move(bufs[k]);
      st.real_bytes = static_cast<size_t>(out.numel()) * out.element_size();
      st.real_of = st.buffer.get();
    } else {
      fresh.push_back(wrap_capacity(std::move(bufs[k]), out_sizes[k], dt, device));
    }
  }
  push_returns(info, entry->ret_lists, fresh, s, first);
  metrics().bucketed_calls++;
  return true;
}

}  // namespace torchtpu::aten
