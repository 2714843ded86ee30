"""The SSD forward's cumsum (F1) with each program's tile laid out (heads, positions): a candidate.

On an H100 80GB the runtime's `ssd_chunk_cumsum` (mamba_tune.ssd.chunk_cumsum) is slower than
mamba-ssm's `_chunk_cumsum_fwd` at every preset measured, tuned or not: 0.013 against 0.009-0.010
ms at Nemotron-3 Nano TP1, 0.71-0.90x at Nano and Mamba2 (generated_configs/h100 sweeps and
`verify`). Both compute the same thing; the difference is the tile's layout. The runtime's kernel
loads dt as it lies, (positions, heads) with the heads contiguous, takes the cumsum along the
positions and stores the outputs transposed, (heads, positions) (`v.T`: a register transpose
through shared memory in the generated code). mamba-ssm's loads a (heads, positions) tile
directly (strided loads) and stores it as it is. `cumsum_hc_kernel` does that: the same math in
the same order per element (so the same bits), with the tile (block_h heads, one chunk) read
through a (batch, nheads, seqlen) view of dt and no transpose.

`installed()` makes the runtime's `chunk_cumsum_fwd` use it (for the tests and
`time_cumsum_hc.py`); nothing in `mamba_tune` imports this file. If it wins on a GPU, its
layout replaces the kernel's (whose entries then need a re-tune: the source changes).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import helion
import helion.language as hl
import torch

from mamba_tune import keys, runtime, vocab
from mamba_tune.ssd import chunk_cumsum


@helion.kernel(static_shapes=True, autotuner_fn=runtime.refuse_autotune)
def cumsum_hc_kernel(
    dt_t: torch.Tensor,  # (batch, nheads, seqlen): dt.transpose(1, 2), a view
    A: torch.Tensor,  # (nheads,)
    dt_bias: torch.Tensor | None,  # (nheads,)
    dt_min: float,
    dt_max: float,
    chunk_size: hl.constexpr,
    dt_softplus: hl.constexpr,
) -> tuple[torch.Tensor, torch.Tensor]:
    batch, nheads, seqlen = dt_t.shape
    nchunks = (seqlen + chunk_size - 1) // chunk_size
    dA_cumsum = torch.empty([batch, nheads, nchunks, chunk_size], dtype=torch.float32, device=dt_t.device)
    dt_out = torch.empty([batch, nheads, nchunks, chunk_size], dtype=torch.float32, device=dt_t.device)
    block_h = hl.register_block_size(nheads)
    # One program: block_h heads of one chunk (padded to chunk_size), as (heads, positions).
    for tile_b, tile_h, tile_l in hl.tile(
        [batch, nheads, nchunks * chunk_size], block_size=[1, block_h, chunk_size]
    ):
        b = tile_b.begin
        c = tile_l.id
        valid = tile_l.index < seqlen
        v = hl.load(dt_t, [b, tile_h, tile_l], extra_mask=valid[None, :]).to(torch.float32)
        if dt_bias is not None:
            v = v + dt_bias[tile_h].to(torch.float32)[:, None]
        if dt_softplus:
            v = torch.where(v <= 20.0, torch.log1p(torch.exp(v)), v)
        v = torch.clamp(v, min=dt_min, max=dt_max)
        v = torch.where(valid[None, :], v, 0.0)
        cs = torch.cumsum(v * A[tile_h].to(torch.float32)[:, None], dim=1)
        dt_out[b, tile_h, c, tile_l.index - tile_l.begin] = v
        dA_cumsum[b, tile_h, c, tile_l.index - tile_l.begin] = cs
    return dA_cumsum, dt_out


# The runtime's key's dims (the same shapes), under another name: not planned at any layer shape
# (dims_for None), so no spec tunes it; the timing script passes configs explicitly.
KEY = keys.KernelKey("ssd_chunk_cumsum_hc", "ssd", keys.SSD_CHUNK_CUMSUM.dims, keys.SSD_CHUNK_CUMSUM.size_dims,
                     lambda shape: None, f"{__name__}:cumsum_hc_kernel")


def _dims_from_args(args: Sequence[Any]) -> dict[str, int]:
    dt_t, _A, dt_bias, _lo, _hi, chunk_size, softplus = args
    batch, nheads, seqlen = dt_t.shape
    return {"batch": batch, "seqlen": seqlen, "nheads": nheads, "chunk_size": int(chunk_size),
            "has_dt_bias": int(dt_bias is not None), "dt_softplus": int(softplus)}


CUMSUM_HC = runtime.RuntimeKernel(
    key=KEY,
    kernel=cumsum_hc_kernel,
    dims_from_args=_dims_from_args,
    default_config=lambda dims: {"block_sizes": [min(8, 1 << (int(dims["nheads"]) - 1).bit_length())],
                                 "num_warps": 4},
)


def args_for(dt: torch.Tensor, A: torch.Tensor, chunk_size: int, dt_bias: torch.Tensor | None,
             dt_softplus: bool, dt_limit: tuple[float, float]) -> tuple[Any, ...]:
    """The kernel's arguments for the runtime's call (dt: (batch, seqlen, nheads), as it lies)."""
    return (dt.transpose(1, 2), A.contiguous(), None if dt_bias is None else dt_bias.contiguous(),
            float(dt_limit[0]), float(dt_limit[1]), int(chunk_size), bool(dt_softplus))


def chunk_cumsum_hc(dt: torch.Tensor, A: torch.Tensor, chunk_size: int, dt_bias: torch.Tensor | None = None,
                    dt_softplus: bool = False, dt_limit: tuple[float, float] = vocab.DT_LIMIT_NONE
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """`mamba_tune.ssd.chunk_cumsum.chunk_cumsum_fwd`'s contract (the same checks and outputs)."""
    chunk_cumsum._check(dt, A, chunk_size, dt_bias, dt_limit)
    return runtime.run(CUMSUM_HC, args_for(dt, A, chunk_size, dt_bias, dt_softplus, dt_limit))


@contextlib.contextmanager
def installed() -> Iterator[None]:
    """The runtime's F1 launcher runs this kernel for as long as the block lasts."""
    saved = chunk_cumsum._launch

    def launch(dt: torch.Tensor, A: torch.Tensor, chunk_size: int, dt_bias: torch.Tensor | None,
               dt_softplus: bool, dt_limit: tuple[float, float]) -> tuple[torch.Tensor, torch.Tensor]:
        return runtime.run(CUMSUM_HC, args_for(dt, A, chunk_size, dt_bias, dt_softplus, dt_limit))

    chunk_cumsum._launch = launch
    try:
        yield
    finally:
        chunk_cumsum._launch = saved
