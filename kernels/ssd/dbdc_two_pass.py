"""B5 + B6 + B7 + B8 of the SSD backward in two passes: dB and dC with each dCB tile computed once.

The same sums as chunk_state_scan_bwd_dbdc.py (its docstring has the math), split where the
one-kernel form repeats work. There a program owns block_m positions and builds the dCB
tiles of its rows for dC (dCB[l, j], j <= l) and again, transposed, for dB (dCB[l', l],
l' >= l): every tile of dout . x^T is computed twice, once by the program of its rows and
once by the program of its columns, and once more per dstate block. At one group of many
heads with 256-long chunks (Mamba2-2.7B, Zamba2-2.7B) those dots are about half the kernel's
work.

Here:
1. `dcb_kernel`: one program per (batch, chunk, group, head run) walks its chunk's blocks
   of rows. For each it adds the state terms over the run's heads (F5's for dC, F2's for
   dB) into fp32 partials, and for each block of columns j <= l it sums the run's heads'
   dCB tile once: into S (the run's head sum, in the inputs' dtype, as the one-kernel form
   rounds it before its dots), into dout . y's chunk term of the rows, and, from the same
   tile, into ddt~'s chunk term of the columns. The program owns the whole chunk, so every
   address of those sums gets its adds from one program in program order: bitwise
   reproducible, as in the one-kernel form.
2. `dbdc_kernel`: one program per (batch, block of rows, group, block of dstate) sums the
   runs' partials and S in a fixed order and takes the dots: dC_l = state + sum_{j <= l}
   S[l, j] B_j, dB_l = state + sum_{l' >= l} S[l', l] C_l'.

The cost is memory: S (runs x batch x ngroups x seqlen x chunk_size in the inputs' dtype,
67 MB at Mamba2-2.7B, batch 2, seqlen 8192) and the state partials in fp32, written once and
read once. It pays where the one kernel repeats most: at dstate 256 (Nemotron-H 47B on the
H200, 4.06 ms on the defaults against the one kernel's 5.19 ms tuned, and mamba-ssm's 4.09 ms);
at dstate <= 128 the one kernel is faster (`combined.two_pass_dbdc` has the figures and picks
the path per shape).

Order: Helion kernels -> host launcher -> runtime declarations.
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
from mamba_tune.ssd.chunk_state_scan_bwd_dbdc import head_splits


@helion.kernel(static_shapes=True, autotuner_fn=runtime.refuse_autotune,
               ignore_warnings=[helion.exc.TensorOperationInWrapper])
def dcb_kernel(
    S: torch.Tensor,  # (runs, batch, ngroups, seqlen, chunk_size) x's dtype: rows l, columns j - chunk start
    dB_state: torch.Tensor,  # (runs, batch, seqlen, ngroups, dstate) fp32, written
    dC_state: torch.Tensor,  # like dB_state
    dy: torch.Tensor,  # (batch, seqlen, nheads, headdim)
    z: torch.Tensor | None,  # like dy
    x: torch.Tensor,  # (batch, seqlen, nheads, headdim)
    C: torch.Tensor,  # (batch, seqlen, ngroups, dstate)
    dt: torch.Tensor,  # (batch, nheads, nchunks, chunk_size) fp32
    dA_cumsum: torch.Tensor,  # (batch, nheads, nchunks, chunk_size) fp32
    prev_states: torch.Tensor,  # (batch, nchunks, nheads, headdim, dstate), x's dtype
    dstates: torch.Tensor,  # (batch, nchunks, nheads, headdim, dstate), x's dtype
    seq_idx: torch.Tensor | None,  # (batch, seqlen) int
    rows: torch.Tensor | None,  # the dx kernel's (3, slots, batch, nheads, nchunks * chunk_size) fp32 sums
    cb: torch.Tensor | None,  # (batch, nchunks, ngroups, chunk_size, chunk_size) fp32, with rows
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    batch, seqlen, nheads, headdim = x.shape
    ngroups = C.size(2)
    dstate = C.size(3)
    nchunks = dt.size(2)
    chunk_size = hl.specialize(dt.size(3))
    heads_per_group = nheads // ngroups
    runs = S.size(0)
    heads_per_run = (heads_per_group + runs - 1) // runs
    dt_pos = dt.view(batch, nheads, nchunks * chunk_size)
    dA_pos = dA_cumsum.view(batch, nheads, nchunks * chunk_size)
    block_m = hl.register_block_size(16, chunk_size)
    block_n = hl.register_block_size(max(16, min(SLOT_N, dstate & -dstate)), dstate)  # slot_block(dstate, SLOT_N)
    block_k = hl.register_block_size(16, chunk_size)
    block_q = hl.register_block_size(16, headdim)
    for tile_gs, tile_c, tile_b in hl.tile([ngroups * runs, nchunks, batch], block_size=[1, 1, 1]):
        b = tile_b.begin
        c = tile_c.begin
        g = tile_gs.begin // runs
        sp = tile_gs.begin % runs
        # This program's run of the group's heads: [h0, h1).
        h0 = g * heads_per_group + sp * heads_per_run
        h1 = min(h0 + heads_per_run, (g + 1) * heads_per_group)
        c0 = c * chunk_size
        c_end = min(c0 + chunk_size, seqlen)
        if seq_idx is not None:
            seq_prev = hl.load(seq_idx, [b, max(c0, 1) - 1]) * min(c, 1)
            seq_last = hl.load(seq_idx, [b, c_end - 1])
        for tile_m in hl.tile(c0, c_end, block_size=block_m):
            if seq_idx is not None:
                seq_m = seq_idx[b, tile_m]
            # The state terms, head by head, one dstate block at a time.
            for tile_n in hl.tile(dstate, block_size=block_n):
                acc_c = hl.zeros([tile_m, tile_n], dtype=torch.float32)
                acc_b = hl.zeros([tile_m, tile_n], dtype=torch.float32)
                if rows is not None:
                    c_mn = C[b, tile_m, g, tile_n].to(torch.float32)
                for tile_h in hl.tile(h0, h1, block_size=1):
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
                    if rows is not None:
                        # dout_l . y_l's state term over this dstate block, into its own slot.
                        hl.atomic_add(rows, [2, tile_n.id, b, h, tile_m], torch.sum(t_c * c_mn, dim=1) * scale_m)
                dC_state[sp, b, tile_m, g, tile_n] = acc_c
                dB_state[sp, b, tile_m, g, tile_n] = acc_b
            # The dCB tiles of these rows, j <= l, each once: S, and the chunk terms of rows and columns.
            for tile_k in hl.tile(c0, tile_m.end, block_size=block_k):
                dcb = hl.zeros([tile_m, tile_k], dtype=torch.float32)
                keep = tile_m.index[:, None] >= tile_k.index[None, :]
                if seq_idx is not None:
                    keep = keep & (seq_m[:, None] == seq_idx[b, tile_k][None, :])
                if rows is not None:
                    cb_k = torch.where(keep, cb[b, c, g, tile_m.index - c0, tile_k.index - c0], 0.0)
                for tile_h in hl.tile(h0, h1, block_size=1):
                    h = tile_h.begin
                    w = hl.zeros([tile_m, tile_k], dtype=torch.float32)
                    for tile_q in hl.tile(headdim, block_size=block_q):
                        dout = dy[b, tile_m, h, tile_q]
                        if z is not None:
                            zv = z[b, tile_m, h, tile_q].to(torch.float32)
                            dout = (dout.to(torch.float32) * zv * torch.sigmoid(zv)).to(x.dtype)
                        w = hl.dot(dout, x[b, tile_k, h, tile_q].T, acc=w)
                    decay = torch.exp(torch.clamp(dA_pos[b, h, tile_m][:, None] - dA_pos[b, h, tile_k][None, :], max=0.0))
                    pd = w * decay
                    part = pd * dt_pos[b, h, tile_k][None, :]
                    dcb = dcb + part
                    if rows is not None:
                        # dout_l . y_l's chunk term (sum over j of CB[l, j] times the addend) and
                        # ddt~_j's (sum over l of CB[l, j] (dout_l . x_j) exp(dA_l - dA_j)).
                        hl.atomic_add(rows, [2, 0, b, h, tile_m], torch.sum(cb_k * part, dim=1))
                        hl.atomic_add(rows, [0, 0, b, h, tile_k], torch.sum(cb_k * pd, dim=0))
                hl.store(S, [sp, b, g, tile_m, tile_k.index - c0], torch.where(keep, dcb, 0.0).to(S.dtype))
    return S, dB_state, dC_state


@helion.kernel(static_shapes=True, autotuner_fn=runtime.refuse_autotune,
               ignore_warnings=[helion.exc.TensorOperationInWrapper])
def dbdc_kernel(
    dB: torch.Tensor,  # (batch, seqlen, ngroups, dstate) x's dtype, written
    dC: torch.Tensor,  # like dB
    S: torch.Tensor,  # (runs, batch, ngroups, seqlen, chunk_size) from dcb_kernel (j <= l written)
    dB_state: torch.Tensor,  # (runs, batch, seqlen, ngroups, dstate) fp32
    dC_state: torch.Tensor,  # like dB_state
    B: torch.Tensor,  # (batch, seqlen, ngroups, dstate), dB's dtype
    C: torch.Tensor,  # like B
) -> tuple[torch.Tensor, torch.Tensor]:
    runs, batch, seqlen, ngroups, dstate = dB_state.shape
    chunk_size = hl.specialize(S.size(4))
    block_m = hl.register_block_size(16, chunk_size)
    block_k = hl.register_block_size(16, chunk_size)
    for tile_g, tile_m, tile_n, tile_b in hl.tile([ngroups, seqlen, dstate, batch], block_size=[1, block_m, None, 1]):
        b = tile_b.begin
        g = tile_g.begin
        c0 = (tile_m.begin // chunk_size) * chunk_size
        c_end = min(c0 + chunk_size, seqlen)
        acc_c = hl.zeros([tile_m, tile_n], dtype=torch.float32)
        acc_b = hl.zeros([tile_m, tile_n], dtype=torch.float32)
        for tile_s in hl.tile(runs, block_size=1):
            acc_c = acc_c + dC_state[tile_s.begin, b, tile_m, g, tile_n]
            acc_b = acc_b + dB_state[tile_s.begin, b, tile_m, g, tile_n]
        # dC: S's rows of this block, columns c0 .. the block's last row.
        for tile_k in hl.tile(c0, tile_m.end, block_size=block_k):
            s = hl.zeros([tile_m, tile_k], dtype=torch.float32)
            for tile_s in hl.tile(runs, block_size=1):
                s = s + S[tile_s.begin, b, g, tile_m, tile_k.index - c0].to(torch.float32)
            s = torch.where(tile_m.index[:, None] >= tile_k.index[None, :], s, 0.0)
            acc_c = hl.dot(s.to(B.dtype), B[b, tile_k, g, tile_n], acc=acc_c)
        # dB: S's columns of this block, rows the block's first row .. the chunk's end.
        for tile_k in hl.tile(tile_m.begin, c_end, block_size=block_k):
            s_t = hl.zeros([tile_k, tile_m], dtype=torch.float32)
            for tile_s in hl.tile(runs, block_size=1):
                s_t = s_t + S[tile_s.begin, b, g, tile_k, tile_m.index - c0].to(torch.float32)
            s_t = torch.where(tile_k.index[:, None] >= tile_m.index[None, :], s_t, 0.0)
            acc_b = hl.dot(s_t.T.to(C.dtype), C[b, tile_k, g, tile_n], acc=acc_b)
        dB[b, tile_m, g, tile_n] = acc_b.to(dB.dtype)
        dC[b, tile_m, g, tile_n] = acc_c.to(dC.dtype)
    return dB, dC


# --- host launcher --------------------------------------------------------------------


def _launch(dy: torch.Tensor, z: torch.Tensor | None, x: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
            dt: torch.Tensor, dA_cumsum: torch.Tensor, prev_states: torch.Tensor, dstates: torch.Tensor,
            seq_idx: torch.Tensor | None, rows: torch.Tensor | None = None,
            cb: torch.Tensor | None = None, dB: torch.Tensor | None = None,
            dC: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """As chunk_state_scan_bwd_dbdc._launch: (dB, dC) in x's dtype (into dB and dC when given),
    and the rows' sums added."""
    batch, seqlen, _, _ = x.shape
    _, _, ngroups, dstate = B.shape
    nchunks, chunk_size = dt.shape[2], dt.shape[3]
    runs = head_splits(batch, nchunks, ngroups, x.shape[2])
    S = torch.empty((runs, batch, ngroups, seqlen, chunk_size), dtype=x.dtype, device=x.device)
    dB_state = torch.empty((runs, batch, seqlen, ngroups, dstate), dtype=torch.float32, device=x.device)
    dC_state = torch.empty_like(dB_state)
    Bx, Cx = B.to(x.dtype), C.to(x.dtype)
    runtime.run(SSD_DCB, (S, dB_state, dC_state, dy, z, x, Cx, dt.contiguous(), dA_cumsum.contiguous(),
                          prev_states.to(x.dtype), dstates.to(x.dtype), seq_idx, rows, cb))
    if dB is None or dC is None:
        dB = torch.empty((batch, seqlen, ngroups, dstate), dtype=x.dtype, device=x.device)
        dC = torch.empty_like(dB)
    return runtime.run(SSD_DBDC_FROM_DCB, (dB, dC, S, dB_state, dC_state, Bx, Cx))


