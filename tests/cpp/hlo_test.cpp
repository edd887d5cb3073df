// Golden tests of the StableHLO text builder: text checks, then modules
// compiled and run on the stock CPU PJRT plugin.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "hlo/builder.h"
#include "hlo/work.h"
#include "pjrt/pjrt.h"

namespace torchtpu::hlo {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNan = std::numeric_limits<double>::quiet_NaN();

// A host tensor: type plus row-major bytes.
struct Host {
  Type type;
  std::vector<char> bytes;
  template <class T>
  static Host of(DType dt, Shape shape, const std::vector<T>& v) {
    Host h{Type{dt, std::move(shape)}, std::vector<char>(v.size() * sizeof(T))};
    EXPECT_EQ(static_cast<size_t>(h.type.numel()) * itemsize(dt), h.bytes.size());
    std::memcpy(h.bytes.data(), v.data(), h.bytes.size());
    return h;
  }
  template <class T>
  std::vector<T> vec() const {
    EXPECT_EQ(bytes.size() % sizeof(T), 0u);
    std::vector<T> v(bytes.size() / sizeof(T));
    std::memcpy(v.data(), bytes.data(), bytes.size());
    return v;
  }
};

Host f32(Shape s, std::vector<float> v) { return Host::of(DType::F32, std::move(s), v); }
Host i64(Shape s, std::vector<int64_t> v) { return Host::of(DType::I64, std::move(s), v); }

// One CPU client per test binary: loading the plugin takes about a second.
pjrt::ClientPtr client() {
  static pjrt::ClientPtr c =
      pjrt::Client::create(pjrt::Plugin::load(pjrt::find_plugin({TORCHTPU_SITE_PACKAGES})), {});
  return c;
}

// Compiles b's module, runs it on `args` and returns every output on the host.
std::vector<Host> run(const Builder& b, const std::vector<Host>& args = {}) {
  std::string text = b.module();
  pjrt::ExecutablePtr exe;
  try {
    exe = client()->compile(text);
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string(e.what()) + "\n--- module:\n" + text);
  }
  std::vector<pjrt::BufferPtr> in;
  std::vector<pjrt::Buffer*> raw;
  for (const Host& h : args) {
    in.push_back(client()->buffer_from_host(h.bytes.data(), h.type.dtype, h.type.shape, 0));
    raw.push_back(in.back().get());
  }
  std::vector<Host> out;
  for (const pjrt::BufferPtr& buf : exe->execute(raw, 0)) {
    Host h{Type{buf->dtype(), buf->dims()}, std::vector<char>(buf->nbytes())};
    buf->to_host(h.bytes.data(), h.bytes.size());
    out.push_back(std::move(h));
  }
  return out;
}

// Params for `args`, a body on them, run; returns all outputs.
template <class Fn>
std::vector<Host> run_fn(const std::vector<Host>& args, Fn&& body) {
  Builder b;
  std::vector<Value> ps;
  for (const Host& h : args) ps.push_back(b.param(h.type));
  b.ret(body(b, ps));
  return run(b, args);
}

template <class T>
void expect_vec(const Host& h, const Shape& shape, const std::vector<T>& want) {
  EXPECT_EQ(h.type.shape, shape);
  std::vector<T> got = h.vec<T>();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if constexpr (std::is_floating_point_v<T>) {
      if (std::isnan(want[i])) {
        EXPECT_TRUE(std::isnan(got[i])) << "at " << i;
        continue;
      }
    }
    EXPECT_EQ(got[i], want[i]) << "at " << i;
  }
}

