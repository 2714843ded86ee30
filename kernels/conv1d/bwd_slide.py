"""The conv1d backward of channel-last calls in one kernel stepping one row of channels at a time.

`causal_conv1d_bwd_slide_kernel` gives dx, dweight, dbias and dinitial_states without the two
kernels' fp32 dpre buffer (bwd.py): each program steps through its chunk of positions one row of
channels at a time, keeping the last width - 1 rows of x and of dpre in registers, so each
position's pre-activation and dpre are computed once. At Nemotron-3 Nano TP1 it moves about
0.6 GB (x and dout read, dx written) against the two kernels' 1.4 GB (that plus dpre's fp32
round trip). Rows must be unit-stride (channel-last x, dout and dx, as the Mamba-2 layer passes
xBC), and dx may not share dout's memory (programs read dout past their own positions):
`conv1d_backward` (bwd.py) runs it for every such call and the two kernels for the rest.

Why it is the channel-last path: on an H100 80GB (bf16, batch 2, seqlen 8192, bias, SiLU, width 4,
`do_bench` medians, one process) it took 0.348 ms at Nemotron-3 Nano TP1 (dim 6144) against the two
kernels' 0.591 ms (1.70x), and 0.328 ms at Zamba2-2.7B (dim 5248) against 0.530 ms (1.62x), with
dx equal to theirs and dweight within one bf16 rounding, on its default config below (the best of
seven timed there). Every kept row starts as a value of its own: Triton's front end carries a
variable through a loop only where one pass over the body changes it, and rows that all started
as one shared zero were dropped (`autotune_cli.lowering.dropped_loop_carries` checks it).

Order: Helion kernel -> host launcher -> runtime declaration (its tuning record:
`autotune_cli/tuning/conv1d.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import helion
import helion.language as hl
import torch

from mamba_tune import keys, runtime
from mamba_tune.conv1d import common


@helion.kernel(static_shapes=True, autotuner_fn=runtime.refuse_autotune,
               ignore_warnings=[helion.exc.TensorOperationInWrapper])
def causal_conv1d_bwd_slide_kernel(
    x: torch.Tensor,  # (batch, dim, seqlen), channel-last (rows of channels at unit stride)
    weight: torch.Tensor,  # (dim, width)
    bias: torch.Tensor | None,  # (dim,)
    dout: torch.Tensor,  # like x (not dx's memory: programs read dout past their own positions)
    seq_idx: torch.Tensor | None,  # (batch, seqlen) int
    initial_states: torch.Tensor | None,  # (batch, dim, width - 1)
    dfinal_states: torch.Tensor | None,  # (batch, dim, width - 1)
    dx: torch.Tensor,  # like x, written
    dinitial_states: torch.Tensor | None,  # (batch, dim, width - 1), written
    width: hl.constexpr,
    silu: hl.constexpr,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    batch, dim, seqlen = x.shape
    # Positions per program (one fp32 dweight/dbias partial each), channels per row.
    # At least 16 of each where the sizes allow: a chunk under the halo's 2 (width - 1) steps or a
    # row of a few channels only wastes steps and lanes (and ref mode steps in Python).
    chunk = hl.register_block_size(min(16, seqlen), seqlen)
    block_d = hl.register_block_size(min(16, dim), dim)
    nchunk = (seqlen + chunk - 1) // chunk
    dw_part = torch.empty([width, batch, nchunk, dim], dtype=torch.float32, device=x.device)
    db_part = torch.empty([batch, nchunk, dim], dtype=torch.float32, device=x.device)
    for tile_b, tile_d, tile_c in hl.tile([batch, dim, seqlen], block_size=[1, block_d, chunk]):
        b = tile_b.begin
        c0 = tile_c.begin
        c1 = tile_c.end
        lanes = tile_d.index >= 0  # all true: masks of one position's row of channels
        w0 = weight[tile_d, 0].to(torch.float32)
        w1 = weight[tile_d, 1].to(torch.float32)
        w2 = weight[tile_d, min(2, width - 1)].to(torch.float32)
        w3 = weight[tile_d, min(3, width - 1)].to(torch.float32)
        bv = hl.zeros([tile_d], dtype=torch.float32)
        if bias is not None:
            bv = bias[tile_d].to(torch.float32)
        zero = hl.zeros([tile_d], dtype=torch.float32)
        # The last width - 1 rows of x (or the initial states) and of dpre, newest first, and
        # their sequences (-1 outside x: no tap crosses them, as no tap crosses a sequence's start).
        # Each starts as a value of its own, never a copy of another: Triton's front end carries
        # a variable through the loop only where one pass over the body changes its value, so
        # `x3 = x2` with x2 and x3 both `zero` kept x3 (and x2, d2, d3, s2, s3) zero on the GPU.
        x1 = hl.zeros([tile_d], dtype=torch.float32)
        x2 = hl.zeros([tile_d], dtype=torch.float32)
        x3 = hl.zeros([tile_d], dtype=torch.float32)
        d1 = hl.zeros([tile_d], dtype=torch.float32)
        d2 = hl.zeros([tile_d], dtype=torch.float32)
        d3 = hl.zeros([tile_d], dtype=torch.float32)
        s1 = hl.full([tile_d], -1, dtype=torch.int32)
        s2 = hl.full([tile_d], -1, dtype=torch.int32)
        s3 = hl.full([tile_d], -1, dtype=torch.int32)
        acc0 = zero
        acc1 = zero
        acc2 = zero
        acc3 = zero
        accb = zero
        # Position t from width - 1 before the chunk (their x enters its first pre-activations)
        # to width - 2 past it (their dpre enters its last dx): one row per step, so the taps
        # of x and dpre are the rows kept from the steps before (no recompute, no buffer).
        for i in hl.grid(chunk + 2 * (width - 1)):
            t = c0 - (width - 1) + i
            inx = lanes & (t >= 0) & (t < seqlen)
            tc = min(max(t, 0), seqlen - 1)
            xv = hl.load(x, [b, tile_d, tc], extra_mask=inx).to(torch.float32)
            if initial_states is not None:
                xv = xv + hl.load(initial_states, [b, tile_d, min(max(t + (width - 1), 0), width - 2)],
                                  extra_mask=lanes & (t < 0) & (t >= -(width - 1))).to(torch.float32)
            st = zero.to(torch.int32) - 1
            if seq_idx is not None:
                st = torch.where(inx, hl.load(seq_idx, [b, tc]).to(torch.int32) + zero.to(torch.int32), -1)
            # pre[t] = bias + sum_k weight[k] x[t - (width - 1) + k] (k in order, as the forward).
            xs = [xv, x1, x2, x3]
            ss = [st, s1, s2, s3]
            ws = [w0, w1, w2, w3]
            pre = bv + zero
            for k in hl.static_range(width):
                tap = xs[width - 1 - k]
                if seq_idx is not None:
                    tap = torch.where(ss[width - 1 - k] == st, tap, 0.0)
                pre = pre + ws[k] * tap
            live = inx & (t >= c0)
            if seq_idx is not None:
                live = live & (st >= 0)  # padding: output 0, no gradient
            g = hl.load(dout, [b, tile_d, tc], extra_mask=live).to(torch.float32)
            if silu:
                sg = torch.sigmoid(pre)
                g = g * sg * (1.0 + pre * (1.0 - sg))
            g = torch.where(live, g, 0.0)
            # dweight's and dbias's terms at the chunk's own positions.
            own = (t < c1) & (t >= c0)
            gw = torch.where(own & lanes, g, 0.0)
            for k in hl.static_range(width):
                tap = xs[width - 1 - k]
                if seq_idx is not None:
                    tap = torch.where(ss[width - 1 - k] == st, tap, 0.0)
                if k == 0:
                    acc0 = acc0 + gw * tap
                if k == 1:
                    acc1 = acc1 + gw * tap
                if k == 2:
                    acc2 = acc2 + gw * tap
                if k == 3:
                    acc3 = acc3 + gw * tap
            if bias is not None:
                accb = accb + gw
            # dx[s], s = t - (width - 1): sum_j weight[width - 1 - j] dpre[s + j] over the s + j of s's
            # sequence (j in order, as causal_conv1d_bwd_dx), plus the final states' gradient.
            s = t - (width - 1)
            ds = [g, d1, d2, d3]
            acc = zero
            for j in hl.static_range(width):
                c = ws[width - 1 - j] * ds[width - 1 - j]
                if seq_idx is not None:
                    c = torch.where(ss[width - 1 - j] == ss[width - 1], c, 0.0)
                acc = acc + c
            if dfinal_states is not None:
                f = s - (seqlen - (width - 1))
                acc = acc + hl.load(dfinal_states, [b, tile_d, min(max(f, 0), width - 2)],
                                    extra_mask=lanes & (f >= 0) & (s < seqlen)).to(torch.float32)
            mine = (s >= c0) & (s < c1)
            hl.store(dx, [b, tile_d, min(max(s, 0), seqlen - 1)], acc.to(dx.dtype), extra_mask=lanes & mine)
            if dinitial_states is not None:
                hl.store(dinitial_states, [b, tile_d, min(max(s + (width - 1), 0), width - 2)],
                         acc.to(dinitial_states.dtype), extra_mask=lanes & (c0 == 0) & (s < 0) & (s >= -(width - 1)))
            x3 = x2
            x2 = x1
            x1 = xv
            d3 = d2
            d2 = d1
            d1 = g
            s3 = s2
            s2 = s1
            s1 = st
        dw_part[0, b, tile_c.id, tile_d] = acc0
        dw_part[1, b, tile_c.id, tile_d] = acc1
        if width > 2:
            dw_part[2, b, tile_c.id, tile_d] = acc2
        if width > 3:
            dw_part[3, b, tile_c.id, tile_d] = acc3
        if bias is not None:
            db_part[b, tile_c.id, tile_d] = accb
    dw = dw_part.sum(dim=(1, 2))
    db = torch.zeros([dim], dtype=torch.float32, device=x.device)  # without a bias (Helion cannot return None here)
    if bias is not None:
        db = db_part.sum(dim=(0, 1))
    return dx, dw, db


# --- host launcher ---------------------------------------------------------------------

def fits(x: torch.Tensor, dout: torch.Tensor, dx: torch.Tensor | None) -> bool:
    """Whether the slide kernel can run this call: x, dout (and dx when given) channel-last, and
    dx not in dout's storage (a host-side check of strides and pointers: no sync)."""
    if not (common.channel_last(x) and common.channel_last(dout)):
        return False
    if dx is None:
        return True
    return bool(common.channel_last(dx)) and dx.untyped_storage().data_ptr() != dout.untyped_storage().data_ptr()


