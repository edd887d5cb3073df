// Reading and writing strided views of a flat storage buffer inside a program.
// Storages are rank-1 buffers; a view is (sizes, strides, offset) over them.
#pragma once
#include "hlo/builder.h"

namespace torchtpu::lower {

struct ViewGeom {
  hlo::Shape sizes;
  std::vector<int64_t> strides;
  int64_t offset = 0;
  int64_t numel() const;
  bool contiguous() const;  // row-major dense (size-1 dims ignored)
};

// The view's value, shape `g.sizes`, from the rank-1 storage value `flat`.
hlo::Value read_view(hlo::Builder& b, hlo::Value flat, const ViewGeom& g);
// The storage value after writing `value` (shape g.sizes) through the view.
hlo::Value write_view(hlo::Builder& b, hlo::Value flat, const ViewGeom& g, hlo::Value value);

}  // namespace torchtpu::lower
