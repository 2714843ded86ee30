"""B1 + B4 + B9 of the SSD backward fused: dx, dz, dD and the per-position pieces of ddt~ and ddA.

For one head h and positions l of one chunk c (G = the state gradient leaving the chunk,
from chunk_state_passing_bwd.py; dout = dy * silu(z), or dy):

  raw_state_l = exp(dA_last - dA_l) (B_l . G)                        (through F2)
  raw_scan_l  = sum_{l' >= l} CB[l', l] exp(dA_l' - dA_l) dout_l'      (through F5's chunk term)
  dx_l  = dt~_l (raw_state_l + raw_scan_l) + D dout_l
  ddt~_l = x_l . (raw_state_l + raw_scan_l)   (the part not through dA)
  y_l   = exp(dA_l) C_l . prev_c + sum_{j <= l} CB[l, j] exp(dA_l - dA_j) dt~_j x_j  (F5 recomputed)
  dz_l  = dy_l (y_l + D x_l) silu'(z_l);   dD = sum_l dout_l x_l

(with z only: without z, y serves only dout . y, which chunk_state_scan_bwd_dbdc.py sums
from the tiles it has, dout . prev_c and dout . x^T; so for ddt~'s chunk term x_l . raw_scan_l,
with raw_scan then only for dx)
and d dA_cumsum_l = dout_l . y_l - dt~_l ddt~_l (plus, at the chunk's last position, the
chunk's sum of dt~_l x_l . raw_state_l and the state passing's term): the cumsum backward
assembles that from the three per-position sums written here. mamba-ssm reads the saved
output for dz (`_chunk_scan_bwd_dz`) and runs a separate pass for ddA
(`_chunk_scan_bwd_ddAcs_stable`); recomputing y in this kernel, where its operands are
already loaded, removes both and the saved output (the forward saves no output at all).

Reductions without atomics: ddt~, d dA pieces and dD over headdim blocks go to one slot
per block of headdim, dD over positions to one row per 16-row block; the cumsum backward
and the host sum the slots in a fixed order. The slots are memset and read whole, so a
headdim block is at least SLOT_P wide (or the largest power of two dividing headdim, if
less): one slot at every model's headdim of 64, where 16-wide blocks, which no tuned
config chose, made Nano TP1's sums 100 MB instead of 13.

Order: Helion kernel -> host launcher -> runtime declaration (its tuning record:
`autotune_cli/tuning/ssd/`). One program owns block_m
positions of one chunk, one head and a block of headdim (as F5).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import helion
import helion.language as hl
import torch

from mamba_tune import keys, runtime
from mamba_tune.keys import SLOT_P, row_slots
from mamba_tune.ssd import common

SLOT = 16  # dD_part: one row per this many positions (block_m's least)
# SLOT_P, SLOT_N: the least headdim block (rows' slots) and, for the dB/dC kernel's dout . y
# sums, the least dstate block (mamba_tune.keys.slot_block): the rows' count is a key dim.
LOG2E = 1.4426950408889634


@helion.kernel(static_shapes=True, autotuner_fn=runtime.refuse_autotune,
               ignore_warnings=[helion.exc.TensorOperationInWrapper])
def chunk_scan_chunk_state_bwd_dx_kernel(
    rows: torch.Tensor,  # (3, slots_p, batch, nheads, nchunks * chunk_size) fp32 zeros: ddt~, its F2 part, dout.y
    dD_part: torch.Tensor,  # (batch, ceil(seqlen / 16), nheads, headdim) fp32 zeros
    dz: torch.Tensor | None,  # like x (any strides but a unit last one), written
    dx: torch.Tensor,  # like x (any strides but a unit last one), written
    dy: torch.Tensor,  # (batch, seqlen, nheads, headdim)
    z: torch.Tensor | None,  # like x
    x: torch.Tensor,  # (batch, seqlen, nheads, headdim)
    B: torch.Tensor,  # (batch, seqlen, ngroups, dstate)
    C: torch.Tensor,  # (batch, seqlen, ngroups, dstate)
    cb: torch.Tensor,  # (batch, nchunks, ngroups, chunk_size, chunk_size) fp32, seq_idx-masked
    dt: torch.Tensor,  # (batch, nheads, nchunks, chunk_size) fp32
    dA_cumsum: torch.Tensor,  # (batch, nheads, nchunks, chunk_size) fp32
    prev_states: torch.Tensor,  # (batch, nchunks, nheads, headdim, dstate), x's dtype
    dstates: torch.Tensor,  # (batch, nchunks, nheads, headdim, dstate), x's dtype: G leaving each chunk
    D: torch.Tensor | None,  # (nheads, headdim), stride 0 over headdim for a per-head D
    seq_idx: torch.Tensor | None,  # (batch, seqlen) int
) -> torch.Tensor:
    batch, seqlen, nheads, headdim = x.shape
    ngroups = C.size(2)
    dstate = C.size(3)
    nchunks = dt.size(2)
    chunk_size = hl.specialize(dt.size(3))
    heads_per_group = nheads // ngroups
    dt_pos = dt.view(batch, nheads, nchunks * chunk_size)
    dA_pos = dA_cumsum.view(batch, nheads, nchunks * chunk_size)
    block_m = hl.register_block_size(16, chunk_size)
    block_p = hl.register_block_size(max(16, min(SLOT_P, headdim & -headdim)), headdim)  # slot_block
    block_k = hl.register_block_size(16, chunk_size)
    block_n = hl.register_block_size(16, dstate)
    for tile_h, tile_m, tile_p, tile_b in hl.tile(
        [nheads, seqlen, headdim, batch], block_size=[1, block_m, block_p, 1]
    ):
        b = tile_b.begin
        h = tile_h.begin
        g = h // heads_per_group
        c = tile_m.begin // chunk_size
        c0 = c * chunk_size
        c_end = min(c0 + chunk_size, seqlen)
        slot = tile_p.id
        dA_m = dA_pos[b, h, tile_m]
        dt_m = dt_pos[b, h, tile_m]
        dA_last = dA_cumsum[b, h, c, chunk_size - 1]
        scale_m = torch.exp(dA_m)
        weight_m = torch.exp(torch.clamp(dA_last - dA_m, max=0.0))
        if seq_idx is not None:
            seq_m = seq_idx[b, tile_m]
            seq_prev = hl.load(seq_idx, [b, max(c0, 1) - 1]) * min(c, 1)
            seq_last = hl.load(seq_idx, [b, c_end - 1])
            scale_m = torch.where(seq_m == seq_prev, scale_m, 0.0)
            weight_m = torch.where((seq_m == seq_last) & (seq_last >= 0), weight_m, 0.0)
        # F5 recomputed (y without D; with z only) and the F2 term of the backward: dots over dstate.
        y = hl.zeros([tile_m, tile_p], dtype=torch.float32)
        raw_state = hl.zeros([tile_m, tile_p], dtype=torch.float32)
        for tile_n in hl.tile(dstate, block_size=block_n):
            if z is not None:
                y = hl.dot(C[b, tile_m, g, tile_n], prev_states[b, c, h, tile_p, tile_n].T, acc=y)
            raw_state = hl.dot(B[b, tile_m, g, tile_n], dstates[b, c, h, tile_p, tile_n].T, acc=raw_state)
        raw_state = raw_state * weight_m[:, None]
        dA_m2 = dA_m * LOG2E
        # F5's chunk term, columns c0 .. the block's last row (causal): only with z, where dz needs
        # y itself. Without z, y serves only dout . y, whose chunk term the dB/dC kernel adds to
        # rows[2] from the dout . x^T tiles it computes anyway (chunk_state_scan_bwd_dbdc.py).
        if z is not None:
            y = y * scale_m[:, None]
            for tile_k in hl.tile(c0, tile_m.end, block_size=block_k):
                scores = cb[b, c, g, tile_m.index - c0, tile_k.index - c0]
                decay = torch.exp2(torch.clamp(dA_m2[:, None] - dA_pos[b, h, tile_k][None, :] * LOG2E, max=0.0))
                scores = scores * decay * dt_pos[b, h, tile_k][None, :]
                scores = torch.where(tile_m.index[:, None] >= tile_k.index[None, :], scores, 0.0)
                # Two parts (high and low bits), as for dx below: dout . y enters ddA, whose
                # reverse cumsum adds a chunk's errors up; rounded once, dA came out over 20x
                # further from fp32 than eager bf16 at seqlen 1024 (CPU, ref mode).
                hi = scores.to(x.dtype)
                lo = (scores - hi.to(torch.float32)).to(x.dtype)
                x_k = x[b, tile_k, h, tile_p]
                y = hl.dot(hi, x_k, acc=y)
                y = hl.dot(lo, x_k, acc=y)
        # Its transpose for dx: rows l' = the block's first row .. the chunk's end.
        raw_scan = hl.zeros([tile_m, tile_p], dtype=torch.float32)
        for tile_k in hl.tile(tile_m.begin, c_end, block_size=block_k):
            scores_t = cb[b, c, g, tile_k.index - c0, tile_m.index - c0].T
            decay = torch.exp2(torch.clamp(dA_pos[b, h, tile_k][None, :] * LOG2E - dA_m2[:, None], max=0.0))
            scores_t = torch.where(tile_k.index[None, :] >= tile_m.index[:, None], scores_t * decay, 0.0)
            dout_k = dy[b, tile_k, h, tile_p]
            if z is not None:
                zk = z[b, tile_k, h, tile_p].to(torch.float32)
                dout_k = (dout_k.to(torch.float32) * zk * torch.sigmoid(zk)).to(x.dtype)
            hi = scores_t.to(x.dtype)
            raw_scan = hl.dot(hi, dout_k, acc=raw_scan)
            if z is not None:
                # The scores' low bits too, a second dot: ddt~ = x . raw sums over a whole
                # chunk, and with the scores rounded once (as mamba-ssm does) ddt_bias came out
                # 3-5x further from fp32 than eager torch in bf16 (CPU, ref mode). Without z,
                # ddt~'s chunk term comes in fp32 from the dB/dC kernel, and raw_scan serves
                # only dx, rounded once as mamba-ssm's dx is.
                lo = (scores_t - hi.to(torch.float32)).to(x.dtype)
                raw_scan = hl.dot(lo, dout_k, acc=raw_scan)
        dy_m = dy[b, tile_m, h, tile_p].to(torch.float32)
        x_m = x[b, tile_m, h, tile_p].to(torch.float32)
        if z is not None:
            z_m = z[b, tile_m, h, tile_p].to(torch.float32)
            sig = torch.sigmoid(z_m)
            # The gated dout in fp32 for the D terms (dD sums over the whole sequence: with
            # dout rounded to bf16 first, dD per headdim was 1e4x further from fp32 than
            # mamba-ssm's at Nano TP1 on the H200); rounded, as the other kernels read it,
            # for dout . y (which pairs with their terms in ddA).
            dout_f = dy_m * z_m * sig
            dout_m = dout_f.to(x.dtype).to(torch.float32)
        else:
            dout_f = dy_m
            dout_m = dy_m
        raw = raw_state + raw_scan
        dx_m = raw * dt_m[:, None]
        if D is not None:
            d_hp = D[h, tile_p].to(torch.float32)
            dx_m = dx_m + dout_f * d_hp[None, :]
            dD_part[b, tile_m.id, h, tile_p] = torch.sum(dout_f * x_m, dim=0)
        dx[b, tile_m, h, tile_p] = dx_m.to(dx.dtype)
        if z is not None:
            y_pre = y
            if D is not None:
                y_pre = y + x_m * D[h, tile_p].to(torch.float32)[None, :]
            dz[b, tile_m, h, tile_p] = (dy_m * y_pre * sig * (1.0 + z_m * (1.0 - sig))).to(dz.dtype)
        # Without z only ddt~'s state term (the dB/dC kernel adds its chunk term to slot 0).
        rows[0, slot, b, h, tile_m] = torch.sum(x_m * (raw if z is not None else raw_state), dim=1)
        rows[1, slot, b, h, tile_m] = torch.sum(x_m * raw_state, dim=1)
        if z is not None:  # without z the dB/dC kernel writes dout . y
            rows[2, slot, b, h, tile_m] = torch.sum(dout_m * y, dim=1)
    return dx


# --- host launcher --------------------------------------------------------------------


def _launch(dy: torch.Tensor, z: torch.Tensor | None, x: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
            cb: torch.Tensor, dt: torch.Tensor, dA_cumsum: torch.Tensor, prev_states: torch.Tensor,
            dstates: torch.Tensor, D: torch.Tensor | None, seq_idx: torch.Tensor | None,
            dx: torch.Tensor | None = None, dz: torch.Tensor | None = None
            ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor | None]:
    """Returns (dx, dz or None, rows (3, slots, batch, nheads, nchunks * chunk_size) fp32,
    dD (nheads, headdim) fp32 or None). dx, dz: where to write them (like x, a unit last
    stride, any others: the fused layer's slices of its gradient buffers); None: new buffers."""
    batch, seqlen, nheads, headdim = x.shape
    nchunks, chunk_size = dt.shape[2], dt.shape[3]
    rows = torch.zeros((3, row_slots(headdim, B.shape[3]), batch, nheads, nchunks * chunk_size),
                       dtype=torch.float32, device=x.device)
    dD_part = torch.zeros((batch, -(-seqlen // SLOT), nheads, headdim), dtype=torch.float32, device=x.device)
    if z is not None and dz is None:
        dz = torch.empty_like(z)
    if dx is None:
        dx = torch.empty_like(x)
    args = (rows, dD_part, dz, dx, dy, z, x, B.to(x.dtype), C.to(x.dtype), cb, dt.contiguous(), dA_cumsum.contiguous(),
            prev_states.to(x.dtype), dstates.to(x.dtype), common.expand_D(D, nheads, headdim), seq_idx)
    dx = runtime.run(SSD_CHUNK_SCAN_CHUNK_STATE_BWD_DX, args)
    dD = None if D is None else dD_part.sum(dim=(0, 1))
    return dx, dz, rows, dD


# --- runtime declaration ----------------------------------------------------------------


def _dims_from_args(args: Sequence[Any]) -> dict[str, int]:
    _rows, _dD, _dz, _dx, dy, z, x, B, C, cb, dt, _dA, _prev, _ds, D, seq_idx = args
    batch, seqlen, nheads, headdim = x.shape
    return {"batch": batch, "seqlen": seqlen, "nheads": nheads, "headdim": headdim, "ngroups": C.shape[2],
            "dstate": C.shape[3], "chunk_size": dt.shape[3], "has_D": int(D is not None),
            "has_z": int(z is not None), "has_seq_idx": int(seq_idx is not None)}


# Default (no tuned entry): the blocks and warps both Nano entries (TP1, TP2) converged on; the
# earlier default (8 warps, 2 stages: "three 64 x 64 fp32 accumulators want 8 warps") was 2.7x
# slower than them on the H200.
_DEFAULT = common.clamped_default([64, 64, 32, 64], ("chunk_size", "headdim", "chunk_size", "dstate"), 4, 3)


SSD_CHUNK_SCAN_CHUNK_STATE_BWD_DX = runtime.RuntimeKernel(
    key=keys.SSD_CHUNK_SCAN_CHUNK_STATE_BWD_DX,
    kernel=chunk_scan_chunk_state_bwd_dx_kernel,
    dims_from_args=_dims_from_args,
    default_config=_DEFAULT,
    dtype_arg=4,  # dy: the model's dtype (the first tensors are fp32 buffers)
)
