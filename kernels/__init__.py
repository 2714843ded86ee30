"""Helion re-implementations of the mamba-ssm Mamba-2 training kernels.

Drop-in replacements for the mamba-ssm API; each kernel runs the config tuned for the
current GPU from the bundles in `generated_configs/` (see `kernels.runtime`).

The names below load on first use (PEP 562), so that the torch-free modules
(`kernels.bundle`, `kernels.vocab`) can be imported without torch and helion: the
`mamba-tune` commands that only read specs and bundles start in a fraction of a second.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kernels.norm import LayerNormGated, RMSNormGated, layernorm_fn, rmsnorm_fn
    from kernels.runtime import Mode, configure
    from kernels.ssd import mamba_chunk_scan_combined

_WHERE = {
    "LayerNormGated": "kernels.norm",
    "Mode": "kernels.runtime",
    "RMSNormGated": "kernels.norm",
    "configure": "kernels.runtime",
    "layernorm_fn": "kernels.norm",
    "mamba_chunk_scan_combined": "kernels.ssd",
    "rmsnorm_fn": "kernels.norm",
}

__all__ = [
    "LayerNormGated",
    "Mode",
    "RMSNormGated",
    "configure",
    "layernorm_fn",
    "mamba_chunk_scan_combined",
    "rmsnorm_fn",
]


# Submodules that `import kernels` used to load, still reachable as attributes.
_SUBMODULES = ("bundle", "norm", "runtime", "ssd", "vocab")


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
