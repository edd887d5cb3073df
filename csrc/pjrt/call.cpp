// Out-of-line parts of the PJRT calling convention (call.h) and element types.
#include "pjrt/call.h"

#include <string>
#include <vector>

namespace torchtpu::pjrt::detail {

[[noreturn]] void throw_missing(const char* name) {
  throw Error(std::string("plugin lacks ") + name +
              ": the PJRT plugin is too old or incomplete; install a plugin matching PJRT C API " +
              std::to_string(PJRT_API_MAJOR) + "." + std::to_string(PJRT_API_MINOR));
}

void destroy_error(const PJRT_Api* api, PJRT_Error* err) noexcept {
  if (err == nullptr) return;
  if (auto* fn = TT_FN(api, Error_Destroy)) {
    auto a = TT_ARGS(Error_Destroy);
    a.error = err;
    fn(&a);
  }
}

void throw_error(const PJRT_Api* api, PJRT_Error* err, const char* name) {
  std::string msg = std::string(name) + ": ";
  if (auto* fn = TT_FN(api, Error_Message)) {
    auto a = TT_ARGS(Error_Message);
    a.error = err;
    fn(&a);
    msg.append(a.message, a.message_size);
  } else {
    msg += "(plugin gave no message)";
  }
  int code = 0;
  if (auto* fn = TT_FN(api, Error_GetCode)) {
    auto a = TT_ARGS(Error_GetCode);
    a.error = err;
    if (PJRT_Error* e2 = fn(&a)) {
      destroy_error(api, e2);
    } else {
      code = static_cast<int>(a.code);
    }
  }
  destroy_error(api, err);
  throw Error(msg, code);
}

void destroy_buffer(const PJRT_Api* api, PJRT_Buffer* buf) noexcept {
  if (buf == nullptr) return;
  auto a = TT_ARGS(Buffer_Destroy);
  a.buffer = buf;
  call_ignoring_error(api, TT_FN(api, Buffer_Destroy), &a);
}

PJRT_Buffer_Type to_pjrt(DType t) {
  switch (t) {
    case DType::Bool: return PJRT_Buffer_Type_PRED;
    case DType::I8: return PJRT_Buffer_Type_S8;
    case DType::I16: return PJRT_Buffer_Type_S16;
    case DType::I32: return PJRT_Buffer_Type_S32;
    case DType::I64: return PJRT_Buffer_Type_S64;
    case DType::U8: return PJRT_Buffer_Type_U8;
    case DType::U16: return PJRT_Buffer_Type_U16;
    case DType::U32: return PJRT_Buffer_Type_U32;
    case DType::U64: return PJRT_Buffer_Type_U64;
    case DType::F16: return PJRT_Buffer_Type_F16;
    case DType::BF16: return PJRT_Buffer_Type_BF16;
    case DType::F32: return PJRT_Buffer_Type_F32;
    case DType::F64: return PJRT_Buffer_Type_F64;
    case DType::C64: return PJRT_Buffer_Type_C64;
    case DType::C128: return PJRT_Buffer_Type_C128;
  }
  throw Error("invalid DType " + std::to_string(static_cast<int>(t)));
}

DType from_pjrt(PJRT_Buffer_Type t) {
  switch (t) {
    case PJRT_Buffer_Type_PRED: return DType::Bool;
    case PJRT_Buffer_Type_S8: return DType::I8;
    case PJRT_Buffer_Type_S16: return DType::I16;
    case PJRT_Buffer_Type_S32: return DType::I32;
    case PJRT_Buffer_Type_S64: return DType::I64;
    case PJRT_Buffer_Type_U8: return DType::U8;
    case PJRT_Buffer_Type_U16: return DType::U16;
    case PJRT_Buffer_Type_U32: return DType::U32;
    case PJRT_Buffer_Type_U64: return DType::U64;
    case PJRT_Buffer_Type_F16: return DType::F16;
    case PJRT_Buffer_Type_BF16: return DType::BF16;
    case PJRT_Buffer_Type_F32: return DType::F32;
    case PJRT_Buffer_Type_F64: return DType::F64;
    case PJRT_Buffer_Type_C64: return DType::C64;
    case PJRT_Buffer_Type_C128: return DType::C128;
    default: break;
  }
  throw Error(
      "PJRT buffer element type " + std::to_string(static_cast<int>(t)) +
      " has no torchtpu DType; the program must only produce bool/int/float/complex outputs");
}

BufferPtr wrap_output(const std::shared_ptr<Client>& client, PJRT_Buffer* raw) {
  const PJRT_Api* api = client->api();
  auto type = TT_ARGS(Buffer_ElementType);
  type.buffer = raw;
  TT_CALL(api, Buffer_ElementType, type);
  DType dtype = from_pjrt(type.type);
  auto shape = TT_ARGS(Buffer_Dimensions);
  shape.buffer = raw;
  TT_CALL(api, Buffer_Dimensions, shape);
  std::vector<int64_t> dims(shape.dims, shape.dims + shape.num_dims);
  return std::make_shared<Buffer>(client, raw, dtype, std::move(dims));
}

}  // namespace torchtpu::pjrt::detail
