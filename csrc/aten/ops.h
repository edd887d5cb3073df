// Op registration (ops.cpp).
#pragma once

namespace torchtpu::aten {

// Registers the tpu kernel for every `_foreach_*` op with a rule (PyTorch's
// composite per-tensor loop would otherwise run first, one call per tensor).
void register_foreach_kernels();

}  // namespace torchtpu::aten
