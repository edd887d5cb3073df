#include "lower/types.h"

#include <c10/util/Exception.h>

namespace torchtpu::lower {

DType to_dtype(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Bool: return DType::Bool;
    case c10::ScalarType::Char: return DType::I8;
    case c10::ScalarType::Short: return DType::I16;
    case c10::ScalarType::Int: return DType::I32;
    case c10::ScalarType::Long: return DType::I64;
    case c10::ScalarType::Byte: return DType::U8;
    case c10::ScalarType::UInt16: return DType::U16;
    case c10::ScalarType::UInt32: return DType::U32;
    case c10::ScalarType::UInt64: return DType::U64;
    case c10::ScalarType::Half: return DType::F16;
    case c10::ScalarType::BFloat16: return DType::BF16;
    case c10::ScalarType::Float: return DType::F32;
    case c10::ScalarType::Double: return DType::F64;
    case c10::ScalarType::ComplexFloat: return DType::C64;
    case c10::ScalarType::ComplexDouble: return DType::C128;
    default:
      TORCH_CHECK_TYPE(false, "[tpu] dtype ", t,
                       " is not supported on the tpu device; supported: float32, float64, "
                       "bfloat16, float16, complex64, complex128, int8/16/32/64, uint8, bool. Cast "
                       "the tensor first.");
  }
}

c10::ScalarType to_scalar_type(DType t) {
  switch (t) {
    case DType::Bool: return c10::ScalarType::Bool;
    case DType::I8: return c10::ScalarType::Char;
    case DType::I16: return c10::ScalarType::Short;
    case DType::I32: return c10::ScalarType::Int;
    case DType::I64: return c10::ScalarType::Long;
    case DType::U8: return c10::ScalarType::Byte;
    case DType::U16: return c10::ScalarType::UInt16;
    case DType::U32: return c10::ScalarType::UInt32;
    case DType::U64: return c10::ScalarType::UInt64;
    case DType::F16: return c10::ScalarType::Half;
    case DType::BF16: return c10::ScalarType::BFloat16;
    case DType::F32: return c10::ScalarType::Float;
    case DType::F64: return c10::ScalarType::Double;
    case DType::C64: return c10::ScalarType::ComplexFloat;
    case DType::C128: return c10::ScalarType::ComplexDouble;
  }
  return c10::ScalarType::Undefined;
}

DType promote(DType a, DType b) {
  return to_dtype(c10::promoteTypes(to_scalar_type(a), to_scalar_type(b)));
}

}  // namespace torchtpu::lower
