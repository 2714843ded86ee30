"""Causal depthwise conv1d backward (causal-conv1d's `causal_conv1d_bwd_function`) in Helion.

`conv1d_backward` runs channel-last calls (the Mamba-2 layer's xBC) on the one slide kernel
(bwd_slide.py) and every other call on two kernels. The first (`causal_conv1d_bwd`) recomputes the
forward's `pre` once per position from its width taps (shifted, masked loads of x: L1/L2 hits) and
writes dpre = dout * silu'(pre) (dout without SiLU; 0 at padding) to an fp32 buffer in x's layout;
dweight and dbias come out as one fp32 partial per (batch row, chunk of positions) - a program walks
its chunk in steps, adding into [channels, step] sums that it reduces once at the end - which the
kernel's host code sums in a fixed order (no atomics: the same bits on every run). The second
(`causal_conv1d_bwd_dx`) is a stencil over dpre: dx[t] = sum_j weight[width - 1 - j] * dpre[t + j]
over the t + j of t's sequence, plus the final states' gradient; with dinitial_states its positions
start width - 1 before the sequence, and those positions' "dx" is dinitial_states. Shapes and
layouts as in fwd.py.

Order: Helion kernels -> host launcher (`conv1d_backward`, what the fused layer calls) ->
runtime declarations (their tuning records: `autotune_cli/tuning/conv1d.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import helion
import helion.language as hl
import torch

from mamba_tune import keys, runtime
from mamba_tune.conv1d import bwd_slide
from mamba_tune.conv1d.common import (
    channel_last,
    check_device,
    check_float,
    check_inputs,
    check_shape,
    conv_dims,
    dinit_buffer,
    err,
    like,
    pow2_at_most,
    strided,
    tile_of,
)
from mamba_tune.conv1d.fwd import fwd_config


@helion.kernel(static_shapes=True, autotuner_fn=runtime.refuse_autotune,
               ignore_warnings=[helion.exc.TensorOperationInWrapper])
def causal_conv1d_bwd_kernel(
    x: torch.Tensor,  # (batch, dim, seqlen), contiguous or channel-last
    weight: torch.Tensor,  # (dim, width)
    bias: torch.Tensor | None,  # (dim,)
    dout: torch.Tensor,  # like x
    seq_idx: torch.Tensor | None,  # (batch, seqlen) int
    initial_states: torch.Tensor | None,  # (batch, dim, width - 1)
    dpre: torch.Tensor,  # (batch, dim, seqlen) fp32 in x's layout, written
    width: hl.constexpr,
    silu: hl.constexpr,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    batch, dim, seqlen = x.shape
    # Positions per program (one fp32 dweight/dbias partial each), walked in blocks of block_l.
    chunk = hl.register_block_size(seqlen)
    block_l = hl.register_block_size(seqlen)
    nchunk = (seqlen + chunk - 1) // chunk
    dw_part = torch.empty([width, batch, nchunk, dim], dtype=torch.float32, device=x.device)
    db_part = torch.empty([batch, nchunk, dim], dtype=torch.float32, device=x.device)
    for tile_b, tile_d, tile_c in hl.tile([batch, dim, seqlen], block_size=[1, None, chunk]):
        b = tile_b.begin
        # The weights and the bias, loaded once per program (width <= 4 named values: Helion
        # keeps no lists across loops; the ones past width are never read).
        w0 = weight[tile_d, 0].to(torch.float32)[:, None]
        w1 = weight[tile_d, 1].to(torch.float32)[:, None]
        w2 = weight[tile_d, min(2, width - 1)].to(torch.float32)[:, None]
        w3 = weight[tile_d, min(3, width - 1)].to(torch.float32)[:, None]
        bv = hl.zeros([tile_d], dtype=torch.float32)[:, None]
        if bias is not None:
            bv = bias[tile_d].to(torch.float32)[:, None]
        # dweight[:, k] and dbias: [channels, block_l] sums, reduced across positions once
        # after the loop (not a cross-lane sum per step).
        acc0 = hl.zeros([tile_d, block_l], dtype=torch.float32)
        acc1 = hl.zeros([tile_d, block_l], dtype=torch.float32)
        acc2 = hl.zeros([tile_d, block_l], dtype=torch.float32)
        acc3 = hl.zeros([tile_d, block_l], dtype=torch.float32)
        accb = hl.zeros([tile_d, block_l], dtype=torch.float32)
        for tile_l in hl.tile(tile_c.begin, tile_c.end, block_size=block_l):
            # Full-width positions, masked past the chunk: every step's values have the
            # accumulators' shape (also in ref mode, whose last tile is a short one).
            t = tile_l.begin + hl.arange(block_l)
            ok = t < tile_c.end
            if seq_idx is not None:
                s_t = hl.load(seq_idx, [b, t], extra_mask=ok)
                ok = ok & (s_t >= 0)  # padding: output 0, no gradient
            g = hl.load(dout, [b, tile_d, t], extra_mask=ok[None, :]).to(torch.float32)
            # The taps of t (pre's recompute and dweight's terms; a list that Helion unrolls).
            taps = [g, g, g, g]
            pre = bv + hl.zeros([tile_d, block_l], dtype=torch.float32)
            for k in hl.static_range(width):
                p = t - (width - 1 - k)
                xv = hl.load(x, [b, tile_d, p], extra_mask=((p >= 0) & ok)[None, :]).to(torch.float32)
                if initial_states is not None:
                    xv = xv + hl.load(initial_states, [b, tile_d, p + (width - 1)],
                                      extra_mask=((p < 0) & ok)[None, :]).to(torch.float32)
                if seq_idx is not None:
                    s_p = hl.load(seq_idx, [b, p], extra_mask=(p >= 0) & ok)
                    xv = torch.where(((p >= 0) & (s_p == s_t))[None, :], xv, 0.0)
                taps[k] = xv
                if k == 0:
                    pre = pre + w0 * xv
                if k == 1:
                    pre = pre + w1 * xv
                if k == 2:
                    pre = pre + w2 * xv
                if k == 3:
                    pre = pre + w3 * xv
            if silu:
                sg = torch.sigmoid(pre)
                g = g * sg * (1.0 + pre * (1.0 - sg))
            hl.store(dpre, [b, tile_d, t], g, extra_mask=(t < tile_c.end)[None, :])
            acc0 = acc0 + g * taps[0]
            acc1 = acc1 + g * taps[1]
            if width > 2:
                acc2 = acc2 + g * taps[2]
            if width > 3:
                acc3 = acc3 + g * taps[3]
            if bias is not None:
                accb = accb + g
        dw_part[0, b, tile_c.id, tile_d] = torch.sum(acc0, dim=1)
        dw_part[1, b, tile_c.id, tile_d] = torch.sum(acc1, dim=1)
        if width > 2:
            dw_part[2, b, tile_c.id, tile_d] = torch.sum(acc2, dim=1)
        if width > 3:
            dw_part[3, b, tile_c.id, tile_d] = torch.sum(acc3, dim=1)
        if bias is not None:
            db_part[b, tile_c.id, tile_d] = torch.sum(accb, dim=1)
    # Sum the partials in a fixed order (a plain torch reduction in the generated host code,
    # no atomics): the same bits on every run, and outputs whose shapes do not depend on
    # the config (Helion's autotuner compares outputs across configs).
    dw = dw_part.sum(dim=(1, 2))
    db = torch.zeros([dim], dtype=torch.float32, device=x.device)  # without a bias (Helion cannot return None here)
    if bias is not None:
        db = db_part.sum(dim=(0, 1))
    return dpre, dw, db


@helion.kernel(static_shapes=True, autotuner_fn=runtime.refuse_autotune)
def causal_conv1d_bwd_dx_kernel(
    dpre: torch.Tensor,  # (batch, dim, seqlen) fp32, contiguous or channel-last
    weight: torch.Tensor,  # (dim, width)
    seq_idx: torch.Tensor | None,  # (batch, seqlen) int
    dfinal_states: torch.Tensor | None,  # (batch, dim, width - 1)
    dx: torch.Tensor,  # (batch, dim, seqlen), written
    dinitial_states: torch.Tensor | None,  # (batch, dim, width - 1), written
    width: hl.constexpr,
) -> torch.Tensor:
    batch, dim, seqlen = dpre.shape
    # Positions -off .. -1 are the initial states' (only when their gradient is wanted).
    # (An expression, not an `if` block: Helion folds `off` to a constant and would leave
    # the host code's `if` with an empty body, which Python rejects at import.)
    off = (width - 1) if dinitial_states is not None else 0
    for tile_b, tile_d, tile_l in hl.tile([batch, dim, seqlen + off], block_size=[1, None, None]):
        b = tile_b.begin
        t = tile_l.index - off
        if seq_idx is not None:
            s_t = hl.load(seq_idx, [b, t], extra_mask=t >= 0)
        # dx[t] = sum_j weight[width - 1 - j] * dpre[t + j], over the t + j of t's sequence.
        acc = hl.zeros([tile_d, tile_l], dtype=torch.float32)
        for j in hl.static_range(width):
            q = t + j
            okq = (q >= 0) & (q < seqlen)
            if seq_idx is not None:
                s_q = hl.load(seq_idx, [b, q], extra_mask=okq)
                okq = okq & (s_q >= 0) & (s_q == s_t)
            g = hl.load(dpre, [b, tile_d, q], extra_mask=okq[None, :])
            acc = acc + weight[tile_d, width - 1 - j].to(torch.float32)[:, None] * g
        if dfinal_states is not None:
            # final_states[f] is position seqlen - (width - 1) + f of cat(initial_states, x).
            f = t - (seqlen - (width - 1))
            acc = acc + hl.load(dfinal_states, [b, tile_d, f],
                                extra_mask=((f >= 0) & (t < seqlen))[None, :]).to(torch.float32)
        hl.store(dx, [b, tile_d, t], acc.to(dx.dtype), extra_mask=(t >= 0)[None, :])
        if dinitial_states is not None:
            hl.store(dinitial_states, [b, tile_d, t + (width - 1)], acc.to(dinitial_states.dtype),
                     extra_mask=(t < 0)[None, :])
    return dx


# --- host launcher ---------------------------------------------------------------------

def conv1d_backward(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    dout: torch.Tensor,
    seq_idx: torch.Tensor | None,
    initial_states: torch.Tensor | None,
    dfinal_states: torch.Tensor | None,
    dx: torch.Tensor | None,
    return_dinitial_states: bool,
    silu: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """The backward the fused layer calls (causal-conv1d's `causal_conv1d_bwd_function`).

    Same shapes and layouts as `conv1d_forward`; dout like x; dfinal_states (batch, dim,
    width - 1) or None. dx, when given (batch, dim, seqlen) in x's dtype, is written in place
    (the fused layer hands in a slice of its own gradient buffer; it may be dout's memory).
    The pre-activation is recomputed for SiLU's derivative. Channel-last x, dout and dx (dx not
    in dout's storage) run the slide kernel (`bwd_slide.fits`); the rest run two kernels:
    `causal_conv1d_bwd` writes dpre (an fp32 buffer in x's layout, batch * dim * seqlen * 4 bytes
    while the call runs) with dweight and dbias, `causal_conv1d_bwd_dx` reads it for dx and
    dinitial_states (it reads only dpre, so dx may be dout's memory). Returns (dx, dweight like
    weight, dbias like bias or None, dinitial_states like initial_states when
    return_dinitial_states, else None).

    The two kernels won over one without the dpre buffer (dpre recomputed at each of dx's
    width taps): on the H200 at Nemotron-3 Nano TP1 (bf16) the one took 0.563 ms, the two 0.487 ms.
    """
    batch, dim, seqlen, width = check_inputs(x, weight, bias, seq_idx, initial_states, None)
    if tuple(dout.shape) != tuple(x.shape):
        raise err(f"dout shape {tuple(dout.shape)} != x shape {tuple(x.shape)}")
    check_float("dout", dout)
    if dfinal_states is not None:
        if seq_idx is not None:
            raise err("seq_idx cannot be combined with dfinal_states (as in causal-conv1d)")
        check_shape("dfinal_states", dfinal_states, (batch, dim, width - 1), "batch, dim, width - 1")
        check_float("dfinal_states", dfinal_states)
    if return_dinitial_states and initial_states is None:
        raise err("return_dinitial_states needs initial_states")
    if dx is not None:
        check_shape("dx", dx, (batch, dim, seqlen), "batch, dim, seqlen")
        if dx.dtype != x.dtype:
            raise err(f"dx dtype {dx.dtype} != x dtype {x.dtype}")
        if dx.stride(2) != 1 and dx.stride(1) != 1:
            raise err(f"dx strides {dx.stride()} have no unit-stride seqlen or dim axis")
    check_device(x.device, dout=dout, dfinal_states=dfinal_states, dx=dx)
    x = strided(x)
    dout = strided(dout)
    slide = bwd_slide.fits(x, dout, dx)
    if dx is None:
        dx = like(x)
    dinit = dinit_buffer(initial_states) if return_dinitial_states else None
    seq_idx = None if seq_idx is None else seq_idx.contiguous()
    run = bwd_slide.slide_backward if slide else two_kernel_backward
    dx, dw, db = run(x, weight, bias, dout, seq_idx, initial_states, dfinal_states, dx, dinit, width, silu)
    return (dx, dw.t().to(weight.dtype), None if bias is None else db.to(bias.dtype),
            None if dinit is None else dinit[:, :, :width - 1])


def two_kernel_backward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dout: torch.Tensor,
                        seq_idx: torch.Tensor | None, initial_states: torch.Tensor | None,
                        dfinal_states: torch.Tensor | None, dx: torch.Tensor, dinit: torch.Tensor | None,
                        width: int, silu: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dweight (width, dim) fp32, dbias fp32) into dx (and dinit) by the two kernels, as
    `bwd_slide.slide_backward` (inputs checked by `conv1d_backward`)."""
    # dpre = dout * silu'(pre), fp32 in x's layout: written by the first kernel (with
    # dweight and dbias), read by the second (dx); freed on return.
    dpre = like(x, torch.float32)
    _dpre, dw, db = runtime.run(CAUSAL_CONV1D_BWD, (x, weight, bias, dout, seq_idx, initial_states, dpre, int(width),
                                                    bool(silu)))
    runtime.run(CAUSAL_CONV1D_BWD_DX, (dpre, weight, seq_idx, dfinal_states, dx, dinit, int(width)))
    del dpre, _dpre
    return dx, dw, db


# --- runtime declarations ---------------------------------------------------------------

def _bwd_dims_from_args(args: Sequence[Any]) -> dict[str, int]:
    x, _w, bias, _dout, seq_idx, initial_states, _dpre, width, silu = args
    return conv_dims(x, bias, seq_idx, initial_states, width, silu)


def _bwd_dx_dims_from_args(args: Sequence[Any]) -> dict[str, int]:
    dpre, _w, seq_idx, dfinal, _dx, dinit, width = args
    batch, dim, seqlen = dpre.shape
    return {"batch": batch, "seqlen": seqlen, "dim": dim, "width": int(width),
            "has_seq_idx": int(seq_idx is not None), "has_dinitial_states": int(dinit is not None),
            "has_dfinal": int(dfinal is not None), "channel_last": channel_last(dpre)}


def bwd_config(dims: dict[str, int], bd: int, bl: int, num_warps: int = 4, chunk: int = 1024) -> dict[str, Any]:
    """The backward's config for a tile walking `chunk` positions per program (one dweight
    partial each); its block_sizes are [positions per program, positions per step, channels]."""
    chunk = max(bl, pow2_at_most(dims["seqlen"], chunk))
    return {"block_sizes": [chunk, bl, bd], "num_warps": num_warps, "num_stages": 1}


def _bwd_default(dims: dict[str, int]) -> dict[str, Any]:
    # The backward holds width taps and width + 1 sums at once: half the forward's tile.
    return bwd_config(dims, *tile_of(dims, 2048))


def _bwd_dx_default(dims: dict[str, int]) -> dict[str, Any]:
    # A stencil like the forward's (fp32 in): the forward's tile and config layout.
    return fwd_config(dims, *tile_of(dims))


CAUSAL_CONV1D_BWD = runtime.RuntimeKernel(
    key=keys.CAUSAL_CONV1D_BWD,
    kernel=causal_conv1d_bwd_kernel,
    dims_from_args=_bwd_dims_from_args,
    default_config=_bwd_default,
)

CAUSAL_CONV1D_BWD_DX = runtime.RuntimeKernel(
    key=keys.CAUSAL_CONV1D_BWD_DX,
    kernel=causal_conv1d_bwd_dx_kernel,
    dims_from_args=_bwd_dx_dims_from_args,
    default_config=_bwd_dx_default,
    dtype_arg=4,  # dx: the model's dtype (dpre is an fp32 buffer)
)
