// StableHLO text emission: module, constants, elementwise and shape ops.
// Ops are printed in MLIR's generic form, which every StableHLO version parses.
#include "hlo/builder.h"

#include <atomic>
#include <bit>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <string_view>

namespace torchtpu::hlo {

namespace {
// Packed (dot, conv) so one atomic load reads a consistent pair.
std::atomic<int> g_float_precision{static_cast<int>(Precision::Highest) * 4 +
                                   static_cast<int>(Precision::Highest)};
}  // namespace

void set_float_precision(FloatPrecision p) {
  g_float_precision.store(static_cast<int>(p.dot) * 4 + static_cast<int>(p.conv),
                          std::memory_order_relaxed);
}

FloatPrecision float_precision() {
  const int v = g_float_precision.load(std::memory_order_relaxed);
  return {static_cast<Precision>(v / 4), static_cast<Precision>(v % 4)};
}

std::string precision_config(DType operands, Precision p) {
  const bool f32 = operands == DType::F32 || operands == DType::C64;
  const char* name = !f32 || p == Precision::Default ? "DEFAULT"
                     : p == Precision::High          ? "HIGH"
                                                     : "HIGHEST";
  const std::string one = std::string("#stablehlo<precision ") + name + ">";
  return "precision_config = [" + one + ", " + one + "]";
}

namespace {

std::string hex(uint64_t bits, int digits) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%0*llX", digits, static_cast<unsigned long long>(bits));
  return buf;
}

// Decimal that parses back to the same value; always has a '.' or exponent.
std::string decimal(double v, int digits) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.*g", digits, v);
  std::string s = buf;
  // MLIR float literals need a '.' in the mantissa: "1e+09" -> "1.0e+09".
  size_t e = s.find('e');
  std::string mantissa = s.substr(0, e);
  if (mantissa.find('.') == std::string::npos)
    s.insert(e == std::string::npos ? s.size() : e, ".0");
  return s;
}

uint16_t f32_to_bf16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7FFFFFFF) > 0x7F800000) return static_cast<uint16_t>((x >> 16) | 0x40);  // quiet NaN
  x += 0x7FFF + ((x >> 16) & 1);  // round to nearest even
  return static_cast<uint16_t>(x >> 16);
}

uint16_t f32_to_f16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  uint32_t sign = (x >> 16) & 0x8000, ax = x & 0x7FFFFFFF;
  if (ax > 0x7F800000) return static_cast<uint16_t>(sign | 0x7E00);
  if (ax >= 0x477FF000) return static_cast<uint16_t>(sign | 0x7C00);  // >= 65520 rounds to inf
  if (ax < 0x38800000) {  // f16 subnormal: units of 2^-24, nearbyint rounds half to even
    float a = std::bit_cast<float>(ax);
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(a * 16777216.0f)));
  }
  uint32_t r = ax - ((127u - 15u) << 23);
  r += 0xFFF + ((r >> 13) & 1);
  return static_cast<uint16_t>(sign | (r >> 13));
}

// Wraps `v` to the integer dtype's width (two's complement), as a C cast would.
std::string int_literal(int64_t v, DType t) {
  if (t == DType::Bool) return v ? "true" : "false";
  int bits = static_cast<int>(itemsize(t)) * 8;
  uint64_t u = static_cast<uint64_t>(v);
  if (bits < 64) u &= (uint64_t{1} << bits) - 1;
  if (is_unsigned(t)) return std::to_string(u);
  if (bits < 64 && (u >> (bits - 1)))
    return std::to_string(static_cast<int64_t>(u) - (int64_t{1} << bits));
  return std::to_string(static_cast<int64_t>(u));
}

// Exact element literal for dense<...>. Non-finite floats use bit patterns;
// f16/bf16 always do (rounded via f32, as c10::Half/BFloat16 do).
std::string float_literal(double v, DType t) {
  if (t == DType::F64) {
    if (std::isnan(v)) return hex(0x7FF8000000000000ull, 16);
    if (std::isinf(v)) return hex(v > 0 ? 0x7FF0000000000000ull : 0xFFF0000000000000ull, 16);
    return decimal(v, 17);
  }
  float f = static_cast<float>(v);
  if (t == DType::F32) {
    if (std::isnan(f)) return hex(0x7FC00000, 8);
    if (std::isinf(f)) return hex(f > 0 ? 0x7F800000 : 0xFF800000, 8);
    return decimal(f, 9);
  }
  return hex(t == DType::BF16 ? f32_to_bf16(f) : f32_to_f16(f), 4);
}

