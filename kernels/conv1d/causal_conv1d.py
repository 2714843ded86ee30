"""Causal depthwise conv1d (the `causal-conv1d` package's `causal_conv1d_fn`): forward and backward in Helion.

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

The backward is two kernels. The first (`causal_conv1d_bwd`) recomputes `pre` once
per position from its width taps (shifted, masked loads of x: L1/L2 hits) and writes
dpre = dout * silu'(pre) (dout without SiLU; 0 at padding) to an fp32 buffer in x's
layout; dweight and dbias come out as one fp32 partial per (batch row, chunk of
positions) - a program walks its chunk in steps, adding into [channels, step] sums
that it reduces once at the end - which the kernel's host code sums in a fixed order
(no atomics: the same bits on every run). The second (`causal_conv1d_bwd_dx`) is a
stencil over dpre: dx[t] = sum_j weight[width - 1 - j] * dpre[t + j] over the t + j of
t's sequence, plus the final states' gradient; with dinitial_states its positions start
width - 1 before the sequence, and those positions' "dx" is dinitial_states.

Order: Helion kernels -> host launchers (checks) -> the explicit forward/backward that
the fused layer calls -> autograd Function -> public function -> runtime declarations
(their tuning records: `autotune_cli/tuning/conv1d.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import helion
import helion.language as hl
import torch

from mamba_tune import runtime, vocab
from mamba_tune.conv1d.common import (
    check_activation,
    check_device,
    check_float,
    check_shape,
    check_weight,
    err,
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


# --- host launchers -------------------------------------------------------------------

def _check(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, seq_idx: torch.Tensor | None,
           initial_states: torch.Tensor | None, final_states_out: torch.Tensor | None) -> tuple[int, int, int, int]:
    """The shape contract of the forward; returns (batch, dim, seqlen, width)."""
    if x.dim() != 3:
        raise err(f"x must be (batch, dim, seqlen), got shape {tuple(x.shape)}")
    batch, dim, seqlen = x.shape
    if x.numel() == 0:
        raise err(f"empty x (batch, dim, seqlen) = {tuple(x.shape)}")
    check_float("x", x)
    width = check_weight(weight, dim, bias)
    if seq_idx is not None:
        check_shape("seq_idx", seq_idx, (batch, seqlen), "batch, seqlen")
        if not vocab.is_index(seq_idx.dtype):
            raise err(f"seq_idx dtype {seq_idx.dtype} is not int32 or int64")
        if initial_states is not None or final_states_out is not None:
            # causal-conv1d's rule: with packed sequences there is no one sequence to carry.
            raise err("seq_idx cannot be combined with initial_states or final states (as in causal-conv1d)")
    for name, t in (("initial_states", initial_states), ("final_states_out", final_states_out)):
        if t is not None:
            check_shape(name, t, (batch, dim, width - 1), "batch, dim, width - 1")
            check_float(name, t)
    check_device(x.device, weight=weight, bias=bias, seq_idx=seq_idx, initial_states=initial_states,
                 final_states_out=final_states_out)
    return batch, dim, seqlen, width


def _strided(t: torch.Tensor) -> torch.Tensor:
    """t (batch, dim, seqlen) as the kernels take it: its own layout when the seqlen or the
    dim axis is unit-stride (contiguous, channel-last), else a contiguous copy (as causal-conv1d)."""
    if t.stride(2) == 1 or t.stride(1) == 1:
        return t
    return t.contiguous()


def _like(x: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """An empty (batch, dim, seqlen) tensor in x's layout (channel-last stays channel-last,
    also for a strided view such as a slice of a wider (batch, seqlen, width) tensor), in
    x's dtype unless `dtype` is given. Never a view (empty_strided, not a transpose): the
    autograd Function returns it, and an in-place op on a view among several outputs raises."""
    batch, dim, seqlen = x.shape
    dtype = x.dtype if dtype is None else dtype
    if x.stride(2) != 1 and x.stride(1) == 1:
        return torch.empty_strided((batch, dim, seqlen), (seqlen * dim, 1, dim), dtype=dtype, device=x.device)
    return torch.empty(batch, dim, seqlen, dtype=dtype, device=x.device)


def dinit_buffer(initial_states: torch.Tensor) -> torch.Tensor:
    """The buffer the backward kernels write dinitial_states (batch, dim, width - 1) into: one like
    initial_states, or at width 2 (batch, dim, 2), whose first column is the gradient (`[..., :1]`).
    Helion drops a size-1 dim's index from a store's pointer, so at width 2 the dx kernel's store of
    a [channels, positions] tile got a [channels, 1] pointer, which Triton refuses to compile."""
    batch, dim, states = initial_states.shape
    if states > 1:
        return torch.empty_like(initial_states)
    return torch.empty(batch, dim, 2, dtype=initial_states.dtype, device=initial_states.device)


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
    _batch, _dim, seqlen, width = _check(x, weight, bias, seq_idx, initial_states, final_states_out)
    x = _strided(x)
    out = _like(x)
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
    (the fused layer hands in a slice of its own gradient buffer; it may be dout's memory:
    the second kernel reads only dpre). The pre-activation is recomputed for SiLU's
    derivative. Two kernels: `causal_conv1d_bwd` writes dpre (an fp32 buffer in x's layout,
    batch * dim * seqlen * 4 bytes while the call runs) with dweight and dbias,
    `causal_conv1d_bwd_dx` reads it for dx and dinitial_states. Returns (dx, dweight like weight, dbias like bias or
    None, dinitial_states like initial_states when return_dinitial_states, else None).

    The two kernels won over one without the dpre buffer (dpre recomputed at each of dx's
    width taps): on the H200 at Nemotron-3 Nano TP1 (bf16) the one took 0.563 ms, the two 0.487 ms.
    """
    batch, dim, seqlen, width = _check(x, weight, bias, seq_idx, initial_states, None)
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
    x = _strided(x)
    dout = _strided(dout)
    if dx is None:
        dx = _like(x)
    dinit = dinit_buffer(initial_states) if return_dinitial_states else None
    seq_idx = None if seq_idx is None else seq_idx.contiguous()
    # dpre = dout * silu'(pre), fp32 in x's layout: written by the first kernel (with
    # dweight and dbias), read by the second (dx); freed on return.
    dpre = _like(x, torch.float32)
    _dpre, dw, db = runtime.run(CAUSAL_CONV1D_BWD, (x, weight, bias, dout, seq_idx, initial_states, dpre, int(width),
                                                    bool(silu)))
    runtime.run(CAUSAL_CONV1D_BWD_DX, (dpre, weight, seq_idx, dfinal_states, dx, dinit, int(width)))
    del dpre, _dpre
    dweight = dw.t().to(weight.dtype)
    dbias = None if bias is None else db.to(bias.dtype)
    return dx, dweight, dbias, None if dinit is None else dinit[:, :, :width - 1]


