"""Helion re-implementations of the mamba-ssm Mamba-2 training kernels.

Drop-in replacements for the mamba-ssm API; each kernel runs the config tuned for the
current GPU from the bundles in `generated_configs/` (see `kernels.runtime`).
`patch_mamba_ssm()` (or MAMBA_TUNE_PATCH_MAMBA_SSM=1 at import) makes mamba-ssm's own
modules call them (see `kernels.patch`).
`record_calls(path)` (or MAMBA_TUNE_RECORD=path) records which kernel keys run (see
`kernels.record`).

The names below load on first use (PEP 562), so that the torch-free modules
(`kernels.bundle`, `kernels.vocab`) can be imported without torch and helion: the
`mamba-tune` commands that only read specs and bundles start in a fraction of a second.
Only when MAMBA_TUNE_PATCH_MAMBA_SSM or MAMBA_TUNE_RECORD is set does `import kernels`
load the kernels (to patch, to record).
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kernels.norm import LayerNormGated, RMSNormGated, layernorm_fn, rmsnorm_fn
    from kernels.patch import (
        MambaSsmNotInstalledError,
        is_patched,
        patch_mamba_ssm,
        patched_mamba_ssm,
        unpatch_mamba_ssm,
    )
    from kernels.record import record_calls
    from kernels.runtime import Mode, configure
    from kernels.ssd import mamba_chunk_scan_combined

_WHERE = {
    "LayerNormGated": "kernels.norm",
    "MambaSsmNotInstalledError": "kernels.patch",
    "Mode": "kernels.runtime",
    "RMSNormGated": "kernels.norm",
    "configure": "kernels.runtime",
    "is_patched": "kernels.patch",
    "layernorm_fn": "kernels.norm",
    "mamba_chunk_scan_combined": "kernels.ssd",
    "patch_mamba_ssm": "kernels.patch",
    "patched_mamba_ssm": "kernels.patch",
    "record_calls": "kernels.record",
    "rmsnorm_fn": "kernels.norm",
    "unpatch_mamba_ssm": "kernels.patch",
}

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


# Submodules that `import kernels` used to load, still reachable as attributes.
_SUBMODULES = ("bundle", "norm", "patch", "record", "runtime", "ssd", "vocab")


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"kernels.{name}")
    if name not in _WHERE:
        raise AttributeError(f"module 'kernels' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


# MAMBA_TUNE_PATCH_MAMBA_SSM=1 (or strict) patches mamba-ssm at `import kernels`; unset or 0,
# nothing loads here. kernels.patch checks the value.
if os.environ.get("MAMBA_TUNE_PATCH_MAMBA_SSM", "").strip() not in ("", "0"):
    importlib.import_module("kernels.patch").patch_from_env()
# MAMBA_TUNE_RECORD=FILE records the whole process's kernel keys from `import kernels` on.
if os.environ.get("MAMBA_TUNE_RECORD"):
    importlib.import_module("kernels.record").start_from_env()
