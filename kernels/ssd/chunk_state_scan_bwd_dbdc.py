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

Without z it also writes, per head and position, the dx kernel's sums that it can take from
tiles it has: dout_l . y_l whole (its state term exp(dA_l) sum_n (dout_l . prev_c)[n] C_l[n]
from the state term's tiles, one slot per dstate block; its chunk term sum_j CB[l, j] times
the head's dCB addend [l, j]), and ddt~_j's chunk term (sum_l CB[l, j] times the addend
without dt~_j, from the transposed tiles of the dB loop). Both chunk terms come in fp32 from
the same products, as mamba-ssm's `_chunk_scan_bwd_ddAcs_stable` takes the two sums that
cancel in ddA from one set. The dx kernel then recomputes no y at all and its chunk term only
for dx, rounded once as mamba-ssm rounds it. The writes are atomic adds, but each address
gets its non-zero adds from one program in program order (the chunk terms from the first
dstate block's; the others add zeros), so the sums are bitwise reproducible.

Where a group has many heads and there are few (chunk, group) pairs (one group of 80 heads
in Mamba2 / Zamba2: 64 pairs at batch 2, seqlen 8192 with chunk 256), one program per pair
and dstate block leaves most SMs idle while it walks all the heads. The host then splits each
group's heads into `head_splits` consecutive runs, one program each, writing fp32 partial dB
and dC that it sums over the runs in a fixed order with torch, a sum and a cast for each (mamba-ssm
splits its heads by SM count and adds the partials with torch too).
With one run (Nemotron's 8-head groups) the program writes dB and dC in the inputs' dtype as before.

dC and dB are two branches of the program, and the grid runs one program for each (`SIDES`):
with one fp32 accumulator live at a time instead of two, 4 warps beat 8 (the default).

Order: Helion kernels -> host launcher -> runtime declarations (their tuning records:
`autotune_cli/tuning/ssd/`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import helion
import helion.language as hl
import torch

from mamba_tune import keys, runtime
from mamba_tune.keys import SLOT_N
from mamba_tune.ssd import common


@helion.kernel(static_shapes=True, autotuner_fn=runtime.refuse_autotune,
               ignore_warnings=[helion.exc.TensorOperationInWrapper])
def chunk_state_scan_bwd_dbdc_kernel(
    dB: torch.Tensor,  # (splits, batch, seqlen, ngroups, dstate): x's dtype for one split, else fp32 partials
    dC: torch.Tensor,  # like dB
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
    rows: torch.Tensor | None,  # the dx kernel's (3, slots, batch, nheads, nchunks * chunk_size) fp32 sums
    cb: torch.Tensor | None,  # (batch, nchunks, ngroups, chunk_size, chunk_size) fp32, with rows
    sides_n: int,  # 1: one program takes dC then dB; 2: one program for each (`sides`)
) -> tuple[torch.Tensor, torch.Tensor]:
    batch, seqlen, nheads, headdim = x.shape
    ngroups = C.size(2)
    dstate = C.size(3)
    nchunks = dt.size(2)
    chunk_size = hl.specialize(dt.size(3))
    sides = hl.specialize(sides_n)
    heads_per_group = nheads // ngroups
    splits = dB.size(0)
    heads_per_split = (heads_per_group + splits - 1) // splits
    dt_pos = dt.view(batch, nheads, nchunks * chunk_size)
    dA_pos = dA_cumsum.view(batch, nheads, nchunks * chunk_size)
    block_m = hl.register_block_size(16, chunk_size)
    block_n = hl.register_block_size(max(16, min(SLOT_N, dstate & -dstate)), dstate)  # slot_block(dstate, SLOT_N)
    block_k = hl.register_block_size(16, chunk_size)
    block_q = hl.register_block_size(16, headdim)
    for tile_s, tile_gs, tile_m, tile_n, tile_b in hl.tile(
        [sides, ngroups * splits, seqlen, dstate, batch], block_size=[1, 1, block_m, block_n, 1]
    ):
        b = tile_b.begin
        g = tile_gs.begin // splits
        sp = tile_gs.begin % splits
        # This program's run of the group's heads: [h0, h1).
        h0 = g * heads_per_group + sp * heads_per_split
        h1 = min(h0 + heads_per_split, (g + 1) * heads_per_group)
        c = tile_m.begin // chunk_size
        c0 = c * chunk_size
        c_end = min(c0 + chunk_size, seqlen)
        if seq_idx is not None:
            seq_m = seq_idx[b, tile_m]
            seq_prev = hl.load(seq_idx, [b, max(c0, 1) - 1]) * min(c, 1)
            seq_last = hl.load(seq_idx, [b, c_end - 1])
        if tile_s.begin == 0:
            # dC: its state term head by head, then dCB rows of this block against B.
            acc_c = hl.zeros([tile_m, tile_n], dtype=torch.float32)
            if rows is not None:
                c_mn = C[b, tile_m, g, tile_n].to(torch.float32)
            for tile_h in hl.tile(h0, h1, block_size=1):
                h = tile_h.begin
                scale_m = torch.exp(dA_pos[b, h, tile_m])
                if seq_idx is not None:
                    scale_m = torch.where(seq_m == seq_prev, scale_m, 0.0)
                t_c = hl.zeros([tile_m, tile_n], dtype=torch.float32)
                for tile_q in hl.tile(headdim, block_size=block_q):
                    dout = dy[b, tile_m, h, tile_q]
                    if z is not None:
                        zv = z[b, tile_m, h, tile_q].to(torch.float32)
                        dout = (dout.to(torch.float32) * zv * torch.sigmoid(zv)).to(x.dtype)
                    t_c = hl.dot(dout, prev_states[b, c, h, tile_q, tile_n], acc=t_c)
                acc_c = acc_c + t_c * scale_m[:, None]
                if rows is not None:
                    # dout_l . y_l's state term over this dstate block, into its own slot.
                    hl.atomic_add(rows, [2, tile_n.id, b, h, tile_m], torch.sum(t_c * c_mn, dim=1) * scale_m)
            # Columns c0 .. the block's last row.
            for tile_k in hl.tile(c0, tile_m.end, block_size=block_k):
                dcb = hl.zeros([tile_m, tile_k], dtype=torch.float32)
                keep = tile_m.index[:, None] >= tile_k.index[None, :]
                if seq_idx is not None:
                    keep = keep & (seq_m[:, None] == seq_idx[b, tile_k][None, :])
                if rows is not None:
                    # dout_l . y_l's chunk term per head: sum_j CB[l, j] (dout_l . x_j) exp(dA_l - dA_j)
                    # dt~_j, the head's dCB addend times CB, all fp32. Only the first dstate block's
                    # program adds it (the others add zeros); its k steps add in program order.
                    cb_k = torch.where(keep, cb[b, c, g, tile_m.index - c0, tile_k.index - c0], 0.0)
                    cb_k = cb_k * (1 - min(tile_n.begin, 1))
                for tile_h in hl.tile(h0, h1, block_size=1):
                    h = tile_h.begin
                    w = hl.zeros([tile_m, tile_k], dtype=torch.float32)
                    for tile_q in hl.tile(headdim, block_size=block_q):
                        dout = dy[b, tile_m, h, tile_q]
                        if z is not None:
                            zv = z[b, tile_m, h, tile_q].to(torch.float32)
                            dout = (dout.to(torch.float32) * zv * torch.sigmoid(zv)).to(x.dtype)
                        w = hl.dot(dout, x[b, tile_k, h, tile_q].T, acc=w)
                    decay = torch.exp(torch.clamp(dA_pos[b, h, tile_m][:, None] - dA_pos[b, h, tile_k][None, :],
                                                  max=0.0))
                    part = w * decay * dt_pos[b, h, tile_k][None, :]
                    dcb = dcb + part
                    if rows is not None:
                        hl.atomic_add(rows, [2, 0, b, h, tile_m], torch.sum(cb_k * part, dim=1))
                dcb = torch.where(keep, dcb, 0.0)
                acc_c = hl.dot(dcb.to(x.dtype), B[b, tile_k, g, tile_n], acc=acc_c)
            dC[sp, b, tile_m, g, tile_n] = acc_c.to(dC.dtype)
        if tile_s.begin == sides - 1:
            # dB: its state term head by head, then dCB columns of this block against C.
            acc_b = hl.zeros([tile_m, tile_n], dtype=torch.float32)
            for tile_h in hl.tile(h0, h1, block_size=1):
                h = tile_h.begin
                dA_m = dA_pos[b, h, tile_m]
                weight_m = torch.exp(torch.clamp(dA_cumsum[b, h, c, chunk_size - 1] - dA_m, max=0.0)) * dt_pos[b, h, tile_m]
                if seq_idx is not None:
                    weight_m = torch.where((seq_m == seq_last) & (seq_last >= 0), weight_m, 0.0)
                t_b = hl.zeros([tile_m, tile_n], dtype=torch.float32)
                for tile_q in hl.tile(headdim, block_size=block_q):
                    t_b = hl.dot(x[b, tile_m, h, tile_q], dstates[b, c, h, tile_q, tile_n], acc=t_b)
                acc_b = acc_b + t_b * weight_m[:, None]
            # Rows the block's first row .. the chunk's end.
            for tile_k in hl.tile(tile_m.begin, c_end, block_size=block_k):
                dcb_t = hl.zeros([tile_m, tile_k], dtype=torch.float32)
                keep = tile_k.index[None, :] >= tile_m.index[:, None]
                if seq_idx is not None:
                    keep = keep & (seq_m[:, None] == seq_idx[b, tile_k][None, :])
                if rows is not None:
                    # ddt~_j's chunk term per head (j: this block's rows): sum_{l >= j} CB[l, j]
                    # (x_j . dout_l) exp(dA_l - dA_j), the transposed addend before its dt~_j factor.
                    cb_t = torch.where(keep, cb[b, c, g, tile_k.index - c0, tile_m.index - c0].T, 0.0)
                    cb_t = cb_t * (1 - min(tile_n.begin, 1))
                for tile_h in hl.tile(h0, h1, block_size=1):
                    h = tile_h.begin
                    w = hl.zeros([tile_m, tile_k], dtype=torch.float32)
                    for tile_q in hl.tile(headdim, block_size=block_q):
                        dout = dy[b, tile_k, h, tile_q]
                        if z is not None:
                            zv = z[b, tile_k, h, tile_q].to(torch.float32)
                            dout = (dout.to(torch.float32) * zv * torch.sigmoid(zv)).to(x.dtype)
                        w = hl.dot(x[b, tile_m, h, tile_q], dout.T, acc=w)
                    dt_m = dt_pos[b, h, tile_m]
                    decay = torch.exp(torch.clamp(dA_pos[b, h, tile_k][None, :] - dA_pos[b, h, tile_m][:, None],
                                                  max=0.0))
                    part_t = w * decay
                    dcb_t = dcb_t + part_t * dt_m[:, None]
                    if rows is not None:
                        hl.atomic_add(rows, [0, 0, b, h, tile_m], torch.sum(cb_t * part_t, dim=1))
                dcb_t = torch.where(keep, dcb_t, 0.0)
                acc_b = hl.dot(dcb_t.to(x.dtype), C[b, tile_k, g, tile_n], acc=acc_b)
            dB[sp, b, tile_m, g, tile_n] = acc_b.to(dB.dtype)
    return dB, dC


# --- host launcher --------------------------------------------------------------------


def head_splits(batch: int, nchunks: int, ngroups: int, nheads: int) -> int:
    """How many runs the host splits each group's heads into (1: no split, no partials): the
    rule the keys read (mamba_tune.keys.dbdc_head_runs)."""
    return keys.dbdc_head_runs(batch, nchunks, ngroups, nheads)


# dC and dB in one program each (the kernel's `sides_n` 2: each program holds one fp32 accumulator
# instead of two, and there are twice as many) won over both in one program: on the H200 (bf16,
# batch 2, seqlen 8192, the kernel alone at its best of five configs, ms, both / one each) Mamba2-2.7B
# 0.916 / 0.844, Zamba2-2.7B 0.785 / 0.735, Falcon-H1-0.5B 0.221 / 0.204, Nemotron-3 Nano TP1 0.659 / 0.515.
SIDES = 2


def out_buffers(x: torch.Tensor, B: torch.Tensor, nchunks: int, dB: torch.Tensor | None = None,
                dC: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's dB and dC buffers: one split in x's dtype (dB and dC themselves when given:
    the kernel writes them in place), else fp32 partials."""
    splits = head_splits(x.shape[0], nchunks, B.shape[2], x.shape[2])
    if splits == 1 and dB is not None and dC is not None:
        return dB.unsqueeze(0), dC.unsqueeze(0)
    dtype = x.dtype if splits == 1 else torch.float32
    shape = (splits, *B.shape)
    return (torch.empty(shape, dtype=dtype, device=x.device), torch.empty(shape, dtype=dtype, device=x.device))


def sum_splits(part: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """dB or dC from the kernel's buffer: the partials summed over the runs in order (torch)."""
    return part[0] if part.size(0) == 1 else part.sum(0).to(dtype)


def sum_runs(dB_part: torch.Tensor, dC_part: torch.Tensor, dtype: torch.dtype, dB: torch.Tensor | None = None,
             dC: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(dB, dC) in `dtype` from `out_buffers`' two buffers: the runs' partials summed by torch (a sum
    and a cast each; experiments/dbdc_runs_sum/ folds both in one kernel: not promoted); into dB and
    dC when given (in `dtype`: `out_buffers`' own buffers with one run)."""
    if dB is None or dC is None or dB_part.size(0) == 1:
        return sum_splits(dB_part, dtype), sum_splits(dC_part, dtype)
    return dB.copy_(dB_part.sum(0)), dC.copy_(dC_part.sum(0))  # cast as .to(dtype) rounds


def _launch(dy: torch.Tensor, z: torch.Tensor | None, x: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
            dt: torch.Tensor, dA_cumsum: torch.Tensor, prev_states: torch.Tensor, dstates: torch.Tensor,
            seq_idx: torch.Tensor | None, rows: torch.Tensor | None = None,
            cb: torch.Tensor | None = None, dB: torch.Tensor | None = None,
            dC: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (dB, dC), (batch, seqlen, ngroups, dstate) in x's dtype; adds dout . y and ddt~'s
    chunk term to the dx kernel's rows when given (with cb; see the module docstring). dB, dC:
    where to write them (x's dtype, a unit last stride); None: new buffers."""
    dB_part, dC_part = out_buffers(x, B, dt.shape[2], dB, dC)
    args = (dB_part, dC_part, dy, z, x, B.to(x.dtype), C.to(x.dtype), dt.contiguous(), dA_cumsum.contiguous(),
            prev_states.to(x.dtype), dstates.to(x.dtype), seq_idx, rows, cb,
            SIDES)
    dB_part, dC_part = runtime.run(SSD_CHUNK_STATE_SCAN_BWD_DBDC, args)
    return sum_runs(dB_part, dC_part, x.dtype, dB, dC)


# --- runtime declaration ----------------------------------------------------------------


def _dims_from_args(args: Sequence[Any]) -> dict[str, int]:
    _dB, _dC, dy, z, x, B, C, dt, _dA, _prev, _ds, seq_idx, _rows, _cb, _sides = args
    batch, seqlen, nheads, headdim = x.shape
    return {"batch": batch, "seqlen": seqlen, "nheads": nheads, "headdim": headdim, "ngroups": C.shape[2],
            "dstate": C.shape[3], "chunk_size": dt.shape[3], "has_z": int(z is not None),
            "has_seq_idx": int(seq_idx is not None)}


# Default (no tuned entry): 64 rows, all of dstate up to 128, 64-wide k steps, 4 warps, 3 stages.
# With dC and dB in branches one accumulator is live at a time, and 4 warps beat 8 at Mamba2 and
# Zamba2 on the H200 (0.844 / 1.121 and 0.735 / 1.087 ms). Before the branches two
# accumulators wanted 8 warps, and the 32-wide k step with 2 stages was 1.6x slower.
_DEFAULT = common.clamped_default([64, 128, 64, 64], ("chunk_size", "dstate", "chunk_size", "headdim"), 4, 3)


SSD_CHUNK_STATE_SCAN_BWD_DBDC = runtime.RuntimeKernel(
    key=keys.SSD_CHUNK_STATE_SCAN_BWD_DBDC,
    kernel=chunk_state_scan_bwd_dbdc_kernel,
    dims_from_args=_dims_from_args,
    default_config=_DEFAULT,
    dtype_arg=2,  # dy: the model's dtype (dB and dC are fp32 partials when the heads are split)
)
