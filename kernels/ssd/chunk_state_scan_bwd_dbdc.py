"""B5 + B6 + B7 + B8 of the SSD backward fused: dB and dC, summed over the heads of each group.

For positions l of one chunk c and group g (sums over the heads h of g; dout = dy * silu(z)):

  dC_l = sum_h exp(dA_l) dout_l . prev_c                          (F5's state term)
       + sum_{j <= l} dCB[l, j] B_j                                  (F5's chunk term)
  dB_l = sum_h dt~_l exp(dA_last - dA_l) x_l . G_c                  (F2: G leaving the chunk)
       + sum_{l' >= l} dCB[l', l] C_l'
  dCB[l, j] = sum_h exp(dA_l - dA_j) dt~_j dout_l . x_j   (causal; zero across sequences)

mamba-ssm computes this in four kernels with dCB in fp32 memory between them and the
heads split by SM count into partial sums added by torch (`_chunk_state_bwd_db`,
`_chunk_scan_bwd_dC`, `_chunk_scan_bwd_dcb`, `_bmm_chunk_bwd` twice). Here one program
owns block_m positions of one chunk, one group and a block of dstate, and loops over the
group's heads in order: dCB tiles live in registers (rounded to the dots' dtype, as
mamba-ssm's bmm backward reads them), every sum has a fixed order, no atomics, and dB
and dC are written once in the inputs' dtype.

Order: Helion kernel -> host launcher -> runtime declaration (its tuning record:
`autotune_cli/tuning/ssd/`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import helion
import helion.language as hl
import torch

from mamba_tune import runtime
from mamba_tune.ssd import common


@helion.kernel(static_shapes=True, autotuner_fn=runtime.refuse_autotune,
               ignore_warnings=[helion.exc.TensorOperationInWrapper])
def chunk_state_scan_bwd_dbdc_kernel(
    dy: torch.Tensor,  # (batch, seqlen, nheads, headdim)
    z: torch.Tensor | None,  # like dy
    x: torch.Tensor,  # (batch, seqlen, nheads, headdim)
    B: torch.Tensor,  # (batch, seqlen, ngroups, dstate)
    C: torch.Tensor,  # (batch, seqlen, ngroups, dstate)
    dt: torch.Tensor,  # (batch, nheads, nchunks, chunk_size) fp32
    dA_cumsum: torch.Tensor,  # (batch, nheads, nchunks, chunk_size) fp32
    prev_states: torch.Tensor,  # (batch, nchunks, nheads, headdim, dstate), x's dtype
    dstates: torch.Tensor,  # (batch, nchunks, nheads, headdim, dstate), x's dtype
    seq_idx: torch.Tensor | None,  # (batch, seqlen) int
) -> tuple[torch.Tensor, torch.Tensor]:
    batch, seqlen, nheads, headdim = x.shape
    ngroups = C.size(2)
    dstate = C.size(3)
    nchunks = dt.size(2)
    chunk_size = hl.specialize(dt.size(3))
    heads_per_group = nheads // ngroups
    dt_pos = dt.view(batch, nheads, nchunks * chunk_size)
    dA_pos = dA_cumsum.view(batch, nheads, nchunks * chunk_size)
    dB = torch.empty_like(B)
    dC = torch.empty_like(C)
    block_m = hl.register_block_size(16, chunk_size)
    block_n = hl.register_block_size(16, dstate)
    block_k = hl.register_block_size(16, chunk_size)
    block_q = hl.register_block_size(16, headdim)
    for tile_g, tile_m, tile_n, tile_b in hl.tile(
        [ngroups, seqlen, dstate, batch], block_size=[1, block_m, block_n, 1]
    ):
        b = tile_b.begin
        g = tile_g.begin
        h0 = g * heads_per_group
        c = tile_m.begin // chunk_size
        c0 = c * chunk_size
        c_end = min(c0 + chunk_size, seqlen)
        if seq_idx is not None:
            seq_m = seq_idx[b, tile_m]
            seq_prev = hl.load(seq_idx, [b, max(c0, 1) - 1]) * min(c, 1)
            seq_last = hl.load(seq_idx, [b, c_end - 1])
        acc_c = hl.zeros([tile_m, tile_n], dtype=torch.float32)
        acc_b = hl.zeros([tile_m, tile_n], dtype=torch.float32)
        # The state terms, head by head.
        for tile_h in hl.tile(h0, h0 + heads_per_group, block_size=1):
            h = tile_h.begin
            dA_m = dA_pos[b, h, tile_m]
            scale_m = torch.exp(dA_m)
            weight_m = torch.exp(torch.clamp(dA_cumsum[b, h, c, chunk_size - 1] - dA_m, max=0.0)) * dt_pos[b, h, tile_m]
            if seq_idx is not None:
                scale_m = torch.where(seq_m == seq_prev, scale_m, 0.0)
                weight_m = torch.where((seq_m == seq_last) & (seq_last >= 0), weight_m, 0.0)
            t_c = hl.zeros([tile_m, tile_n], dtype=torch.float32)
            t_b = hl.zeros([tile_m, tile_n], dtype=torch.float32)
            for tile_q in hl.tile(headdim, block_size=block_q):
                dout = dy[b, tile_m, h, tile_q]
                if z is not None:
                    zv = z[b, tile_m, h, tile_q].to(torch.float32)
                    dout = (dout.to(torch.float32) * zv * torch.sigmoid(zv)).to(x.dtype)
                t_c = hl.dot(dout, prev_states[b, c, h, tile_q, tile_n], acc=t_c)
                t_b = hl.dot(x[b, tile_m, h, tile_q], dstates[b, c, h, tile_q, tile_n], acc=t_b)
            acc_c = acc_c + t_c * scale_m[:, None]
            acc_b = acc_b + t_b * weight_m[:, None]
        # dC: dCB rows of this block against B, columns c0 .. the block's last row.
        for tile_k in hl.tile(c0, tile_m.end, block_size=block_k):
            dcb = hl.zeros([tile_m, tile_k], dtype=torch.float32)
            for tile_h in hl.tile(h0, h0 + heads_per_group, block_size=1):
                h = tile_h.begin
                w = hl.zeros([tile_m, tile_k], dtype=torch.float32)
                for tile_q in hl.tile(headdim, block_size=block_q):
                    dout = dy[b, tile_m, h, tile_q]
                    if z is not None:
                        zv = z[b, tile_m, h, tile_q].to(torch.float32)
                        dout = (dout.to(torch.float32) * zv * torch.sigmoid(zv)).to(x.dtype)
                    w = hl.dot(dout, x[b, tile_k, h, tile_q].T, acc=w)
                decay = torch.exp(torch.clamp(dA_pos[b, h, tile_m][:, None] - dA_pos[b, h, tile_k][None, :], max=0.0))
                dcb = dcb + w * decay * dt_pos[b, h, tile_k][None, :]
            keep = tile_m.index[:, None] >= tile_k.index[None, :]
            if seq_idx is not None:
                keep = keep & (seq_m[:, None] == seq_idx[b, tile_k][None, :])
            dcb = torch.where(keep, dcb, 0.0)
            acc_c = hl.dot(dcb.to(x.dtype), B[b, tile_k, g, tile_n], acc=acc_c)
        # dB: dCB columns of this block against C, rows the block's first row .. the chunk's end.
        for tile_k in hl.tile(tile_m.begin, c_end, block_size=block_k):
            dcb_t = hl.zeros([tile_m, tile_k], dtype=torch.float32)
            for tile_h in hl.tile(h0, h0 + heads_per_group, block_size=1):
                h = tile_h.begin
                w = hl.zeros([tile_m, tile_k], dtype=torch.float32)
                for tile_q in hl.tile(headdim, block_size=block_q):
                    dout = dy[b, tile_k, h, tile_q]
                    if z is not None:
                        zv = z[b, tile_k, h, tile_q].to(torch.float32)
                        dout = (dout.to(torch.float32) * zv * torch.sigmoid(zv)).to(x.dtype)
                    w = hl.dot(x[b, tile_m, h, tile_q], dout.T, acc=w)
                dt_m = dt_pos[b, h, tile_m]
                decay = torch.exp(torch.clamp(dA_pos[b, h, tile_k][None, :] - dA_pos[b, h, tile_m][:, None], max=0.0))
                dcb_t = dcb_t + w * decay * dt_m[:, None]
            keep = tile_k.index[None, :] >= tile_m.index[:, None]
            if seq_idx is not None:
                keep = keep & (seq_m[:, None] == seq_idx[b, tile_k][None, :])
            dcb_t = torch.where(keep, dcb_t, 0.0)
            acc_b = hl.dot(dcb_t.to(x.dtype), C[b, tile_k, g, tile_n], acc=acc_b)
        dB[b, tile_m, g, tile_n] = acc_b.to(dB.dtype)
        dC[b, tile_m, g, tile_n] = acc_c.to(dC.dtype)
    return dB, dC


# --- host launcher --------------------------------------------------------------------


def _launch(dy: torch.Tensor, z: torch.Tensor | None, x: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
            dt: torch.Tensor, dA_cumsum: torch.Tensor, prev_states: torch.Tensor, dstates: torch.Tensor,
            seq_idx: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (dB, dC), (batch, seqlen, ngroups, dstate) in x's dtype."""
    args = (dy, z, x, B.to(x.dtype), C.to(x.dtype), dt.contiguous(), dA_cumsum.contiguous(), prev_states.to(x.dtype),
            dstates.to(x.dtype), seq_idx)
    return runtime.run(SSD_CHUNK_STATE_SCAN_BWD_DBDC, args)


