"""Tuning record of `kernels/ssd/bmm.py`: inputs at a shape, the fp32 check, the baseline, seeds."""

from __future__ import annotations

from typing import Any

import torch

from autotune_cli.reference import bmm_chunk_ref
from autotune_cli.tuning.record import Baseline, Problem, TunableKernel
from autotune_cli.tuning.ssd import inputs
from mamba_tune.ssd import bmm as kernel
from mamba_tune.ssd import common


def _make_problem(dims: dict[str, int], dtype: torch.dtype, device: torch.device, seed: int) -> Problem:
    i = inputs.SSDInputs.make({**dims, "nheads": dims["ngroups"]}, dtype, device, seed)
    args = (i.C, i.B, i.chunk_size)
    b, L, G, N = i.C.shape
    nc = common.nchunks_of(L, i.chunk_size)
    return Problem(
        args=args,
        reference=lambda: {"CB": bmm_chunk_ref(i.C.float(), i.B.float(), i.chunk_size)},
        lowp_reference=lambda: {"CB": bmm_chunk_ref(i.C, i.B, i.chunk_size, upcast=False)},
        outputs=lambda res: {"CB": res.float()},
        bytes_moved=2 * i.C.numel() * i.C.element_size() + b * nc * G * i.chunk_size**2 * 4,
        flops=2 * b * nc * G * i.chunk_size**2 * N,
    )


def _baseline(dims: dict[str, int], dtype: torch.dtype, device: torch.device, seed: int) -> Baseline | None:
    found = inputs.mamba_ssm_ops()
    if found is None or device.type != "cuda":
        return None
    mods, name = found
    i = inputs.SSDInputs.make({**dims, "nheads": dims["ngroups"]}, dtype, device, seed)

    def fn() -> Any:
        return mods["bmm"]._bmm_chunk_fwd(i.C, i.B, i.chunk_size, output_dtype=torch.float32)

    return Baseline(name, fn)


# block_sizes = [chunk rows, chunk cols, dstate per dot].
_SEEDS = inputs.fixed_seeds([([128, 128, 32], 4, 4), ([64, 64, 64], 4, 3)])


SSD_BMM = TunableKernel(
    runtime=kernel.SSD_BMM,
    make_problem=_make_problem,
    make_baseline=_baseline,
    seed_configs=_SEEDS,
    description="SSD F4: C B^T per chunk and group (mamba-ssm _bmm_chunk_fwd_kernel)",
)
