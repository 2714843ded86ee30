"""Helion re-implementations of the mamba-ssm Mamba-2 training kernels.

Drop-in replacements for the mamba-ssm API; each kernel runs the config tuned for the
current GPU from the bundles in `generated_configs/` (see `kernels.runtime`).
`patch_mamba_ssm()` (or MAMBA_TUNE_PATCH_MAMBA_SSM=1 at import) makes mamba-ssm's own
modules call them (see `kernels.patch`).
`record_calls(path)` (or MAMBA_TUNE_RECORD=path) records which kernel keys run (see
`kernels.record`).
"""

from kernels import record as _record
from kernels.norm import LayerNormGated, RMSNormGated, layernorm_fn, rmsnorm_fn
from kernels.patch import (
    MambaSsmNotInstalledError,
    is_patched,
    patch_from_env,
    patch_mamba_ssm,
    patched_mamba_ssm,
    unpatch_mamba_ssm,
)
from kernels.record import record_calls
from kernels.runtime import Mode, configure
from kernels.ssd import mamba_chunk_scan_combined

__all__ = [
    "LayerNormGated",
    "MambaSsmNotInstalledError",
    "Mode",
    "RMSNormGated",
    "configure",
    "is_patched",
    "layernorm_fn",
    "mamba_chunk_scan_combined",
    "patch_mamba_ssm",
    "patched_mamba_ssm",
    "record_calls",
    "rmsnorm_fn",
    "unpatch_mamba_ssm",
]

patch_from_env()
_record.start_from_env()
