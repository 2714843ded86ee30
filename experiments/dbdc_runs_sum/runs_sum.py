"""The dB/dC backward's head-run partials folded in one kernel: a candidate (experiments/README.md
has its H100 figures: 12-14 us faster at Zamba2, dB off the torch path by more than one rounding).

Where the one dB/dC kernel (`mamba_tune.ssd.chunk_state_scan_bwd_dbdc`) splits a group's heads into
runs (Mamba2, Zamba2: 8 runs of 10 heads; Falcon-H1: 4 of 6), each run writes fp32 partial dB and
dC, which the runtime adds with torch: a sum and a cast for each, four launches and an fp32 sum in
memory. `runs_sum_kernel` adds the runs in order in fp32 and rounds once, dB and dC in one launch.
`installed()` makes the runtime's backward use it (for the tests and `time_runs_sum.py`); nothing
in `mamba_tune` imports this file. If it wins on a GPU, it moves into the dB/dC kernel's file as
the default and the torch sum goes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import helion
import helion.language as hl
import torch

from mamba_tune import keys, runtime
from mamba_tune.ssd import chunk_state_scan_bwd_dbdc as dbdc
from mamba_tune.ssd import common


@helion.kernel(static_shapes=True, autotuner_fn=runtime.refuse_autotune)
def runs_sum_kernel(
    dB_part: torch.Tensor,  # (runs, batch, seqlen, ngroups, dstate) fp32: the head runs' partial dB
    dC_part: torch.Tensor,  # like dB_part
    dB: torch.Tensor,  # (batch, seqlen, ngroups, dstate) in x's dtype, written
    dC: torch.Tensor,  # like dB
) -> tuple[torch.Tensor, torch.Tensor]:
    runs, batch, seqlen, ngroups, dstate = dB_part.shape
    for tile_b, tile_l, tile_g in hl.tile([batch, seqlen, ngroups], block_size=[1, None, 1]):
        b = tile_b.begin
        g = tile_g.begin
        # The runs in order, in fp32, rounded once: a fixed order (no atomics) and no fp32 sum
        # in memory between the adds and the cast.
        acc_b = hl.zeros([tile_l, dstate], dtype=torch.float32)
        acc_c = hl.zeros([tile_l, dstate], dtype=torch.float32)
        for tile_r in hl.tile(runs, block_size=1):
            acc_b = acc_b + dB_part[tile_r.begin, b, tile_l, g, :]
            acc_c = acc_c + dC_part[tile_r.begin, b, tile_l, g, :]
        dB[b, tile_l, g, :] = acc_b.to(dB.dtype)
        dC[b, tile_l, g, :] = acc_c.to(dC.dtype)
    return dB, dC


# dB's dims and the run count (the trip count of its loop, a static range in some configs). Not
# planned at any layer shape (dims_for None): the runtime's default path does not run it.
KEY = keys.KernelKey("ssd_bwd_dbdc_runs_sum", "ssd", ("batch", "seqlen", "ngroups", "dstate", "runs"),
                     ("batch", "seqlen"), lambda shape: None, f"{__name__}:runs_sum_kernel")


def _dims_from_args(args: Sequence[Any]) -> dict[str, int]:
    dB_part, _dC_part, _dB, _dC = args
    runs, batch, seqlen, ngroups, dstate = dB_part.shape
    return {"batch": batch, "seqlen": seqlen, "ngroups": ngroups, "dstate": dstate, "runs": runs}


# 32 positions of a whole dstate row per program, 4 warps: a streaming fold, memory-bound.
RUNS_SUM = runtime.RuntimeKernel(
    key=KEY,
    kernel=runs_sum_kernel,
    dims_from_args=_dims_from_args,
    default_config=common.clamped_default([32], ("seqlen",), 4, 2),
    dtype_arg=2,  # dB: the model's dtype (the partials are fp32)
)


def sum_runs(dB_part: torch.Tensor, dC_part: torch.Tensor, dtype: torch.dtype, dB: torch.Tensor | None = None,
             dC: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(dB, dC) in `dtype` from the dB/dC kernel's two buffers, folded by the kernel (one run: as
    is), into dB and dC when given (the runtime's `sum_runs` signature: the fused backward passes
    its gradient buffer's slices)."""
    if dB_part.size(0) == 1 or dB is None or dC is None:
        if dB_part.size(0) == 1:
            return dbdc.sum_splits(dB_part, dtype), dbdc.sum_splits(dC_part, dtype)
        dB = torch.empty(dB_part.shape[1:], dtype=dtype, device=dB_part.device)
        dC = torch.empty_like(dB)
    return runtime.run(RUNS_SUM, (dB_part, dC_part, dB, dC))


@contextlib.contextmanager
def installed() -> Iterator[None]:
    """The runtime's dB/dC backward folds its head runs with the kernel while this is open."""
    torch_sum = dbdc.sum_runs
    dbdc.sum_runs = sum_runs
    try:
        yield
    finally:
        dbdc.sum_runs = torch_sum
