"""Tuning record of `kernels/ssd/state_passing_bwd.py` (the elementwise reverse walk of B2+B3 split): inputs at a shape, the fp32 check, the baseline, seeds."""

from __future__ import annotations

from typing import Any

import torch

from autotune_cli.tuning.record import Baseline, Problem, TunableKernel
from autotune_cli.tuning.ssd import bwd_inputs, inputs
from mamba_tune import keys
from mamba_tune.ssd import state_passing_bwd as kernel


def _stage(dims: dict[str, int], dtype: torch.dtype, device: torch.device, seed: int) -> bwd_inputs.StageInputs:
    # The walk reads C only through each chunk's term (its input), so one group stands for any.
    return bwd_inputs.StageInputs.make({**dims, "ngroups": 1, "has_z": 0, "has_initial_states": dims["has_dfinal"]},
                                       dtype, device, seed)


def _chunk_terms(s: bwd_inputs.StageInputs) -> torch.Tensor:
    """dprev_c = sum_{l in c} dout_l^T w_l C_l in fp32 from the inputs (the split's first
    kernel's output), (batch, nchunks, nheads, headdim, dstate)."""
    i = s.inp
    b, L, H, P = i.x.shape
    nc, Q = s.dA_cumsum.shape[2], s.dA_cumsum.shape[3]
    w = kernel.entering_weights(s.dA_cumsum, i.seq_idx, L)  # (b, H, nc, Q)
    pad = nc * Q - L
    dy = torch.nn.functional.pad(s.dy.float(), (0, 0, 0, 0, 0, pad)).view(b, nc, Q, H, P)
    C = torch.nn.functional.pad(i.C.float(), (0, 0, 0, 0, 0, pad)).view(b, nc, Q, -1, i.C.shape[3])[:, :, :, 0]
    return torch.einsum("bclhp,bhcl,bcln->bchpn", dy, w, C)


