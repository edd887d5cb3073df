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

}  // namespace

ModuleWork module_work(std::string_view text) {
  ModuleWork w;
  for (size_t start = 0; start < text.size();) {
    size_t end = std::min(text.find('\n', start), text.size());
    std::string_view line = text.substr(start, end - start);
    start = end + 1;
    if (has(line, "func.func") || has(line, "stablehlo.reshape")) continue;
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

}  // namespace torchtpu::hlo
