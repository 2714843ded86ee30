"""Tuning records of `kernels/ssd/dbdc_two_pass.py` (B5-B8 of the SSD backward in two passes, the
path `combined.two_pass_dbdc` picks at dstate >= 256): inputs at a shape, the fp32 check, the
baseline, seeds, for each pass.

The first pass (`ssd_chunk_state_scan_bwd_dcb`) writes intermediates: its check takes the second
pass in fp32 torch (`second_pass`) on what it wrote, to dB and dC, against the same references as
the one kernel's record. The second (`ssd_bmm_bwd_dbdc`) reads only those intermediates: its
problem is random ones, its reference `second_pass` in float64.
"""

from __future__ import annotations

from typing import Any

import torch

from autotune_cli.tuning.record import Baseline, Problem, TunableKernel
from autotune_cli.tuning.ssd import bwd_inputs, inputs
from autotune_cli.tuning.ssd.chunk_state_scan_bwd_dbdc import (
    mamba_ssm_dbdc,
    reference,
    rows_buffer,
    with_rows,
)
from mamba_tune import keys
from mamba_tune.ssd import dbdc_two_pass as kernel


def second_pass(S: torch.Tensor, dB_state: torch.Tensor, dC_state: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """dB and dC from the first pass's intermediates in eager torch, every op in `dtype`:
    dC_l = sum_runs dC_state_l + sum_{j <= l in l's chunk} S[l, j] B_j and
    dB_j = sum_runs dB_state_j + sum_{l >= j in j's chunk} S[l, j] C_l (S summed over the runs;
    its entries above the diagonal, which the first pass does not write, never read)."""
    runs, b, G, L, Q = S.shape
    nc = -(-L // Q)
    pad = nc * Q - L
    s = S.to(dtype).sum(0)  # (b, G, L, Q)
    s = torch.nn.functional.pad(s, (0, 0, 0, pad)).view(b, G, nc, Q, Q)
    s = torch.where(torch.ones(Q, Q, dtype=torch.bool, device=S.device).tril(), s, 0.0)

    def chunks(t: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.pad(t.to(dtype), (0, 0, 0, 0, 0, pad)).view(b, nc, Q, G, -1)

    dC = torch.einsum("bgclj,bcjgn->bclgn", s, chunks(B)).reshape(b, nc * Q, G, -1)[:, :L]
    dB = torch.einsum("bgclj,bclgn->bcjgn", s, chunks(C)).reshape(b, nc * Q, G, -1)[:, :L]
    return {"dB": (dB + dB_state.to(dtype).sum(0)).float(), "dC": (dC + dC_state.to(dtype).sum(0)).float()}


# --- the first pass: head-summed dCB and the state terms ----------------------------------


def _make_dcb_problem(dims: dict[str, int], dtype: torch.dtype, device: torch.device, seed: int) -> Problem:
    s = bwd_inputs.StageInputs.make(dims, dtype, device, seed)
    i = s.inp
    b, L, H, P = i.x.shape
    G, N = i.C.shape[2], i.C.shape[3]
    nc, Q = s.dt_out.shape[2], s.dt_out.shape[3]
    runs = kernel.head_splits(b, nc, G, H)
    # Zeros, not empty: the pass writes S only where j <= l, in blocks, and Helion's search compares
    # the whole buffer against the default config's (tests/tuner/test_tuning_written_args.py).
    S = torch.zeros((runs, b, G, L, Q), dtype=i.x.dtype, device=device)
    dB_state = torch.empty((runs, b, L, G, N), dtype=torch.float32, device=device)
    dC_state = torch.empty_like(dB_state)
    # Without z the pass also adds ddt~'s chunk term and dout . y to the dx kernel's sums (checked below).
    rows = rows_buffer(s)
    args = (S, dB_state, dC_state, s.dy, i.z, i.x, i.C.to(i.x.dtype), s.dt_out, s.dA_cumsum, s.prev_states_lowp,
            s.dstates_lowp, i.seq_idx, rows, None if rows is None else s.cb)

    def outputs(res: Any) -> dict[str, torch.Tensor]:
        return with_rows(second_pass(res[0], res[1], res[2], i.B, i.C, torch.float32), rows)

    e = i.x.element_size()
    return Problem(
        args=args,
        reference=lambda: reference(s, rows, False),
        lowp_reference=lambda: reference(s, rows, True),
        outputs=outputs,
        reset=None if rows is None else rows.zero_,
        bytes_moved=(i.x.numel() * (2 + (i.z is not None)) + i.C.numel()) * e + 2 * s.dstates_lowp.numel() * e
        + 2 * s.dt_out.numel() * 4 + S.numel() * e + 2 * dB_state.numel() * 4,
        flops=4 * b * L * H * P * N + 2 * b * L * H * P * Q,
    )


def _dcb_baseline(dims: dict[str, int], dtype: torch.dtype, device: torch.device, seed: int) -> Baseline | None:
    # mamba-ssm's kernels for the same work: dB's and dC's state terms and dCB (and, without z,
    # its ddA pass, which has the chunk terms this pass adds to the rows); not its bmm backwards.
    return mamba_ssm_dbdc(dims, dtype, device, seed, bmm=False)


# --- the second pass: the dots from the head-summed dCB -------------------------------------


def _make_bmm_problem(dims: dict[str, int], dtype: torch.dtype, device: torch.device, seed: int) -> Problem:
    b, L, G, N, Q, runs = (dims[k] for k in ("batch", "seqlen", "ngroups", "dstate", "chunk_size", "runs"))
    g = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape: int, dt: torch.dtype = dtype) -> torch.Tensor:
        return torch.randn(*shape, generator=g, device=device).to(dt)

    # S at dCB's scale (a sum over headdim and heads of products of unit entries).
    S = randn(runs, b, G, L, Q, dt=torch.float32).mul_(4.0).to(dtype)
    dB_state, dC_state = randn(runs, b, L, G, N, dt=torch.float32), randn(runs, b, L, G, N, dt=torch.float32)
    B, C = randn(b, L, G, N), randn(b, L, G, N)
    dB, dC = torch.empty_like(B), torch.empty_like(C)
    e = B.element_size()
    return Problem(
        args=(dB, dC, S, dB_state, dC_state, B, C),
        reference=lambda: second_pass(S, dB_state, dC_state, B, C, torch.float64),
        lowp_reference=lambda: second_pass(S, dB_state, dC_state, B, C, dtype),
        outputs=lambda res: {"dB": res[0].float(), "dC": res[1].float()},
        # S read for the rows' dots and again for the columns', the partials once, B and C once, dB and dC written.
        bytes_moved=2 * S.numel() * e + 2 * dB_state.numel() * 4 + 4 * B.numel() * e,
        flops=2 * b * L * G * N * Q,
    )


def _bmm_baseline(dims: dict[str, int], dtype: torch.dtype, device: torch.device, seed: int) -> Baseline | None:
    found = inputs.mamba_ssm_ops()
    if found is None or device.type != "cuda":
        return None
    mods, name = found
    b, L, G, N, Q = (dims[k] for k in ("batch", "seqlen", "ngroups", "dstate", "chunk_size"))
    nc = -(-L // Q)
    g = torch.Generator(device=device).manual_seed(seed)
    B, C = (torch.randn(b, L, G, N, generator=g, device=device).to(dtype) for _ in range(2))
    dCB = torch.randn(b, nc, G, Q, Q, generator=g, device=device)
    res_b, res_c = (torch.randn(b, L, G, N, generator=g, device=device) for _ in range(2))
    bm = mods["bmm"]

    def fn() -> Any:  # its two bmm backwards, dB's and dC's, each onto the state terms
        return bm._bmm_chunk_bwd(C, dCB, residual=res_b), bm._bmm_chunk_bwd(B, dCB.transpose(-1, -2), residual=res_c)

    return Baseline(name, fn)


# block_sizes = [chunk rows, dstate, chunk positions per dot, headdim per dot]; H200
# probes at Nemotron-H 47B, Nemotron-3 Nano and the one-group presets (experiments/ssd_bwd_paths/dbdc_paths.py).
_DCB_SEEDS = inputs.fixed_seeds([([128, 128, 64, 64], 8, 2), ([64, 128, 64, 64], 8, 3), ([32, 128, 64, 64], 4, 3),
                                 ([64, 64, 64, 64], 4, 3), ([64, 128, 32, 64], 8, 2)],
                                least=lambda d: {1: keys.slot_block(d["dstate"], keys.SLOT_N)})
# block_sizes = [rows, chunk positions per dot, dstate], the same probes.
_BMM_SEEDS = inputs.fixed_seeds([([32, 64, 128], 4, 3), ([64, 64, 128], 4, 3), ([64, 64, 64], 4, 3),
                                 ([32, 32, 64], 4, 3), ([64, 32, 128], 4, 2)])


SSD_CHUNK_STATE_SCAN_BWD_DCB = TunableKernel(
    runtime=kernel.SSD_DCB,
    make_problem=_make_dcb_problem,
    make_baseline=_dcb_baseline,
    seed_configs=_DCB_SEEDS,
    description="SSD B5-B8, first of two passes: each dCB tile once, summed over a run of a group's heads, and "
                "dB's and dC's state terms (mamba-ssm _chunk_state_bwd_db_kernel + _chunk_scan_bwd_dc_kernel + "
                "_chunk_scan_bwd_dcb_kernel)",
)

SSD_BMM_BWD_DBDC = TunableKernel(
    runtime=kernel.SSD_DBDC_FROM_DCB,
    make_problem=_make_bmm_problem,
    make_baseline=_bmm_baseline,
    seed_configs=_BMM_SEEDS,
    description="SSD B5-B8, second of two passes: dB and dC from the head-summed dCB and the state terms "
                "(mamba-ssm _bmm_chunk_bwd_kernel x2)",
)
