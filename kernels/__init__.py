"""Helion re-implementations of the mamba-ssm Mamba-2 training kernels.

Drop-in replacements for the mamba-ssm API; each kernel runs the config tuned for the
current GPU from the bundles in `generated_configs/` (see `kernels.runtime`).
"""

from kernels.norm import LayerNormGated, RMSNormGated, layernorm_fn, rmsnorm_fn
from kernels.runtime import Mode, configure

__all__ = ["LayerNormGated", "Mode", "RMSNormGated", "configure", "layernorm_fn", "rmsnorm_fn"]

try:  # the SSD family
    from kernels.ssd import mamba_chunk_scan_combined  # noqa: F401

    __all__.append("mamba_chunk_scan_combined")
except ImportError as _e:  # pragma: no cover - until the SSD family lands
    if "kernels.ssd" not in str(_e):
        raise
