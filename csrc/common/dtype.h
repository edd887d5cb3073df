// Element types shared by the torch-free layers (pjrt, hlo).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace torchtpu {

// C64/C128: complex<f32>/complex<f64>, real and imaginary parts interleaved.
enum class DType : uint8_t {
  Bool,
  I8,
  I16,
  I32,
  I64,
  U8,
  U16,
  U32,
  U64,
  F16,
  BF16,
  F32,
  F64,
  C64,
  C128
};

constexpr size_t itemsize(DType t) {
  switch (t) {
    case DType::Bool:
    case DType::I8:
    case DType::U8: return 1;
    case DType::I16:
    case DType::U16:
    case DType::F16:
    case DType::BF16: return 2;
    case DType::I32:
    case DType::U32:
    case DType::F32: return 4;
    case DType::I64:
    case DType::U64:
    case DType::F64:
    case DType::C64: return 8;
    case DType::C128: return 16;
  }
  return 0;
}

// MLIR element type spelling used in StableHLO text.
constexpr std::string_view mlir_name(DType t) {
  switch (t) {
    case DType::Bool: return "i1";
    case DType::I8: return "i8";
    case DType::I16: return "i16";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
    case DType::U8: return "ui8";
    case DType::U16: return "ui16";
    case DType::U32: return "ui32";
    case DType::U64: return "ui64";
    case DType::F16: return "f16";
    case DType::BF16: return "bf16";
    case DType::F32: return "f32";
    case DType::F64: return "f64";
    case DType::C64: return "complex<f32>";
    case DType::C128: return "complex<f64>";
  }
  return "?";
}

constexpr bool is_float(DType t) {
  return t == DType::F16 || t == DType::BF16 || t == DType::F32 || t == DType::F64;
}
constexpr bool is_complex(DType t) { return t == DType::C64 || t == DType::C128; }
// The real type of a complex type's parts; other types map to themselves.
constexpr DType real_part_dtype(DType t) {
  return t == DType::C64 ? DType::F32 : t == DType::C128 ? DType::F64 : t;
}
// The complex type whose parts are `t` (F32 -> C64, F64 -> C128).
constexpr DType complex_dtype(DType t) { return t == DType::F64 ? DType::C128 : DType::C64; }
constexpr bool is_unsigned(DType t) {
  return t == DType::U8 || t == DType::U16 || t == DType::U32 || t == DType::U64;
}
constexpr bool is_signed_int(DType t) {
  return t == DType::I8 || t == DType::I16 || t == DType::I32 || t == DType::I64;
}

}  // namespace torchtpu
