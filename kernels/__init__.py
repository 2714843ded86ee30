"""Helion re-implementations of the mamba-ssm Mamba-2 training kernels.

Drop-in replacements for the mamba-ssm API; each kernel runs the config tuned for the
current GPU from the bundles in `generated_configs/` (see `kernels.runtime`).
`record_calls(path)` (or MAMBA_TUNE_RECORD=path) records which kernel keys run (see
`kernels.record`).
"""

from kernels import record as _record
from kernels.norm import LayerNormGated, RMSNormGated, layernorm_fn, rmsnorm_fn
from kernels.record import record_calls
from kernels.runtime import Mode, configure
from kernels.ssd import mamba_chunk_scan_combined

__all__ = [
    "LayerNormGated",
    "Mode",
    "RMSNormGated",
    "configure",
    "layernorm_fn",
    "mamba_chunk_scan_combined",
    "record_calls",
    "rmsnorm_fn",
]

_record.start_from_env()
