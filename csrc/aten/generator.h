// The device RNG: one Philox (seed, offset) per device, advanced on the host.
#pragma once
#include <ATen/core/Generator.h>

#include <cstdint>
#include <optional>

namespace torchtpu::aten {

const at::Generator& default_generator(int device);
at::Generator new_generator(int device);
// Reserves `numel` random values: writes [seed, offset] and advances the offset.
void philox_take(const std::optional<at::Generator>& gen, int device, int64_t numel,
                 uint64_t state[2]);

}  // namespace torchtpu::aten