std::string literal(double v, DType t) {
  if (is_float(t)) return float_literal(v, t);
  if (is_complex(t)) return "(" + float_literal(v, real_part_dtype(t)) + ", 0.0)";
  if (t == DType::Bool) return v != 0 ? "true" : "false";
  if (std::isnan(v)) return "0";
  // Truncate toward zero like a float->int cast; saturate beyond 64 bits.
  double tv = std::trunc(v);
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  if (tv >= 9223372036854775808.0) {
    if (!is_unsigned(t)) return int_literal(std::numeric_limits<int64_t>::max(), t);
    uint64_t u = tv >= 18446744073709551616.0 ? ~uint64_t{0} : static_cast<uint64_t>(tv);
    return int_literal(static_cast<int64_t>(u), t);
  }
  return int_literal(tv < -9223372036854775808.0 ? kMin : static_cast<int64_t>(tv), t);
}

const char* cmp_name(Cmp c) {
  static const char* n[] = {"EQ", "NE", "LT", "LE", "GT", "GE"};
  return n[static_cast<int>(c)];
}

bool named(std::string_view op, std::initializer_list<std::string_view> names) {
  for (std::string_view n : names)
    if (op == n) return true;
  return false;
}

// Why StableHLO rejects `op` on these element types, or "" when it takes them.
// Caught here, the error names the op instead of failing the whole compile.
std::string element_type_error(std::string_view op, const std::vector<Value>& args,
                               const Type& out) {
  if (op == "iota" && out.dtype == DType::Bool) return "has no boolean form";
  for (const Value& a : args) {
    const DType t = a.dtype();
    if (!is_float(t) && !is_complex(t) &&
        named(op, {"exponential", "exponential_minus_one", "log", "log_plus_one", "logistic",
                   "sqrt", "rsqrt", "tanh", "sine", "cosine", "tan", "atan2"}))
      return "takes floating-point or complex operands, got " + a.type.str();
    if (!is_float(t) && named(op, {"cbrt", "floor", "ceil", "round_nearest_afz",
                                   "round_nearest_even", "is_finite"}))
      return "takes floating-point operands, got " + a.type.str();
    if (t == DType::Bool &&
        named(op, {"abs", "negate", "sign", "subtract", "divide", "remainder", "power",
                   "shift_left", "shift_right_logical", "shift_right_arithmetic"}))
      return "takes no boolean operands, got " + a.type.str();
    if (is_float(t) && named(op, {"and", "or", "xor", "not", "shift_left", "shift_right_logical",
                                  "shift_right_arithmetic", "popcnt"}))
      return "takes integer or boolean operands, got " + a.type.str();
  }
  return "";
}

}  // namespace

// ---------------------------------------------------------------- types, names

int64_t Type::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string Type::str() const {
  std::string s = "tensor<";
  for (int64_t d : shape) s += std::to_string(d) + "x";
  s += mlir_name(dtype);
  s += ">";
  return s;
}

void Builder::fail(const char* op, const std::string& what) {
  throw BuildError(std::string("[hlo] ") + op + ": " + what);
}

std::string Builder::arr(const std::vector<int64_t>& v) {
  std::string s = "array<i64";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : ": ") + std::to_string(v[i]);
  return s + ">";
}

