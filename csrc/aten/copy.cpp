#include "aten/copy.h"

#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <functional>

#include "aten/fused.h"
#include "aten/host_ops.h"
#include "aten/launch.h"
#include "aten/program.h"
#include "lower/types.h"
#include "lower/view.h"

namespace torchtpu::aten {

using hlo::Builder;
using hlo::Shape;
using hlo::Type;
using hlo::Value;
using lower::to_dtype;

namespace {

// Runs the internal program `key` (a "C"-prefixed key in the launcher's
// table), built by `build` on a miss; `kind` names it in profiler traces.
std::vector<pjrt::BufferPtr> run_internal(const char* kind, const std::string& key,
                                          const std::function<void(Builder&)>& build,
                                          const std::vector<pjrt::BufferPtr>& inputs, int device) {
  std::shared_ptr<const Launchable> entry = find_program(key);
  auto name = [&](const char* what) { return std::string("torchtpu::") + what + " " + kind; };
  if (!entry) {
    TraceScope trace([&] { return name("compile"); });
    Builder b;
    build(b);
    auto made = std::make_shared<Launchable>();
    compile_program(b.module(), *made);
    made->what = kind;
    count_program(kind);
    add_program(key, made);
    entry = std::move(made);
  } else {
    metrics().cache_hits++;
  }
  TraceScope trace([&] { return name("execute"); });
  return launch(*entry, inputs, device);
}

std::string geom_key(const at::Tensor& t) {
  std::string k;
  auto put = [&](int64_t v) { k.append(reinterpret_cast<const char*>(&v), sizeof v); };
  put(static_cast<int64_t>(t.scalar_type()));
  put(t.dim());
  for (int64_t s : t.sizes()) put(s);
  for (int64_t s : t.strides()) put(s);
  put(t.storage_offset());
  return k;
}

// The storage's buffer, created as zeros (of the tensor's dtype) when unwritten.
DeviceStorage& ready_storage(const at::Tensor& t) {
  auto& st = device_storage(t.storage());
  if (!st.buffer) {
    DType d = to_dtype(t.scalar_type());
    st.buffer = zeros_buffer(d, static_cast<int64_t>(st.nbytes / itemsize(d)), st.device);
    st.dtype = d;
  }
  return st;
}

Value load_flat(Builder& b, const DeviceStorage& st, DType want) {
  Value flat = b.param(Type{st.dtype, {static_cast<int64_t>(st.buffer->numel())}});
  return b.reinterpret_flat(flat, want);
}

bool whole_storage(const at::Tensor& t, const DeviceStorage& st) {
  lower::ViewGeom g = view_geom(t);
  return g.contiguous() && g.offset == 0 &&
         static_cast<size_t>(g.numel()) * t.element_size() == st.nbytes;
}

// Writes `value_buf` (dense, dst's sizes; maybe another dtype) through dst's view.
void write_dense(const at::Tensor& dst, const pjrt::BufferPtr& value_buf) {
  auto& st = device_storage(dst.storage());
  fused_sync(st, "write", /*write=*/true);
  DType d = to_dtype(dst.scalar_type());
  if (whole_storage(dst, st) && value_buf->dtype() == d) {
    st.buffer = value_buf;
    st.dtype = d;
    return;
  }
  ready_storage(dst);
  std::string key = "Cwrite" + geom_key(dst);
  key.push_back(static_cast<char>(value_buf->dtype()));
  key.push_back(static_cast<char>(st.dtype));
  key.append(std::to_string(st.buffer->numel()));
  DType sd = st.dtype;
  int64_t n = st.buffer->numel();
  auto outs = run_internal(
      "copy_write", key,
      [&](Builder& b) {
        Value v = b.param(Type{value_buf->dtype(), {dst.numel()}});
        Value flat = b.param(Type{sd, {n}});
        Value view = b.convert(b.reshape(v, dst.sizes().vec()), d);
        Value written = lower::write_view(b, b.reinterpret_flat(flat, d), view_geom(dst), view);
        b.ret({b.reinterpret_flat(written, sd)});
      },
      {value_buf, st.buffer}, st.device);
  st.buffer = outs[0];
}

// A view of `st` gathered densely, its offset and strides runtime values.
pjrt::BufferPtr read_moving_view(const at::Tensor& t, const DeviceStorage& st, DType d) {
  const int64_t rank = t.dim();
  std::vector<int64_t> geo{t.storage_offset()};
  for (int64_t s : t.strides()) geo.push_back(s);
  const int64_t n_geo = static_cast<int64_t>(geo.size());
  std::string key = "Creadg";
  key.push_back(static_cast<char>(d));
  key.push_back(static_cast<char>(st.dtype));
  for (int64_t z : t.sizes()) key.append(std::to_string(z)).push_back(',');
  key.append(std::to_string(st.buffer->numel()));
  auto outs = run_internal(
      "copy_read", key,
      [&](Builder& b) {
        Value flat = load_flat(b, st, d);
        Value g = b.param(Type{DType::I64, {n_geo}});
        auto at = [&](int64_t i) { return b.reshape(b.slice(g, {i}, {i + 1}, {1}), {}); };
        const std::vector<int64_t> sizes = t.sizes().vec();
        const Type idx_t{DType::I64, sizes};
        Value idx = b.broadcast_in_dim(at(0), sizes, {});
        for (int64_t k = 0; k < rank; ++k)
          idx = b.binary(
              "add", idx,
              b.binary("multiply", b.iota(idx_t, k), b.broadcast_in_dim(at(k + 1), sizes, {})));
        b.ret({b.reshape(b.gather_flat(flat, idx), {t.numel()})});
      },
      {st.buffer, upload(geo.data(), DType::I64, {&n_geo, 1}, st.device)}, st.device);
  return outs[0];
}

}  // namespace

pjrt::BufferPtr buffer_copy(const pjrt::BufferPtr& buf, int device) {
  const DType d = buf->dtype();
  const std::vector<int64_t> dims = buf->dims();
  std::string key = "Cdup";
  key.push_back(static_cast<char>(d));
  for (int64_t n : dims) key.append(std::to_string(n)).push_back(',');
  return run_internal(
      "copy_buffer", key,
      [&](Builder& b) {
        b.ret({b.param(Type{d, dims})});
      },
      {buf}, device)[0];
}

pjrt::BufferPtr dense_buffer(const at::Tensor& t, const char* why) {
  fused_sync(device_storage(t.storage()), why);
  auto& st = ready_storage(t);
  DType d = to_dtype(t.scalar_type());
  if (whole_storage(t, st) && st.dtype == d) return st.buffer;
  std::string key = "Cread" + geom_key(t);
  key.push_back(static_cast<char>(st.dtype));
  key.append(std::to_string(st.buffer->numel()));
  // A bucketed call wrote this storage at its bucket's capacity, so views of
  // it move (a growing sequence's last column) while its size stays: read
  // with the offset and strides as runtime values, one program per bucket.
  if (st.bucketed() && t.dim() > 0 && t.numel() > 0 && !find_program(key))
    return read_moving_view(t, st, d);
  // A small integer view whose geometry keeps changing (a growing sequence's
  // last column) is gathered on the host instead of compiling a program each time.
  if (st.nbytes <= (64 << 10) && c10::isIntegralType(t.scalar_type(), true) && !find_program(key) &&
      shape_churn("copy_read|" + std::to_string(static_cast<int>(t.scalar_type())) + "," +
                      std::to_string(t.dim()),
                  key) != NewShape::Compile) {
    count_host_call("copy_read");
    at::Tensor host = to_host(t, why).contiguous();
    int64_t dims[1] = {host.numel()};
    return upload(host.data_ptr(), d, dims, st.device);
  }
  auto outs = run_internal(
      "copy_read", key,
      [&](Builder& b) {
        Value flat = load_flat(b, st, d);
        b.ret({b.reshape(lower::read_view(b, flat, view_geom(t)), {t.numel()})});
      },
      {st.buffer}, st.device);
  return outs[0];
}

at::Tensor storage_bytes_to_host(const at::Tensor& t, const char* why) {
  auto& st = device_storage(t.storage());
  fused_sync(st, why);
  at::Tensor bytes = at::empty({static_cast<int64_t>(st.nbytes)}, at::kByte);
  if (!st.buffer) return bytes.zero_();
  return download(*st.buffer, bytes);
}

at::Tensor view_of_bytes(const at::Tensor& bytes, const at::Tensor& t) {
  return at::empty({0}, t.options().device(c10::kCPU))
      .set_(bytes.storage(), t.storage_offset(), t.sizes(), t.strides());
}

at::Tensor to_host(const at::Tensor& t, const char* why) {
  const auto& st = device_storage(t.storage());
  const size_t view_bytes = static_cast<size_t>(t.numel()) * t.element_size();
  // Reading up to twice the bytes (or 64 KiB) beats compiling a gather.
  if (!whole_storage(t, st) && (st.nbytes <= (64 << 10) || st.nbytes <= 2 * view_bytes))
    return view_of_bytes(storage_bytes_to_host(t, why), t);
  return download(*dense_buffer(t, why), t);
}

void device_copy(const at::Tensor& src, const at::Tensor& dst) {
  if (dst.numel() == 0) return;
  auto& ss = device_storage(src.storage());
  auto& ds = device_storage(dst.storage());
  if (ss.device != ds.device) {
    // Across devices: through the host (one client, no peer copies needed here).
    at::Tensor host = download(*dense_buffer(src), src);
    host_to_device(host.expand(dst.sizes()).to(dst.scalar_type()).contiguous(), dst);
    return;
  }
  // Read src densely, then broadcast/convert/write into dst in one program.
  pjrt::BufferPtr sbuf = dense_buffer(src);
  DType d = to_dtype(dst.scalar_type());
  if (src.sizes() == dst.sizes() && sbuf->dtype() == d) return write_dense(dst, sbuf);
  std::string key = "Cbcast" + geom_key(src) + geom_key(dst);
  auto outs = run_internal(
      "copy_broadcast", key,
      [&](Builder& b) {
        Value v = b.param(Type{sbuf->dtype(), {src.numel()}});
        v = b.reshape(v, src.sizes().vec());
        Shape target = dst.sizes().vec();
        // Right-aligned broadcast of src to dst's sizes.
        std::vector<int64_t> dims;
        Shape kept;
        for (int64_t i = 0; i < src.dim(); ++i) {
          int64_t td = dst.dim() - src.dim() + i;
          if (src.size(i) == target[td]) {
            dims.push_back(td);
            kept.push_back(src.size(i));
          }
        }
        v = b.broadcast_in_dim(b.reshape(v, kept), target, dims);
        b.ret({b.reshape(b.convert(v, d), {dst.numel()})});
      },
      {sbuf}, ss.device);
  write_dense(dst, outs[0]);
}

void host_to_device(const at::Tensor& src, const at::Tensor& dst) {
  TORCH_INTERNAL_ASSERT(src.is_contiguous() && src.sizes() == dst.sizes());
  auto& st = device_storage(dst.storage());
  int64_t dims[1] = {src.numel()};
  write_dense(dst, upload(src.data_ptr(), to_dtype(src.scalar_type()), dims, st.device));
}

void resize_storage(const c10::Storage& storage, size_t nbytes) {
  auto& st = device_storage(storage);
  if (nbytes == st.nbytes) return;
  fused_sync(st, "resize", /*write=*/true);
  if (st.buffer) {
    size_t is = itemsize(st.dtype);
    TORCH_CHECK(nbytes % is == 0, "[tpu] cannot resize a ", mlir_name(st.dtype), " storage to ",
                nbytes, " bytes");
    int64_t n_old = st.buffer->numel(), n_new = static_cast<int64_t>(nbytes / is);
    if (n_new == 0) {
      st.buffer.reset();
    } else {
      std::string key = "Cresize" + std::to_string(n_old) + "_" + std::to_string(n_new);
      key.push_back(static_cast<char>(st.dtype));
      DType d = st.dtype;
      auto outs = run_internal(
          "resize", key,
          [&](Builder& b) {
            Value flat = b.param(Type{d, {n_old}});
            Value out = n_new > n_old ? b.pad(flat, b.constant(0, d), {0}, {n_new - n_old}, {0})
                                      : b.slice(flat, {0}, {n_new}, {1});
            b.ret({out});
          },
          {st.buffer}, st.device);
      st.buffer = outs[0];
    }
  }
  storage_resized(st, nbytes);
  storage.unsafeGetStorageImpl()->set_nbytes(nbytes);
}

}  // namespace torchtpu::aten
