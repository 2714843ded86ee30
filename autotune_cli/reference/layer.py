"""fp32 reference for Mamba-2's fused layer (mamba-ssm `mamba_split_conv1d_scan_combined`).

Composed from the other references: the causal depthwise conv1d (`causal_conv1d_ref`), the
chunked SSD (`ssd_chunked_ref`) and the gated norm (`gated_norm_ref`), plus torch's SwiGLU and linear.
Plain differentiable torch ops: its gradients (torch.autograd) are the reference gradients.

zxbcdt (batch, seqlen, 2 * d_mlp + 2 * dim + 2 * ngroups * dstate + nheads) splits into
[z0 x0 | z | xBC | dt]; xBC goes through the conv (+ SiLU) and splits into x, B, C; the SSD
runs with dt_softplus; the SSD output is gated by z through the RMSNorm (rmsnorm_weight) or
inside the SSD (no norm weight); [silu(z0) * x0 | y] goes through out_proj.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from autotune_cli.reference.conv1d import causal_conv1d_ref
from autotune_cli.reference.norm import gated_norm_ref
from autotune_cli.reference.ssd import ssd_chunked_ref
from mamba_tune.vocab import DT_LIMIT_NONE


def split_conv1d_scan_ref(
    zxbcdt: torch.Tensor,
    conv1d_weight: torch.Tensor,
    conv1d_bias: torch.Tensor | None,
    dt_bias: torch.Tensor,
    A: torch.Tensor,
    D: torch.Tensor,
    chunk_size: int,
    initial_states: torch.Tensor | None = None,
    seq_idx: torch.Tensor | None = None,
    dt_limit: tuple[float, float] = DT_LIMIT_NONE,
    activation: str | None = "silu",
    rmsnorm_weight: torch.Tensor | None = None,
    rmsnorm_eps: float = 1e-6,
    outproj_weight: torch.Tensor | None = None,
    outproj_bias: torch.Tensor | None = None,
    headdim: int | None = None,
    ngroups: int = 1,
    norm_before_gate: bool = True,
    upcast: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The layer's (out, final_states fp32); arguments as `mamba_split_conv1d_scan_combined`.

    upcast=True computes in fp32 (inputs cast first; out is fp32). upcast=False keeps the
    inputs' dtypes the way eager PyTorch would (the tests' error bound), except the conv,
    which rounds its fp32 result to x's dtype, as the kernels do.
    """
    if upcast:
        def up(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.float()
        zxbcdt, conv1d_weight, conv1d_bias, D = up(zxbcdt), up(conv1d_weight), up(conv1d_bias), up(D)
        rmsnorm_weight, outproj_weight, outproj_bias = up(rmsnorm_weight), up(outproj_weight), up(outproj_bias)
    nheads = D.shape[0]
    headdim = D.shape[1] if D.dim() == 2 else headdim
    assert headdim is not None, "headdim is needed with D per head"
    dim = nheads * headdim
    dstate = (conv1d_weight.shape[0] - dim) // (2 * ngroups)
    d_mlp = (zxbcdt.shape[-1] - 2 * dim - 2 * ngroups * dstate - nheads) // 2
    batch, seqlen, _ = zxbcdt.shape
    zx0, z, xBC, dt = torch.split(zxbcdt, [2 * d_mlp, dim, dim + 2 * ngroups * dstate, nheads], dim=-1)
    # The conv in fp32 rounded to x's dtype in both modes, as the kernels (and causal-conv1d) compute it.
    xBC = causal_conv1d_ref(xBC.transpose(1, 2), conv1d_weight, conv1d_bias, seq_idx,
                            activation="silu" if activation is not None else None, upcast=True)[0].transpose(1, 2)
    x, B, C = torch.split(xBC, [dim, ngroups * dstate, ngroups * dstate], dim=-1)
    x = x.unflatten(-1, (nheads, headdim))
    B, C = B.unflatten(-1, (ngroups, dstate)), C.unflatten(-1, (ngroups, dstate))
    z4 = z.unflatten(-1, (nheads, headdim))
    y, final_states = ssd_chunked_ref(x, dt, A, B, C, chunk_size, D=D, z=z4 if rmsnorm_weight is None else None,
                                      dt_bias=dt_bias, initial_states=initial_states, seq_idx=seq_idx,
                                      dt_softplus=True, dt_limit=dt_limit, upcast=upcast)
    out = y.reshape(batch, seqlen, dim)
    if rmsnorm_weight is not None:
        out = gated_norm_ref(out, rmsnorm_weight, None, z, rmsnorm_eps, dim // ngroups, norm_before_gate, True,
                             upcast=upcast)
    if d_mlp > 0:
        z0, x0 = zx0.float().chunk(2, dim=-1)
        out = torch.cat([(F.silu(z0) * x0).to(zx0.dtype), out], dim=-1)
    if outproj_weight is not None:
        out = F.linear(out, outproj_weight, outproj_bias)
    return out, final_states