def walk_ref(dprev: torch.Tensor, dA_cumsum: torch.Tensor, prev: torch.Tensor, dfinal: torch.Tensor | None,
             seq_idx: torch.Tensor | None, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The reverse walk in eager torch, carrying G in `dtype` (float64: the reference; the
    inputs' dtype: what a plain low-precision walk gives): G_C = dfinal (or 0), per chunk c
    from the last: dstates[c] = G_{c+1}, d dA_last[c] = decay_c <G_{c+1}, prev_c>,
    G_c = decay_c G_{c+1} + dprev_c, with decay_c = exp(dA_last[c]), 0 where seq_idx says the
    chunk's last position is not in the sequence entering it; dinitial_states = G_0."""
    b, nc, H, P, N = dprev.shape
    Q = dA_cumsum.shape[3]
    decay = torch.exp(dA_cumsum[..., -1].to(dtype))  # (b, H, nc)
    if seq_idx is not None:
        L = seq_idx.shape[1]
        starts = torch.arange(nc, device=seq_idx.device) * Q
        last = seq_idx[:, (starts + Q).clamp(max=L) - 1]
        entering = seq_idx[:, (starts - 1).clamp(min=0)] * (starts > 0)
        decay = torch.where((last == entering)[:, None], decay, 0.0)
    G = torch.zeros((b, H, P, N), dtype=dtype, device=dprev.device) if dfinal is None else dfinal.to(dtype)
    dstates = torch.empty((b, nc, H, P, N), dtype=dtype, device=dprev.device)
    ddA = torch.empty((b, H, nc), dtype=dtype, device=dprev.device)
    for c in range(nc - 1, -1, -1):
        dstates[:, c] = G
        d = decay[:, :, c]
        ddA[:, :, c] = d * (G * prev[:, c].to(dtype)).sum((-1, -2))
        G = d[..., None, None] * G + dprev[:, c].to(dtype)
    out = {"dstates": dstates.float(), "ddA_last": ddA.float()}
    if dfinal is not None:
        out["dinitial_states"] = G.float()
    return out


def _make_problem(dims: dict[str, int], dtype: torch.dtype, device: torch.device, seed: int) -> Problem:
    s = _stage(dims, dtype, device, seed)
    b, L, H, P = s.inp.x.shape
    N = s.inp.C.shape[3]
    nc = s.dA_cumsum.shape[2]
    dstates = torch.empty((b, nc, H, P, N), dtype=dtype, device=device)
    ddA_last = torch.zeros((keys.last_slots(P, N), b, H, nc), dtype=torch.float32, device=device)
    dprev = _chunk_terms(s)
    dA = s.dA_cumsum.contiguous()
    args = (dstates, ddA_last, dprev, dA, s.prev_states_lowp, s.dfinal, s.inp.seq_idx)

    def outputs(dinit: torch.Tensor) -> dict[str, torch.Tensor]:
        out = {"dstates": dstates.float(), "ddA_last": ddA_last.sum(0)}
        if s.dfinal is not None:
            out["dinitial_states"] = dinit.float()
        return out

    e = s.inp.x.element_size()
    return Problem(
        args=args,
        # The walk on its own inputs (each chunk's term in fp32, the entering states as the
        # forward rounds them): in float64, and carrying G in the inputs' dtype.
        reference=lambda: walk_ref(dprev, dA, s.prev_states_lowp, s.dfinal, s.inp.seq_idx, torch.float64),
        lowp_reference=lambda: walk_ref(dprev, dA, s.prev_states_lowp, s.dfinal, s.inp.seq_idx, dtype),
        outputs=outputs,
        # dprev (fp32) and the entering states read, G written, once each.
        bytes_moved=dprev.numel() * 4 + 2 * dstates.numel() * e + dA.numel() * 4,
        flops=4 * dstates.numel(),
    )


def _baseline(dims: dict[str, int], dtype: torch.dtype, device: torch.device, seed: int) -> Baseline | None:
    found = inputs.mamba_ssm_ops()
    if found is None or device.type != "cuda":
        return None
    mods, name = found
    s = _stage(dims, dtype, device, seed)
    b, _, H, P = s.inp.x.shape
    N = s.inp.C.shape[3]
    dfinal = None if s.dfinal is None else s.dfinal.reshape(b, H, P * N)
    prev = s.prev_states_lowp.float().reshape(b, -1, H, P * N)
    # The same work in mamba-ssm: its `_state_passing_bwd` on the chunk terms its
    # `_chunk_scan_bwd_dstates` writes (computed once, outside the timed call).
    dprev = mods["chunk_scan"]._chunk_scan_bwd_dstates(s.inp.C, s.dA_cumsum, s.dy, seq_idx=s.inp.seq_idx,
                                                       dtype=torch.float32).reshape(b, -1, H, P * N)

    def fn() -> Any:
        return mods["state_passing"]._state_passing_bwd(
            prev, s.dA_cumsum[..., -1], dprev, dfinal_states=dfinal, seq_idx=s.inp.seq_idx,
            has_initial_states=s.dfinal is not None, dstates_dtype=dtype, states_dtype=torch.float32,
            chunk_size=s.inp.chunk_size)

    return Baseline(name, fn)


# block_sizes = [headdim, dstate]; H200 probes at Mamba2-2.7B, Zamba2-2.7B,
# Falcon-H1-0.5B and Nemotron-3 Nano (kernels/ssd/state_passing_bwd.py's default comment).
_SEEDS = inputs.fixed_seeds([([16, 64], 4, 2), ([16, 32], 4, 2), ([16, 32], 2, 3), ([32, 32], 4, 2),
                             ([16, 16], 2, 2), ([64, 64], 8, 2)])


SSD_STATE_PASSING_BWD = TunableKernel(
    runtime=kernel.SSD_STATE_PASSING_BWD,
    make_problem=_make_problem,
    make_baseline=_baseline,
    seed_configs=_SEEDS,
    description="SSD B2+B3 split, the walk: state gradients by an elementwise reverse walk over each chunk's "
                "own term (F2's kernel computes those), dinitial_states and d dA_last (mamba-ssm "
                "_state_passing_bwd_kernel)",
)
