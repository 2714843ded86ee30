"""The conv1d forward of channel-last calls stepping one row of channels at a time: a candidate.

At the layers' own row stride the runtime's forward (mamba_tune.conv1d.fwd) still trails
causal-conv1d's `causal_conv1d_fwd_function` where the rows are not packed: on an H200 (bf16,
bias, SiLU, width 4, each entry a 20 s search at the layer's stride) 0.91x at Nemotron-3 Nano TP1
batch 8 x 2048, 0.97x at Zamba2-2.7B batch 4 x 2048, 1.00x at Mamba2-2.7B 2 x 8192
(docs/status.md). Each of its programs loads a (channels, positions) tile once per tap: width
loads of every x element, shifted by one position each (the overlap served by L1).
causal-conv1d's channel-last kernel stages a tile with its halo once. `fwd_slide_kernel` does
what the backward's slide kernel (mamba_tune.conv1d.bwd_slide) does: one program per (row of
the batch, chunk of positions, block of channels) steps through its positions one row at a time,
keeping the last width - 1 rows of x in registers, so each x element is loaded once (plus a
halo of width - 1 rows a chunk). The sums are the runtime kernel's, in its order (bias, then the
taps k = 0 .. width - 1): in Helion ref mode its output is that kernel's bit for bit without
SiLU, a few fp32 roundings off with it (torch.sigmoid on a row against a tile); the timing script
says whether the compiled outputs are the same bits.

Rows must be unit-stride (channel-last x and out, as the Mamba-2 layer passes xBC).
`conv1d_forward_slide` is the host call; nothing in `mamba_tune` imports this file. If it wins
on a GPU (`time_fwd_slide.py`), it becomes the channel-last forward and its entries are tuned
anew (the source and the config space change).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import helion
import helion.language as hl
import torch

from mamba_tune import keys, runtime
from mamba_tune.conv1d import bwd_slide, common


@helion.kernel(static_shapes=True, autotuner_fn=runtime.refuse_autotune)
def fwd_slide_kernel(
    x: torch.Tensor,  # (batch, dim, seqlen), channel-last (rows of channels at unit stride)
    weight: torch.Tensor,  # (dim, width)
    bias: torch.Tensor | None,  # (dim,)
    seq_idx: torch.Tensor | None,  # (batch, seqlen) int
    initial_states: torch.Tensor | None,  # (batch, dim, width - 1)
    out: torch.Tensor,  # like x, written
    width: hl.constexpr,
    silu: hl.constexpr,
) -> torch.Tensor:
    batch, dim, seqlen = x.shape
    chunk = hl.register_block_size(min(16, seqlen), seqlen)
    block_d = hl.register_block_size(min(16, dim), dim)
    for tile_b, tile_d, tile_c in hl.tile([batch, dim, seqlen], block_size=[1, block_d, chunk]):
        b = tile_b.begin
        c0 = tile_c.begin
        lanes = tile_d.index >= 0  # all true: masks of one position's row of channels
        w0 = weight[tile_d, 0].to(torch.float32)
        w1 = weight[tile_d, 1].to(torch.float32)
        w2 = weight[tile_d, min(2, width - 1)].to(torch.float32)
        w3 = weight[tile_d, min(3, width - 1)].to(torch.float32)
        zero = hl.zeros([tile_d], dtype=torch.float32)
        bv = zero
        if bias is not None:
            bv = bias[tile_d].to(torch.float32)
        # The last width - 1 rows of x (or of the initial states), newest first, and their
        # sequences (-1 before x: with seq_idx no tap reads there, as in the runtime kernel). Each
        # starts as a value of its own (Triton carries a variable through the loop only where one
        # pass over the body changes it: bwd_slide.py's docstring).
        x1 = hl.zeros([tile_d], dtype=torch.float32)
        x2 = hl.zeros([tile_d], dtype=torch.float32)
        x3 = hl.zeros([tile_d], dtype=torch.float32)
        s1 = hl.full([tile_d], -1, dtype=torch.int32)
        s2 = hl.full([tile_d], -1, dtype=torch.int32)
        s3 = hl.full([tile_d], -1, dtype=torch.int32)
        # Position t from width - 1 before the chunk (the taps of its first outputs) to its end.
        for i in hl.grid(chunk + width - 1):
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
            xs = [xv, x1, x2, x3]
            ss = [st, s1, s2, s3]
            ws = [w0, w1, w2, w3]
            acc = zero + bv
            for k in hl.static_range(width):
                tap = xs[width - 1 - k]
                if seq_idx is not None:
                    tap = torch.where(ss[width - 1 - k] == st, tap, 0.0)
                acc = acc + ws[k] * tap
            if seq_idx is not None:
                acc = torch.where(st >= 0, acc, 0.0)  # padding: output 0
            if silu:
                acc = acc * torch.sigmoid(acc)
            hl.store(out, [b, tile_d, tc], acc.to(out.dtype), extra_mask=inx & (t >= c0))
            x3 = x2
            x2 = x1
            x1 = xv
            s3 = s2
            s2 = s1
            s1 = st
    return out


def fits(x: torch.Tensor) -> bool:
    """Whether the slide kernel can run this call: x channel-last (its output is made so)."""
    return bool(common.channel_last(x))


def conv1d_forward_slide(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                         seq_idx: torch.Tensor | None, initial_states: torch.Tensor | None, silu: bool,
                         config: dict[str, Any] | None = None) -> torch.Tensor:
    """`mamba_tune.conv1d.conv1d_forward` for channel-last x through the slide kernel (no final
    states): through the runtime (its default config below), or compiled with `config`."""
    common.check_inputs(x, weight, bias, seq_idx, initial_states, None)
    if not fits(x):
        raise common.err(f"the slide forward takes channel-last x (unit stride along dim); got strides "
                         f"{tuple(x.stride())}")
    out = common.like(x)
    args = (x, weight, bias, None if seq_idx is None else seq_idx.contiguous(), initial_states, out,
            int(weight.shape[1]), bool(silu))
    if config is None:
        return runtime.run(FWD_SLIDE, args)
    return FWD_SLIDE.kernel.bind(args).compile_config(helion.Config(**config), allow_print=False)(*args)


# Its configs are the backward slide kernel's (the same two registered block sizes, positions per
# program then channels a row, and the same step loop): `bwd_slide.slide_config`, its default and
# seeds. The timing script's grid adds fewer warps and wider or longer rows (a forward row holds
# less live state than the backward's). (channels, positions, warps, stages, unroll)
slide_config = bwd_slide.slide_config
default_config = bwd_slide.default_config
GRID = ((256, 128, 4, 4, 0), *bwd_slide.SEEDS, (256, 256, 2, 3, 0), (512, 128, 4, 4, 0), (128, 512, 1, 4, 0),
        (256, 1024, 4, 4, 0))


# The runtime's key dims under another name: not planned at any layer shape (dims_for None), so no
# spec tunes it; the timing script passes configs explicitly.
KEY = keys.KernelKey("causal_conv1d_fwd_slide", "conv1d", keys.CAUSAL_CONV1D_FWD.dims,
                     keys.CAUSAL_CONV1D_FWD.size_dims, lambda shape: None, f"{__name__}:fwd_slide_kernel")


def _dims_from_args(args: Sequence[Any]) -> dict[str, int]:
    x, _weight, bias, seq_idx, initial_states, _out, width, silu = args
    return common.layer_dims(x, bias, seq_idx, initial_states, width, silu)


FWD_SLIDE = runtime.RuntimeKernel(key=KEY, kernel=fwd_slide_kernel, dims_from_args=_dims_from_args,
                                  default_config=default_config)
