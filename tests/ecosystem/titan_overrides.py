"""TorchTitan `--override.imports` factories used by the ecosystem runs.

`titan_overrides.causal_sdpa` swaps the llama3 model's FlexAttention for TorchTitan's own
ScaledDotProductAttention module (causal, no per-document mask). TorchTitan 0.3.0 gives
language models only FlexAttention (torch.compile'd through inductor, which has no
backward on CPU and rejects devices other than cuda/cpu/xpu/hpu/mps) or VarlenAttention
(CUDA flash kernels). Both the CPU reference and the tpu runs use this override, so they
train the same model."""

from torchtitan.config import override
from torchtitan.models.common.attention import FlexAttention, ScaledDotProductAttention


@override(target=FlexAttention.Config, description="causal SDPA in place of FlexAttention")
def causal_sdpa(cfg: FlexAttention.Config) -> ScaledDotProductAttention.Config:
    return ScaledDotProductAttention.Config()
