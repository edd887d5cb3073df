// A stand-in "plugin" that reports another PJRT major version, so the
// version check can be tested without a second real plugin.
#include <cstring>

#include "pjrt_c_api.h"

extern "C" const PJRT_Api* GetPjrtApi() {
  static PJRT_Api api;
  std::memset(&api, 0, sizeof api);
  api.struct_size = PJRT_Api_STRUCT_SIZE;
  api.pjrt_api_version.struct_size = PJRT_Api_Version_STRUCT_SIZE;
  api.pjrt_api_version.major_version = PJRT_API_MAJOR + 1;
  api.pjrt_api_version.minor_version = 3;
  return &api;
}