size_t occurrences(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

template <class Fn>
std::string build_error(Fn&& fn) {
  try {
    fn();
  } catch (const BuildError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected BuildError";
  return "";
}

// ---------------------------------------------------------------- text

TEST(HloText, ModuleHasPublicMainAndDonor) {
  Builder b;
  Value x = b.param(Type{DType::F32, {2, 3}});
  b.param(Type{DType::F32, {}}, /*donate=*/true);
  b.ret({b.binary("add", x, x)});
  std::string m = b.module();
  EXPECT_NE(m.find("module @m {"), std::string::npos) << m;
  EXPECT_NE(m.find("func.func public @main(%arg0: tensor<2x3xf32>, %arg1: tensor<f32> "
                   "{jax.buffer_donor = true}) -> (tensor<2x3xf32>)"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("return %v"), std::string::npos) << m;
  EXPECT_EQ(b.num_params(), 2);
}

TEST(HloText, TypeStrings) {
  EXPECT_EQ((Type{DType::F32, {2, 3}}.str()), "tensor<2x3xf32>");
  EXPECT_EQ((Type{DType::Bool, {}}.str()), "tensor<i1>");
  EXPECT_EQ((Type{DType::U64, {0, 4}}.str()), "tensor<0x4xui64>");
  EXPECT_EQ((Type{DType::BF16, {5, 2}}.numel()), 10);
}

TEST(HloText, ConstantsAreExact) {
  Builder b;
  std::vector<Value> vs = {b.constant(0.1, DType::F64),   b.constant(kInf, DType::F32),
                           b.constant(-kInf, DType::F32), b.constant(kNan, DType::F32),
                           b.constant(kInf, DType::BF16), b.constant(-kInf, DType::F16),
                           b.constant(kInf, DType::F64),  b.constant(1.0, DType::Bool)};
  vs.push_back(b.constant_int(std::numeric_limits<int64_t>::min(), DType::I64));
  vs.push_back(b.constant_int(-1, DType::U64));
  vs.push_back(b.constant_int(300, DType::I8));
  b.ret(vs);
  std::string m = b.module();
  for (const char* want : {"dense<0.10000000000000001> : tensor<f64>",
                           "dense<0x7F800000> : tensor<f32>", "dense<0xFF800000> : tensor<f32>",
                           "dense<0x7FC00000> : tensor<f32>", "dense<0x7F80> : tensor<bf16>",
                           "dense<0xFC00> : tensor<f16>", "dense<0x7FF0000000000000> : tensor<f64>",
                           "dense<true> : tensor<i1>", "dense<-9223372036854775808> : tensor<i64>",
                           "dense<18446744073709551615> : tensor<ui64>", "dense<44> : tensor<i8>"})
    EXPECT_NE(m.find(want), std::string::npos) << want << "\n" << m;
}

TEST(HloText, MultiResultValuesAreIndexed) {
  Builder b;
  Value k = b.param(Type{DType::F32, {4}});
  Value i = b.iota(Type{DType::I64, {4}}, 0);
  std::vector<Value> s = b.sort({k, i}, 0, false);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_NE(s[0].id, s[1].id);
  EXPECT_EQ(s[1].type, i.type);
  b.ret({s[1]});
  std::string m = b.module();
  EXPECT_NE(m.find(":2 = \"stablehlo.sort\""), std::string::npos) << m;
  EXPECT_NE(m.find("#1 : tensor<4xi64>"), std::string::npos) << m;
}

// A backend kernel's call: its config escaped as a string attribute, operands
// row-major, results in the layouts given.
TEST(HloText, CustomCallCarriesConfigAndLayouts) {
  Builder b;
  Value q = b.param(Type{DType::BF16, {2, 3, 4, 8}});
  std::vector<Value> r = b.custom_call("__cudnn$fmhaSoftmax", {q}, {q.type, Type{DType::U8, {0}}},
                                       R"({"a":"x\y"})", {{3, 1, 2, 0}, {0}});
  ASSERT_EQ(r.size(), 2u);
  b.ret({r[0]});
  std::string m = b.module();
  EXPECT_NE(m.find("call_target_name = \"__cudnn$fmhaSoftmax\", api_version = 2 : i32"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find(R"(backend_config = "{\"a\":\"x\\y\"}")"), std::string::npos) << m;
  EXPECT_NE(m.find("operand_layouts = [dense<[3, 2, 1, 0]> : tensor<4xindex>]"), std::string::npos)
      << m;
  EXPECT_NE(m.find("result_layouts = [dense<[3, 1, 2, 0]> : tensor<4xindex>, dense<[0]> : "
                   "tensor<1xindex>]"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("-> (tensor<2x3x4x8xbf16>, tensor<0xui8>)"), std::string::npos) << m;
}

// Element types StableHLO does not define an op on are DTypeErrors at build
// time, not a module the compiler rejects.
TEST(HloText, FloatDotsAndConvolutionsCarryThePrecisionSet) {
  auto text = [](DType d) {
    Builder b;
    Value x = b.param(Type{d, {1, 2, 3}});
    b.ret(
        {b.dot_general(x, x, {0}, {0}, {2}, {2}, d), b.convolution(x, x, {}, {}, {}, {}, 1, 1, d)});
    return b.module();
  };
  auto count = [](const std::string& s, const std::string& what) {
    size_t n = 0;
    for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
    return n;
  };
  const FloatPrecision was = float_precision();
  EXPECT_EQ(count(text(DType::F32), "precision HIGHEST>"), 4u);  // the default: IEEE f32
  set_float_precision({Precision::High, Precision::Default});
  std::string f32 = text(DType::F32);
  EXPECT_EQ(count(f32, "precision HIGH>"), 2u) << f32;     // the dot's two operands
  EXPECT_EQ(count(f32, "precision DEFAULT>"), 2u) << f32;  // the convolution's
  // Lower-precision types have nothing to round more: always DEFAULT.
  set_float_precision({Precision::Highest, Precision::Highest});
  EXPECT_EQ(count(text(DType::BF16), "precision DEFAULT>"), 4u);
  EXPECT_EQ(count(text(DType::F64), "precision DEFAULT>"), 4u);
  set_float_precision(was);
}

TEST(HloText, UndefinedElementTypesAreDTypeErrors) {
  Builder b;
  Value i = b.param(Type{DType::I32, {3}});
  Value p = b.param(Type{DType::Bool, {3}});
  Value f = b.param(Type{DType::F32, {3}});
  auto dtype_error = [](auto&& fn) -> std::string {
    try {
      fn();
    } catch (const DTypeError& e) {
      return e.what();
    }
    ADD_FAILURE() << "expected DTypeError";
    return "";
  };
  EXPECT_NE(dtype_error([&] { b.unary("floor", i); }).find("[hlo] floor takes floating-point"),
            std::string::npos);
  EXPECT_NE(dtype_error([&] { b.unary("logistic", p); }).find("tensor<3xi1>"), std::string::npos);
  EXPECT_NE(dtype_error([&] { b.binary("subtract", p, p); }).find("no boolean"), std::string::npos);
  EXPECT_NE(dtype_error([&] { b.binary("and", f, f); }).find("integer or boolean"),
            std::string::npos);
  EXPECT_NE(dtype_error([&] {
              b.iota(Type{DType::Bool, {3}}, 0);
            }).find("iota"),
            std::string::npos);
  EXPECT_NE(dtype_error([&] { b.chlo("lgamma", {i}, i.type); }).find("chlo.lgamma"),
            std::string::npos);
  // The same ops on the types they take build.
  b.unary("floor", f);
  b.binary("subtract", i, i);
  b.binary("and", p, p);
  b.iota(Type{DType::I32, {3}}, 0);
}

TEST(HloText, ShapeErrorsNameTheOp) {
  Builder b;
  Value x = b.param(Type{DType::F32, {2, 3}});
  Value y = b.param(Type{DType::F32, {3, 2}});
  Value n = b.param(Type{DType::I32, {2, 3}});
  EXPECT_NE(build_error([&] { b.binary("add", x, y); }).find("[hlo] add: operand types differ"),
            std::string::npos);
  EXPECT_NE(build_error([&] { b.reshape(x, {4}); }).find("[hlo] reshape:"), std::string::npos);
  EXPECT_NE(build_error([&] {
              b.transpose(x, {0, 0});
            }).find("[hlo] transpose:"),
            std::string::npos);
  EXPECT_NE(build_error([&] {
              b.dot_general(x, x, {}, {}, {1}, {0}, DType::F32);
            }).find("[hlo] dot_general:"),
            std::string::npos);
  EXPECT_NE(build_error([&] { b.select(x, x, x); }).find("[hlo] select:"), std::string::npos);
  EXPECT_NE(build_error([&] { b.take_along(x, b.convert(x, DType::F64), 0); }).find("take_along"),
            std::string::npos);
  EXPECT_NE(build_error([&] {
              b.broadcast_in_dim(y, {2, 3}, {0, 1});
            }).find("broadcast_in_dim"),
            std::string::npos);
  EXPECT_NE(build_error([&] { b.compare(Cmp::LT, x, n); }).find("[hlo] compare:"),
            std::string::npos);
  EXPECT_NE(build_error([&] { b.module(); }).find("ret() was not called"), std::string::npos);
  Value forged{999, x.type};
  EXPECT_NE(build_error([&] { b.unary("negate", forged); }).find("invalid Value"),
            std::string::npos);
  b.ret({x});
  EXPECT_NE(build_error([&] { b.ret({x}); }).find("[hlo] ret:"), std::string::npos);
}

// ---------------------------------------------------------------- run: elementwise, constants

TEST(HloRun, Elementwise) {
  Host a = f32({4}, {1.5f, -2.f, 0.f, 3.f}), c = f32({4}, {1.f, 1.f, 0.f, 5.f});
  auto out = run_fn({a, c}, [](Builder& b, std::vector<Value> p) {
    Value lt = b.compare(Cmp::LT, p[0], p[1]);
    Value lo = b.splat(-1, p[0].type), hi = b.splat(2, p[0].type);
    return std::vector<Value>{
        b.binary("add", p[0], p[1]),
        b.unary("negate", p[0]),
        lt,
        b.select(lt, p[0], p[1]),
        b.convert(p[0], DType::I32),
        b.convert(b.convert(p[0], DType::Bool), DType::F32),
        b.clamp(lo, p[0], hi),
        b.bitcast_convert(p[1], DType::U32),
        b.compare(Cmp::EQ, b.convert(p[1], DType::U8), b.splat(1, Type{DType::U8, {4}}))};
  });
  ASSERT_EQ(out.size(), 9u);
  expect_vec<float>(out[0], {4}, {2.5f, -1.f, 0.f, 8.f});
  expect_vec<float>(out[1], {4}, {-1.5f, 2.f, -0.f, -3.f});
  expect_vec<uint8_t>(out[2], {4}, {0, 1, 0, 1});
  expect_vec<float>(out[3], {4}, {1.f, -2.f, 0.f, 3.f});
  expect_vec<int32_t>(out[4], {4}, {1, -2, 0, 3});
  expect_vec<float>(out[5], {4}, {1.f, 1.f, 0.f, 1.f});
  expect_vec<float>(out[6], {4}, {1.5f, -1.f, 0.f, 2.f});
  expect_vec<uint32_t>(out[7], {4}, {0x3F800000u, 0x3F800000u, 0u, 0x40A00000u});
  expect_vec<uint8_t>(out[8], {4}, {1, 1, 0, 0});
}

TEST(HloRun, UnaryOpsAndDonatedParam) {
  Builder b;
  Value x = b.param(Type{DType::F32, {3}}, /*donate=*/true);
  Value inf = b.splat(kInf, x.type);
  Value y = b.binary("divide", x, b.select(b.compare(Cmp::GT, x, b.splat(0, x.type)), x, inf));
  b.ret({b.unary("exponential", b.binary("subtract", x, x)), b.unary("is_finite", y),
         b.unary("not", b.unary("is_finite", y)), b.unary("abs", x)});
  auto out = run(b, {f32({3}, {2, -1, 0})});
  expect_vec<float>(out[0], {3}, {1, 1, 1});
  expect_vec<uint8_t>(out[1], {3}, {1, 1, 1});  // 2/2, -1/inf, 0/inf
  expect_vec<uint8_t>(out[2], {3}, {0, 0, 0});
  expect_vec<float>(out[3], {3}, {2, 1, 0});
}

TEST(HloRun, PackedScalarsArriveAfterParamsOnePackPerDtype) {
  Builder b;
  Value a = b.packed_scalar(DType::F64);
  Value x = b.param(Type{DType::F32, {2}});
  Value k = b.packed_scalar(DType::I64);
  Value c = b.packed_scalar(DType::F64);
  auto as_f32 = [&](Value s) { return b.broadcast_in_dim(b.convert(s, DType::F32), {2}, {}); };
  b.ret({b.binary("add", b.binary("multiply", x, as_f32(a)), as_f32(c)), as_f32(k)});
  using P = std::pair<DType, int>;
  EXPECT_EQ(b.packs(), (std::vector<P>{{DType::F64, 2}, {DType::I64, 1}}));
  EXPECT_NE(b.module().find("%arg0: tensor<2xf32>, %pack0: tensor<2xf64>, %pack1: tensor<1xi64>"),
            std::string::npos);
  auto out =
      run(b, {f32({2}, {1, 2}), Host::of<double>(DType::F64, {2}, {3.0, 0.5}), i64({1}, {7})});
  expect_vec<float>(out[0], {2}, {3.5f, 6.5f});
  expect_vec<float>(out[1], {2}, {7.f, 7.f});
}

TEST(HloRun, ConstantsRoundTrip) {
  Builder b;
  auto f = [&](double v, DType t) { return b.convert(b.constant(v, t), DType::F64); };
  std::vector<Value> fl = {f(0.1, DType::F64),     f(0.1, DType::F32),   f(kInf, DType::F32),
                           f(-kInf, DType::F64),   f(kNan, DType::F32),  f(1.5, DType::BF16),
                           f(kInf, DType::BF16),   f(65504, DType::F16), f(1e6, DType::F16),
                           f(0x1p-24, DType::F16), f(1e-40, DType::F32), f(-3.75, DType::I32)};
  Value fv = b.concatenate(
      [&] {
        std::vector<Value> r;
        for (Value v : fl) r.push_back(b.reshape(v, {1}));
        return r;
      }(),
      0);
  std::vector<Value> iv;
  for (int64_t v :
       {std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), int64_t{-7}})
    iv.push_back(b.reshape(b.constant_int(v, DType::I64), {1}));
  Value u = b.constant_int(-1, DType::U64);
  Value io = b.iota(Type{DType::I32, {2, 3}}, 1);
  b.ret({fv, b.concatenate(iv, 0), u, io, b.splat(true, Type{DType::Bool, {2}})});
  auto out = run(b);
  expect_vec<double>(out[0], {12},
                     {0.1, static_cast<double>(0.1f), kInf, -kInf, kNan, 1.5, kInf, 65504, kInf,
                      0x1p-24, static_cast<double>(1e-40f), -3.0});
  expect_vec<int64_t>(
      out[1], {3}, {std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), -7});
  expect_vec<uint64_t>(out[2], {}, {~uint64_t{0}});
  expect_vec<int32_t>(out[3], {2, 3}, {0, 1, 2, 0, 1, 2});
  expect_vec<uint8_t>(out[4], {2}, {1, 1});
}

// ---------------------------------------------------------------- run: shape ops

TEST(HloRun, ShapeOps) {
  Host x = f32({2, 3}, {0, 1, 2, 3, 4, 5});
  auto out = run_fn({x}, [](Builder& b, std::vector<Value> p) {
    Value x = p[0], zero = b.constant(0, DType::F32);
    Value i1 = b.constant_int(1, DType::I32), i0 = b.constant_int(0, DType::I64);
    return std::vector<Value>{
        b.reshape(x, {3, 2}),
        b.broadcast_in_dim(b.reshape(b.slice(x, {0, 0}, {1, 3}, {}), {3}), {2, 3}, {1}),
        b.transpose(x, {1, 0}),
        b.slice(x, {0, 0}, {2, 3}, {1, 2}),
        b.concatenate({x, x}, 1),
        b.pad(x, zero, {1, -1}, {0, 1}, {0, 1}),
        b.dynamic_slice(x, {i1, i1}, {1, 2}),
        b.dynamic_update_slice(x, b.splat(9, Type{DType::F32, {1, 2}}), {i1, i0}),
        b.reverse(x, {0, 1})};
  });
  ASSERT_EQ(out.size(), 9u);
  expect_vec<float>(out[0], {3, 2}, {0, 1, 2, 3, 4, 5});
  expect_vec<float>(out[1], {2, 3}, {0, 1, 2, 0, 1, 2});
  expect_vec<float>(out[2], {3, 2}, {0, 3, 1, 4, 2, 5});
  expect_vec<float>(out[3], {2, 2}, {0, 2, 3, 5});
  expect_vec<float>(out[4], {2, 6}, {0, 1, 2, 0, 1, 2, 3, 4, 5, 3, 4, 5});
  // rows: [pad, x0, x1]; cols: drop first of [x, 0, x, 0, x] then pad 1.
  expect_vec<float>(out[5], {3, 5}, {0, 0, 0, 0, 0, 0, 1, 0, 2, 0, 0, 4, 0, 5, 0});
  expect_vec<float>(out[6], {1, 2}, {4, 5});
  expect_vec<float>(out[7], {2, 3}, {0, 1, 2, 9, 9, 5});
  expect_vec<float>(out[8], {2, 3}, {5, 4, 3, 2, 1, 0});
}

// ---------------------------------------------------------------- run: reductions

TEST(HloRun, Reduce) {
  Host x = f32({2, 3}, {1, 5, 2, -1, 4, 3});
  Host m = Host::of<uint8_t>(DType::Bool, {2, 2}, {0, 1, 0, 0});
  auto out = run_fn({x, m}, [](Builder& b, std::vector<Value> p) {
    Value z = b.constant(0, DType::F32), lo = b.constant(-kInf, DType::F32);
    return std::vector<Value>{b.reduce(p[0], z, {1}, Reducer::Add),
                              b.reduce(p[0], lo, {0, 1}, Reducer::Max),
                              b.reduce(p[0], b.constant(1, DType::F32), {0}, Reducer::Mul),
                              b.reduce(p[1], b.constant(0, DType::Bool), {1}, Reducer::Or)};
  });
  expect_vec<float>(out[0], {2}, {8, 6});
  expect_vec<float>(out[1], {}, {5});
  expect_vec<float>(out[2], {3}, {-1, 20, 6});
  expect_vec<uint8_t>(out[3], {2}, {1, 0});
}

TEST(HloRun, ReduceEachIsOneVariadicReduce) {
  Host x = f32({2, 3}, {1, 5, 2, -1, 4, 3});
  Host y = f32({2, 3}, {0, 1, 0, 2, 0, 3});
  auto out = run_fn({x, y}, [](Builder& b, std::vector<Value> p) {
    Value z = b.constant(0, DType::F32);
    std::vector<Value> sums = b.reduce_each({p[0], p[1], p[0]}, z, {0}, Reducer::Add);
    std::vector<Value> maxes =
        b.reduce_each({p[0], p[1]}, b.constant(-kInf, DType::F32), {0, 1}, Reducer::Max);
    sums.insert(sums.end(), maxes.begin(), maxes.end());
    return sums;
  });
  ASSERT_EQ(out.size(), 5u);
  expect_vec<float>(out[0], {3}, {0, 9, 5});
  expect_vec<float>(out[1], {3}, {2, 1, 3});
  expect_vec<float>(out[2], {3}, {0, 9, 5});
  expect_vec<float>(out[3], {}, {5});
  expect_vec<float>(out[4], {}, {3});
  // One reduce op for all three sums; shapes must agree.
  Builder b;
  Value a = b.param(Type{DType::F32, {2, 3}}), c = b.param(Type{DType::F32, {3, 2}});
  b.ret(b.reduce_each({a, a, a}, b.constant(0, DType::F32), {1}, Reducer::Add));
  std::string m = b.module();
  EXPECT_EQ(occurrences(m, "stablehlo.reduce"), 1u) << m;
  EXPECT_NE(build_error([&] {
              b.reduce_each({a, c}, b.constant(0, DType::F32), {0}, Reducer::Add);
            }).find("differ"),
            std::string::npos);
}

TEST(HloRun, ReduceArgTiesAndNan) {
  float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  Host x = f32({4, 4}, {1, 3, 3, 2,  //
                        1, nan, 5, nan, -inf, -inf, -inf, -inf, 2, 0, 0, 7});
  Host n = Host::of<int32_t>(DType::I32, {5}, {4, -9, 4, -9, 0});
  auto out = run_fn({x, n}, [](Builder& b, std::vector<Value> p) {
    auto [mx, amx] = b.reduce_arg(p[0], 1, true);
    auto [mn, amn] = b.reduce_arg(p[0], 1, false);
    auto [imx, iamx] = b.reduce_arg(p[1], 0, true);
    auto [imn, iamn] = b.reduce_arg(p[1], 0, false);
    auto [cmx, camx] = b.reduce_arg(p[0], 0, true);
    return std::vector<Value>{mx, amx, mn, amn, imx, iamx, imn, iamn, camx};
  });
  expect_vec<float>(out[0], {4}, {3, nan, -inf, 7});
  expect_vec<int64_t>(out[1], {4}, {1, 1, 0, 3});
  expect_vec<float>(out[2], {4}, {1, nan, -inf, 0});
  expect_vec<int64_t>(out[3], {4}, {0, 1, 0, 1});
  expect_vec<int32_t>(out[4], {}, {4});
  expect_vec<int64_t>(out[5], {}, {0});
  expect_vec<int32_t>(out[6], {}, {-9});
  expect_vec<int64_t>(out[7], {}, {1});
  expect_vec<int64_t>(out[8], {4}, {3, 1, 1, 1});
}

// Float max/min reduces fold by compare and select (XLA:CPU runs a maximum
// reducer as a slow scalar loop); NaN must still win from any position.
TEST(HloRun, FloatMaxMinFoldBySelectAndKeepNan) {
  float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  Host x = f32({4, 3}, {nan, 1, 2, 1, nan, 2, 1, 2, nan, -inf, -inf, -inf});
  auto out = run_fn({x}, [](Builder& b, std::vector<Value> p) {
    Value lo = b.constant(-kInf, DType::F32), hi = b.constant(kInf, DType::F32);
    std::vector<Value> both = b.reduce_each({p[0], p[0]}, lo, {1}, Reducer::Max);
    return std::vector<Value>{b.reduce(p[0], lo, {1}, Reducer::Max),
                              b.reduce(p[0], hi, {1}, Reducer::Min), both[1],
                              b.reduce_window(p[0], lo, Reducer::Max, {1, 2}, {}, {}, {}),
                              b.reduce(p[0], hi, {0}, Reducer::Min)};
  });
  expect_vec<float>(out[0], {4}, {nan, nan, nan, -inf});
  expect_vec<float>(out[1], {4}, {nan, nan, nan, -inf});
  expect_vec<float>(out[2], {4}, {nan, nan, nan, -inf});
  expect_vec<float>(out[3], {4, 2}, {nan, 2, nan, nan, 2, nan, -inf, -inf});
  expect_vec<float>(out[4], {3}, {nan, nan, nan});
  Builder b;
  Value a = b.param(Type{DType::F32, {2, 3}}), i = b.param(Type{DType::I32, {2, 3}});
  b.ret({b.reduce(a, b.constant(-kInf, DType::F32), {1}, Reducer::Max),
         b.reduce(i, b.constant_int(0, DType::I32), {1}, Reducer::Max)});
  std::string m = b.module();
  EXPECT_NE(m.find("stablehlo.select"), std::string::npos) << m;
  // Integers have no NaN: their reduce keeps the one op.
  EXPECT_EQ(m.find("stablehlo.maximum"), m.rfind("stablehlo.maximum")) << m;
  EXPECT_NE(m.find("stablehlo.maximum"), std::string::npos) << m;
}

// Float and int arg-reductions are two one-value reduces (the extreme, then the
// least index holding it), not one variadic reduce with a comparator.
TEST(HloText, ReduceArgIsTwoPlainReduces) {
  for (DType t : {DType::F32, DType::I32}) {
    Builder b;
    auto [v, i] = b.reduce_arg(b.param(Type{t, {4, 6}}), 1, true);
    b.ret({v, i});
    std::string m = b.module();
    EXPECT_EQ(occurrences(m, "\"stablehlo.reduce\""), 2u) << m;
    EXPECT_EQ(m.find(":2 = \"stablehlo.reduce\""), std::string::npos) << m;
  }
}

TEST(HloRun, TopKIsDescendingWithTiesByIndex) {
  Host x = f32({2, 4}, {1, 5, 5, -2, 0, -1, 3, 3});
  auto out = run_fn({x}, [](Builder& b, std::vector<Value> p) {
    auto [v, i] = b.top_k(p[0], 3);
    return std::vector<Value>{v, i};
  });
  expect_vec<float>(out[0], {2, 3}, {5, 5, 1, 3, 3, 0});
  expect_vec<int32_t>(out[1], {2, 3}, {1, 2, 0, 2, 3, 0});
  Builder b;
  Value a = b.param(Type{DType::F32, {2, 4}});
  EXPECT_NE(build_error([&] { b.top_k(a, 5); }).find("top_k"), std::string::npos);
}

// Values of up to 32 bits sort as one u64 key (value order, then index) under a
// bare unstable compare, which XLA:CPU runs as std::sort; the result is still
// torch's stable sort: NaN largest, -0.0 equal to 0.0, ties by index, and the
// values come back bit for bit (sign of zero and of NaN included).
TEST(HloRun, SortIndexedPacksValueAndIndex) {
  float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  Host x = f32({2, 6}, {1, nan, -0.0f, 0.0f, -nan, 1, 3, -inf, 2, 2, inf, -1});
  Host n = Host::of(DType::I32, {3, 2}, std::vector<int32_t>{5, -7, 5, 2, -7, 2});
  auto out = run_fn({x, n}, [](Builder& b, std::vector<Value> p) {
    auto up = b.sort_indexed(p[0], 1, false), down = b.sort_indexed(p[0], 1, true);
    auto cols = b.sort_indexed(p[1], 0, false);
    return std::vector<Value>{up.first,    up.second,  down.first,
                              down.second, cols.first, cols.second};
  });
  expect_vec<float>(out[0], {2, 6}, {0, 0, 1, 1, nan, nan, -inf, -1, 2, 2, 3, inf});
  expect_vec<int64_t>(out[1], {2, 6}, {2, 3, 0, 5, 1, 4, 1, 5, 2, 3, 0, 4});
  expect_vec<float>(out[2], {2, 6}, {nan, nan, 1, 1, 0, 0, inf, 3, 2, 2, -1, -inf});
  expect_vec<int64_t>(out[3], {2, 6}, {1, 4, 0, 5, 2, 3, 4, 0, 2, 3, 5, 1});
  std::vector<float> up = out[0].vec<float>(), down = out[2].vec<float>();
  EXPECT_TRUE(std::signbit(up[0]) && !std::signbit(up[1]));      // -0.0 first: index 2
  EXPECT_TRUE(!std::signbit(up[4]) && std::signbit(up[5]));      // -NaN second: index 4
  EXPECT_TRUE(std::signbit(down[4]) && !std::signbit(down[5]));  // zeros in index order
  expect_vec<int32_t>(out[4], {3, 2}, {-7, -7, 5, 2, 5, 2});
  expect_vec<int64_t>(out[5], {3, 2}, {2, 0, 0, 1, 1, 2});
  // One single-operand unstable sort per call; 64-bit values take two (low half,
  // then high half), and no sort keeps a comparator over two operands.
  for (DType t : {DType::F32, DType::BF16, DType::I8, DType::Bool, DType::F64, DType::I64}) {
    Builder b;
    auto [v, i] = b.sort_indexed(b.param(Type{t, {4, 6}}), 0, false);
    b.ret({v, i});
    std::string m = b.module();
    const size_t sorts = itemsize(t) == 8 ? 2 : 1;
    EXPECT_EQ(occurrences(m, "\"stablehlo.sort\""), sorts) << m;
    EXPECT_EQ(occurrences(m, "is_stable = false"), sorts) << m;
    EXPECT_EQ(occurrences(m, "(tensor<6x4xui64>) -> tensor<6x4xui64>"), sorts) << m;
  }
}

// 64-bit values sort stably in two passes: ties by index, NaN largest, -0.0 equal
// to 0.0, extremes of int64 in order, values bit for bit.
TEST(HloRun, SortIndexedWideTakesTwoPasses) {
  double nan = std::numeric_limits<double>::quiet_NaN();
  Host d = Host::of(DType::F64, {7}, std::vector<double>{1, nan, -0.0, 0.0, -nan, 1, -1e300});
  const int64_t lo = std::numeric_limits<int64_t>::min(), hi = std::numeric_limits<int64_t>::max();
  Host n = i64({6}, {hi, 5, lo, 5, -1, (int64_t{1} << 32) + 5});
  auto out = run_fn({d, n}, [](Builder& b, std::vector<Value> p) {
    auto up = b.sort_indexed(p[0], 0, false), down = b.sort_indexed(p[1], 0, true);
    return std::vector<Value>{up.first, up.second, down.first, down.second};
  });
  expect_vec<double>(out[0], {7}, {-1e300, 0, 0, 1, 1, nan, nan});
  expect_vec<int64_t>(out[1], {7}, {6, 2, 3, 0, 5, 1, 4});
  EXPECT_TRUE(std::signbit(out[0].vec<double>()[1]));  // the -0.0 at index 2
  expect_vec<int64_t>(out[2], {6}, {hi, (int64_t{1} << 32) + 5, 5, 5, -1, lo});
  expect_vec<int64_t>(out[3], {6}, {0, 5, 1, 3, 4, 2});
}

// The k-th smallest along a dim by its key bits, NaN largest and -0.0 equal to 0.0;
// the index is the value's first position, and the value comes back bit for bit.
TEST(HloRun, KthSmallestSelectsByKeyBits) {
  float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  Host x = f32({2, 6}, {1, nan, -0.0f, 0.0f, -nan, 1, 3, -inf, 2, 2, inf, -1});
  Host n = Host::of(DType::I32, {3, 2}, std::vector<int32_t>{5, -7, 5, 2, -7, 2});
  Host d = Host::of(DType::F64, {4}, std::vector<double>{2.5, -1, 7, 0});
  auto out = run_fn(
      {x, n, d, i64({2, 1}, {2, 3}), i64({2, 1}, {0, 5}), i64({1, 2}, {1, 2}), i64({1}, {2})},
      [](Builder& b, std::vector<Value> p) {
        auto mid = b.kth_smallest(p[0], 1, p[3]);
        auto ends = b.kth_smallest(p[0], 1, p[4]);
        auto cols = b.kth_smallest(p[1], 0, p[5]);
        return std::vector<Value>{mid.first,
                                  mid.second,
                                  ends.first,
                                  ends.second,
                                  cols.first,
                                  cols.second,
                                  b.kth_smallest(p[2], 0, p[6]).first};
      });
  expect_vec<float>(out[0], {2, 1}, {1, 2});
  expect_vec<int64_t>(out[1], {2, 1}, {0, 2});
  expect_vec<float>(out[2], {2, 1}, {0, inf});
  expect_vec<int64_t>(out[3], {2, 1}, {2, 4});
  EXPECT_TRUE(std::signbit(out[2].vec<float>()[0]));  // the -0.0 at index 2, as it was
  expect_vec<int32_t>(out[4], {1, 2}, {5, 2});
  expect_vec<int64_t>(out[5], {1, 2}, {0, 1});
  expect_vec<double>(out[6], {1}, {2.5});  // 64-bit values take the sort
  Host row = f32({1, 5}, {nan, 4, nan, 4, 1});
  auto last = run_fn({row, i64({1, 1}, {3})}, [](Builder& b, std::vector<Value> p) {
    auto r = b.kth_smallest(p[0], 1, p[1]);
    return std::vector<Value>{r.first, r.second};
  });
  expect_vec<float>(last[0], {1, 1}, {nan});
  expect_vec<int64_t>(last[1], {1, 1}, {0});  // the first NaN
}

TEST(HloRun, ReduceWindow) {
  Host x = f32({2, 4}, {1, 3, 2, 5, 4, 0, 6, 1});
  auto out = run_fn({x}, [](Builder& b, std::vector<Value> p) {
    Value lo = b.constant(-kInf, DType::F32), z = b.constant(0, DType::F32);
    return std::vector<Value>{
        b.reduce_window(p[0], lo, Reducer::Max, {2, 2}, {1, 2}, {}, {}),
        b.reduce_window(p[0], z, Reducer::Add, {1, 4}, {}, {0, 3}, {0, 0}),  // cumsum along dim 1
        b.reduce_window(p[0], lo, Reducer::Max, {1, 3}, {1, 2}, {0, 1}, {0, 1})};
  });
  expect_vec<float>(out[0], {1, 2}, {4, 6});
  expect_vec<float>(out[1], {2, 4}, {1, 4, 6, 11, 4, 4, 10, 11});
  expect_vec<float>(out[2], {2, 2}, {3, 5, 4, 6});
}

// ---------------------------------------------------------------- run: dot

TEST(HloRun, DotGeneralBatched) {
  Host a = f32({2, 2, 3}, {1, 2, 3, 4, 5, 6, 1, 0, 0, 0, 1, 0});
  Host c = f32({2, 3, 2}, {1, 0, 0, 1, 1, 1, 7, 8, 9, 10, 11, 12});
  auto out = run_fn({a, c}, [](Builder& b, std::vector<Value> p) {
    Value m = b.slice(p[0], {0, 0, 0}, {1, 2, 3}, {});
    return std::vector<Value>{
        b.dot_general(p[0], p[1], {0}, {0}, {2}, {1}, DType::F32),
        b.dot_general(b.reshape(m, {2, 3}), b.reshape(m, {2, 3}), {}, {}, {1}, {1}, DType::F32),
        b.dot_general(b.convert(p[0], DType::BF16), b.convert(p[1], DType::BF16), {0}, {0}, {2},
                      {1}, DType::F32)};
  });
  expect_vec<float>(out[0], {2, 2, 2}, {4, 5, 10, 11, 7, 8, 9, 10});
  expect_vec<float>(out[1], {2, 2}, {14, 32, 32, 77});
  expect_vec<float>(out[2], {2, 2, 2}, {4, 5, 10, 11, 7, 8, 9, 10});
}

// ---------------------------------------------------------------- run: indexing

TEST(HloRun, GatherAndScatterAlong) {
  Host x = f32({2, 3}, {0, 1, 2, 3, 4, 5});
  Host idx = Host::of<int32_t>(DType::I32, {2, 2}, {2, 0, 1, 1});
  Host rows = i64({3}, {1, 0, 1});
  Host upd = f32({2, 3}, {10, 20, 30, 40, 50, 60});
  Host idx0 = i64({2, 2}, {1, 0, 0, 1});
  auto out = run_fn({x, idx, rows, upd, idx0}, [](Builder& b, std::vector<Value> p) {
    Value x = p[0], idx = p[1], u = p[3];
    Value zeros = b.splat(0, x.type), u22 = b.slice(u, {0, 0}, {2, 2}, {});
    return std::vector<Value>{
        b.take_along(x, idx, 1), b.take_along(x, b.slice(idx, {1, 0}, {2, 2}, {}), 0),
        b.index_select(x, p[2], 0), b.index_select(x, p[2], 1),
        // Replace with an index smaller than the (2x3) updates: only its corner is read.
        b.scatter_along(zeros, b.slice(idx, {0, 0}, {1, 2}, {}), u, 1, /*add=*/false),
        b.scatter_along(x, idx, u, 1, /*add=*/true), b.scatter_along(zeros, p[4], u22, 0, true)};
  });
  expect_vec<float>(out[0], {2, 2}, {2, 0, 4, 4});
  expect_vec<float>(out[1], {1, 2}, {3, 4});
  expect_vec<float>(out[2], {3, 3}, {3, 4, 5, 0, 1, 2, 3, 4, 5});
  expect_vec<float>(out[3], {2, 3}, {1, 0, 1, 4, 3, 4});
  expect_vec<float>(out[4], {2, 3}, {20, 0, 10, 0, 0, 0});
  expect_vec<float>(out[5], {2, 3}, {20, 1, 12, 3, 94, 5});  // duplicates accumulate
  expect_vec<float>(out[6], {2, 3}, {40, 20, 0, 10, 50, 0});
}

TEST(HloRun, ScatterSlices) {
  Host x = f32({2, 3}, {0, 1, 2, 3, 4, 5});
  Host rows = i64({3}, {1, 0, 1});
  Host cols = Host::of<int32_t>(DType::I32, {2}, {2, 0});
  Host u3 = f32({3, 3}, {10, 20, 30, 40, 50, 60, 70, 80, 90});
  Host u2 = f32({2, 2}, {1, 2, 3, 4});
  auto out = run_fn({x, rows, cols, u3, u2}, [](Builder& b, std::vector<Value> p) {
    return std::vector<Value>{b.scatter_slices(p[0], p[1], p[3], 0, /*add=*/true),
                              b.scatter_slices(p[0], p[2], p[4], 1, /*add=*/false)};
  });
  expect_vec<float>(out[0], {2, 3}, {40, 51, 62, 83, 104, 125});  // rows 0 and 2 add to row 1
  expect_vec<float>(out[1], {2, 3}, {2, 1, 1, 4, 4, 3});
  Builder b;
  Value x2 = b.param(Type{DType::F32, {2, 3}}), i2 = b.param(Type{DType::I64, {2}});
  std::string err = build_error([&] {
    b.scatter_slices(x2, i2, b.splat(0, Type{DType::F32, {2, 2}}), 0, true);
  });
  EXPECT_NE(err.find("scatter_slices"), std::string::npos) << err;
}

TEST(HloRun, FlatGatherScatter) {
  Host x = f32({5}, {10, 11, 12, 13, 14});
  Host pos = i64({2, 2}, {4, 0, 4, 2});
  Host upd = f32({2, 2}, {1, 2, 3, 4});
  auto out = run_fn({x, pos, upd}, [](Builder& b, std::vector<Value> p) {
    Value one = b.constant_int(3, DType::I32);
    return std::vector<Value>{
        b.gather_flat(p[0], p[1]), b.gather_flat(p[0], one),
        b.scatter_flat(p[0], p[1], p[2], /*add=*/true),
        b.scatter_flat(p[0], b.reshape(one, {1}), b.splat(-1, Type{DType::F32, {1}}), false)};
  });
  expect_vec<float>(out[0], {2, 2}, {14, 10, 14, 12});
  expect_vec<float>(out[1], {}, {13});
  expect_vec<float>(out[2], {5}, {12, 11, 16, 13, 18});
  expect_vec<float>(out[3], {5}, {10, 11, 12, -1, 14});
}

// ---------------------------------------------------------------- run: sort, rng

TEST(HloRun, SortNanLastAndStable) {
  float nan = std::numeric_limits<float>::quiet_NaN();
  Host k = f32({2, 5}, {3, nan, 1, 3, -2,  //
                        1, 1, nan, 0, 1});
  Host ints = Host::of<int32_t>(DType::I32, {4}, {5, -1, 7, 0});
  auto out = run_fn({k, ints}, [](Builder& b, std::vector<Value> p) {
    Value i = b.iota(Type{DType::I64, {2, 5}}, 1);
    std::vector<Value> asc = b.sort({p[0], i}, 1, false), desc = b.sort({p[0], i}, 1, true);
    return std::vector<Value>{asc[0], asc[1], desc[0], desc[1], b.sort({p[1]}, 0, true)[0]};
  });
  expect_vec<float>(out[0], {2, 5}, {-2, 1, 3, 3, nan, 0, 1, 1, 1, nan});
  expect_vec<int64_t>(out[1], {2, 5}, {4, 2, 0, 3, 1, 3, 0, 1, 4, 2});
  expect_vec<float>(out[2], {2, 5}, {nan, 3, 3, 1, -2, nan, 1, 1, 1, 0});
  expect_vec<int64_t>(out[3], {2, 5}, {1, 0, 3, 2, 4, 2, 0, 1, 4, 3});
  expect_vec<int32_t>(out[4], {4}, {7, 5, 0, -1});
}

TEST(HloRun, RngBitGenerator) {
  Host s1 = Host::of<uint64_t>(DType::U64, {2}, {1, 2}),
       s2 = Host::of<uint64_t>(DType::U64, {2}, {1, 3});
  auto out = run_fn({s1, s2}, [](Builder& b, std::vector<Value> p) {
    auto [n1, bits1] = b.rng_bit_generator(p[0], Type{DType::U32, {4, 4}});
    auto [n2, bits2] = b.rng_bit_generator(p[1], Type{DType::U32, {4, 4}});
    auto [n3, bits3] = b.rng_bit_generator(n1, Type{DType::U64, {3}});
    return std::vector<Value>{n1, bits1, bits2, n3, bits3};
  });
  ASSERT_EQ(out.size(), 5u);
  EXPECT_EQ(out[0].type, (Type{DType::U64, {2}}));
  EXPECT_EQ(out[1].type, (Type{DType::U32, {4, 4}}));
  EXPECT_EQ(out[4].type, (Type{DType::U64, {3}}));
  EXPECT_NE(out[0].vec<uint64_t>(), s1.vec<uint64_t>());
  EXPECT_NE(out[1].vec<uint32_t>(), out[2].vec<uint32_t>());
  EXPECT_NE(out[3].vec<uint64_t>(), out[0].vec<uint64_t>());
  std::vector<uint32_t> bits = out[1].vec<uint32_t>();
  EXPECT_LT(std::count(bits.begin(), bits.end(), bits[0]), 16);
}

// ---------------------------------------------------------------- run: convolution

// Direct-loop reference of a grouped 2-D convolution on NCHW / OIHW data.
std::vector<float> conv2d_ref(const std::vector<float>& x, const Shape& xs,
                              const std::vector<float>& w, const Shape& ws, Shape stride,
                              std::vector<std::pair<int64_t, int64_t>> pad, Shape lhs_dil,
                              Shape rhs_dil, int64_t groups, Shape* out_shape) {
  int64_t n = xs[0], c = xs[1], h = xs[2], wd = xs[3], o = ws[0], cg = ws[1], kh = ws[2],
          kw = ws[3];
  auto size = [&](int64_t in, int64_t k, int d) {
    int64_t dil = (in - 1) * lhs_dil[d] + 1 + pad[d].first + pad[d].second;
    return (dil - ((k - 1) * rhs_dil[d] + 1)) / stride[d] + 1;
  };
  int64_t oh = size(h, kh, 0), ow = size(wd, kw, 1);
  *out_shape = {n, o, oh, ow};
  std::vector<float> out;
  for (int64_t b = 0; b < n; ++b)
    for (int64_t f = 0; f < o; ++f)
      for (int64_t y = 0; y < oh; ++y)
        for (int64_t z = 0; z < ow; ++z) {
          float acc = 0;
          int64_t g = f / (o / groups);
          for (int64_t ci = 0; ci < cg; ++ci)
            for (int64_t i = 0; i < kh; ++i)
              for (int64_t j = 0; j < kw; ++j) {
                // Position in the dilated, padded input; holes and padding read 0.
                int64_t py = y * stride[0] + i * rhs_dil[0] - pad[0].first;
                int64_t pz = z * stride[1] + j * rhs_dil[1] - pad[1].first;
                if (py < 0 || pz < 0 || py % lhs_dil[0] || pz % lhs_dil[1]) continue;
                py /= lhs_dil[0];
                pz /= lhs_dil[1];
                if (py >= h || pz >= wd) continue;
                acc += x[((b * c + g * cg + ci) * h + py) * wd + pz] *
                       w[((f * cg + ci) * kh + i) * kw + j];
              }
          out.push_back(acc);
        }
  return out;
}

TEST(HloRun, ConvolutionStridePadDilationGroups) {
  // Small integers keep every sum exact in f32.
  std::vector<float> xv(2 * 4 * 5 * 6), wv(6 * 2 * 2 * 3);
  for (size_t i = 0; i < xv.size(); ++i)
    xv[i] = static_cast<float>(static_cast<int>(i * 7 % 11) - 5);
  for (size_t i = 0; i < wv.size(); ++i)
    wv[i] = static_cast<float>(static_cast<int>(i * 5 % 7) - 3);
  Host x = f32({2, 4, 5, 6}, xv), w = f32({6, 2, 2, 3}, wv);
  std::vector<std::pair<int64_t, int64_t>> pad{{1, 0}, {2, 1}};
  auto out = run_fn({x, w}, [&](Builder& b, std::vector<Value> p) {
    return std::vector<Value>{
        b.convolution(p[0], p[1], {2, 1}, pad, {}, {1, 2}, 2, 1, DType::F32),
        b.convolution(p[0], p[1], {1, 2}, {{1, 1}, {0, -1}}, {2, 1}, {2, 1}, 2, 1, DType::F32)};
  });
  Shape s1, s2;
  std::vector<float> want1 =
      conv2d_ref(xv, {2, 4, 5, 6}, wv, {6, 2, 2, 3}, {2, 1}, pad, {1, 1}, {1, 2}, 2, &s1);
  std::vector<float> want2 = conv2d_ref(xv, {2, 4, 5, 6}, wv, {6, 2, 2, 3}, {1, 2},
                                        {{1, 1}, {0, -1}}, {2, 1}, {2, 1}, 2, &s2);
  EXPECT_EQ(s1, (Shape{2, 6, 3, 5}));
  expect_vec<float>(out[0], s1, want1);
  expect_vec<float>(out[1], s2, want2);
}

TEST(HloRun, ConvolutionBatchGroupsAndErrors) {
  // batch_group_count = 2 on a 1-D conv: lhs batches {0} and {1} meet output
  // features {0} and {1}: out[0, f] = x[f] (*) w[f].
  Host x = f32({2, 1, 4}, {1, 2, 3, 4, 10, 20, 30, 40});
  Host w = f32({2, 1, 2}, {1, 1, 1, -1});
  auto out = run_fn({x, w}, [](Builder& b, std::vector<Value> p) {
    return std::vector<Value>{b.convolution(p[0], p[1], {}, {}, {}, {}, 1, 2, DType::F32)};
  });
  expect_vec<float>(out[0], {1, 2, 3}, {3, 5, 7, -10, -10, -10});
  Builder b;
  Value a = b.param(Type{DType::F32, {1, 4, 5, 5}});
  Value k = b.param(Type{DType::F32, {2, 3, 3, 3}});
  Value big = b.param(Type{DType::F32, {2, 4, 7, 7}});
  std::string groups = build_error([&] { b.convolution(a, k, {}, {}, {}, {}, 1, 1, DType::F32); });
  std::string fit = build_error([&] { b.convolution(a, big, {}, {}, {}, {}, 1, 1, DType::F32); });
  EXPECT_NE(groups.find("convolution"), std::string::npos) << groups;
  EXPECT_NE(fit.find("does not fit"), std::string::npos) << fit;
}

TEST(HloRun, ReduceWindowDilatedAndArgmax) {
  float nan = std::numeric_limits<float>::quiet_NaN();
  Host x = f32({1, 5}, {1, 7, 3, 7, 2});
  Host y = f32({1, 4}, {1, nan, 5, nan});
  auto out = run_fn({x, y}, [](Builder& b, std::vector<Value> p) {
    Value z = b.constant(0, DType::F32);
    Value ix = b.iota(Type{DType::I64, {1, 5}}, 1), iy = b.iota(Type{DType::I64, {1, 4}}, 1);
    auto [m, i] = b.reduce_window_argmax(p[0], ix, {1, 2}, {1, 1}, {1, 2}, {0, 0}, {0, 2});
    auto [mn, in] = b.reduce_window_argmax(p[1], iy, {1, 4}, {}, {}, {}, {});
    return std::vector<Value>{
        b.reduce_window_dilated(p[0], z, Reducer::Add, {1, 2}, {1, 2}, {1, 3}, {0, 1}, {0, 0}), m,
        i, mn, in};
  });
  // Sum taps 3 apart over [pad, 1, 7, 3, 7, 2]: pad + 3, 7 + 2.
  expect_vec<float>(out[0], {1, 2}, {3, 9});
  // Max taps 2 apart: (1,3) (7,7) (3,2) (7,pad) (2,pad); ties keep the first.
  expect_vec<float>(out[1], {1, 5}, {3, 7, 3, 7, 2});
  expect_vec<int64_t>(out[2], {1, 5}, {2, 1, 2, 3, 4});
  expect_vec<float>(out[3], {1, 1}, {nan});
  expect_vec<int64_t>(out[4], {1, 1}, {3});  // torch CPU keeps the last NaN
}

// Complex values: XLA has no bitcast between complex and real types, so
// reinterpret_flat and convert go through the parts.
TEST(HloRun, ComplexPartsReinterpretAndConvert) {
  Host x = f32({4}, {1, 2, 3, -4});  // (1+2i), (3-4i) as interleaved pairs
  auto out = run_fn({x}, [](Builder& b, std::vector<Value> p) {
    Value z = b.reinterpret_flat(p[0], DType::C64);
    Value sq = b.binary("multiply", z, z);
    Value back = b.reinterpret_flat(sq, DType::F32);
    Value one = b.convert(b.splat(1.5, Type{DType::F32, {2}}), DType::C64);
    Value sum = b.reinterpret_flat(b.binary("add", z, one), DType::F32);
    return std::vector<Value>{back, b.convert(z, DType::F32), b.unary("abs", z), sum,
                              b.convert(z, DType::C128)};
  });
  expect_vec<float>(out[0], {4}, {-3, 4, -7, -24});
  expect_vec<float>(out[1], {2}, {1, 3});
  expect_vec<float>(out[2], {2}, {std::sqrt(5.0f), 5});
  expect_vec<float>(out[3], {4}, {2.5, 2, 4.5, -4});
  EXPECT_EQ(out[4].type.dtype, DType::C128);
  expect_vec<double>(out[4], {2}, {1, 2, 3, -4});
}

TEST(HloRun, FftKinds) {
  Host x = f32({2, 4}, {1, 0, 0, 0, 1, 1, 1, 1});
  auto out = run_fn({x}, [](Builder& b, std::vector<Value> p) {
    Value r = b.fft(p[0], Fft::RFFT, {4});  // [2, 3] complex
    Value back = b.fft(r, Fft::IRFFT, {4});
    Value full = b.fft(b.convert(p[0], DType::C64), Fft::FFT, {2, 4});
    Value inv = b.fft(full, Fft::IFFT, {2, 4});
    Value re = b.reinterpret_flat(b.reshape(r, {6}), DType::F32);
    return std::vector<Value>{re, back, b.convert(inv, DType::F32)};
  });
  // An impulse has a flat spectrum; ones put everything in bin 0.
  expect_vec<float>(out[0], {12}, {1, 0, 1, 0, 1, 0, 4, 0, 0, 0, 0, 0});
  expect_vec<float>(out[1], {2, 4}, {1, 0, 0, 0, 1, 1, 1, 1});
  expect_vec<float>(out[2], {2, 4}, {1, 0, 0, 0, 1, 1, 1, 1});
  Builder b;
  Value c = b.param(Type{DType::C64, {2, 3}});
  std::string bad = build_error([&] { b.fft(c, Fft::IRFFT, {8}); });
  EXPECT_NE(bad.find("n/2+1"), std::string::npos) << bad;
}

// Exact modules: IEEE-exact arithmetic, comparisons, selects and data movement
// only (their quick and optimized XLA:CPU builds agree bit for bit).
TEST(HloText, ModuleWorkTellsExactArithmetic) {
  auto exact = [](auto&& body) {
    Builder b;
    Value x = b.param(Type{DType::F32, {8, 4}}), y = b.param(Type{DType::F32, {8, 4}});
    b.ret({body(b, x, y)});
    return module_work(b.module()).exact;
  };
  EXPECT_TRUE(exact([](Builder& b, Value x, Value y) {
    Value m = b.binary("add", b.binary("multiply", x, y), b.unary("sqrt", b.unary("abs", y)));
    Value d = b.binary("divide", m, b.binary("subtract", x, b.splat(3.0, x.type)));
    Value s = b.select(b.compare(hlo::Cmp::LT, x, y), d, b.unary("negate", x));
    return b.reshape(b.transpose(b.convert(s, DType::BF16), {1, 0}), {32});
  }));
  EXPECT_FALSE(exact([](Builder& b, Value x, Value y) { return b.unary("tanh", x); }));
  EXPECT_FALSE(exact([](Builder& b, Value x, Value y) { return b.unary("exponential", y); }));
  EXPECT_FALSE(exact([](Builder& b, Value x, Value y) { return b.unary("log_plus_one", y); }));
  EXPECT_FALSE(exact([](Builder& b, Value x, Value y) { return b.unary("rsqrt", y); }));
  EXPECT_FALSE(exact([](Builder& b, Value x, Value y) {
    return b.reduce(x, b.constant(0.0, DType::F32), {0}, Reducer::Add);
  }));
  EXPECT_FALSE(exact([](Builder& b, Value x, Value y) {
    return b.dot_general(x, y, {}, {}, {0}, {0}, DType::F32);
  }));
  // Any op of another dialect counts as inexact.
  EXPECT_FALSE(module_work("  %0 = chlo.erf %arg0 : tensor<8xf32>").exact);
  EXPECT_TRUE(module_work("  %0 = stablehlo.add %arg0, %arg0 : tensor<8xf32>").exact);
}

// The loop and dot sizes and region ops the runtime picks compile settings by.
TEST(HloText, ModuleWorkCountsLoopsAndDots) {
  {  // An elementwise op and a reduction: their operands and results.
    Builder b;
    Value x = b.param(Type{DType::F32, {64, 64}});
    Value s = b.reduce(b.binary("add", x, x), b.constant(0.0, DType::F32), {0, 1}, Reducer::Add);
    b.ret({s});
    ModuleWork w = module_work(b.module());
    EXPECT_EQ(w.loop, 4096);
    EXPECT_EQ(w.dot, 0);
    EXPECT_TRUE(w.regions);
  }
  {  // Plain loops: no region op (the elemental emitter's programs).
    Builder b;
    Value x = b.param(Type{DType::F32, {64, 64}});
    b.ret({b.unary("tanh", b.binary("multiply", x, x))});
    EXPECT_FALSE(module_work(b.module()).regions);
  }
  {  // A sort, and a scatter: region ops.
    Builder b;
    Value x = b.param(Type{DType::F32, {8}});
    b.ret({b.sort({x}, 0, false)[0]});
    EXPECT_TRUE(module_work(b.module()).regions);
    Builder c;
    Value y = c.param(Type{DType::F32, {8}});
    Value pos = c.param(Type{DType::I64, {3}});
    c.ret({c.scatter_flat(y, pos, c.param(Type{DType::F32, {3}}), true)});
    EXPECT_TRUE(module_work(c.module()).regions);
  }
  {  // Read in MLIR's pretty form too (JAX's programs); reduce_precision is a plain loop.
    EXPECT_TRUE(module_work("  %0 = stablehlo.reduce(%arg0 init: %c) applies stablehlo.add "
                            "across dimensions = [0] : (tensor<8xf32>, tensor<f32>) -> tensor<f32>")
                    .regions);
    EXPECT_FALSE(module_work("  %0 = stablehlo.reduce_precision %arg0, format = e5m10 : "
                             "tensor<8xf32>")
                     .regions);
  }
  {  // A gather reads a large table's rows: only its result counts; arguments not.
    Builder b;
    Value table = b.param(Type{DType::F32, {512, 64}});
    Value idx = b.param(Type{DType::I64, {5}});
    b.ret({b.binary("multiply", b.gather_flat(b.reshape(table, {512 * 64}), idx),
                    b.splat(2.0, Type{DType::F32, {5}}))});
    ModuleWork w = module_work(b.module());
    EXPECT_EQ(w.loop, 5);
  }
  {  // A gemv on a flat weight: the reshape is a bitcast; the dot counts apart.
    Builder b;
    Value x = b.param(Type{DType::F32, {1, 64}});
    Value w = b.reshape(b.param(Type{DType::F32, {64 * 256}}), {64, 256});
    b.ret({b.unary("tanh", b.dot_general(x, w, {}, {}, {1}, {0}, DType::F32))});
    ModuleWork work = module_work(b.module());
    EXPECT_EQ(work.loop, 256);
    EXPECT_EQ(work.dot, 64 * 256);
  }
  {  // A slice of a large operand counts its result.
    Builder b;
    Value x = b.param(Type{DType::F32, {100, 100}});
    b.ret({b.unary("negate", b.slice(x, {0, 0}, {2, 100}, {1, 1}))});
    EXPECT_EQ(module_work(b.module()).loop, 200);
  }
}

// Result types as a placeholder for a still-compiling program's outputs takes them.
TEST(HloText, ModuleResultsReadsMainSignature) {
  Builder b;
  Value x = b.param(Type{DType::F32, {3, 4}}, /*donate=*/true);
  Value s = b.packed_scalar(DType::F64);
  Value c = b.param(Type{DType::C64, {2}});
  b.ret({b.convert(x, DType::BF16), b.convert(s, DType::F32), c,
         b.compare(Cmp::GT, b.reshape(x, {12}), b.splat(0.0, Type{DType::F32, {12}}))});
  std::optional<std::vector<Type>> r = module_results(b.module());
  ASSERT_TRUE(r.has_value());
  std::vector<Type> want = {Type{DType::BF16, {3, 4}}, Type{DType::F32, {}}, Type{DType::C64, {2}},
                            Type{DType::Bool, {12}}};
  EXPECT_EQ(*r, want);
  EXPECT_FALSE(module_results("module @m {\n}\n").has_value());
}

}  // namespace
// Whole floats that print with an exponent ("1e+09") must still parse as floats.
TEST(HloRun, LargeWholeFloatConstantsParse) {
  Builder b;
  Value a = b.constant(1e9, DType::F32), c = b.constant(1e22, DType::F64);
  b.ret({b.convert(a, DType::F64), c});
  std::vector<Host> out = run(b, {});
  expect_vec<double>(out[0], {}, {1e9});
  expect_vec<double>(out[1], {}, {1e22});
}

// Functions from another producer are added once and called; the module says so.
TEST(HloRun, CallsInlinedFunctions) {
  const std::string text =
      "func.func private @ext_main(%a: tensor<2xf32>, %b: tensor<2xf32>) -> (tensor<2xf32>, "
      "tensor<2xf32>) {\n"
      "  %0 = func.call @ext_twice(%a) : (tensor<2xf32>) -> tensor<2xf32>\n"
      "  %1 = stablehlo.multiply %a, %b : tensor<2xf32>\n"
      "  return %0, %1 : tensor<2xf32>, tensor<2xf32>\n}\n"
      "func.func private @ext_twice(%x: tensor<2xf32>) -> tensor<2xf32> {\n"
      "  %0 = stablehlo.add %x, %x : tensor<2xf32>\n  return %0 : tensor<2xf32>\n}";
  const Type t{DType::F32, {2}};
  Builder b;
  Value x = b.param(t), y = b.param(t);
  EXPECT_FALSE(b.has_functions());
  b.add_functions("ext_main", text);
  b.add_functions("ext_main", text);
  std::vector<Value> r = b.call("ext_main", {x, y}, {t, t});
  std::vector<Value> r2 = b.call("ext_main", {r[0], y}, {t, t});
  b.ret({r2[0], r[1]});
  std::string m = b.module();
  EXPECT_TRUE(b.has_functions());
  EXPECT_EQ(m.rfind("module @m attributes {torchtpu.external = true}", 0), 0u) << m;
  EXPECT_EQ(m.find("@ext_twice(%x"), m.rfind("@ext_twice(%x")) << "added twice:\n" << m;
  auto out = run(b, {f32({2}, {1, 2}), f32({2}, {3, 4})});
  expect_vec<float>(out[0], {2}, {4, 8});
  expect_vec<float>(out[1], {2}, {3, 8});
  EXPECT_NE(build_error([&] { b.call("ext_main", {x}, {}); }).find("returns nothing"),
            std::string::npos);
}

}  // namespace torchtpu::hlo