std::string Builder::list(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

void Builder::check_dims(const char* op, const std::vector<int64_t>& dims, int64_t rank) {
  std::vector<bool> seen(static_cast<size_t>(rank), false);
  for (int64_t d : dims) {
    if (d < 0 || d >= rank)
      fail(op, "dim " + std::to_string(d) + " out of range for rank " + std::to_string(rank));
    if (seen[d]) fail(op, "dim " + std::to_string(d) + " repeated");
    seen[d] = true;
  }
}

std::string Builder::name(const Value& v) const {
  if (v.id < 0 || v.id >= static_cast<int>(names_.size()))
    throw BuildError("[hlo] invalid Value id " + std::to_string(v.id));
  if (!(types_[v.id] == v.type))
    throw BuildError("[hlo] Value " + names_[v.id] + " has type " + v.type.str() + ", built as " +
                     types_[v.id].str());
  return names_[v.id];
}

Value Builder::new_value(std::string nm, const Type& type) {
  Value v{next_id_++, type};
  names_.push_back(std::move(nm));
  types_.push_back(type);
  return v;
}

Value Builder::emit(const std::string& rhs_and_type, const Type& type) {
  Value v = new_value("%v" + std::to_string(next_id_), type);
  lines_.push_back(names_.back() + " = " + rhs_and_type);
  return v;
}

std::vector<Value> Builder::emit_multi(const std::string& rhs, const std::vector<Type>& types) {
  if (types.size() == 1) return {emit(rhs, types[0])};
  std::string base = "%v" + std::to_string(next_id_);
  lines_.push_back(base + ":" + std::to_string(types.size()) + " = " + rhs);
  std::vector<Value> out;
  for (size_t i = 0; i < types.size(); ++i)
    out.push_back(new_value(base + "#" + std::to_string(i), types[i]));
  return out;
}

std::string Builder::generic(const char* op, const std::vector<Value>& args,
                             const std::string& attrs, const std::vector<Type>& results,
                             const std::string& region) const {
  std::string s;
  s.reserve(128 + region.size() + attrs.size());
  s += "\"stablehlo.";
  s += op;
  s += "\"(";
  for (size_t i = 0; i < args.size(); ++i) s += (i ? ", " : "") + name(args[i]);
  s += ")";
  if (!region.empty()) s += " " + region;
  if (!attrs.empty()) s += " {" + attrs + "}";
  s += " : (";
  for (size_t i = 0; i < args.size(); ++i) s += (i ? ", " : "") + args[i].type.str();
  s += ") -> ";
  if (results.size() == 1) return s + results[0].str();
  s += "(";
  for (size_t i = 0; i < results.size(); ++i) s += (i ? ", " : "") + results[i].str();
  return s + ")";
}

Value Builder::op(const char* op, const std::vector<Value>& args, const std::string& attrs,
                  const Type& out, const std::string& region) {
  if (std::string why = element_type_error(op, args, out); !why.empty())
    throw DTypeError(std::string("[hlo] ") + op + " " + why);
  return emit(generic(op, args, attrs, {out}, region), out);
}

// The body's lines go to a scratch list; its values draw fresh ids from the
// shared counter, so region-local names never clash with outer ones.
std::string Builder::region(const std::vector<Type>& args, const Body& body) {
  struct Swap {
    std::vector<std::string>& a;
    std::vector<std::string> saved;
    explicit Swap(std::vector<std::string>& l) : a(l) { saved.swap(a); }
    ~Swap() { saved.swap(a); }
  } scope(lines_);
  std::vector<Value> in;
  std::string head = "^bb0(";
  for (size_t i = 0; i < args.size(); ++i) {
    in.push_back(new_value("%v" + std::to_string(next_id_), args[i]));
    head += (i ? ", " : "") + names_.back() + ": " + args[i].str();
  }
  std::vector<Value> out = body(in);
  std::string s = "({\n      " + head + "):\n";
  for (const std::string& l : lines_) s += "        " + l + "\n";
  std::string ret = "\"stablehlo.return\"(", types;
  for (size_t i = 0; i < out.size(); ++i) {
    ret += (i ? ", " : "") + name(out[i]);
    types += (i ? ", " : "") + out[i].type.str();
  }
  return s + "        " + ret + ") : (" + types + ") -> ()\n    })";
}

// ---------------------------------------------------------------- module

Value Builder::param(const Type& type, bool donate) {
  params_.emplace_back(type, donate);
  return new_value("%arg" + std::to_string(params_.size() - 1), type);
}

Value Builder::packed_scalar(DType d) {
  auto it = std::find_if(packs_.begin(), packs_.end(), [&](const auto& p) { return p.first == d; });
  if (it == packs_.end()) it = packs_.insert(packs_.end(), {d, {}});
  Value v = new_value("%ps" + std::to_string(next_id_), Type{d, {}});
  it->second.push_back(names_.back());
  return v;
}

std::vector<std::pair<DType, int>> Builder::packs() const {
  std::vector<std::pair<DType, int>> out;
  for (const auto& [d, names] : packs_) out.emplace_back(d, static_cast<int>(names.size()));
  return out;
}

void Builder::ret(const std::vector<Value>& results) {
  if (has_ret_) fail("ret", "called twice");
  std::string names, types;
  for (size_t i = 0; i < results.size(); ++i) {
    names += (i ? ", " : "") + name(results[i]);
    types += (i ? ", " : "") + results[i].type.str();
    results_.push_back(results[i].type);
  }
  ret_line_ = results.empty() ? "return" : "return " + names + " : " + types;
  has_ret_ = true;
}

std::string Builder::module() const {
  if (!has_ret_) throw BuildError("[hlo] module: ret() was not called");
  size_t n = 256 + ret_line_.size();
  for (const std::string& l : lines_) n += l.size() + 5;
  for (const auto& f : functions_) n += f.second.size() + 1;
  std::string s;
  s.reserve(n);
  s += functions_.empty() ? "module @m {\n" : "module @m attributes {torchtpu.external = true} {\n";
  s += "  func.func public @main(";
  for (size_t i = 0; i < params_.size(); ++i) {
    s += (i ? ", %arg" : "%arg") + std::to_string(i) + ": " + params_[i].first.str();
    if (params_[i].second) s += " {jax.buffer_donor = true}";
  }
  // Packed scalars: one parameter per dtype, sliced into the scalars' names.
  std::string unpack;
  for (size_t k = 0; k < packs_.size(); ++k) {
    const auto& [d, names] = packs_[k];
    const int64_t count = static_cast<int64_t>(names.size());
    const std::string pack = "%pack" + std::to_string(k), one = Type{d, {1}}.str();
    const std::string type = Type{d, {count}}.str(), scalar = Type{d, {}}.str();
    s += (params_.empty() && k == 0 ? "" : ", ") + pack + ": " + type;
    for (int64_t j = 0; j < count; ++j) {
      const std::string& nm = names[j];
      unpack += "    " + nm + "_1 = \"stablehlo.slice\"(" + pack +
                ") {start_indices = " + arr({j}) + ", limit_indices = " + arr({j + 1}) +
                ", strides = " + arr({1}) + "} : (" + type + ") -> " + one + "\n";
      unpack += "    " + nm + " = \"stablehlo.reshape\"(" + nm + "_1) : (" + one + ") -> " +
                scalar + "\n";
    }
  }
  s += ") -> (";
  for (size_t i = 0; i < results_.size(); ++i) s += (i ? ", " : "") + results_[i].str();
  s += ") {\n";
  s += unpack;
  for (const std::string& l : lines_) s += "    " + l + "\n";
  s += "    " + ret_line_ + "\n  }\n";
  for (const auto& f : functions_) s += f.second + "\n";
  return s + "}\n";
}

void Builder::add_functions(const std::string& callee, const std::string& text) {
  for (const auto& f : functions_)
    if (f.first == callee) return;
  functions_.emplace_back(callee, text);
}

std::vector<Value> Builder::call(const std::string& callee, const std::vector<Value>& args,
                                 const std::vector<Type>& results) {
  if (results.empty()) fail("call", "@" + callee + " returns nothing");
  std::string s = "func.call @" + callee + "(";
  for (size_t i = 0; i < args.size(); ++i) s += (i ? ", " : "") + name(args[i]);
  s += ") : (";
  for (size_t i = 0; i < args.size(); ++i) s += (i ? ", " : "") + args[i].type.str();
  s += ") -> (";
  for (size_t i = 0; i < results.size(); ++i) s += (i ? ", " : "") + results[i].str();
  return emit_multi(s + ")", results);
}

namespace {
std::string layout_attr(const std::vector<int64_t>& minor_to_major) {
  std::string s = "dense<";
  if (!minor_to_major.empty()) {
    s += "[";
    for (size_t i = 0; i < minor_to_major.size(); ++i)
      s += (i ? ", " : "") + std::to_string(minor_to_major[i]);
    s += "]";
  }
  return s + "> : tensor<" + std::to_string(minor_to_major.size()) + "xindex>";
}
std::vector<int64_t> row_major(int64_t rank) {
  std::vector<int64_t> m;
  for (int64_t d = rank - 1; d >= 0; --d) m.push_back(d);
  return m;
}
}  // namespace

std::vector<Value> Builder::custom_call(const std::string& target, const std::vector<Value>& args,
                                        const std::vector<Type>& results, const std::string& config,
                                        const std::vector<std::vector<int64_t>>& result_layouts) {
  if (result_layouts.size() != results.size())
    fail("custom_call", target + ": one layout per result");
  std::string escaped;
  for (char ch : config) {
    if (ch == '"' || ch == '\\') escaped += '\\';
    escaped += ch;
  }
  std::string attrs = "call_target_name = \"" + target + "\", api_version = 2 : i32, " +
                      "backend_config = \"" + escaped + "\", operand_layouts = [";
  for (size_t i = 0; i < args.size(); ++i)
    attrs += (i ? ", " : "") + layout_attr(row_major(args[i].rank()));
  attrs += "], result_layouts = [";
  for (size_t i = 0; i < results.size(); ++i)
    attrs += (i ? ", " : "") + layout_attr(result_layouts[i]);
  attrs += "]";
  std::string s = generic("custom_call", args, attrs, results);
  if (results.size() == 1) return {emit(s, results[0])};
  return emit_multi(s, results);
}

// ---------------------------------------------------------------- constants

Value Builder::constant(double v, DType dtype) { return splat(v, Type{dtype, {}}); }

Value Builder::constant_int(int64_t v, DType dtype) {
  if (is_float(dtype) || is_complex(dtype)) return constant(static_cast<double>(v), dtype);
  Type t{dtype, {}};
  return emit("stablehlo.constant dense<" + int_literal(v, dtype) + "> : " + t.str(), t);
}

Value Builder::splat(double v, const Type& type) {
  return emit("stablehlo.constant dense<" + literal(v, type.dtype) + "> : " + type.str(), type);
}

Value Builder::iota(const Type& type, int64_t dim) {
  if (dim < 0 || dim >= type.rank())
    fail("iota", "dim " + std::to_string(dim) + " out of range for " + type.str());
  return op("iota", {}, "iota_dimension = " + std::to_string(dim) + " : i64", type);
}

// ---------------------------------------------------------------- elementwise

Value Builder::unary(const char* opname, Value x) {
  Type out = x.type;
  std::string_view n(opname);
  if (n == "is_finite") out.dtype = DType::Bool;
  if (n == "abs" || n == "real" || n == "imag") out.dtype = real_part_dtype(x.dtype());
  return op(opname, {x}, "", out);
}

std::vector<Value> Builder::while_loop(const std::vector<Value>& init,
                                       const std::function<Value(const std::vector<Value>&)>& cond,
                                       const Body& body) {
  std::vector<Type> types;
  for (const Value& v : init) types.push_back(v.type);
  std::string c = region(types, [&](const std::vector<Value>& a) {
    Value p = cond(a);
    if (!(p.type == Type{DType::Bool, {}})) fail("while", "condition must be tensor<i1>");
    return std::vector<Value>{p};
  });
  std::string d = region(types, [&](const std::vector<Value>& a) {
    std::vector<Value> next = body(a);
    if (next.size() != types.size()) fail("while", "body returns the wrong number of values");
    for (size_t i = 0; i < next.size(); ++i)
      if (!(next[i].type == types[i]))
        fail("while", "body value " + std::to_string(i) + " is " + next[i].type.str() +
                          ", carried as " + types[i].str());
    return next;
  });
  // region() gives "({...})"; the op takes both regions in one list.
  std::string regions = c.substr(0, c.size() - 1) + ", " + d.substr(1);
  return emit_multi(generic("while", init, "", types, regions), types);
}

Value Builder::triangular_solve(Value a, Value b, bool left_side, bool lower, bool unit_diagonal,
                                bool transpose_a) {
  if (a.rank() < 2 || a.rank() != b.rank()) fail("triangular_solve", "rank mismatch");
  auto flag = [](bool v) { return v ? std::string("true") : std::string("false"); };
  std::string attrs = "left_side = " + flag(left_side) + ", lower = " + flag(lower) +
                      ", unit_diagonal = " + flag(unit_diagonal) +
                      ", transpose_a = #stablehlo<transpose " +
                      (transpose_a ? "TRANSPOSE" : "NO_TRANSPOSE") + ">";
  return op("triangular_solve", {a, b}, attrs, b.type);
}

Value Builder::cholesky(Value a, bool lower) {
  if (a.rank() < 2) fail("cholesky", "rank < 2");
  return op("cholesky", {a}, lower ? "lower = true" : "lower = false", a.type);
}

// generic()'s text of an op, moved from the stablehlo dialect to chlo.
static std::string as_chlo(const std::string& generic_text) {
  return "\"chlo." + generic_text.substr(std::string_view("\"stablehlo.").size());
}

Value Builder::chlo(const char* opname, const std::vector<Value>& args, const Type& out) {
  // The CHLO ops we emit are defined on floats (lgamma, digamma, zeta, ...) and
  // some on complex values too (asinh, atanh, ...), never on integers.
  for (const Value& a : args)
    if (!is_float(a.dtype()) && !is_complex(a.dtype()))
      throw DTypeError(std::string("[hlo] chlo.") + opname +
                       " takes floating-point or complex operands, got " + a.type.str());
  return emit(as_chlo(generic(opname, args, "", {out})), out);
}

std::pair<Value, Value> Builder::top_k(Value x, int64_t k) {
  if (x.rank() < 1 || k < 0 || k > x.shape().back())
    fail("top_k", "k " + std::to_string(k) + " for " + x.type.str());
  Shape s = x.shape();
  s.back() = k;
  std::vector<Type> outs{Type{x.dtype(), s}, Type{DType::I32, s}};
  auto r =
      emit_multi(as_chlo(generic("top_k", {x}, "k = " + std::to_string(k) + " : i64", outs)), outs);
  return {r[0], r[1]};
}

Value Builder::binary(const char* opname, Value a, Value b) {
  if (!(a.type == b.type))
    fail(opname, "operand types differ: " + a.type.str() + " vs " + b.type.str());
  return op(opname, {a, b}, "", a.type);
}

Value Builder::compare(Cmp dir, Value a, Value b) {
  if (!(a.type == b.type))
    fail("compare", "operand types differ: " + a.type.str() + " vs " + b.type.str());
  DType t = a.dtype();
  const char* kind = is_float(t) || is_complex(t) ? "FLOAT"
                     : is_signed_int(t)           ? "SIGNED"
                                                  : "UNSIGNED";
  std::string attrs = std::string("comparison_direction = #stablehlo<comparison_direction ") +
                      cmp_name(dir) + ">, compare_type = #stablehlo<comparison_type " + kind + ">";
  return op("compare", {a, b}, attrs, Type{DType::Bool, a.shape()});
}

Value Builder::select(Value pred, Value on_true, Value on_false) {
  if (!(on_true.type == on_false.type))
    fail("select", "branch types differ: " + on_true.type.str() + " vs " + on_false.type.str());
  if (pred.dtype() != DType::Bool || (pred.rank() != 0 && pred.shape() != on_true.shape()))
    fail("select", "pred " + pred.type.str() + " does not fit " + on_true.type.str());
  return op("select", {pred, on_true, on_false}, "", on_true.type);
}

Value Builder::clamp(Value lo, Value x, Value hi) {
  for (const Value& b : {lo, hi})
    if (b.dtype() != x.dtype() || (b.rank() != 0 && b.shape() != x.shape()))
      fail("clamp", "bound " + b.type.str() + " does not fit " + x.type.str());
  return op("clamp", {lo, x, hi}, "", x.type);
}

Value Builder::convert(Value x, DType to) {
  if (x.dtype() == to) return x;
  // XLA converts neither way between complex and real: as torch, a complex
  // value casts to its real part, a real one gains a zero imaginary part.
  if (is_complex(x.dtype()) && !is_complex(to)) return convert(unary("real", x), to);
  if (!is_complex(x.dtype()) && is_complex(to)) {
    Value re = convert(x, real_part_dtype(to));
    return complex(re, splat(0, re.type));
  }
  return op("convert", {x}, "", Type{to, x.shape()});
}

Value Builder::complex(Value re, Value im) {
  if (!(re.type == im.type) || (re.dtype() != DType::F32 && re.dtype() != DType::F64))
    fail("complex",
         "parts must be f32 or f64 of one type: " + re.type.str() + ", " + im.type.str());
  return op("complex", {re, im}, "", Type{complex_dtype(re.dtype()), re.shape()});
}

Value Builder::bitcast_convert(Value x, DType to) {
  if (x.dtype() == to) return x;
  if (itemsize(x.dtype()) != itemsize(to) || x.dtype() == DType::Bool || to == DType::Bool)
    fail("bitcast_convert", std::string("itemsize differs: ") + std::string(mlir_name(x.dtype())) +
                                " -> " + std::string(mlir_name(to)));
  return op("bitcast_convert", {x}, "", Type{to, x.shape()});
}

Value Builder::reinterpret_flat(Value x, DType to) {
  if (x.dtype() == to) return x;
  if (x.rank() != 1) fail("reinterpret_flat", "expects a rank-1 value, got " + x.type.str());
  // Complex values have no bitcast in XLA: they are read and made as their
  // interleaved (real, imaginary) parts.
  if (is_complex(x.dtype())) {
    const int64_t n = x.shape()[0];
    Type col{real_part_dtype(x.dtype()), {n, 1}};
    Value parts = concatenate(
        {reshape(unary("real", x), col.shape), reshape(unary("imag", x), col.shape)}, 1);
    return reinterpret_flat(reshape(parts, {2 * n}), to);
  }
  if (is_complex(to)) {
    Value flat = reinterpret_flat(x, real_part_dtype(to));
    const int64_t n = flat.shape()[0];
    if (n % 2 != 0) fail("reinterpret_flat", "length is not a whole number of complex elements");
    Value pairs = reshape(flat, {n / 2, 2});
    Value re = reshape(slice(pairs, {0, 0}, {n / 2, 1}, {1, 1}), {n / 2});
    Value im = reshape(slice(pairs, {0, 1}, {n / 2, 2}, {1, 1}), {n / 2});
    return complex(re, im);
  }
  if (x.dtype() == DType::Bool) x = convert(x, DType::U8);
  DType target = to == DType::Bool ? DType::U8 : to;
  const int64_t a = static_cast<int64_t>(itemsize(x.dtype()));
  const int64_t c = static_cast<int64_t>(itemsize(target));
  const int64_t n = x.shape()[0];
  Value out;
  if (a == c) {
    out = bitcast_convert(x, target);
  } else if (a > c) {
    // One wide element -> a/c narrow ones: bitcast adds a trailing dim.
    out = op("bitcast_convert", {x}, "", Type{target, {n, a / c}});
    out = reshape(out, {n * (a / c)});
  } else {
    if (n % (c / a) != 0) fail("reinterpret_flat", "length is not a whole number of elements");
    Value grouped = reshape(x, {n / (c / a), c / a});
    out = op("bitcast_convert", {grouped}, "", Type{target, {n / (c / a)}});
  }
  return to == DType::Bool ? convert(out, DType::Bool) : out;
}

// ---------------------------------------------------------------- shape

Value Builder::reshape(Value x, const Shape& shape) {
  if (x.shape() == shape) return x;
  Type out{x.dtype(), shape};
  if (out.numel() != x.type.numel())
    fail("reshape", "cannot reshape " + x.type.str() + " to " + out.str());
  auto it = reshape_src_.find(x.id);
  const Value src = it == reshape_src_.end() ? x : it->second;
  if (src.shape() == shape) return src;
  Value r = op("reshape", {src}, "", out);
  reshape_src_.emplace(r.id, src);
  return r;
}

Value Builder::broadcast_in_dim(Value x, const Shape& shape, const std::vector<int64_t>& dims) {
  Type out{x.dtype(), shape};
  if (static_cast<int64_t>(dims.size()) != x.rank())
    fail("broadcast_in_dim", "need " + std::to_string(x.rank()) + " dims, got " + list(dims));
  check_dims("broadcast_in_dim", dims, out.rank());
  for (size_t i = 0; i < dims.size(); ++i)
    if (x.shape()[i] != 1 && x.shape()[i] != shape[dims[i]])
      fail("broadcast_in_dim",
           "cannot broadcast " + x.type.str() + " to " + out.str() + " with dims " + list(dims));
  return op("broadcast_in_dim", {x}, "broadcast_dimensions = " + arr(dims), out);
}

Value Builder::transpose(Value x, const std::vector<int64_t>& perm) {
  if (static_cast<int64_t>(perm.size()) != x.rank())
    fail("transpose", "permutation " + list(perm) + " for " + x.type.str());
  check_dims("transpose", perm, x.rank());
  Type out{x.dtype(), {}};
  for (int64_t p : perm) out.shape.push_back(x.shape()[p]);
  return op("transpose", {x}, "permutation = " + arr(perm), out);
}

Value Builder::swap_dims(Value x, int64_t a, int64_t b) {
  if (a == b) return x;
  std::vector<int64_t> perm(static_cast<size_t>(x.rank()));
  std::iota(perm.begin(), perm.end(), 0);
  check_dims("swap_dims", {a, b}, x.rank());
  std::swap(perm[a], perm[b]);
  return transpose(x, perm);
}

Value Builder::slice(Value x, const Shape& start, const Shape& limit, const Shape& strides) {
  size_t r = static_cast<size_t>(x.rank());
  Shape st = strides.empty() ? Shape(r, 1) : strides;
  if (start.size() != r || limit.size() != r || st.size() != r)
    fail("slice", "bounds rank differs from " + x.type.str());
  Type out{x.dtype(), {}};
  for (size_t i = 0; i < r; ++i) {
    if (start[i] < 0 || limit[i] < start[i] || limit[i] > x.shape()[i] || st[i] < 1)
      fail("slice", "bad bounds " + list(start) + ".." + list(limit) + " step " + list(st) +
                        " for " + x.type.str());
    out.shape.push_back((limit[i] - start[i] + st[i] - 1) / st[i]);
  }
  Value v = op("slice", {x},
               "start_indices = " + arr(start) + ", limit_indices = " + arr(limit) +
                   ", strides = " + arr(st),
               out);
  if (v.rank() == 1 && st[0] == 1) {
    auto it = piece_.find(x.id);
    piece_.emplace(v.id, it == piece_.end() ? Piece{x, start[0], limit[0]}
                                            : Piece{it->second.of, it->second.begin + start[0],
                                                    it->second.begin + limit[0]});
  }
  return v;
}

Value Builder::dynamic_slice(Value x, const std::vector<Value>& starts, const Shape& sizes) {
  if (static_cast<int64_t>(starts.size()) != x.rank() ||
      static_cast<int64_t>(sizes.size()) != x.rank())
    fail("dynamic_slice", "need " + std::to_string(x.rank()) + " starts and sizes");
  std::vector<Value> args{x};
  for (size_t i = 0; i < starts.size(); ++i) {
    if (starts[i].rank() != 0 || is_float(starts[i].dtype()) || starts[i].dtype() == DType::Bool)
      fail("dynamic_slice", "start " + std::to_string(i) + " must be an integer scalar, got " +
                                starts[i].type.str());
    if (sizes[i] < 0 || sizes[i] > x.shape()[i])
      fail("dynamic_slice", "size " + list(sizes) + " exceeds " + x.type.str());
    args.push_back(convert(starts[i], DType::I64));  // all starts must share one type
  }
  return op("dynamic_slice", args, "slice_sizes = " + arr(sizes), Type{x.dtype(), sizes});
}

Value Builder::dynamic_update_slice(Value x, Value update, const std::vector<Value>& starts) {
  if (update.dtype() != x.dtype() || update.rank() != x.rank() ||
      static_cast<int64_t>(starts.size()) != x.rank())
    fail("dynamic_update_slice", "update " + update.type.str() + " / " +
                                     std::to_string(starts.size()) + " starts for " + x.type.str());
  std::vector<Value> args{x, update};
  for (size_t i = 0; i < starts.size(); ++i) {
    if (starts[i].rank() != 0 || is_float(starts[i].dtype()) || starts[i].dtype() == DType::Bool)
      fail("dynamic_update_slice", "start " + std::to_string(i) + " must be an integer scalar");
    if (update.shape()[i] > x.shape()[i])
      fail("dynamic_update_slice", "update " + update.type.str() + " larger than " + x.type.str());
    args.push_back(convert(starts[i], DType::I64));
  }
  return op("dynamic_update_slice", args, "", x.type);
}

Value Builder::concatenate(const std::vector<Value>& xs, int64_t dim) {
  if (xs.empty()) fail("concatenate", "no operands");
  if (dim < 0 || dim >= xs[0].rank())
    fail("concatenate", "dim " + std::to_string(dim) + " out of range for " + xs[0].type.str());
  if (xs.size() == 1) return xs[0];
  if (xs[0].rank() == 1) {
    // Adjacent slices of one value, in order: that value, or one slice of it.
    auto first = piece_.find(xs[0].id);
    bool adjacent = first != piece_.end();
    int64_t end = adjacent ? first->second.begin : 0;
    for (const Value& v : xs) {
      auto it = adjacent ? piece_.find(v.id) : piece_.end();
      adjacent =
          it != piece_.end() && it->second.of.id == first->second.of.id && it->second.begin == end;
      if (adjacent) end = it->second.end;
    }
    if (adjacent) {
      const Value& of = first->second.of;
      if (first->second.begin == 0 && end == of.shape()[0]) return of;
      return slice(of, {first->second.begin}, {end}, {1});
    }
  }
  Type out = xs[0].type;
  out.shape[dim] = 0;
  for (const Value& v : xs) {
    Shape a = v.shape(), b = xs[0].shape();
    if (v.rank() == xs[0].rank()) a[dim] = b[dim] = 0;
    if (v.dtype() != out.dtype || a != b)
      fail("concatenate", "operand " + v.type.str() + " does not match " + xs[0].type.str());
    out.shape[dim] += v.shape()[dim];
  }
  Value r = op("concatenate", xs, "dimension = " + std::to_string(dim) + " : i64", out);
  joined_.insert(r.id);
  return r;
}

Value Builder::pad(Value x, Value pad_value, const Shape& lo, const Shape& hi,
                   const Shape& interior) {
  size_t r = static_cast<size_t>(x.rank());
  Shape in = interior.empty() ? Shape(r, 0) : interior;
  if (pad_value.rank() != 0 || pad_value.dtype() != x.dtype())
    fail("pad", "pad value " + pad_value.type.str() + " for " + x.type.str());
  if (lo.size() != r || hi.size() != r || in.size() != r)
    fail("pad", "padding rank differs from " + x.type.str());
  Type out{x.dtype(), {}};
  for (size_t i = 0; i < r; ++i) {
    int64_t d = x.shape()[i];
    int64_t n = lo[i] + hi[i] + d + (d > 0 ? (d - 1) * in[i] : 0);
    if (in[i] < 0 || n < 0)
      fail("pad",
           "bad padding " + list(lo) + "/" + list(hi) + "/" + list(in) + " for " + x.type.str());
    out.shape.push_back(n);
  }
  return op("pad", {x, pad_value},
            "edge_padding_low = " + arr(lo) + ", edge_padding_high = " + arr(hi) +
                ", interior_padding = " + arr(in),
            out);
}

Value Builder::reverse(Value x, const std::vector<int64_t>& dims) {
  check_dims("reverse", dims, x.rank());
  if (dims.empty()) return x;
  return op("reverse", {x}, "dimensions = " + arr(dims), x.type);
}

}  // namespace torchtpu::hlo
