"""Tuning record of `kernels/ssd/chunk_scan_chunk_state_bwd_dx.py` (B1+B4+B9 of the SSD backward): inputs at a shape, the fp32 check, the baseline, seeds."""

from __future__ import annotations

from typing import Any

import torch

from autotune_cli.tuning.record import Baseline, Problem, TunableKernel
from autotune_cli.tuning.ssd import bwd_inputs, inputs
from mamba_tune import keys
from mamba_tune.ssd import chunk_scan_chunk_state_bwd_dx as kernel
from mamba_tune.ssd import common as kernel_common


def _make_problem(dims: dict[str, int], dtype: torch.dtype, device: torch.device, seed: int) -> Problem:
    s = bwd_inputs.StageInputs.make(dims, dtype, device, seed)
    i = s.inp
    b, L, H, P = i.x.shape
    nc, Q = s.dt_out.shape[2], s.dt_out.shape[3]
    dstates = s.dstates_lowp
    rows = torch.zeros((3, keys.row_slots(P, i.C.shape[3]), b, H, nc * Q), dtype=torch.float32, device=device)
    dD_part = torch.zeros((b, -(-L // kernel.SLOT), H, P), dtype=torch.float32, device=device)
    dz = None if i.z is None else torch.empty_like(i.z)
    args = (rows, dD_part, dz, torch.empty_like(i.x), s.dy, i.z, i.x, i.B, i.C, s.cb, s.dt_out, s.dA_cumsum,
            s.prev_states_lowp, dstates, kernel_common.expand_D(i.D, H, P), i.seq_idx)

    def ref(lowp: bool) -> dict[str, torch.Tensor]:
        g = s.stage_grads(lowp)
        out = {"dx": g["x"].float(), "ddt": (g["dt_state"] + g["dt_scan"]).float(),
               "ddt_state": g["dt_state"].float(), "ddA_scan": g["dA_scan"].float()}
        if i.z is not None:
            out["dz"] = g["z"].float()
        if i.D is not None:
            out["dD"] = g["D"].float()[:, None].expand(H, P) if g["D"].dim() == 1 else g["D"].float()
        return out

    def outputs(dx: torch.Tensor) -> dict[str, torch.Tensor]:
        r = rows.sum(1).view(3, b, H, nc, Q)
        ddt, dout_y = r[0], r[2]
        if i.z is None:  # the dB/dC kernel adds ddt~'s chunk term and dout . y
            terms = s.dbdc_sum_terms().view(2, b, H, nc, Q)
            ddt, dout_y = ddt + terms[0], dout_y + terms[1]
        out = {"dx": dx.float(), "ddt": ddt, "ddt_state": r[1], "ddA_scan": dout_y - s.dt_out * (ddt - r[1])}
        if dz is not None:
            out["dz"] = dz.float()
        if i.D is not None:
            dD = dD_part.sum(dim=(0, 1))
            out["dD"] = dD.sum(-1, keepdim=True).expand(H, P) if i.D.dim() == 1 else dD
        return out

    e = i.x.element_size()
    nbytes = (i.x.numel() * (3 + 2 * (i.z is not None)) + 2 * i.C.numel()) * e + 2 * dstates.numel() * e
    nbytes += s.cb.numel() * 4 + 2 * s.dt_out.numel() * 4 + rows.numel() * 4
    N = i.C.shape[3]
    return Problem(
        args=args,
        reference=lambda: ref(False),
        lowp_reference=lambda: ref(True),
        outputs=outputs,
        bytes_moved=nbytes,
        flops=4 * b * L * H * P * N + 2 * b * L * H * P * Q,
    )


def _baseline(dims: dict[str, int], dtype: torch.dtype, device: torch.device, seed: int) -> Baseline | None:
    found = inputs.mamba_ssm_ops()
    if found is None or device.type != "cuda":
        return None
    mods, name = found
    s = bwd_inputs.StageInputs.make(dims, dtype, device, seed)
    i = s.inp
    dstates = s.dstates_lowp
    dout = s.gated_dout()
    out_x = torch.randn_like(i.x)

    # mamba-ssm's matching work: the dz kernel (with z), the fused dx kernel and, with z, the ddA
    # pass (without z our dB/dC kernel does that work: its record's baseline times the pass).
    def fn() -> Any:
        d = dout
        if i.z is not None:
            _, d, *_ = mods["chunk_scan"]._chunk_scan_bwd_dz(i.x, i.z, out_x, s.dy, chunk_size=i.chunk_size,
                                                            has_ddAcs=False, D=i.D)
        dx = mods["combined"]._chunk_scan_chunk_state_bwd_dx(i.x, s.dt_out, s.dA_cumsum, i.B, s.cb, d, dstates,
                                                             D=i.D, seq_idx=i.seq_idx)
        if i.z is None:
            return dx
        return dx, mods["chunk_scan"]._chunk_scan_bwd_ddAcs_stable(i.x, s.dt_out, s.dA_cumsum, d, s.cb)

    return Baseline(name, fn)


# block_sizes = [chunk rows, headdim, chunk positions per dot, dstate per dot].
# The headdim block starts at the least the kernel registers (`slot_block`).
_SEEDS = inputs.fixed_seeds([([64, 64, 32, 64], 4, 3), ([64, 64, 64, 64], 4, 3), ([32, 64, 32, 64], 4, 3),
                             ([64, 32, 32, 128], 4, 3), ([128, 64, 32, 64], 8, 3), ([64, 64, 32, 32], 4, 2)],
                            least=lambda d: {1: keys.slot_block(d["headdim"], keys.SLOT_P)})


SSD_CHUNK_SCAN_CHUNK_STATE_BWD_DX = TunableKernel(
    runtime=kernel.SSD_CHUNK_SCAN_CHUNK_STATE_BWD_DX,
    make_problem=_make_problem,
    make_baseline=_baseline,
    seed_configs=_SEEDS,
    description="SSD B1+B4+B9 fused: dx, dz, dD and the per-position ddt/ddA sums, recomputing the output "
                    "(mamba-ssm _chunk_scan_bwd_dz_kernel + _chunk_scan_chunk_state_bwd_dx_kernel + "
                    "_chunk_scan_bwd_ddAcs_stable_kernel)",
)
