// The `tpu_local` c10d backend: ranks are threads of this process, global
// rank r on device tpu:r. Each collective meets in an in-process rendezvous shared
// by the group's ranks; the last rank to arrive checks that every rank runs
// the same call, then launches one replicated device program over all the
// ranks' buffers (device.h); sends and receives meet in the group's mailbox
// (local_p2p.h). No host copies, no gloo.
#pragma once
#include <chrono>
#include <string>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <vector>

namespace torchtpu::dist {

// `session` names the rendezvous: equal for every rank of one group (agreed
// through the group's store), unique in the process. Group rank k runs on
// tpu:devices[k] (its global rank).
c10::intrusive_ptr<c10d::Backend> make_local_backend(const std::string& session, int rank,
                                                     const std::vector<int>& devices,
                                                     std::chrono::milliseconds timeout);

// Rank `backend` (a tpu_local backend) stops taking part, e.g. its thread
// raised: collectives it has not reached fail at once on the other ranks,
// naming it and `why`. False when `backend` is not a tpu_local backend.
bool local_rank_left(const c10::intrusive_ptr<c10d::Backend>& backend, const std::string& why);

}  // namespace torchtpu::dist