# --- runtime declaration ----------------------------------------------------------------

DIMS = (*common.SHAPE_DIMS, "has_z", "has_seq_idx")


def _dims_from_args(args: Sequence[Any]) -> dict[str, int]:
    dy, z, x, B, C, dt, _dA, _prev, _ds, seq_idx = args
    batch, seqlen, nheads, headdim = x.shape
    return {"batch": batch, "seqlen": seqlen, "nheads": nheads, "headdim": headdim, "ngroups": C.shape[2],
            "dstate": C.shape[3], "chunk_size": dt.shape[3], "has_z": int(z is not None),
            "has_seq_idx": int(seq_idx is not None)}


# Default (no tuned entry): two 64 x dstate fp32 accumulators per program want 8 warps; the
# 64-wide k step with 3 stages is both Nano entries' config (the earlier 32-wide step with 2
# stages was 1.6x slower than it on the H200).
_DEFAULT = common.clamped_default([64, 128, 64, 64], ("chunk_size", "dstate", "chunk_size", "headdim"), 8, 3)


SSD_CHUNK_STATE_SCAN_BWD_DBDC = runtime.RuntimeKernel(
    name="ssd_chunk_state_scan_bwd_dbdc",
    family="ssd",
    kernel=chunk_state_scan_bwd_dbdc_kernel,
    dims=DIMS,
    size_dims=common.size_dims(DIMS),
    dims_from_args=_dims_from_args,
    default_config=_DEFAULT,
)
