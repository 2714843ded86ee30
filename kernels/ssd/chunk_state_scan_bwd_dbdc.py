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

Order: Helion kernel -> host launcher -> tuning record.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import helion
import helion.language as hl
import torch

from kernels import runtime
from kernels.registry import Baseline, ModelShape, Problem, TunableKernel, register
from kernels.ssd import bwd_common, common


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


# --- tuning record --------------------------------------------------------------------

DIMS = (*common.SHAPE_DIMS, "has_z", "has_seq_idx")


def _dims_for(shape: ModelShape) -> dict[str, int]:
    return common.pick(common.mixer_dims(shape), DIMS)


def _dims_from_args(args: Sequence[Any]) -> dict[str, int]:
    dy, z, x, B, C, dt, _dA, _prev, _ds, seq_idx = args
    batch, seqlen, nheads, headdim = x.shape
    return {"batch": batch, "seqlen": seqlen, "nheads": nheads, "headdim": headdim, "ngroups": C.shape[2],
            "dstate": C.shape[3], "chunk_size": dt.shape[3], "has_z": int(z is not None),
            "has_seq_idx": int(seq_idx is not None)}


def _make_problem(dims: dict[str, int], dtype: torch.dtype, device: torch.device, seed: int) -> Problem:
    s = bwd_common.StageInputs.make(dims, dtype, device, seed)
    i = s.inp
    dstates = s.dstates_lowp
    args = (s.dy, i.z, i.x, i.B, i.C, s.dt_out, s.dA_cumsum, s.prev_states_lowp, dstates, i.seq_idx)

    def ref(lowp: bool) -> dict[str, torch.Tensor]:
        g = s.stage_grads(lowp)
        return {"dB": g["B"].float(), "dC": g["C"].float()}

    b, L, H, P = i.x.shape
    G, N = i.C.shape[2], i.C.shape[3]
    e = i.x.element_size()
    return Problem(
        args=args,
        reference=lambda: ref(False),
        lowp_reference=lambda: ref(True),
        outputs=lambda res: {"dB": res[0].float(), "dC": res[1].float()},
        bytes_moved=(i.x.numel() * (2 + (i.z is not None)) + 4 * i.C.numel()) * e + 2 * dstates.numel() * e
        + 2 * s.dt_out.numel() * 4,
        flops=4 * b * L * H * P * N + 2 * b * L * H * P * i.chunk_size + 2 * b * L * G * N * i.chunk_size,
    )


def _baseline(dims: dict[str, int], dtype: torch.dtype, device: torch.device, seed: int) -> Baseline | None:
    found = common.mamba_ssm_ops()
    if found is None or device.type != "cuda":
        return None
    mods, name = found
    s = bwd_common.StageInputs.make(dims, dtype, device, seed)
    i = s.inp
    G = i.B.shape[2]
    dstates = s.dstates_lowp
    dout = s.gated_dout()
    cs, sc, bm = mods["chunk_state"], mods["chunk_scan"], mods["bmm"]

    def fn() -> Any:
        dB, _ = cs._chunk_state_bwd_db(i.x, s.dt_out, s.dA_cumsum, dstates, seq_idx=i.seq_idx, B=i.B, ngroups=G)
        dC, _ = sc._chunk_scan_bwd_dC(s.prev_states_lowp, s.dA_cumsum, dout, seq_idx=i.seq_idx, C=i.C, ngroups=G)
        dCB = sc._chunk_scan_bwd_dcb(i.x, s.dt_out, s.dA_cumsum, dout, seq_idx=i.seq_idx, ngroups=G).float()
        dB2 = bm._bmm_chunk_bwd(i.C, dCB, residual=dB)
        dC2 = bm._bmm_chunk_bwd(i.B, dCB.transpose(-1, -2), residual=dC)
        return dB2, dC2

    return Baseline(name, fn)


# block_sizes = [chunk rows, dstate, chunk positions per dot, headdim per dot].
_SEEDS = common.fixed_seeds([([64, 128, 32, 64], 4, 3), ([64, 64, 32, 64], 4, 3), ([32, 128, 32, 64], 4, 3),
                             ([64, 128, 64, 64], 8, 3), ([128, 64, 32, 64], 8, 2), ([32, 64, 32, 32], 4, 3)])

# Default (no tuned entry): two 64 x dstate fp32 accumulators per program want 8 warps.
_DEFAULT = bwd_common.clamped_default([64, 128, 32, 64], ("chunk_size", "dstate", "chunk_size", "headdim"), 8, 2)

SSD_CHUNK_STATE_SCAN_BWD_DBDC = register(
    TunableKernel(
        name="ssd_chunk_state_scan_bwd_dbdc",
        family="ssd",
        kernel=chunk_state_scan_bwd_dbdc_kernel,
        dims=DIMS,
        size_dims=common.size_dims(DIMS),
        dims_for=_dims_for,
        dims_from_args=_dims_from_args,
        make_problem=_make_problem,
        make_baseline=_baseline,
        seed_configs=_SEEDS,
        default_config=_DEFAULT,
        description="SSD B5+B6+B7+B8 fused: dB and dC summed over each group's heads in order, dCB in registers "
                    "(mamba-ssm _chunk_state_bwd_db_kernel + _chunk_scan_bwd_dc_kernel + _chunk_scan_bwd_dcb_kernel "
                    "+ _bmm_chunk_bwd_kernel x2)",
    )
)
