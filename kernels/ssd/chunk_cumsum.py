"""F1 of the SSD forward: dt~ = clamp(softplus(dt + dt_bias), dt_limit) and dA_cumsum per chunk.

Order: Helion kernel -> host launcher (shape and dtype checks) -> public function ->
runtime declaration (its tuning record: `autotune_cli/tuning/ssd/`). Outputs are
mamba-ssm's layout, (batch, nheads, nchunks, chunk_size) fp32, contiguous, so that
viewed as (batch, nheads, nchunks * chunk_size) a chunk-local entry sits at its sequence
position: later stages index them with the same tile as x. Positions past seqlen get dt~
= 0, so dA_cumsum is flat there and its last entry is the chunk's total decay (what F2
and F3 read).

The cumsum runs in fp32 over one chunk-sized tile (a chunk is one block, never split by
a config), so every config computes it the same way; only block_h (heads per program)
is tuned.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import helion
import helion.language as hl
import torch

from mamba_tune import keys, runtime, vocab
from mamba_tune.ssd import common


@helion.kernel(static_shapes=True, autotuner_fn=runtime.refuse_autotune)
def chunk_cumsum_kernel(
    dt: torch.Tensor,  # (batch, seqlen, nheads)
    A: torch.Tensor,  # (nheads,)
    dt_bias: torch.Tensor | None,  # (nheads,)
    dt_min: float,
    dt_max: float,
    chunk_size: hl.constexpr,
    dt_softplus: hl.constexpr,
) -> tuple[torch.Tensor, torch.Tensor]:
    batch, seqlen, nheads = dt.shape
    nchunks = (seqlen + chunk_size - 1) // chunk_size
    dA_cumsum = torch.empty([batch, nheads, nchunks, chunk_size], dtype=torch.float32, device=dt.device)
    dt_out = torch.empty([batch, nheads, nchunks, chunk_size], dtype=torch.float32, device=dt.device)
    block_h = hl.register_block_size(nheads)
    # One program: one chunk (padded to chunk_size) of block_h heads.
    for tile_b, tile_l, tile_h in hl.tile(
        [batch, nchunks * chunk_size, nheads], block_size=[1, chunk_size, block_h]
    ):
        b = tile_b.begin
        c = tile_l.id
        valid = tile_l.index < seqlen
        v = hl.load(dt, [b, tile_l, tile_h], extra_mask=valid[:, None]).to(torch.float32)
        if dt_bias is not None:
            v = v + dt_bias[tile_h].to(torch.float32)[None, :]
        if dt_softplus:
            v = torch.where(v <= 20.0, torch.log1p(torch.exp(v)), v)
        v = torch.clamp(v, min=dt_min, max=dt_max)
        v = torch.where(valid[:, None], v, 0.0)
        cs = torch.cumsum(v * A[tile_h].to(torch.float32)[None, :], dim=0)
        dt_out[b, tile_h, c, tile_l.index - tile_l.begin] = v.T
        dA_cumsum[b, tile_h, c, tile_l.index - tile_l.begin] = cs.T
    return dA_cumsum, dt_out


# --- host launcher --------------------------------------------------------------------


def _check(dt: torch.Tensor, A: torch.Tensor, chunk_size: int, dt_bias: torch.Tensor | None,
           dt_limit: tuple[float, float]) -> None:
    if dt.dim() != 3:
        raise ValueError(f"ssd: dt must be (batch, seqlen, nheads), got shape {tuple(dt.shape)}")
    batch, seqlen, nheads = dt.shape
    if batch == 0 or seqlen == 0 or nheads == 0:
        raise ValueError(f"ssd: empty dt (batch, seqlen, nheads) = {tuple(dt.shape)}")
    common.check_chunk_size(chunk_size)
    common.check_float("dt", dt)
    common.check_float("A", A)
    common.check_shape("A", A, (nheads,), "nheads,")
    if dt_bias is not None:
        common.check_float("dt_bias", dt_bias)
        common.check_shape("dt_bias", dt_bias, (nheads,), "nheads,")
    common.check_device(dt.device, A=A, dt_bias=dt_bias)
    if len(dt_limit) != 2 or not dt_limit[0] <= dt_limit[1]:
        raise ValueError(f"ssd: dt_limit {dt_limit} must be (min, max) with min <= max")


def _launch(dt: torch.Tensor, A: torch.Tensor, chunk_size: int, dt_bias: torch.Tensor | None,
            dt_softplus: bool, dt_limit: tuple[float, float]) -> tuple[torch.Tensor, torch.Tensor]:
    args = (dt, A.contiguous(), None if dt_bias is None else dt_bias.contiguous(),
            float(dt_limit[0]), float(dt_limit[1]), int(chunk_size), bool(dt_softplus))
    return runtime.run(SSD_CHUNK_CUMSUM, args)


# --- public function ------------------------------------------------------------------


def chunk_cumsum_fwd(
    dt: torch.Tensor,
    A: torch.Tensor,
    chunk_size: int,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = False,
    dt_limit: tuple[float, float] = vocab.DT_LIMIT_NONE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """F1 (mamba-ssm `_chunk_cumsum_fwd`).

    dt: (batch, seqlen, nheads); A, dt_bias: (nheads,); chunk_size: a power of two >= 16.
    Returns (dA_cumsum, dt_out), both (batch, nheads, nchunks, chunk_size) fp32 with
    nchunks = ceil(seqlen / chunk_size): dt_out = clamp(softplus(dt + dt_bias), *dt_limit)
    (zero past seqlen) and dA_cumsum = cumsum of dt_out * A inside each chunk.
    """
    _check(dt, A, chunk_size, dt_bias, dt_limit)
    return _launch(dt, A, chunk_size, dt_bias, dt_softplus, dt_limit)


# --- runtime declaration ----------------------------------------------------------------


def _dims_from_args(args: Sequence[Any]) -> dict[str, int]:
    dt, _A, dt_bias, _lo, _hi, chunk_size, softplus = args
    batch, seqlen, nheads = dt.shape
    return {"batch": batch, "seqlen": seqlen, "nheads": nheads, "chunk_size": int(chunk_size),
            "has_dt_bias": int(dt_bias is not None), "dt_softplus": int(softplus)}


SSD_CHUNK_CUMSUM = runtime.RuntimeKernel(
    key=keys.SSD_CHUNK_CUMSUM,
    kernel=chunk_cumsum_kernel,
    dims_from_args=_dims_from_args,
)
