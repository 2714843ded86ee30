"""The decode step of the causal conv1d (the `causal-conv1d` package's `causal_conv1d_update`) in Helion.

Each step convolves a few new positions x (batch, dim, seqlen) with the window the
conv_state (batch, dim, state_len) keeps, state_len >= width - 1, and updates the state in
place:
- without cache_seqlens, the window is the state's last width - 1 positions, and the
  state becomes the last state_len positions of cat(state, x) (shifted left by seqlen);
- with cache_seqlens (batch,) the state is a circular buffer: the window is the width - 1
  positions before cache_seqlens % state_len, and x is written from there on (wrapping;
  of a step longer than the state only its last state_len positions stay);
- with conv_state_indices (batch,) row b of x uses state conv_state[conv_state_indices[b]]
  (continuous batching: conv_state holds more rows than the batch); a negative index is
  a padding slot: its output is 0 and no state is touched.

One program owns a block of channels of one batch row and walks the positions in order,
with every tensor shaped (1, channels, 1): each element is loaded and stored by the same
thread, so the in-place shift (read position i + seqlen, then write position i) and the
window's reads before the state's writes need no barrier.

Order: Helion kernel -> host launcher (checks) -> public function -> runtime declaration
(its tuning record: `autotune_cli/tuning/conv1d.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import helion
import helion.language as hl
import torch

from mamba_tune import keys, runtime, vocab
from mamba_tune.conv1d.common import check_activation, check_float, check_weight, err


@helion.kernel(static_shapes=True, autotuner_fn=runtime.refuse_autotune)
def causal_conv1d_update_kernel(
    x: torch.Tensor,  # (batch, dim, seqlen)
    conv_state: torch.Tensor,  # (nstates, dim, state_len), updated in place
    weight: torch.Tensor,  # (dim, width)
    bias: torch.Tensor | None,  # (dim,)
    cache_seqlens: torch.Tensor | None,  # (batch,) int
    conv_state_indices: torch.Tensor | None,  # (batch,) int
    out: torch.Tensor,  # like x, written
    width: hl.constexpr,
    silu: hl.constexpr,
) -> torch.Tensor:
    batch, dim, seqlen = x.shape
    state_len = conv_state.size(2)
    for tile_b, tile_d in hl.tile([batch, dim], block_size=[1, None]):
        if conv_state_indices is not None:
            c = conv_state_indices[tile_b]
        else:
            c = tile_b.index
        live = (c >= 0)[:, None, None]
        if cache_seqlens is not None:
            start = cache_seqlens[tile_b] % state_len
        # The outputs, from the window cat(state's width - 1 positions, x) (the state is still unchanged).
        for tile_t in hl.tile(seqlen, block_size=1):
            t = tile_t.index
            acc = hl.zeros([tile_b, tile_d, tile_t], dtype=torch.float32)
            if bias is not None:
                acc = acc + bias[tile_d].to(torch.float32)[None, :, None]
            for k in hl.static_range(width):
                wp = t + k  # window position; the first width - 1 are the state's
                xv = hl.load(x, [tile_b, tile_d, wp - (width - 1)], extra_mask=(wp >= width - 1)[None, None, :])
                if cache_seqlens is not None:
                    sp = (start + state_len + wp - (width - 1)) % state_len
                else:
                    sp = state_len - (width - 1) + wp
                sv = hl.load(conv_state, [c, tile_d, sp], extra_mask=(wp < width - 1)[None, None, :] & live)
                acc = acc + weight[tile_d, k].to(torch.float32)[None, :, None] * (
                    xv.to(torch.float32) + sv.to(torch.float32))
            if silu:
                acc = acc * torch.sigmoid(acc)
            acc = torch.where(live, acc, 0.0)
            out[tile_b, tile_d, tile_t] = acc.to(out.dtype)
        # The state's update.
        if cache_seqlens is not None:
            for tile_t in hl.tile(seqlen, block_size=1):
                t = tile_t.index
                xv = x[tile_b, tile_d, tile_t]
                hl.store(conv_state, [c, tile_d, (start + t) % state_len], xv.to(conv_state.dtype),
                         extra_mask=(t >= seqlen - state_len)[None, None, :] & live)
        else:
            for tile_i in hl.tile(state_len, block_size=1):
                i = tile_i.index
                src = i + seqlen  # position in cat(state, x)
                sv = hl.load(conv_state, [c, tile_d, src], extra_mask=(src < state_len)[None, None, :] & live)
                xv = hl.load(x, [tile_b, tile_d, src - state_len],
                             extra_mask=(src >= state_len)[None, None, :] & live)
                hl.store(conv_state, [c, tile_d, i], sv + xv.to(conv_state.dtype), extra_mask=live)
    return out


# --- host launcher --------------------------------------------------------------------


def _check(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
           cache_seqlens: torch.Tensor | None, conv_state_indices: torch.Tensor | None) -> None:
    if x.dim() != 3:
        raise err(f"x must be (batch, dim) or (batch, dim, seqlen), got shape {tuple(x.shape)}")
    batch, dim, seqlen = x.shape
    if x.numel() == 0:
        raise err(f"empty x (batch, dim, seqlen) = {tuple(x.shape)}")
    check_float("x", x)
    width = check_weight(weight, dim, bias)
    if conv_state.dim() != 3 or conv_state.shape[1] != dim or conv_state.shape[2] < width - 1:
        raise err(f"conv_state must be (batch, dim, state_len) with dim={dim} and state_len >= width - 1 = "
                   f"{width - 1}, got shape {tuple(conv_state.shape)}")
    check_float("conv_state", conv_state)
    if conv_state_indices is None and conv_state.shape[0] != batch:
        raise err(f"conv_state batch {conv_state.shape[0]} != x batch {batch} (without conv_state_indices)")
    for name, t in (("cache_seqlens", cache_seqlens), ("conv_state_indices", conv_state_indices)):
        if t is None:
            continue
        if tuple(t.shape) != (batch,):
            raise err(f"{name} shape {tuple(t.shape)} != (batch,) = ({batch},)")
        if not vocab.is_index(t.dtype):
            raise err(f"{name} dtype {t.dtype} is not int32 or int64")
    for name, t in (("conv_state", conv_state), ("weight", weight), ("bias", bias), ("cache_seqlens", cache_seqlens),
                    ("conv_state_indices", conv_state_indices)):
        if t is not None and t.device != x.device:
            raise err(f"{name} is on {t.device}, x is on {x.device}")


# --- public function ------------------------------------------------------------------


def causal_conv1d_update(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    cache_seqlens: torch.Tensor | None = None,
    conv_state_indices: torch.Tensor | None = None,
) -> torch.Tensor:
    """Drop-in for `causal_conv1d.causal_conv1d_update` (decode; no autograd).

    x: (batch, dim) or (batch, dim, seqlen); conv_state: (batch, dim, state_len), state_len
    >= width - 1, updated in place (with conv_state_indices: (nstates, dim, state_len), row
    b of x using state conv_state_indices[b], < 0: padding, output 0, state untouched);
    weight: (dim, width), width 2..4; bias: (dim,); activation: None, "silu" or "swish";
    cache_seqlens: (batch,) int, non-negative: the state is a circular buffer and x is
    written from cache_seqlens % state_len on. Returns out like x.
    """
    silu = check_activation(activation)
    squeeze = x.dim() == 2
    x3 = x.unsqueeze(-1) if squeeze else x
    _check(x3, conv_state, weight, bias, cache_seqlens, conv_state_indices)
    out = torch.empty_like(x3)
    args = (x3, conv_state, weight, bias, cache_seqlens, conv_state_indices, out, int(weight.shape[1]), silu)
    runtime.run(CAUSAL_CONV1D_UPDATE, args)
    return out.squeeze(-1) if squeeze else out


# --- runtime declaration ----------------------------------------------------------------


def _dims_from_args(args: Sequence[Any]) -> dict[str, int]:
    x, conv_state, _w, bias, cache_seqlens, indices, _out, width, silu = args
    batch, dim, seqlen = x.shape
    return {"batch": batch, "dim": dim, "seqlen": seqlen, "width": int(width), "state_len": conv_state.shape[2],
            "has_bias": int(bias is not None), "silu": int(silu), "has_cache_seqlens": int(cache_seqlens is not None),
            "has_state_indices": int(indices is not None)}


def config(block_d: int, num_warps: int) -> dict[str, Any]:
    """block_sizes = [channels per program]."""
    return {"block_sizes": [block_d], "num_warps": num_warps, "num_stages": 1}


def _default(dims: dict[str, int]) -> dict[str, Any]:
    # 128 channels per program: one element per thread at 4 warps.
    return config(min(128, max(16, 1 << (int(dims["dim"]) - 1).bit_length())), 4)


CAUSAL_CONV1D_UPDATE = runtime.RuntimeKernel(
    key=keys.CAUSAL_CONV1D_UPDATE,
    kernel=causal_conv1d_update_kernel,
    dims_from_args=_dims_from_args,
    default_config=_default,
)
