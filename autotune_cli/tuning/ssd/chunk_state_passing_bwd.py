"""Tuning record of `kernels/ssd/chunk_state_passing_bwd.py` (B2+B3 of the SSD backward): inputs at a shape, the fp32 check, the baseline, seeds."""

from __future__ import annotations

from typing import Any

import torch

from autotune_cli.tuning.record import Baseline, Problem, TunableKernel
from autotune_cli.tuning.ssd import bwd_inputs, inputs
from mamba_tune import keys
from mamba_tune.ssd import chunk_state_passing_bwd as kernel


def _make_problem(dims: dict[str, int], dtype: torch.dtype, device: torch.device, seed: int) -> Problem:
    s = bwd_inputs.StageInputs.make({**dims, "has_initial_states": dims["has_dfinal"]}, dtype, device, seed)
    i = s.inp
    b, L, H, P = i.x.shape
    N = i.C.shape[3]
    nc = s.dA_cumsum.shape[2]
    dstates = torch.empty((b, nc, H, P, N), dtype=dtype, device=device)
    ddA_last = torch.zeros((keys.last_slots(P, N), b, H, nc), dtype=torch.float32, device=device)
    args = (dstates, ddA_last, s.dy, i.z, i.C, s.dA_cumsum, s.prev_states_lowp, s.dfinal, i.seq_idx)

    def ref(lowp: bool) -> dict[str, torch.Tensor]:
        g = s.stage_grads(lowp)
        out = {"dstates": g["states"], "ddA_last": g["dA_last"]}
        if s.dfinal is not None:
            out["dinitial_states"] = g["initial_states"]
        return out

    def outputs(dinit: torch.Tensor) -> dict[str, torch.Tensor]:
        out = {"dstates": dstates.float(), "ddA_last": ddA_last.sum(0)}
        if s.dfinal is not None:
            out["dinitial_states"] = dinit.float()
        return out

    e = i.x.element_size()
    return Problem(
        args=args,
        reference=lambda: ref(False),
        lowp_reference=lambda: ref(True),
        outputs=outputs,
        bytes_moved=(b * L * H * P * (1 + (i.z is not None)) + b * L * i.C.shape[2] * N) * e
        + 2 * dstates.numel() * e + s.dA_cumsum.numel() * 4,
        flops=2 * b * L * H * P * N,
    )


def _baseline(dims: dict[str, int], dtype: torch.dtype, device: torch.device, seed: int) -> Baseline | None:
    found = inputs.mamba_ssm_ops()
    if found is None or device.type != "cuda":
        return None
    mods, name = found
    s = bwd_inputs.StageInputs.make({**dims, "has_initial_states": dims["has_dfinal"]}, dtype, device, seed)
    i = s.inp
    b, _, H, P = i.x.shape
    N = i.C.shape[3]
    dfinal = None if s.dfinal is None else s.dfinal.reshape(b, H, P * N)
    prev = s.prev_states_lowp.float().reshape(b, -1, H, P * N)
    dout = s.gated_dout()

    def fn() -> Any:
        dstates = mods["chunk_scan"]._chunk_scan_bwd_dstates(i.C, s.dA_cumsum, dout, seq_idx=i.seq_idx,
                                                            dtype=torch.float32)
        return mods["state_passing"]._state_passing_bwd(
            prev, s.dA_cumsum[..., -1], dstates.reshape(b, -1, H, P * N), dfinal_states=dfinal,
            seq_idx=i.seq_idx, has_initial_states=s.dfinal is not None, dstates_dtype=dtype,
            states_dtype=torch.float32, chunk_size=i.chunk_size)

    return Baseline(name, fn)


# block_sizes = [headdim, dstate, chunk positions per dot].
_SEEDS = inputs.fixed_seeds([([64, 64, 64], 4, 3), ([64, 32, 64], 4, 3), ([32, 64, 64], 4, 3),
                             ([64, 64, 32], 4, 3), ([32, 32, 64], 4, 3), ([64, 128, 32], 8, 3)])


SSD_CHUNK_STATE_PASSING_BWD = TunableKernel(
    runtime=kernel.SSD_CHUNK_STATE_PASSING_BWD,
    make_problem=_make_problem,
    make_baseline=_baseline,
    seed_configs=_SEEDS,
    description="SSD B2+B3 fused: state gradients by a reverse walk over chunks, dinitial_states and the "
                    "state passing's d dA_last (mamba-ssm _chunk_scan_bwd_dstates_kernel + "
                    "_state_passing_bwd_kernel)",
)
