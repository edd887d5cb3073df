// The PJRT key-value store on torch.distributed's c10d store: how the
// processes of a torchrun job exchange what a multi-process PJRT client needs
// (the CUDA plugin's global topology) without a second rendezvous.
#pragma once
#include <optional>
#include <string>

#include "aten/runtime.h"

namespace torchtpu::dist {

// Under torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set): a TCPStore
// client of the agent's store, keys under "torchtpu/pjrt/<restart>/", with
// node_id = RANK and num_nodes = WORLD_SIZE. Used for platform "cuda" when
// WORLD_SIZE > 1; TORCHTPU_KV_STORE=1 uses it on any platform (and requires
// the variables), TORCHTPU_KV_STORE=0 never. nullopt when not used.
std::optional<aten::ClientKv> torchrun_client_kv(const std::string& platform);

}  // namespace torchtpu::dist
