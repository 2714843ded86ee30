"""Shared pieces of the conv1d family: the shape contract, raising `ValueError` with the offending sizes."""

from __future__ import annotations

import torch

from mamba_tune import vocab

ACTIVATIONS = (None, "silu", "swish")
WIDTHS = (2, 3, 4)


def err(message: str) -> ValueError:
    return ValueError(f"causal_conv1d: {message}")


def check_float(name: str, t: torch.Tensor) -> None:
    if not vocab.is_float(t.dtype):
        raise err(f"{name} dtype {t.dtype} is not one of fp32, fp16, bf16")


def check_shape(name: str, t: torch.Tensor, expected: tuple[int, ...], letters: str) -> None:
    if tuple(t.shape) != expected:
        raise err(f"{name} shape {tuple(t.shape)} != ({letters}) = {expected}")


def check_device(device: torch.device, **tensors: torch.Tensor | None) -> None:
    for name, t in tensors.items():
        if t is not None and t.device != device:
            raise err(f"{name} is on {t.device}, x is on {device}")


def check_weight(weight: torch.Tensor, dim: int, bias: torch.Tensor | None) -> int:
    """Checks weight (dim, width) and bias (dim,); returns width."""
    if weight.dim() != 2 or weight.shape[0] != dim:
        raise err(f"weight must be (dim, width) = ({dim}, width), got shape {tuple(weight.shape)}")
    width = weight.shape[1]
    if width not in WIDTHS:
        raise err(f"width {width} (weight shape {tuple(weight.shape)}) is not one of 2, 3, 4")
    check_float("weight", weight)
    if bias is not None:
        check_shape("bias", bias, (dim,), "dim,")
        check_float("bias", bias)
    return width


def check_activation(activation: str | None) -> bool:
    if activation not in ACTIVATIONS:
        raise err(f"activation {activation!r} is not one of None, 'silu', 'swish'")
    return activation is not None