def slide_backward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dout: torch.Tensor,
                   seq_idx: torch.Tensor | None, initial_states: torch.Tensor | None,
                   dfinal_states: torch.Tensor | None, dx: torch.Tensor, dinit: torch.Tensor | None, width: int,
                   silu: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dweight (width, dim) fp32, dbias fp32) into dx (and dinit); inputs checked by
    `conv1d_backward`, which calls this where `fits`."""
    return runtime.run(CAUSAL_CONV1D_BWD_SLIDE, (x, weight, bias, dout, seq_idx, initial_states, dfinal_states, dx,
                                                 dinit, int(width), bool(silu)))


# --- runtime declaration ----------------------------------------------------------------

def _dims_from_args(args: Sequence[Any]) -> dict[str, int]:
    x, _w, bias, _dout, seq_idx, initial_states, dfinal, _dx, dinit, width, silu = args
    return {**common.layer_dims(x, bias, seq_idx, initial_states, width, silu),
            "has_dinitial_states": int(dinit is not None), "has_dfinal": int(dfinal is not None)}


# One program per (row, chunk of positions, block of channels). Its loop steps one row at a time,
# so what keeps loads in flight is a wide row per warp and the loop's software pipeline
# (range_num_stages of the step loop, the second of the kernel's two loops) or its unrolling.
def slide_config(dims: dict[str, int], bd: int, chunk: int, num_warps: int = 4, stages: int = 3,
                 unroll: int = 0) -> dict[str, Any]:
    """A config: `chunk` positions per program, `bd` channels a row, the step loop pipelined
    `stages` deep and unrolled `unroll` times (0: the compiler's choice)."""
    return {"block_sizes": [common.pow2_at_most(dims["seqlen"], chunk), common.pow2_at_most(dims["dim"], bd)],
            "num_warps": num_warps, "num_stages": 1, "range_num_stages": [0, stages],
            "range_unroll_factors": [0, unroll]}


def default_config(dims: dict[str, int]) -> dict[str, Any]:
    # 128 positions (5 % more steps for the halo at width 4), 256 channels (512 B of bf16 a row), the
    # step loop 4 deep: the fastest of seven configs on an H100 at Nano TP1 and Zamba2 (0.348 and
    # 0.328 ms; 256 positions 3 deep, the next, 0.400 and 0.381 ms).
    return slide_config(dims, 256, 128, 4, 4)


# Configs a search starts from besides the default: 128-512 channels, 128-1024 positions per
# program (the halo's 2 (width - 1) extra steps against the programs' count), the step loop
# pipelined 2-4 deep or unrolled (loads in flight). (channels, positions, warps, stages, unroll)
SEEDS = ((256, 256, 4, 3, 0), (512, 256, 4, 3, 0), (256, 512, 4, 4, 0), (128, 256, 2, 3, 0), (256, 256, 4, 2, 2),
         (512, 1024, 8, 2, 4), (256, 64, 4, 4, 0), (128, 128, 4, 4, 0))

CAUSAL_CONV1D_BWD_SLIDE = runtime.RuntimeKernel(
    key=keys.CAUSAL_CONV1D_BWD_SLIDE,
    kernel=causal_conv1d_bwd_slide_kernel,
    dims_from_args=_dims_from_args,
    default_config=default_config,
)