# --- autograd Function -----------------------------------------------------------------


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


# --- runtime declarations ---------------------------------------------------------------

FWD_DIMS = ("batch", "seqlen", "dim", "width", "has_bias", "has_seq_idx", "has_initial_states", "silu",
            "channel_last")
# The backward's first kernel (dpre, dweight, dbias) reads what the forward reads; the
# second (dx) reads dpre, seq_idx and the final states' gradient.
BWD_DIMS = FWD_DIMS
BWD_DX_DIMS = ("batch", "seqlen", "dim", "width", "has_seq_idx", "has_dinitial_states", "has_dfinal",
               "channel_last")
# Dims the runtime's nearest rule may vary: a config tuned at one model's xBC width and
# sequence length serves neighbouring ones (each within 4x); width, the flags and the
# layout stay structural.
SIZE_DIMS = ("batch", "seqlen", "dim")


def channel_last(x: torch.Tensor) -> int:
    """1 when x (batch, dim, seqlen) steps along dim with unit stride and not along seqlen."""
    return int(x.stride(2) != 1 and x.stride(1) == 1)


def _fwd_dims_from_args(args: Sequence[Any]) -> dict[str, int]:
    x, weight, bias, seq_idx, initial_states, _out, width, silu = args
    batch, dim, seqlen = x.shape
    return {"batch": batch, "seqlen": seqlen, "dim": dim, "width": int(width), "has_bias": int(bias is not None),
            "has_seq_idx": int(seq_idx is not None), "has_initial_states": int(initial_states is not None),
            "silu": int(silu), "channel_last": channel_last(x)}


