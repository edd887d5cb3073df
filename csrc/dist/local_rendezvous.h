// The rendezvous of tpu_local's thread ranks (local.h): each collective's
// ranks meet here, the last to arrive checks the fingerprints and launches
// one replicated device program for all; a rank that is missing, disagrees
// or left fails the round on every rank.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dist/check.h"
#include "dist/device.h"
#include "dist/local_p2p.h"
#include "pjrt/pjrt.h"

namespace torchtpu::dist {

using Bufs = std::vector<pjrt::BufferPtr>;
using Metas = std::vector<std::vector<int64_t>>;

// The device program of one collective: one collective per part (a
// coalesced call has several); no parts runs none (barrier, an exchange of
// split sizes).
struct Program {
  std::string kind, reduce;
  std::vector<Part> parts;
  int64_t dim = 0, dim2 = 0;
  // Checked on every rank's `meta` once all agreed (split sizes that must pair
  // up across ranks): a message fails the collective on every rank.
  std::function<std::string(const Metas&)> check;
  // A replicated program built elsewhere (a Fused Eager graph holding SPMD
  // collectives): run as it is, one input list per rank.
  pjrt::ExecutablePtr exe;
};

// What one rank brings: its call (the fingerprint), its input buffers (one
// per part), facts the ranks exchange (split sizes), or a problem found on
// this rank alone (a tensor on another device), which fails the collective
// on every rank instead of leaving the others waiting.
struct Entry {
  Call call;
  Bufs inputs;
  std::vector<int64_t> meta;
  std::string problem;
};

// What a rank takes from a round: its outputs and every rank's meta. For a
// prebuilt program (Program::exe) that the ranks' fingerprints disagree on,
// nothing ran: `differ` holds the report, and the group goes on.
struct Met {
  Bufs out;
  Metas metas;
  std::string differ;
};

class Rendezvous;

// The group named `session` (created by its first rank): rank k runs on
// tpu:devices[k]. `timeout` bounds the waits of its SPMD programs.
std::shared_ptr<Rendezvous> rendezvous(const std::string& session, const std::vector<int>& devices,
                                       std::chrono::milliseconds timeout);
// The group's tag in programs that hold its SPMD collectives (unique in the process).
int64_t group_tag(const Rendezvous& rv);

// Blocks until every rank brought step `step` (0, or 1 for the second round
// of an uneven all_to_all) of collective `seq`; returns this rank's outputs
// and every rank's meta. Throws c10::DistBackendError when the round fails.
Met meet(Rendezvous& rv, uint64_t seq, int step, int rank, Entry entry, const Program& prog,
         std::chrono::milliseconds timeout);

// Rank `rank` is gone: rounds and point-to-point waits that need it fail.
void leave(Rendezvous& rv, int rank, const std::string& why);

// The group's point-to-point mailbox.
const std::shared_ptr<Mailbox>& mailbox(Rendezvous& rv);

}  // namespace torchtpu::dist