# --- runtime declarations ---------------------------------------------------------------


def _dcb_dims_from_args(args: Sequence[Any]) -> dict[str, int]:
    _S, _dBs, _dCs, dy, z, x, C, dt, _dA, _prev, _ds, seq_idx, _rows, _cb = args
    batch, seqlen, nheads, headdim = x.shape
    return {"batch": batch, "seqlen": seqlen, "nheads": nheads, "headdim": headdim, "ngroups": C.shape[2],
            "dstate": C.shape[3], "chunk_size": dt.shape[3], "has_z": int(z is not None),
            "has_seq_idx": int(seq_idx is not None)}


def _dbdc_dims_from_args(args: Sequence[Any]) -> dict[str, int]:
    _dB, _dC, S, dB_state, _dCs, _B, _C = args
    runs, batch, seqlen, ngroups, dstate = dB_state.shape
    return {"batch": batch, "seqlen": seqlen, "ngroups": ngroups, "dstate": dstate, "chunk_size": S.shape[4],
            "runs": runs}


# Defaults (no tuned entries): the one-kernel form's blocks (64 rows, a whole dstate up to 128,
# 64-wide column steps, the whole headdim), 8 warps for its two 64 x dstate accumulators.
_DCB_DEFAULT = common.clamped_default([64, 128, 64, 64], ("chunk_size", "dstate", "chunk_size", "headdim"), 8, 3)


# [block_m, block_k, the tile's dstate block] (Helion numbers blocks as they are registered).
_DBDC_DEFAULT = common.clamped_default([64, 64, 128], ("chunk_size", "chunk_size", "dstate"), 4, 3)


SSD_DCB = runtime.RuntimeKernel(
    key=keys.SSD_CHUNK_STATE_SCAN_BWD_DCB,
    kernel=dcb_kernel,
    dims_from_args=_dcb_dims_from_args,
    default_config=_DCB_DEFAULT,
    dtype_arg=3,  # dy: the model's dtype (S's may match, the state partials are fp32)
)

SSD_DBDC_FROM_DCB = runtime.RuntimeKernel(
    key=keys.SSD_BMM_BWD_DBDC,
    kernel=dbdc_kernel,
    dims_from_args=_dbdc_dims_from_args,
    default_config=_DBDC_DEFAULT,
    dtype_arg=0,
)
