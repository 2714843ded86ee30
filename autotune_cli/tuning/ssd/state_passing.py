"""Tuning record of `kernels/ssd/state_passing.py`: inputs at a shape, the fp32 check, the baseline, seeds."""

from __future__ import annotations

from typing import Any

import torch

from autotune_cli.reference import chunk_cumsum_ref, state_passing_ref
from autotune_cli.tuning.record import Baseline, Problem, TunableKernel
from autotune_cli.tuning.ssd import inputs
from mamba_tune.ssd import state_passing as kernel


class _StageInputs:
    """F3's inputs: dA_cumsum from the F1 reference and random fp32 chunk states (F3 does
    not care where they come from; F2's reference would cost minutes at model sizes on CPU)."""

    def __init__(self, dims: dict[str, int], dtype: torch.dtype, device: torch.device, seed: int):
        full = {**dims, "has_dt_bias": 1, "dt_softplus": 1, "ngroups": 1}
        self.inp = i = inputs.SSDInputs.make(full, dtype, device, seed)
        self.dA_cumsum, _dt = chunk_cumsum_ref(i.dt, i.A, i.chunk_size, i.dt_bias, i.dt_softplus, i.dt_limit)
        b, _L, H, P = i.x.shape
        gen = torch.Generator(device="cpu").manual_seed(seed + 1)
        shape = (b, self.dA_cumsum.shape[2], H, P, i.B.shape[3])
        self.states = (torch.randn(*shape, generator=gen) * 0.5).to(device)


def _make_problem(dims: dict[str, int], dtype: torch.dtype, device: torch.device, seed: int) -> Problem:
    s = _StageInputs(dims, dtype, device, seed)
    i = s.inp
    out = torch.empty(s.states.shape, dtype=dtype, device=device)
    args = (out, s.states, s.dA_cumsum, i.initial_states, i.seq_idx)

    def ref(out_dtype: torch.dtype) -> dict[str, torch.Tensor]:
        prev, final = state_passing_ref(s.states, s.dA_cumsum[..., -1], i.initial_states, i.seq_idx,
                                        i.chunk_size, out_dtype=out_dtype)
        return {"prev_states": prev.float(), "final_states": final}

    n = s.states.numel()
    return Problem(
        args=args,
        reference=lambda: ref(torch.float32),
        # Every implementation scans in fp32 (mamba-ssm's reference too); low precision only
        # rounds the states written for F5.
        lowp_reference=lambda: ref(dtype),
        outputs=lambda final: {"prev_states": out.float(), "final_states": final.float()},
        bytes_moved=n * 4 + n * out.element_size() + s.dA_cumsum.numel() * 4,
    )


def _baseline(dims: dict[str, int], dtype: torch.dtype, device: torch.device, seed: int) -> Baseline | None:
    found = inputs.mamba_ssm_ops()
    if found is None or device.type != "cuda":
        return None
    mods, name = found
    s = _StageInputs(dims, dtype, device, seed)
    i = s.inp
    b, nc, h, p, n = s.states.shape
    flat = s.states.view(b, nc, h, p * n)
    init = None if i.initial_states is None else i.initial_states.reshape(b, h, p * n)
    dA_last = s.dA_cumsum[..., -1]

    def fn() -> Any:
        return mods["state_passing"]._state_passing_fwd(flat, dA_last, initial_states=init, seq_idx=i.seq_idx,
                                                       chunk_size=i.chunk_size, out_dtype=dtype)

    return Baseline(name, fn)


# block_sizes = [state elements (headdim x dstate) per program, chunks per scan block].
_SEEDS = inputs.fixed_seeds([([2048, 4], 8, 2), ([4096, 2], 8, 2), ([2048, 2], 8, 2), ([1024, 4], 4, 2), ([4096, 4], 8, 2)])


SSD_STATE_PASSING = TunableKernel(
    runtime=kernel.SSD_STATE_PASSING,
    make_problem=_make_problem,
    make_baseline=_baseline,
    seed_configs=_SEEDS,
    description="SSD F3: inter-chunk state recurrence as a blocked associative scan "
                "(mamba-ssm _state_passing_fwd_kernel, sequential there)",
)
