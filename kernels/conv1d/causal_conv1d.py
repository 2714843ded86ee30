"""`causal_conv1d_fn` (the `causal-conv1d` package's): the forward (fwd.py) and backward (bwd.py)
as one autograd Function.

Order: autograd Function -> public function.
"""

from __future__ import annotations

from typing import Any

import torch

from mamba_tune.conv1d.bwd import conv1d_backward
from mamba_tune.conv1d.common import check_activation
from mamba_tune.conv1d.fwd import conv1d_forward


class CausalConv1dFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                seq_idx: torch.Tensor | None, initial_states: torch.Tensor | None, return_final_states: bool,
                final_states_out: torch.Tensor | None, activation: str | None) -> Any:
        silu = check_activation(activation)
        if return_final_states and final_states_out is None:
            batch, dim = x.shape[0], x.shape[1]
            width = weight.shape[-1] if weight.dim() == 2 else 0
            # (batch, dim, width - 1) channel-last as causal-conv1d allocates it, not a view.
            final_states_out = torch.empty_strided((batch, dim, max(width - 1, 0)), (max(width - 1, 0) * dim, 1, dim),
                                                   dtype=x.dtype, device=x.device)
        if not return_final_states:
            final_states_out = None
        out = conv1d_forward(x, weight, bias, seq_idx, initial_states, final_states_out, silu)
        ctx.save_for_backward(x, weight, bias, seq_idx, initial_states)
        ctx.silu = silu
        ctx.return_final_states = return_final_states
        ctx.return_dinitial_states = initial_states is not None and initial_states.requires_grad
        if return_final_states:
            return out, final_states_out
        return out

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor, *rest: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        x, weight, bias, seq_idx, initial_states = ctx.saved_tensors
        dfinal = rest[0] if ctx.return_final_states and rest else None
        dx, dweight, dbias, dinit = conv1d_backward(x, weight, bias, dout, seq_idx, initial_states, dfinal, None,
                                                    ctx.return_dinitial_states, ctx.silu)
        return dx, dweight, dbias, None, dinit, None, None, None


# --- public function ------------------------------------------------------------------


def causal_conv1d_fn(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    seq_idx: torch.Tensor | None = None,
    initial_states: torch.Tensor | None = None,
    return_final_states: bool = False,
    final_states_out: torch.Tensor | None = None,
    activation: str | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Drop-in for `causal_conv1d.causal_conv1d_fn` (forward and backward).

    x: (batch, dim, seqlen), contiguous or channel-last (x.stride(1) == 1); weight: (dim,
    width), width 2..4; bias: (dim,); seq_idx: (batch, seqlen) int32, the packed sequence of
    each position (< 0: padding, output 0); initial_states: (batch, dim, width - 1);
    final_states_out: (batch, dim, width - 1), written when return_final_states; activation:
    None, "silu" or "swish". fp32/bf16/fp16, accumulated in fp32.

    Returns out (batch, dim, seqlen) in x's dtype and layout, and (out, final_states) with
    return_final_states. Unlike causal-conv1d, initial and final states work in both
    layouts; like it, they cannot be combined with seq_idx.
    """
    return CausalConv1dFn.apply(x, weight, bias, seq_idx, initial_states, return_final_states, final_states_out,
                                activation)
