// Point-to-point between tpu_local thread ranks. A send posts the sender's
// device buffer (immutable: later writes to the tensor make a new one) under
// (src, dst, tag); a receive posts what it expects. Each post is matched at
// once with the oldest fitting post of the other side, so both calls return
// at once and isend/irecv rings cannot deadlock. Their Work waits for the
// match; a receive then gets a device-to-device copy on its own device. A
// peer that never answers, or answers with another dtype or size, fails the
// wait within the timeout on each side that waits; a peer that left fails it
// at once.
#pragma once
#include <ATen/core/Tensor.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "pjrt/pjrt.h"

namespace torchtpu::dist {

class Mailbox;
std::shared_ptr<Mailbox> make_mailbox(int size);
// Rank `rank` is gone: waits that need it fail at once, naming `why`.
void mailbox_leave(Mailbox& box, int rank, const std::string& why);

struct PointToPoint {
  std::shared_ptr<Mailbox> box;
  int rank = 0;
  int device = 0;  // the rank's tpu device index
  std::chrono::milliseconds timeout{0};
  std::string where;  // the caller's Python "file:line", if known
};

// `buf`: `t`'s values as a flat buffer on the sender's device.
c10::intrusive_ptr<c10d::Work> local_send(const PointToPoint& p, const at::Tensor& t,
                                          pjrt::BufferPtr buf, int dst, int tag);
// `src` < 0: from any rank. `assign(t, buf)` writes a flat buffer of t's numel into `t`.
c10::intrusive_ptr<c10d::Work> local_recv(
    const PointToPoint& p, const at::Tensor& t, int src, int tag,
    std::function<void(at::Tensor&, const pjrt::BufferPtr&)> assign);

}  // namespace torchtpu::dist
