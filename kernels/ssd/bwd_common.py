"""Shared pieces of the SSD backward's tuning records: one set of stage inputs for every kernel.

`StageInputs` draws `mamba_chunk_scan_combined`'s inputs (common.SSDInputs), an output
gradient dy (and dfinal_states), runs the fp32 chunked reference forward for the
recomputed intermediates the kernels read (dA_cumsum, dt~, the entering states, CB), and
the reference backward (`kernels.reference.ssd_chunked_grads`) for the state gradients the
later kernels read and for every kernel's expected outputs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from kernels.reference import (
    bmm_chunk_ref,
    chunk_cumsum_ref,
    chunk_state_ref,
    ssd_chunked_grads,
    state_passing_ref,
)
from kernels.ssd import common

# Flags a backward stage's dims may leave out: the Mamba-2 mixer's call.
MIXER_FLAGS = {"has_dt_bias": 1, "dt_softplus": 1, "has_D": 1, "has_z": 0, "has_seq_idx": 0,
               "has_initial_states": 0}


def clamped_default(block_sizes: list[int], block_dims: tuple[str, ...], num_warps: int,
                    num_stages: int) -> Callable[[dict[str, int]], dict[str, Any]]:
    """A kernel's default config: these block sizes, each cut to its dim's next power of two
    (at least 16, the dots' minimum), so that small test shapes get valid blocks too."""
    def config(dims: dict[str, int]) -> dict[str, Any]:
        sizes = [min(bs, max(16, 1 << (int(dims[d]) - 1).bit_length())) for bs, d in zip(block_sizes, block_dims,
                                                                                       strict=True)]
        return {"block_sizes": sizes, "num_warps": num_warps, "num_stages": num_stages}

    return config


@dataclasses.dataclass
class StageInputs:
    inp: common.SSDInputs
    dy: torch.Tensor
    dfinal: torch.Tensor | None
    dA_cumsum: torch.Tensor
    dt_out: torch.Tensor
    prev_states_lowp: torch.Tensor
    cb: torch.Tensor
    _grads: dict[bool, dict[str, torch.Tensor]] = dataclasses.field(default_factory=dict)

    @classmethod
    def make(cls, dims: dict[str, int], dtype: torch.dtype, device: torch.device, seed: int) -> StageInputs:
        full = {**MIXER_FLAGS, **dims}
        i = common.SSDInputs.make(full, dtype, device, seed)
        gen = torch.Generator(device="cpu").manual_seed(seed + 7)
        dy = torch.randn(*i.x.shape, generator=gen).to(dtype).to(device)
        dfinal = None
        if full.get("has_dfinal", full["has_initial_states"]):
            b, _, H, P = i.x.shape
            dfinal = torch.randn(b, H, P, i.B.shape[3], generator=gen).to(device)
        dA, dt_out = chunk_cumsum_ref(i.dt, i.A, i.chunk_size, i.dt_bias, i.dt_softplus, i.dt_limit)
        states = chunk_state_ref(i.B, i.x, dt_out, dA, i.seq_idx)
        prev, _ = state_passing_ref(states, dA[..., -1], i.initial_states, i.seq_idx, i.chunk_size, out_dtype=dtype)
        cb = bmm_chunk_ref(i.C.float(), i.B.float(), i.chunk_size, i.seq_idx)
        return cls(i, dy, dfinal, dA, dt_out, prev, cb)

    def grads(self, lowp: bool) -> dict[str, torch.Tensor]:
        """Reference gradients: fp32 (lowp=False) or eager torch in the inputs' dtype."""
        if lowp not in self._grads:
            i = self.inp if lowp else self.inp.upcast()
            dy = self.dy if lowp else self.dy.float()
            self._grads[lowp] = ssd_chunked_grads(i.x, i.dt, i.A, i.B, i.C, i.chunk_size, dy, self.dfinal,
                                                  upcast=not lowp, **i.kwargs())
        return self._grads[lowp]

    def gated_dout(self) -> torch.Tensor:
        """dy * silu(z) in dy's dtype (what mamba-ssm's backward kernels read)."""
        z = self.inp.z
        if z is None:
            return self.dy
        return (self.dy.float() * torch.nn.functional.silu(z.float())).to(self.dy.dtype)
