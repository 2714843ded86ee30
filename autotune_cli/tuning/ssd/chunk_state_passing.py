"""Tuning record of `kernels/ssd/chunk_state_passing.py`: inputs at a shape, the fp32 check, the baseline, seeds."""

from __future__ import annotations

from typing import Any

import torch

from autotune_cli.reference import chunk_cumsum_ref, chunk_state_ref, state_passing_ref
from autotune_cli.tuning.record import Baseline, Problem, TunableKernel
from autotune_cli.tuning.ssd import inputs
from mamba_tune.ssd import chunk_state_passing as kernel


class _StageInputs:
    """x, B in the tuning dtype; dt~ and dA_cumsum from the fp32 F1 reference."""

    def __init__(self, dims: dict[str, int], dtype: torch.dtype, device: torch.device, seed: int):
        self.inp = i = inputs.SSDInputs.make({**dims, "has_dt_bias": 1, "dt_softplus": 1}, dtype, device, seed)
        self.dA_cumsum, self.dt_out = chunk_cumsum_ref(i.dt, i.A, i.chunk_size, i.dt_bias, i.dt_softplus, i.dt_limit)
        self.dtype = dtype

    def ref(self, lowp: bool) -> dict[str, torch.Tensor]:
        i = self.inp
        B, x = (i.B, i.x) if lowp else (i.B.float(), i.x.float())
        states = chunk_state_ref(B, x, self.dt_out, self.dA_cumsum, i.seq_idx, upcast=not lowp)
        prev, final = state_passing_ref(states, self.dA_cumsum[..., -1], i.initial_states, i.seq_idx, i.chunk_size,
                                        out_dtype=self.dtype if lowp else torch.float32)
        return {"prev_states": prev.float(), "final_states": final}


def _make_problem(dims: dict[str, int], dtype: torch.dtype, device: torch.device, seed: int) -> Problem:
    s = _StageInputs(dims, dtype, device, seed)
    i = s.inp
    b, L, H, P = i.x.shape
    G, N = i.B.shape[2:]
    nc = s.dt_out.shape[2]
    out = torch.empty((b, nc, H, P, N), dtype=dtype, device=device)
    args = (out, i.x, i.B, s.dt_out, s.dA_cumsum, i.initial_states, i.seq_idx)
    e = i.x.element_size()
    return Problem(
        args=args,
        reference=lambda: s.ref(lowp=False),
        lowp_reference=lambda: s.ref(lowp=True),
        outputs=lambda final: {"prev_states": out.float(), "final_states": final.float()},
        bytes_moved=(b * L * H * P + b * L * G * N) * e + 2 * s.dt_out.numel() * 4 + out.numel() * e,
        flops=2 * b * L * H * P * N,
    )


def _baseline(dims: dict[str, int], dtype: torch.dtype, device: torch.device, seed: int) -> Baseline | None:
    found = inputs.mamba_ssm_ops()
    if found is None or device.type != "cuda":
        return None
    mods, name = found
    s = _StageInputs(dims, dtype, device, seed)
    i = s.inp
    b, _, H, P = i.x.shape
    N = i.B.shape[3]
    init = None if i.initial_states is None else i.initial_states.reshape(b, H, P * N)
    dA_last = s.dA_cumsum[..., -1]

    def fn() -> Any:
        states = mods["chunk_state"]._chunk_state_fwd(i.B, i.x, s.dt_out, s.dA_cumsum, seq_idx=i.seq_idx,
                                                     states_in_fp32=True)
        return mods["state_passing"]._state_passing_fwd(states.view(*states.shape[:3], -1), dA_last,
                                                       initial_states=init, seq_idx=i.seq_idx,
                                                       chunk_size=i.chunk_size, out_dtype=dtype)

    return Baseline(name, fn)


# block_sizes = [headdim, dstate, chunk positions per dot]: smaller state tiles than F2 alone,
# since each program walks every chunk in order.
_SEEDS = inputs.fixed_seeds([([64, 64, 64], 4, 3), ([64, 32, 64], 4, 3), ([32, 64, 128], 4, 2), ([64, 64, 32], 4, 3), ([64, 128, 32], 8, 3), ([32, 32, 64], 4, 3), ([16, 64, 64], 4, 3)])


SSD_CHUNK_STATE_PASSING = TunableKernel(
    runtime=kernel.SSD_CHUNK_STATE_PASSING,
    make_problem=_make_problem,
    make_baseline=_baseline,
    seed_configs=_SEEDS,
    description="SSD F2+F3 fused: chunk states folded into the passed state chunk by chunk, no fp32 states "
                "in memory (mamba-ssm _chunk_state_fwd_kernel + _state_passing_fwd_kernel)",
)
