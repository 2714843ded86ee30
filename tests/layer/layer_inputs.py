"""The arguments of one `mamba_split_conv1d_scan_combined` call, for the layer tests (CPU and GPU)."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

NAMES = ("zxbcdt", "conv1d_weight", "conv1d_bias", "dt_bias", "A", "D", "initial_states", "rmsnorm_weight",
         "outproj_weight", "outproj_bias")


@dataclasses.dataclass
class Layer:
    """One call's arguments: tensors by name (None where absent) and the keyword options."""

    tensors: dict[str, torch.Tensor | None]
    seq_idx: torch.Tensor | None
    kwargs: dict[str, Any]
    chunk_size: int = 16

    @classmethod
    def make(cls, dtype: torch.dtype, seed: int = 0, device: str = "cpu", batch: int = 2, seqlen: int = 40,
             nheads: int = 4, headdim: int = 8, ngroups: int = 2, dstate: int = 16, chunk_size: int = 16,
             width: int = 4, d_mlp: int = 0,
             out_dim: int | None = 24, outproj_bias: bool = True, conv_bias: bool = True, rmsnorm: bool = True,
             D_per_head: bool = True, initial_states: bool = False, seq_idx: bool = False,
             **kwargs: Any) -> Layer:
        gen = torch.Generator(device=device).manual_seed(seed)

        def rnd(*shape: int, scale: float = 1.0, shift: float = 0.0, dt: torch.dtype = dtype) -> torch.Tensor:
            return (torch.randn(*shape, generator=gen, device=device) * scale + shift).to(dt)

        dim = nheads * headdim
        conv_dim = dim + 2 * ngroups * dstate
        t: dict[str, torch.Tensor | None] = {
            "zxbcdt": rnd(batch, seqlen, 2 * d_mlp + dim + conv_dim + nheads),
            "conv1d_weight": rnd(conv_dim, width, scale=0.4),
            "conv1d_bias": rnd(conv_dim, scale=0.2) if conv_bias else None,
            "dt_bias": rnd(nheads, scale=0.5, shift=-2.0),  # softplus(dt + dt_bias) ~ 0.1: decays that matter
            "A": -torch.rand(nheads, generator=gen, device=device) - 0.5,  # fp32, as Mamba2 passes -exp(A_log.float())
            "D": rnd(nheads, scale=0.5) if D_per_head else rnd(nheads, headdim, scale=0.5),
            "initial_states": rnd(batch, nheads, headdim, dstate, scale=0.5) if initial_states else None,
            "rmsnorm_weight": rnd(dim, scale=0.1, shift=1.0) if rmsnorm else None,
            "outproj_weight": rnd(out_dim, d_mlp + dim, scale=0.2) if out_dim else None,
            "outproj_bias": rnd(out_dim, scale=0.1) if out_dim and outproj_bias else None,
        }
        ids = None
        if seq_idx:  # three packed sequences in row 0, two in row 1 (at 40 positions: inside chunks)
            cuts = [[seqlen * 7 // 40, seqlen * 29 // 40], [seqlen * 18 // 40]]
            ids = torch.zeros(batch, seqlen, dtype=torch.int32, device=device)
            for b, row in enumerate(cuts[:batch]):
                for c in row:
                    ids[b, c:] += 1
        kw = {"headdim": headdim if D_per_head else None, "ngroups": ngroups, **kwargs}
        return cls(t, ids, kw, chunk_size)

    def leaves(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone().requires_grad_() for k, v in self.tensors.items() if v is not None}

    def call_args(self, t: dict[str, torch.Tensor]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        g = {k: t.get(k) for k in NAMES}
        args = (g["zxbcdt"], g["conv1d_weight"], g["conv1d_bias"], g["dt_bias"], g["A"], g["D"], self.chunk_size)
        kw = {"initial_states": g["initial_states"], "seq_idx": self.seq_idx, "rmsnorm_weight": g["rmsnorm_weight"],
              "outproj_weight": g["outproj_weight"], "outproj_bias": g["outproj_bias"], **self.kwargs}
        return args, kw
