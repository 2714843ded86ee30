"""Tuning record of `kernels/ssd/chunk_scan.py`: inputs at a shape, the fp32 check, the baseline, seeds."""

from __future__ import annotations

from typing import Any

import torch

from autotune_cli.reference import bmm_chunk_ref, chunk_cumsum_ref, chunk_scan_ref
from autotune_cli.tuning.record import Baseline, Problem, TunableKernel
from autotune_cli.tuning.ssd import inputs
from mamba_tune.ssd import chunk_scan as kernel
from mamba_tune.ssd import common


class _StageInputs:
    """F5's inputs: x, C, B, z in the tuning dtype; dt~, dA_cumsum, CB and the entering
    states from the fp32 references (states random: F5 does not care where they come from)."""

    def __init__(self, dims: dict[str, int], dtype: torch.dtype, device: torch.device, seed: int):
        full = {**dims, "has_dt_bias": 1, "dt_softplus": 1}
        self.inp = i = inputs.SSDInputs.make(full, dtype, device, seed)
        self.dA_cumsum, self.dt_out = chunk_cumsum_ref(i.dt, i.A, i.chunk_size, i.dt_bias, i.dt_softplus, i.dt_limit)
        gen = torch.Generator(device="cpu").manual_seed(seed + 1)
        b, L, H, P = i.x.shape
        N = i.C.shape[3]
        nc = self.dt_out.shape[2]
        self.prev_states = (torch.randn(b, nc, H, P, N, generator=gen) * 0.5).to(dtype).to(device)
        # The kernel reads F4's fp32 output.
        self.cb = bmm_chunk_ref(i.C.float(), i.B.float(), i.chunk_size, i.seq_idx)

    def ref(self, lowp: bool) -> dict[str, torch.Tensor]:
        i = self.inp
        if lowp:
            cb = bmm_chunk_ref(i.C, i.B, i.chunk_size, i.seq_idx, upcast=False)
            out = chunk_scan_ref(cb, i.x, self.dt_out, self.dA_cumsum, i.C, self.prev_states, i.D, i.z, i.seq_idx,
                                 upcast=False)
        else:
            u = i.upcast()
            out = chunk_scan_ref(self.cb, u.x, self.dt_out, self.dA_cumsum, u.C, self.prev_states.float(), u.D, u.z,
                                 i.seq_idx)
        return {"out": out.float()}


def _make_problem(dims: dict[str, int], dtype: torch.dtype, device: torch.device, seed: int) -> Problem:
    s = _StageInputs(dims, dtype, device, seed)
    i = s.inp
    H, P = i.x.shape[2], i.x.shape[3]
    args = (i.x, s.cb, i.C, s.dt_out, s.dA_cumsum, s.prev_states, common.expand_D(i.D, H, P), i.z, i.seq_idx)
    e = i.x.element_size()
    nbytes = (i.x.numel() * (2 + (i.z is not None)) + i.C.numel()) * e
    nbytes += s.prev_states.numel() * e + 2 * s.dt_out.numel() * 4 + s.cb.numel() * 4
    b, L = i.x.shape[:2]
    N, Q = i.C.shape[3], i.chunk_size
    # Useful dot work: C . state and the causal half of scores . x.
    flops = 2 * b * L * H * P * N + b * L * H * P * Q
    return Problem(
        args=args,
        reference=lambda: s.ref(lowp=False),
        lowp_reference=lambda: s.ref(lowp=True),
        outputs=lambda res: {"out": res.float()},
        bytes_moved=nbytes,
        flops=flops,
    )


def _baseline(dims: dict[str, int], dtype: torch.dtype, device: torch.device, seed: int) -> Baseline | None:
    found = inputs.mamba_ssm_ops()
    if found is None or device.type != "cuda":
        return None
    mods, name = found
    s = _StageInputs(dims, dtype, device, seed)
    i = s.inp

    def fn() -> Any:
        return mods["chunk_scan"]._chunk_scan_fwd(s.cb, i.x, s.dt_out, s.dA_cumsum, i.C, s.prev_states, D=i.D,
                                                 z=i.z, seq_idx=i.seq_idx)

    return Baseline(name, fn)


# block_sizes = [chunk rows, headdim, chunk positions per dot, dstate per dot].
_SEEDS = inputs.fixed_seeds([([64, 64, 32, 128], 4, 3), ([64, 64, 32, 128], 4, 4), ([64, 64, 32, 64], 4, 3), ([128, 64, 32, 64], 8, 3), ([64, 32, 32, 128], 4, 3), ([32, 64, 32, 128], 4, 3)])


SSD_CHUNK_SCAN = TunableKernel(
    runtime=kernel.SSD_CHUNK_SCAN,
    make_problem=_make_problem,
    make_baseline=_baseline,
    seed_configs=_SEEDS,
    description="SSD F5: output from the entering state and the causal chunk-local term "
                "(mamba-ssm _chunk_scan_fwd_kernel)",
)
