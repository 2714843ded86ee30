"""Tuning record of `kernels/ssd/chunk_state.py`: inputs at a shape, the fp32 check, the baseline, seeds."""

from __future__ import annotations

from typing import Any

import torch

from autotune_cli.reference import chunk_cumsum_ref, chunk_state_ref
from autotune_cli.tuning.record import Baseline, Problem, TunableKernel
from autotune_cli.tuning.ssd import inputs
from mamba_tune.ssd import chunk_state as kernel


class _StageInputs:
    """F2's inputs: x, B in the tuning dtype; dt~ and dA_cumsum from the fp32 F1 reference."""

    def __init__(self, dims: dict[str, int], dtype: torch.dtype, device: torch.device, seed: int):
        full = {**dims, "has_dt_bias": 1, "dt_softplus": 1}
        self.inp = inputs.SSDInputs.make(full, dtype, device, seed)
        i = self.inp
        self.dA_cumsum, self.dt_out = chunk_cumsum_ref(i.dt, i.A, i.chunk_size, i.dt_bias, i.dt_softplus, i.dt_limit)


def _make_problem(dims: dict[str, int], dtype: torch.dtype, device: torch.device, seed: int) -> Problem:
    s = _StageInputs(dims, dtype, device, seed)
    i = s.inp
    args = (i.x, i.B, s.dt_out, s.dA_cumsum, i.seq_idx)
    b, L, H, P = i.x.shape
    G, N = i.B.shape[2:]
    nc = s.dt_out.shape[2]
    e = i.x.element_size()
    return Problem(
        args=args,
        reference=lambda: {"states": chunk_state_ref(i.B.float(), i.x.float(), s.dt_out, s.dA_cumsum, i.seq_idx)},
        lowp_reference=lambda: {"states": chunk_state_ref(i.B, i.x, s.dt_out, s.dA_cumsum, i.seq_idx, upcast=False)},
        outputs=lambda res: {"states": res.float()},
        bytes_moved=(b * L * H * P + b * L * G * N) * e + 2 * s.dt_out.numel() * 4 + b * nc * H * P * N * 4,
        flops=2 * b * L * H * P * N,
    )


def _baseline(dims: dict[str, int], dtype: torch.dtype, device: torch.device, seed: int) -> Baseline | None:
    found = inputs.mamba_ssm_ops()
    if found is None or device.type != "cuda":
        return None
    mods, name = found
    s = _StageInputs(dims, dtype, device, seed)
    i = s.inp

    def fn() -> Any:
        return mods["chunk_state"]._chunk_state_fwd(i.B, i.x, s.dt_out, s.dA_cumsum, seq_idx=i.seq_idx,
                                                   states_in_fp32=True)

    return Baseline(name, fn)


# block_sizes = [headdim, dstate, chunk positions per dot]: mamba-ssm-like 64x128 tiles.
_SEEDS = inputs.fixed_seeds([([64, 128, 32], 4, 3), ([64, 128, 32], 4, 4), ([64, 64, 32], 4, 3)])


SSD_CHUNK_STATE = TunableKernel(
    runtime=kernel.SSD_CHUNK_STATE,
    make_problem=_make_problem,
    make_baseline=_baseline,
    seed_configs=_SEEDS,
    description="SSD F2: per-chunk end states x^T (B * dt * decay) (mamba-ssm _chunk_state_fwd_kernel)",
)
