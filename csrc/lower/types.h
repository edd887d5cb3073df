// DType <-> c10::ScalarType, and torch's type promotion on DTypes.
#pragma once
#include <c10/core/ScalarType.h>

#include "common/dtype.h"

namespace torchtpu::lower {

// Throws c10::Error naming the dtype when the device has no such type.
DType to_dtype(c10::ScalarType t);
c10::ScalarType to_scalar_type(DType t);
// torch.promote_types on DTypes.
DType promote(DType a, DType b);

}  // namespace torchtpu::lower
