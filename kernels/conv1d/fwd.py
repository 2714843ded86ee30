"""Causal depthwise conv1d forward (causal-conv1d's `causal_conv1d_fwd_function`) in Helion.

For each channel d of x (batch, dim, seqlen) and a weight (dim, width), width 2..4:

  pre[b, d, t] = bias[d] + sum_k weight[d, k] * x[b, d, t - (width - 1) + k]
  out          = silu(pre) with activation "silu"/"swish", else pre

Positions before the sequence read initial_states (batch, dim, width - 1) (zeros without
them). With seq_idx (batch, seqlen) a tap enters only where its position belongs to the
same sequence as t (the conv restarts at each packed sequence's start), and positions
with seq_idx < 0 (padding) give 0, as causal-conv1d's channel-last kernel does. The
final states are the last width - 1 positions of cat(initial_states, x).

Layouts: x as (batch, dim, seqlen) contiguous, or channel-last (x.stride(1) == 1: what
`rearrange(xBC, "b s d -> b d s")` of a (batch, seqlen, dim) tensor gives, mamba-ssm's
Mamba2 call). The kernels index x through its strides (Helion bakes them into the code),
so neither layout is copied; `channel_last` is a key dim, each layout has its own tuned
config. The output has x's layout.

Order: Helion kernel -> host launcher (`conv1d_forward`, what the fused layer calls) ->
runtime declaration (its tuning record: `autotune_cli/tuning/conv1d.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import helion
import helion.language as hl
import torch

from mamba_tune import keys, runtime
from mamba_tune.conv1d.common import (
    check_inputs,
    layer_dims,
    like,
    strided,
    tile_of,
)


@helion.kernel(static_shapes=True, autotuner_fn=runtime.refuse_autotune)
def causal_conv1d_fwd_kernel(
    x: torch.Tensor,  # (batch, dim, seqlen), contiguous or channel-last
    weight: torch.Tensor,  # (dim, width)
    bias: torch.Tensor | None,  # (dim,)
    seq_idx: torch.Tensor | None,  # (batch, seqlen) int
    initial_states: torch.Tensor | None,  # (batch, dim, width - 1)
    out: torch.Tensor,  # like x, written
    width: hl.constexpr,
    silu: hl.constexpr,
) -> torch.Tensor:
    batch, dim, seqlen = x.shape
    for tile_b, tile_d, tile_l in hl.tile([batch, dim, seqlen], block_size=[1, None, None]):
        b = tile_b.begin
        t = tile_l.index
        acc = hl.zeros([tile_d, tile_l], dtype=torch.float32)
        if bias is not None:
            acc = acc + bias[tile_d].to(torch.float32)[:, None]
        if seq_idx is not None:
            s_t = seq_idx[b, tile_l]
        for k in hl.static_range(width):
            p = t - (width - 1 - k)
            xv = hl.load(x, [b, tile_d, p], extra_mask=(p >= 0)[None, :]).to(torch.float32)
            if initial_states is not None:
                xv = xv + hl.load(initial_states, [b, tile_d, p + (width - 1)],
                                  extra_mask=(p < 0)[None, :]).to(torch.float32)
            if seq_idx is not None:
                s_p = hl.load(seq_idx, [b, p], extra_mask=p >= 0)
                xv = torch.where(((p >= 0) & (s_p == s_t))[None, :], xv, 0.0)
            acc = acc + weight[tile_d, k].to(torch.float32)[:, None] * xv
        if seq_idx is not None:
            acc = torch.where((s_t >= 0)[None, :], acc, 0.0)
        if silu:
            acc = acc * torch.sigmoid(acc)
        out[b, tile_d, tile_l] = acc.to(out.dtype)
    return out


# --- host launcher ---------------------------------------------------------------------

def conv1d_forward(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    seq_idx: torch.Tensor | None,
    initial_states: torch.Tensor | None,
    final_states_out: torch.Tensor | None,
    silu: bool,
) -> torch.Tensor:
    """The forward the fused layer calls (causal-conv1d's `causal_conv1d_fwd_function`).

    x: (batch, dim, seqlen), contiguous or channel-last; weight: (dim, width); bias: (dim,);
    seq_idx: (batch, seqlen) int; initial_states, final_states_out: (batch, dim, width - 1).
    Returns out like x (x's layout); final_states_out, when given, is written in place.
    """
    _batch, _dim, seqlen, width = check_inputs(x, weight, bias, seq_idx, initial_states, final_states_out)
    x = strided(x)
    out = like(x)
    args = (x, weight, bias, None if seq_idx is None else seq_idx.contiguous(), initial_states, out, int(width),
            bool(silu))
    runtime.run(CAUSAL_CONV1D_FWD, args)
    if final_states_out is not None:
        # The last width - 1 positions of cat(initial_states, x): a copy of (batch, dim, width - 1).
        if seqlen >= width - 1:
            final_states_out.copy_(x[:, :, seqlen - (width - 1):])
        else:
            head = initial_states if initial_states is not None else x.new_zeros(x.shape[0], x.shape[1], width - 1)
            final_states_out.copy_(torch.cat([head.to(x.dtype), x], dim=2)[:, :, -(width - 1):])
    return out


# --- runtime declaration ----------------------------------------------------------------


def _fwd_dims_from_args(args: Sequence[Any]) -> dict[str, int]:
    x, _weight, bias, seq_idx, initial_states, _out, width, silu = args
    return layer_dims(x, bias, seq_idx, initial_states, width, silu)


def fwd_config(dims: dict[str, int], bd: int, bl: int, num_warps: int = 4) -> dict[str, Any]:
    """The forward's config for a tile; its block_sizes are [channels, positions]."""
    return {"block_sizes": [bd, bl], "num_warps": num_warps, "num_stages": 1}


def _fwd_default(dims: dict[str, int]) -> dict[str, Any]:
    return fwd_config(dims, *tile_of(dims))


CAUSAL_CONV1D_FWD = runtime.RuntimeKernel(
    key=keys.CAUSAL_CONV1D_FWD,
    kernel=causal_conv1d_fwd_kernel,
    dims_from_args=_fwd_dims_from_args,
    default_config=_fwd_default,
)
