"""B10 of the SSD backward with its torch glue: d dA_cumsum assembled, the cumsum's and dt~'s backward.

Per chunk and head, from the per-position sums of chunk_scan_chunk_state_bwd_dx.py
(rows: ddt~ not through dA, its F2 part, dout . y) and the state passing's d dA_last:

  ddA_l   = dout_l . y_l - dt~_l ddt~_l                  (every exp() term at position l)
  extra   = sum_l dt~_l ddt~state_l + ddA_last             (terms of the chunk's last dA)
  r_l     = sum_{k >= l} ddA_k + extra                      (reverse cumsum: dA_cumsum's backward)
  ddt~_l += A r_l;  dA = sum dt~_l r_l
  ddt_l   = ddt~_l * [dt~ not clamped] * (sigmoid(dt_l + dt_bias) with softplus, up to 20)
  ddt_bias = sum ddt_l

The clamp's gradient is mamba-ssm's (`_chunk_cumsum_bwd_kernel`): zero where softplus
(dt + dt_bias) lies outside dt_limit, passed through at the bounds. mamba-ssm assembles
ddA with torch ops between kernels (flip-cumsum-flip and partial-sum adds); here all of
it is one pass over (batch, nheads, seqlen). dA and ddt_bias come out as one partial per
(batch, chunk) that the host sums in a fixed order (no atomics).

Order: Helion kernel -> host launcher -> runtime declaration (its tuning record:
`autotune_cli/tuning/ssd/`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import helion
import helion.language as hl
import torch

from mamba_tune import keys, runtime
from mamba_tune.ssd import common


@helion.kernel(static_shapes=True, autotuner_fn=runtime.refuse_autotune)
def chunk_cumsum_bwd_kernel(
    ddt: torch.Tensor,  # like dt (any strides but a unit last one), written
    rows: torch.Tensor,  # (3, slots_p, batch, nheads, nchunks * chunk_size) fp32
    ddA_last: torch.Tensor,  # (slots, batch, nheads, nchunks) fp32
    dt: torch.Tensor,  # (batch, seqlen, nheads), the forward's input
    A: torch.Tensor,  # (nheads,)
    dt_bias: torch.Tensor | None,  # (nheads,)
    dt_min: float,
    dt_max: float,
    chunk_size: hl.constexpr,
    dt_softplus: hl.constexpr,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    batch, seqlen, nheads = dt.shape
    nchunks = (seqlen + chunk_size - 1) // chunk_size
    nslot_p = rows.size(1)
    nslot_s = ddA_last.size(0)
    dA_part = torch.empty([batch, nchunks, nheads], dtype=torch.float32, device=dt.device)
    dbias_part = torch.empty([batch, nchunks, nheads], dtype=torch.float32, device=dt.device)
    block_h = hl.register_block_size(nheads)
    for tile_b, tile_l, tile_h in hl.tile(
        [batch, nchunks * chunk_size, nheads], block_size=[1, chunk_size, block_h]
    ):
        b = tile_b.begin
        c = tile_l.id
        valid = tile_l.index < seqlen
        # dt~ recomputed as F1 does, in (heads, positions) orientation.
        v = hl.load(dt, [b, tile_l, tile_h], extra_mask=valid[:, None]).to(torch.float32).T
        if dt_bias is not None:
            v = v + dt_bias[tile_h].to(torch.float32)[:, None]
        raw = v
        if dt_softplus:
            v = torch.where(v <= 20.0, torch.log1p(torch.exp(v)), v)
        inside = (v >= dt_min) & (v <= dt_max)
        v = torch.where(valid[None, :], torch.clamp(v, min=dt_min, max=dt_max), 0.0)
        ddt_x = hl.zeros([tile_h, tile_l], dtype=torch.float32)
        ddt_state = hl.zeros([tile_h, tile_l], dtype=torch.float32)
        dydot = hl.zeros([tile_h, tile_l], dtype=torch.float32)
        for tile_s in hl.tile(nslot_p, block_size=1):
            s = tile_s.begin
            ddt_x = ddt_x + rows[0, s, b, tile_h, tile_l]
            ddt_state = ddt_state + rows[1, s, b, tile_h, tile_l]
            dydot = dydot + rows[2, s, b, tile_h, tile_l]
        extra = torch.sum(v * ddt_state, dim=1)
        for tile_s in hl.tile(nslot_s, block_size=1):
            extra = extra + ddA_last[tile_s.begin, b, tile_h, c]
        ddA = dydot - v * ddt_x
        csum = torch.cumsum(ddA, dim=1)
        rev = torch.sum(ddA, dim=1)[:, None] - csum + ddA + extra[:, None]
        a = A[tile_h].to(torch.float32)
        dv = ddt_x + a[:, None] * rev
        dA_part[b, c, tile_h] = torch.sum(v * rev, dim=1)
        dv = torch.where(inside & valid[None, :], dv, 0.0)
        if dt_softplus:
            dv = torch.where(raw <= 20.0, dv * torch.sigmoid(raw), dv)
        dbias_part[b, c, tile_h] = torch.sum(dv, dim=1)
        hl.store(ddt, [b, tile_l, tile_h], dv.T.to(ddt.dtype), extra_mask=valid[:, None])
    return ddt, dA_part, dbias_part


# --- host launcher --------------------------------------------------------------------


def _launch(rows: torch.Tensor, ddA_last: torch.Tensor, dt: torch.Tensor, A: torch.Tensor,
            dt_bias: torch.Tensor | None, dt_softplus: bool, dt_limit: tuple[float, float],
            chunk_size: int, ddt: torch.Tensor | None = None
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Returns (ddt like dt, dA (nheads,) fp32, ddt_bias (nheads,) fp32 or None). ddt: where to
    write it (like dt, a unit last stride: the fused layer's slice of its gradient buffer); None:
    a new buffer."""
    args = (torch.empty_like(dt) if ddt is None else ddt, rows, ddA_last, dt, A.contiguous(),
            None if dt_bias is None else dt_bias.contiguous(), float(dt_limit[0]), float(dt_limit[1]),
            int(chunk_size), bool(dt_softplus))
    ddt, dA_part, dbias_part = runtime.run(SSD_CHUNK_CUMSUM_BWD, args)
    return ddt, dA_part.sum(dim=(0, 1)), None if dt_bias is None else dbias_part.sum(dim=(0, 1))


# --- runtime declaration ----------------------------------------------------------------


def _dims_from_args(args: Sequence[Any]) -> dict[str, int]:
    _ddt, rows, last, dt, _A, dt_bias, _lo, _hi, chunk_size, softplus = args
    batch, seqlen, nheads = dt.shape
    return {"batch": batch, "seqlen": seqlen, "nheads": nheads, "chunk_size": int(chunk_size),
            "has_dt_bias": int(dt_bias is not None), "dt_softplus": int(softplus), "row_partials": rows.size(1),
            "last_partials": last.size(0)}


# Default (no tuned entry): 16 heads per program, as F1.
_DEFAULT = common.clamped_default([16], ("nheads",), 4, 2)


SSD_CHUNK_CUMSUM_BWD = runtime.RuntimeKernel(
    key=keys.SSD_CHUNK_CUMSUM_BWD,
    kernel=chunk_cumsum_bwd_kernel,
    dims_from_args=_dims_from_args,
    default_config=_DEFAULT,
    dtype_arg=3,  # dt: the model's dtype (the first tensors are fp32 buffers)
)
