#include "hlo/work.h"

#include <algorithm>

namespace torchtpu::hlo {

namespace {

// The most elements of any tensor type named in `text`.
int64_t largest_tensor(std::string_view text) {
  constexpr std::string_view kTensor = "tensor<";
  int64_t most = 0;
  for (size_t at = text.find(kTensor); at != std::string_view::npos;
       at = text.find(kTensor, at + kTensor.size())) {
    int64_t n = 1;
    size_t i = at + kTensor.size();
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') {
      int64_t d = 0;
      while (i < text.size() && text[i] >= '0' && text[i] <= '9') d = d * 10 + (text[i++] - '0');
      n *= d;
      if (i < text.size() && text[i] == 'x') ++i;
    }
    most = std::max(most, n);
  }
  return most;
}

bool has(std::string_view line, std::string_view what) {
  return line.find(what) != std::string_view::npos;
}

// Generic ("stablehlo.reduce"(...) and pretty (stablehlo.reduce(...) forms alike,
// not reduce_precision or reduce_scatter.
bool has_region_op(std::string_view line) {
  for (std::string_view op : {"stablehlo.reduce", "stablehlo.reduce_window", "stablehlo.scatter",
                              "stablehlo.select_and_scatter", "stablehlo.sort", "stablehlo.while"})
    for (size_t at = line.find(op); at != std::string_view::npos; at = line.find(op, at + 1)) {
      char next = at + op.size() < line.size() ? line[at + op.size()] : ' ';
      if (next == '"' || next == '(' || next == ' ') return true;
    }
  return false;
}

// Ops whose results do not depend on how the loop computing them is compiled.
bool exact_op(std::string_view name) {
  static constexpr std::string_view kExact =
      " abs add and broadcast_in_dim clamp compare concatenate constant convert divide"
      " dynamic_slice dynamic_update_slice iota maximum minimum multiply negate not or pad"
      " reshape return reverse select slice sqrt subtract transpose xor ";
  if (name.empty()) return false;
  for (size_t at = kExact.find(name); at != std::string_view::npos; at = kExact.find(name, at + 1))
    if (kExact[at - 1] == ' ' && kExact[at + name.size()] == ' ') return true;
  return false;
}

// Whether every op named on the line (`stablehlo.NAME`, any other dialect
// counting as not exact) is an exact_op.
bool exact_line(std::string_view line) {
  for (std::string_view dialect : {"chlo.", "mhlo.", "shardy.", "sdy."})
    if (has(line, dialect)) return false;
  constexpr std::string_view kOp = "stablehlo.";
  for (size_t at = line.find(kOp); at != std::string_view::npos; at = line.find(kOp, at + 1)) {
    size_t end = at + kOp.size();
    while (end < line.size() && ((line[end] >= 'a' && line[end] <= 'z') || line[end] == '_')) ++end;
    if (!exact_op(line.substr(at + kOp.size(), end - at - kOp.size()))) return false;
  }
  return true;
}

}  // namespace

ModuleWork module_work(std::string_view text) {
  ModuleWork w;
  for (size_t start = 0; start < text.size();) {
    size_t end = std::min(text.find('\n', start), text.size());
    std::string_view line = text.substr(start, end - start);
    start = end + 1;
    if (has(line, "func.func") || has(line, "stablehlo.reshape")) continue;
    w.regions = w.regions || has_region_op(line);
    w.exact = w.exact && exact_line(line);
    if (has(line, "stablehlo.gather") || has(line, "stablehlo.dynamic_slice") ||
        has(line, "stablehlo.slice")) {
      size_t arrow = line.rfind("->");
      if (arrow != std::string_view::npos)
        w.loop = std::max(w.loop, largest_tensor(line.substr(arrow)));
    } else if (has(line, "stablehlo.dot_general") || has(line, "stablehlo.convolution")) {
      w.dot = std::max(w.dot, largest_tensor(line));
    } else {
      w.loop = std::max(w.loop, largest_tensor(line));
    }
  }
  return w;
}

std::optional<std::vector<Type>> module_results(std::string_view text) {
  constexpr std::string_view kMain = "func.func public @main(", kArrow = ") -> (";
  size_t at = text.find(kMain);
  if (at == std::string_view::npos) return std::nullopt;
  size_t eol = std::min(text.find('\n', at), text.size());
  size_t arrow = text.substr(0, eol).rfind(kArrow);
  if (arrow == std::string_view::npos || arrow < at) return std::nullopt;
  std::string_view sig = text.substr(arrow + kArrow.size(), eol - arrow - kArrow.size());
  std::vector<Type> out;
  constexpr std::string_view kTensor = "tensor<";
  for (size_t i = sig.find(kTensor); i != std::string_view::npos; i = sig.find(kTensor, i)) {
    i += kTensor.size();
    Type t;
    while (i < sig.size() && sig[i] >= '0' && sig[i] <= '9') {
      int64_t d = 0;
      while (i < sig.size() && sig[i] >= '0' && sig[i] <= '9') d = d * 10 + (sig[i++] - '0');
      t.shape.push_back(d);
      if (i < sig.size() && sig[i] == 'x') ++i;
    }
    // The element type runs to the '>' that closes this tensor (complex<..> nests one).
    size_t close = sig.find('>', i);
    if (close == std::string_view::npos) return std::nullopt;
    if (sig.substr(i, 8) == "complex<") close = sig.find('>', close + 1);
    if (close == std::string_view::npos) return std::nullopt;
    std::string_view name = sig.substr(i, close - i);
    bool known = false;
    for (int k = 0; k <= static_cast<int>(DType::C128) && !known; ++k)
      if (mlir_name(static_cast<DType>(k)) == name) {
        t.dtype = static_cast<DType>(k);
        known = true;
      }
    if (!known) return std::nullopt;
    out.push_back(std::move(t));
    i = close + 1;
  }
  return out;
}

}  // namespace torchtpu::hlo
