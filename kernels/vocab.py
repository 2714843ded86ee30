"""The names the kernels, the bundles and the CLI share: dtype names and limits.

Torch-free (the bundle format and the spec parser use it without torch); the helpers
that map names to torch dtypes import torch on first use.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Literal, get_args

if TYPE_CHECKING:
    import torch

# The dtypes a kernel is tuned for: a bundle entry's `dtype`, a spec's `dtypes`, `--dtype`.
DtypeName = Literal["bf16", "fp16", "fp32"]
DTYPES: tuple[str, ...] = get_args(DtypeName)
FLOAT_DTYPES: frozenset[str] = frozenset(DTYPES)
# Integer dtypes an index tensor (seq_idx) may have.
INDEX_DTYPES: frozenset[str] = frozenset({"int32", "int64"})

# dt_limit's default: no clamp of dt~ = softplus(dt + dt_bias) (mamba-ssm's default).
DT_LIMIT_NONE: tuple[float, float] = (0.0, float("inf"))

_TORCH_NAMES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "int32": "int32", "int64": "int64"}


@functools.cache
def _by_dtype() -> dict[torch.dtype, str]:
    import torch

    return {getattr(torch, t): name for name, t in _TORCH_NAMES.items()}


def torch_dtype(name: str) -> torch.dtype:
    """"bf16" -> torch.bfloat16 (also "fp16", "fp32", "int32", "int64")."""
    if name not in _TORCH_NAMES:
        raise KeyError(f"unknown dtype name {name!r}; known: {', '.join(_TORCH_NAMES)}")
    import torch

    return getattr(torch, _TORCH_NAMES[name])


def dtype_name(dtype: torch.dtype) -> str:
    """torch.bfloat16 -> "bf16"; a dtype without a short name -> str(dtype)."""
    return _by_dtype().get(dtype, str(dtype))


def is_float(dtype: torch.dtype) -> bool:
    """One of the floating dtypes the kernels take (fp32, fp16, bf16)."""
    return _by_dtype().get(dtype) in FLOAT_DTYPES


def is_index(dtype: torch.dtype) -> bool:
    """An integer dtype an index tensor may have (int32, int64)."""
    return _by_dtype().get(dtype) in INDEX_DTYPES
