"""Tuning record of `kernels/ssd/chunk_cumsum.py`: inputs at a shape, the fp32 check, the baseline, seeds."""

from __future__ import annotations

from typing import Any

import torch

from autotune_cli.reference import chunk_cumsum_ref
from autotune_cli.tuning.record import Baseline, Problem, TunableKernel
from autotune_cli.tuning.ssd import inputs
from mamba_tune.ssd import chunk_cumsum as kernel
from mamba_tune.ssd import common


def _make_problem(dims: dict[str, int], dtype: torch.dtype, device: torch.device, seed: int) -> Problem:
    inp = inputs.SSDInputs.make(dims, dtype, device, seed)
    args = (inp.dt, inp.A, inp.dt_bias, *map(float, inp.dt_limit), inp.chunk_size, inp.dt_softplus)

    def ref(lowp: bool) -> dict[str, torch.Tensor]:
        # dt~ and its cumsum are fp32 in every implementation (mamba-ssm's eager reference
        # included): the low-precision bound is the same fp32 computation.
        dA, dt_out = chunk_cumsum_ref(inp.dt, inp.A, inp.chunk_size, inp.dt_bias, inp.dt_softplus, inp.dt_limit)
        return {"dA_cumsum": dA, "dt_out": dt_out}

    b, L, H = inp.dt.shape
    nc = common.nchunks_of(L, inp.chunk_size)
    return Problem(
        args=args,
        reference=lambda: ref(False),
        lowp_reference=lambda: ref(True),
        outputs=lambda res: {"dA_cumsum": res[0].float(), "dt_out": res[1].float()},
        bytes_moved=inp.dt.numel() * inp.dt.element_size() + 2 * b * H * nc * inp.chunk_size * 4,
    )


def _baseline(dims: dict[str, int], dtype: torch.dtype, device: torch.device, seed: int) -> Baseline | None:
    found = inputs.mamba_ssm_ops()
    if found is None or device.type != "cuda":
        return None
    mods, name = found
    inp = inputs.SSDInputs.make(dims, dtype, device, seed)

    def fn() -> Any:
        return mods["chunk_state"]._chunk_cumsum_fwd(inp.dt, inp.A, inp.chunk_size, dt_bias=inp.dt_bias,
                                                    dt_softplus=inp.dt_softplus, dt_limit=inp.dt_limit)

    return Baseline(name, fn)


# block_sizes = [heads per program]; mamba-ssm's launch uses 8-16 heads.
_SEEDS = inputs.fixed_seeds([([16], 4, 2), ([8], 4, 2)])


SSD_CHUNK_CUMSUM = TunableKernel(
    runtime=kernel.SSD_CHUNK_CUMSUM,
    make_problem=_make_problem,
    make_baseline=_baseline,
    seed_configs=_SEEDS,
    description="SSD F1: dt softplus/clamp and per-chunk cumsum of dt*A (mamba-ssm _chunk_cumsum_fwd_kernel)",
)
