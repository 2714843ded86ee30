"""Tuning records of `kernels/ssd/chunk_state_scan_bwd_dbdc.py` (B5-B8 of the SSD backward, and the
fold of its head runs' partials): inputs at a shape, the fp32 check, the baseline, seeds."""

from __future__ import annotations

from typing import Any

import torch

from autotune_cli.tuning.record import Baseline, Problem, TunableKernel
from autotune_cli.tuning.ssd import bwd_inputs, inputs
from mamba_tune import keys
from mamba_tune.ssd import chunk_state_scan_bwd_dbdc as kernel


def rows_buffer(s: bwd_inputs.StageInputs) -> torch.Tensor | None:
    """The dx kernel's fp32 sums that B5-B8 add ddt~'s chunk term and dout . y to, zeroed; None
    with z (then they add nothing)."""
    i = s.inp
    if i.z is not None:
        return None
    b, _, H, P = i.x.shape
    return torch.zeros(3, keys.row_slots(P, i.C.shape[3]), b, H, s.dt_out.shape[2] * s.dt_out.shape[3],
                       device=i.x.device)


def reference(s: bwd_inputs.StageInputs, rows: torch.Tensor | None, lowp: bool) -> dict[str, torch.Tensor]:
    """dB, dC (and with rows their two sums) by autograd through the stage reference."""
    g = s.stage_grads(lowp)
    out = {"dB": g["B"].float(), "dC": g["C"].float()}
    if rows is not None:  # fp32 from the low-precision inputs either way: the bound is atol
        terms = s.dbdc_sum_terms()
        out["ddt_chunk"], out["dout_y"] = terms[0], terms[1]
    return out


def with_rows(out: dict[str, torch.Tensor], rows: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """`out` with the two sums the kernel added to rows (as `reference` names them)."""
    if rows is not None:
        r = rows.sum(1)
        out["ddt_chunk"], out["dout_y"] = r[0], r[2]
    return out


def _make_problem(dims: dict[str, int], dtype: torch.dtype, device: torch.device, seed: int) -> Problem:
    s = bwd_inputs.StageInputs.make(dims, dtype, device, seed)
    i = s.inp
    dstates = s.dstates_lowp
    dB_part, dC_part = kernel.out_buffers(i.x, i.B, s.dt_out.shape[2])
    # Without z the kernel also adds ddt~'s chunk term and dout . y to the dx kernel's sums (checked below).
    b, L, H, P = i.x.shape
    G, N = i.C.shape[2], i.C.shape[3]
    rows = rows_buffer(s)
    args = (dB_part, dC_part, s.dy, i.z, i.x, i.B, i.C, s.dt_out, s.dA_cumsum, s.prev_states_lowp, dstates,
            i.seq_idx, rows, None if rows is None else s.cb, kernel.SIDES)

    def outputs(res: Any) -> dict[str, torch.Tensor]:
        return with_rows({"dB": kernel.sum_splits(res[0], i.x.dtype).float(),
                          "dC": kernel.sum_splits(res[1], i.x.dtype).float()}, rows)

    e = i.x.element_size()
    return Problem(
        args=args,
        reference=lambda: reference(s, rows, False),
        lowp_reference=lambda: reference(s, rows, True),
        outputs=outputs,
        reset=None if rows is None else rows.zero_,
        bytes_moved=(i.x.numel() * (2 + (i.z is not None)) + 2 * i.C.numel()) * e + 2 * dstates.numel() * e
        + 2 * s.dt_out.numel() * 4 + 2 * dB_part.numel() * dB_part.element_size(),
        flops=4 * b * L * H * P * N + 2 * b * L * H * P * i.chunk_size + 2 * b * L * G * N * i.chunk_size,
    )


def mamba_ssm_dbdc(dims: dict[str, int], dtype: torch.dtype, device: torch.device, seed: int,
                   bmm: bool = True) -> Baseline | None:
    """mamba-ssm's kernels for B5-B8 at these dims: dB's and dC's state terms, dCB, (with `bmm`)
    its two bmm backwards, and without z its ddA pass (None where mamba-ssm is not importable)."""
    found = inputs.mamba_ssm_ops()
    if found is None or device.type != "cuda":
        return None
    mods, name = found
    s = bwd_inputs.StageInputs.make(dims, dtype, device, seed)
    i = s.inp
    G = i.B.shape[2]
    dstates = s.dstates_lowp
    dout = s.gated_dout()
    cs, sc, bm = mods["chunk_state"], mods["chunk_scan"], mods["bmm"]

    def fn() -> Any:
        dB, _ = cs._chunk_state_bwd_db(i.x, s.dt_out, s.dA_cumsum, dstates, seq_idx=i.seq_idx, B=i.B, ngroups=G)
        dC, _ = sc._chunk_scan_bwd_dC(s.prev_states_lowp, s.dA_cumsum, dout, seq_idx=i.seq_idx, C=i.C, ngroups=G)
        dCB = sc._chunk_scan_bwd_dcb(i.x, s.dt_out, s.dA_cumsum, dout, seq_idx=i.seq_idx, ngroups=G).float()
        if bmm:
            dB = bm._bmm_chunk_bwd(i.C, dCB, residual=dB)
            dC = bm._bmm_chunk_bwd(i.B, dCB.transpose(-1, -2), residual=dC)
        if i.z is not None:
            return dB, dC, dCB
        # Without z ours also adds the chunk terms of dout . y and ddt~: mamba-ssm's ddA pass does
        # that work (it takes both from one set of products; ddt~ it has from its dx kernel too).
        return dB, dC, dCB, sc._chunk_scan_bwd_ddAcs_stable(i.x, s.dt_out, s.dA_cumsum, dout, s.cb)

    return Baseline(name, fn)


def _baseline(dims: dict[str, int], dtype: torch.dtype, device: torch.device, seed: int) -> Baseline | None:
    return mamba_ssm_dbdc(dims, dtype, device, seed)


# block_sizes = [chunk rows, dstate, chunk positions per dot, headdim per dot].
# The dstate block starts at the least the kernel registers (`slot_block`).
_SEEDS = inputs.fixed_seeds([([64, 128, 64, 64], 4, 3), ([64, 128, 32, 64], 4, 3), ([64, 64, 64, 64], 4, 3),
                             ([32, 128, 32, 64], 4, 3), ([64, 128, 64, 64], 8, 3), ([128, 64, 32, 64], 8, 2),
                             ([32, 64, 32, 32], 4, 3)],
                            least=lambda d: {1: keys.slot_block(d["dstate"], keys.SLOT_N)})


SSD_CHUNK_STATE_SCAN_BWD_DBDC = TunableKernel(
    runtime=kernel.SSD_CHUNK_STATE_SCAN_BWD_DBDC,
    make_problem=_make_problem,
    make_baseline=_baseline,
    seed_configs=_SEEDS,
    description="SSD B5+B6+B7+B8 fused: dB and dC summed over each group's heads in order, dCB in registers "
                    "(mamba-ssm _chunk_state_bwd_db_kernel + _chunk_scan_bwd_dc_kernel + _chunk_scan_bwd_dcb_kernel "
                    "+ _bmm_chunk_bwd_kernel x2)",
)
