"""Helion re-implementations of the mamba-ssm Mamba-2 training kernels.

Drop-in replacements for the mamba-ssm API; each kernel runs the config tuned for the
current GPU from the bundles in `generated_configs/` (see `kernels.runtime`).
"""

from kernels.norm import LayerNormGated, RMSNormGated, layernorm_fn, rmsnorm_fn
from kernels.runtime import Mode, configure
from kernels.ssd import mamba_chunk_scan_combined

__all__ = [
    "LayerNormGated",
    "Mode",
    "RMSNormGated",
    "configure",
    "layernorm_fn",
    "mamba_chunk_scan_combined",
    "rmsnorm_fn",
]
