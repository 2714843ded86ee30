"""fp32 reference for the gated norm (mamba-ssm's `layernorm_gated` semantics), written for clarity."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def gated_norm_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    z: torch.Tensor | None = None,
    eps: float = 1e-6,
    group_size: int | None = None,
    norm_before_gate: bool = True,
    is_rms_norm: bool = True,
    upcast: bool = True,
) -> torch.Tensor:
    """norm(x) * silu(z) if norm_before_gate else norm(x * silu(z)), per group of group_size.

    With upcast=True every input is computed in fp32 (the reference); with upcast=False the
    arithmetic stays in the inputs' dtypes (eager PyTorch in low precision: the error bound).
    """
    dtype = x.dtype
    if upcast:
        x = x.float()
        z = z.float() if z is not None else None
        weight = weight.float()
        bias = bias.float() if bias is not None else None
    if z is not None and not norm_before_gate:
        x = x * F.silu(z)
    d = x.shape[-1]
    gs = d if group_size is None else group_size
    xg = x.unflatten(-1, (d // gs, gs))
    if is_rms_norm:
        xhat = xg * torch.rsqrt(xg.square().mean(dim=-1, keepdim=True) + eps)
    else:
        centered = xg - xg.mean(dim=-1, keepdim=True)
        xhat = centered * torch.rsqrt(centered.square().mean(dim=-1, keepdim=True) + eps)
    out = xhat.flatten(-2) * weight
    if bias is not None:
        out = out + bias
    if z is not None and norm_before_gate:
        out = out * F.silu(z)
    return out.to(dtype)