def _bwd_dims_from_args(args: Sequence[Any]) -> dict[str, int]:
    x, _w, bias, _dout, seq_idx, initial_states, _dpre, width, silu = args
    batch, dim, seqlen = x.shape
    return {"batch": batch, "seqlen": seqlen, "dim": dim, "width": int(width), "has_bias": int(bias is not None),
            "has_seq_idx": int(seq_idx is not None), "has_initial_states": int(initial_states is not None),
            "silu": int(silu), "channel_last": channel_last(x)}


def _bwd_dx_dims_from_args(args: Sequence[Any]) -> dict[str, int]:
    dpre, _w, seq_idx, dfinal, _dx, dinit, width = args
    batch, dim, seqlen = dpre.shape
    return {"batch": batch, "seqlen": seqlen, "dim": dim, "width": int(width),
            "has_seq_idx": int(seq_idx is not None), "has_dinitial_states": int(dinit is not None),
            "has_dfinal": int(dfinal is not None), "channel_last": channel_last(dpre)}


def _pow2_at_most(n: int, cap: int) -> int:
    return min(cap, max(1, 1 << (max(int(n), 1) - 1).bit_length()))


def tile_of(dims: dict[str, int], elements: int = 4096) -> tuple[int, int]:
    """A default tile (channels, positions): wide along the unit-stride axis (coalesced
    loads and stores), `elements` per program."""
    if dims["channel_last"]:
        bd = _pow2_at_most(dims["dim"], 128)
        return bd, _pow2_at_most(dims["seqlen"], elements // bd)
    bl = _pow2_at_most(dims["seqlen"], 256)
    return _pow2_at_most(dims["dim"], elements // bl), bl


def fwd_config(dims: dict[str, int], bd: int, bl: int, num_warps: int = 4) -> dict[str, Any]:
    """The forward's config for a tile; its block_sizes are [channels, positions]."""
    return {"block_sizes": [bd, bl], "num_warps": num_warps, "num_stages": 1}


def bwd_config(dims: dict[str, int], bd: int, bl: int, num_warps: int = 4, chunk: int = 1024) -> dict[str, Any]:
    """The backward's config for a tile walking `chunk` positions per program (one dweight
    partial each); its block_sizes are [positions per program, positions per step, channels]."""
    chunk = max(bl, _pow2_at_most(dims["seqlen"], chunk))
    return {"block_sizes": [chunk, bl, bd], "num_warps": num_warps, "num_stages": 1}


def _fwd_default(dims: dict[str, int]) -> dict[str, Any]:
    return fwd_config(dims, *tile_of(dims))


def _bwd_default(dims: dict[str, int]) -> dict[str, Any]:
    # The backward holds width taps and width + 1 sums at once: half the forward's tile.
    return bwd_config(dims, *tile_of(dims, 2048))


def _bwd_dx_default(dims: dict[str, int]) -> dict[str, Any]:
    # A stencil like the forward's (fp32 in): the forward's tile and config layout.
    return fwd_config(dims, *tile_of(dims))


CAUSAL_CONV1D_FWD = runtime.RuntimeKernel(
    name="causal_conv1d_fwd",
    family="conv1d",
    kernel=causal_conv1d_fwd_kernel,
    dims=FWD_DIMS,
    size_dims=SIZE_DIMS,
    dims_from_args=_fwd_dims_from_args,
    default_config=_fwd_default,
)

CAUSAL_CONV1D_BWD = runtime.RuntimeKernel(
    name="causal_conv1d_bwd",
    family="conv1d",
    kernel=causal_conv1d_bwd_kernel,
    dims=BWD_DIMS,
    size_dims=SIZE_DIMS,
    dims_from_args=_bwd_dims_from_args,
    default_config=_bwd_default,
)

CAUSAL_CONV1D_BWD_DX = runtime.RuntimeKernel(
    name="causal_conv1d_bwd_dx",
    family="conv1d",
    kernel=causal_conv1d_bwd_dx_kernel,
    dims=BWD_DX_DIMS,
    size_dims=SIZE_DIMS,
    dims_from_args=_bwd_dx_dims_from_args,
    default_config=_bwd_dx_default,
    dtype_arg=4,  # dx: the model's dtype (dpre is an fp32 buffer)
)
