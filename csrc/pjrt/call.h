// Internal to csrc/pjrt: how every PJRT C API call is made (args structs,
// function lookup, errors), and the small owners built on it. Not installed;
// include only from csrc/pjrt/*.cpp.
#pragma once

#include <cstddef>
#include <cstring>
#include <memory>

#include "pjrt/pjrt.h"
#include "pjrt_c_api.h"

namespace torchtpu::pjrt::detail {

// Zero-initialized args struct with struct_size set, as every PJRT call expects.
template <class Args>
Args make_args(size_t struct_size) {
  Args args{};
  args.struct_size = struct_size;
  return args;
}
#define TT_ARGS(Name) make_args<PJRT_##Name##_Args>(PJRT_##Name##_Args_STRUCT_SIZE)

// Looks up a function pointer, or nullptr when the plugin's PJRT_Api is too old
// to have the field (its struct_size ends before it) or leaves it unset.
template <class Fn>
Fn* find_fn(const PJRT_Api* api, size_t offset) {
  if (offset + sizeof(Fn*) > api->struct_size) return nullptr;
  Fn* fn;
  std::memcpy(&fn, reinterpret_cast<const char*>(api) + offset, sizeof(fn));
  return fn;
}
#define TT_FN(api, Name) find_fn<PJRT_##Name>(api, offsetof(PJRT_Api, PJRT_##Name))

[[noreturn]] void throw_missing(const char* name);

void destroy_error(const PJRT_Api* api, PJRT_Error* err) noexcept;

// Turns a plugin error into pjrt::Error("<name>: <message>", code) and frees it.
[[noreturn]] void throw_error(const PJRT_Api* api, PJRT_Error* err, const char* name);

template <class Fn, class Args>
inline void call_checked(const PJRT_Api* api, Fn* fn, Args* args, const char* name) {
  if (fn == nullptr) [[unlikely]]
    throw_missing(name);
  if (PJRT_Error* err = fn(args)) [[unlikely]]
    throw_error(api, err, name);
}
// Calls PJRT_<Name>(&args), throwing pjrt::Error on failure.
#define TT_CALL(api, Name, args) call_checked(api, TT_FN(api, Name), &(args), "PJRT_" #Name)

// Calls a destroy-like function whose failure can only be swallowed.
template <class Fn, class Args>
void call_ignoring_error(const PJRT_Api* api, Fn* fn, Args* args) noexcept {
  if (fn != nullptr) destroy_error(api, fn(args));
}

void destroy_buffer(const PJRT_Api* api, PJRT_Buffer* buf) noexcept;

// Owns a PJRT_Event; Await reports the async operation's error.
class Event {
 public:
  Event(const PJRT_Api* api, PJRT_Event* event) : api_(api), event_(event) {}
  ~Event() {
    if (event_ == nullptr) return;
    auto a = TT_ARGS(Event_Destroy);
    a.event = event_;
    call_ignoring_error(api_, TT_FN(api_, Event_Destroy), &a);
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  // `what` names the operation the event belongs to, for the error message.
  void await(const char* what) const {
    if (event_ == nullptr) return;  // Nothing pending.
    auto a = TT_ARGS(Event_Await);
    a.event = event_;
    call_checked(api_, TT_FN(api_, Event_Await), &a, what);
  }
  bool is_ready() const {
    if (event_ == nullptr) return true;
    auto a = TT_ARGS(Event_IsReady);
    a.event = event_;
    TT_CALL(api_, Event_IsReady, a);
    return a.is_ready;
  }

 private:
  const PJRT_Api* api_;
  PJRT_Event* event_;
};

// Owns a PJRT_Executable (the unloaded view of a loaded executable).
class ExecutableView {
 public:
  ExecutableView(const PJRT_Api* api, PJRT_LoadedExecutable* loaded) : api_(api) {
    auto a = TT_ARGS(LoadedExecutable_GetExecutable);
    a.loaded_executable = loaded;
    TT_CALL(api, LoadedExecutable_GetExecutable, a);
    exe_ = a.executable;
  }
  ~ExecutableView() {
    auto a = TT_ARGS(Executable_Destroy);
    a.executable = exe_;
    call_ignoring_error(api_, TT_FN(api_, Executable_Destroy), &a);
  }
  ExecutableView(const ExecutableView&) = delete;
  ExecutableView& operator=(const ExecutableView&) = delete;
  PJRT_Executable* get() const { return exe_; }

 private:
  const PJRT_Api* api_;
  PJRT_Executable* exe_ = nullptr;
};

PJRT_Buffer_Type to_pjrt(DType t);
DType from_pjrt(PJRT_Buffer_Type t);
// Wraps a freshly produced PJRT buffer, reading its element type and shape.
BufferPtr wrap_output(const std::shared_ptr<Client>& client, PJRT_Buffer* raw);

}  // namespace torchtpu::pjrt::detail
