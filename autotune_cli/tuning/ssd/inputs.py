"""Inputs, shapes and the mamba-ssm baseline shared by the SSD tuning records.

- `mixer_dims` (from mamba_tune.keys): every dim of the call the Mamba-2 mixer makes at a
  layer shape.
- `SSDInputs`: seeded random inputs at one tuning combo: dt~ = softplus(dt + dt_bias)
  log-uniform in [1e-3, 1e-1] (Mamba-2's init) and A = -U[0.5, 4], decaying slower than
  Mamba-2's init range (-U[1, 16]) so that states carry across chunks and every check
  sees the inter-chunk terms.
- `mamba_ssm_ops()`: mamba-ssm's Triton stage modules (the baseline), when importable.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

from autotune_cli.tuning.record import mamba_ssm_version
from mamba_tune.keys import mixer_dims as mixer_dims
from mamba_tune.keys import pick as pick
from mamba_tune.vocab import DT_LIMIT_NONE


@dataclasses.dataclass
class SSDInputs:
    """Seeded inputs of `mamba_chunk_scan_combined` for one tuning combo (missing flags: off)."""

    x: torch.Tensor
    dt: torch.Tensor
    A: torch.Tensor
    B: torch.Tensor
    C: torch.Tensor
    chunk_size: int
    D: torch.Tensor | None
    z: torch.Tensor | None
    dt_bias: torch.Tensor | None
    initial_states: torch.Tensor | None
    seq_idx: torch.Tensor | None
    dt_softplus: bool
    dt_limit: tuple[float, float]

    @classmethod
    def make(cls, dims: dict[str, int], dtype: torch.dtype, device: torch.device | str, seed: int,
             dt_limit: tuple[float, float] = DT_LIMIT_NONE, D_per_head: bool = True) -> SSDInputs:
        gen = torch.Generator(device="cpu").manual_seed(seed)
        batch, seqlen, nheads = dims["batch"], dims["seqlen"], dims["nheads"]
        headdim, ngroups, dstate = dims.get("headdim", 16), dims.get("ngroups", 1), dims.get("dstate", 16)
        device = torch.device(device)

        def rand(*shape: int, dt: torch.dtype = dtype) -> torch.Tensor:
            return torch.randn(*shape, generator=gen).to(dt).to(device)

        def unif(lo: float, hi: float, *shape: int) -> torch.Tensor:
            return torch.rand(*shape, generator=gen) * (hi - lo) + lo

        softplus = bool(dims.get("dt_softplus", 0))
        has_bias = bool(dims.get("has_dt_bias", 0))
        # Mamba-2's init: softplus(dt_bias) uniform in log space over [1e-3, 1e-1].
        dt_target = torch.exp(unif(math.log(1e-3), math.log(1e-1), batch, seqlen, nheads))
        bias = torch.exp(unif(math.log(1e-3), math.log(1e-1), nheads))
        if softplus:
            raw = torch.log(torch.expm1(dt_target)) + 0.5 * torch.randn(batch, seqlen, nheads, generator=gen)
            if has_bias:
                raw = raw - torch.log(torch.expm1(bias))
        else:
            raw = dt_target - (bias if has_bias else 0.0)
        return cls(
            x=rand(batch, seqlen, nheads, headdim),
            dt=raw.to(dtype).to(device),
            A=(-unif(0.5, 4.0, nheads)).to(device),
            B=rand(batch, seqlen, ngroups, dstate),
            C=rand(batch, seqlen, ngroups, dstate),
            chunk_size=dims["chunk_size"],
            D=(unif(0.5, 1.5, nheads) if D_per_head else unif(0.5, 1.5, nheads, headdim)).to(device)
            if dims.get("has_D", 0) else None,
            z=rand(batch, seqlen, nheads, headdim) if dims.get("has_z", 0) else None,
            dt_bias=(torch.log(torch.expm1(bias)) if softplus else bias).to(device) if has_bias else None,
            initial_states=rand(batch, nheads, headdim, dstate, dt=torch.float32)
            if dims.get("has_initial_states", 0) else None,
            seq_idx=packed_seq_idx(batch, seqlen, gen).to(device) if dims.get("has_seq_idx", 0) else None,
            dt_softplus=softplus,
            dt_limit=dt_limit,
        )

    def upcast(self) -> SSDInputs:
        """The same inputs in fp32 (for the fp32 reference)."""
        def f(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None or not t.is_floating_point() else t.float()
        return dataclasses.replace(self, x=f(self.x), dt=f(self.dt), A=f(self.A), B=f(self.B), C=f(self.C),
                                   D=f(self.D), z=f(self.z), dt_bias=f(self.dt_bias),
                                   initial_states=f(self.initial_states))

    def kwargs(self) -> dict[str, Any]:
        """Keyword arguments of `mamba_chunk_scan_combined` (after x, dt, A, B, C, chunk_size)."""
        return {"D": self.D, "z": self.z, "dt_bias": self.dt_bias, "initial_states": self.initial_states,
                "seq_idx": self.seq_idx, "dt_softplus": self.dt_softplus, "dt_limit": self.dt_limit}


def packed_seq_idx(batch: int, seqlen: int, gen: torch.Generator) -> torch.Tensor:
    """Nondecreasing sequence ids from 0, as packed sequences give: a few random boundaries per row."""
    rows = []
    for _ in range(batch):
        nbound = min(3, max(seqlen - 1, 0))
        cuts = torch.randperm(max(seqlen - 1, 1), generator=gen)[:nbound] + 1
        marks = torch.zeros(seqlen, dtype=torch.int32)
        marks[cuts.clamp(max=seqlen - 1)] = 1
        marks[0] = 0
        rows.append(torch.cumsum(marks, 0).to(torch.int32))
    return torch.stack(rows)


def fixed_seeds(table: list[tuple[list[int], int, int]],
                least: Callable[[dict[str, int]], dict[int, int]] | None = None
                ) -> Callable[[dict[str, int]], list[dict[str, Any]]]:
    """A kernel's search seeds: (block_sizes, num_warps, num_stages) rows, hand-picked from
    H200 probes at Nemotron-3 Nano dims. `least(dims)` maps a block's index to the least size
    the kernel registers for it at those dims (Helion would raise a smaller one, so the seed
    would not reach the search as written); such blocks are raised to it and repeats dropped."""
    configs = [{"block_sizes": bs, "num_warps": w, "num_stages": st} for bs, w, st in table]

    def seeds(dims: dict[str, int]) -> list[dict[str, Any]]:
        floors = least(dims) if least is not None else {}
        out: list[dict[str, Any]] = []
        for c in configs:
            bs = [max(b, floors.get(i, b)) for i, b in enumerate(c["block_sizes"])]
            seed = {**c, "block_sizes": bs}
            if seed not in out:
                out.append(seed)
        return out

    return seeds


def mamba_ssm_ops() -> tuple[dict[str, ModuleType], str] | None:
    """mamba-ssm's Triton SSD modules and a version string, or None when not importable."""
    try:
        from mamba_ssm.ops.triton import (
            ssd_bmm,
            ssd_chunk_scan,
            ssd_chunk_state,
            ssd_combined,
            ssd_state_passing,
        )
    except ImportError:
        return None
    mods = {"bmm": ssd_bmm, "chunk_scan": ssd_chunk_scan, "chunk_state": ssd_chunk_state,
            "combined": ssd_combined, "state_passing": ssd_state_passing}
    return mods, f"mamba-ssm {mamba_ssm_version()}"
