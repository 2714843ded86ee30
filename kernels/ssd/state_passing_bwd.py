"""B2 + B3 of the SSD backward in two kernels, chunk-parallel first: the counterpart of
`chunk_state_passing_bwd`'s one walk, as F2 then F3 (`chunk_state`, `state_passing`) are of
the forward's fused `chunk_state_passing`.

`chunk_state_passing_bwd` runs one program per (head, state block) that walks all chunks,
each step a dot over the chunk's positions. With few heads or long chunks (Falcon-H1: 192
programs walking 64 chunks; Mamba2: 640 walking 32 chunks of 256) that chain of dependent
steps is the kernel's time. Here:

1. dprev_c = sum_{l in c} dout_l^T w_l C_l for every chunk at once, fp32 (mamba-ssm's
   `_chunk_scan_bwd_dstates`): F2's kernel (`chunk_state.chunk_state_kernel`) computes
   exactly sum_l x_l^T (B_l scale_l) with scale_l = exp(min(dA_last - dA_l, 0)) dt~_l, so it
   runs with x = dout, B = C, dA_cumsum = 0 and dt~ = w_l = exp(dA_l), zero at positions
   that do not see the state entering the chunk (another sequence, with seq_idx). Its
   rounding is the fused kernel's: C scaled in fp32, rounded to dout's dtype, an fp32 dot.
2. The reverse walk (this module's kernel): G_C = dfinal (or 0),
   G_c = exp(dA_last[c]) G_{c+1} + dprev_c, writing G_{c+1} per chunk, d dA_last[c] =
   exp(dA_last[c]) <G_{c+1}, prev_c> per state block, and G_0; elementwise, so its blocks can
   be small and many, and its loop holds no dot.

Same outputs as `chunk_state_passing_bwd._launch`, equal up to fp32 summation order (bitwise
in ref mode on the CPU). Which of the two the backward runs: `combined.state_passing_bwd`.

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
from mamba_tune.keys import PARTIAL_SLOT as SLOT
from mamba_tune.keys import last_slots
from mamba_tune.ssd import chunk_state, common


@helion.kernel(static_shapes=True, autotuner_fn=runtime.refuse_autotune,
               ignore_warnings=[helion.exc.TensorOperationInWrapper])
def state_passing_bwd_kernel(
    dstates: torch.Tensor,  # (batch, nchunks, nheads, headdim, dstate), written: G_{c+1} for each chunk c
    ddA_last: torch.Tensor,  # (slots, batch, nheads, nchunks) fp32 zeros, written: partial d dA_last
    dprev: torch.Tensor,  # (batch, nchunks, nheads, headdim, dstate) fp32: each chunk's own term
    dA_cumsum: torch.Tensor,  # (batch, nheads, nchunks, chunk_size) fp32
    prev_states: torch.Tensor,  # (batch, nchunks, nheads, headdim, dstate): the state entering each chunk
    dfinal: torch.Tensor | None,  # (batch, nheads, headdim, dstate)
    seq_idx: torch.Tensor | None,  # (batch, seqlen) int
) -> torch.Tensor:
    batch, nchunks, nheads, headdim, dstate = dprev.shape
    chunk_size = hl.specialize(dA_cumsum.size(3))
    nslot_n = (dstate + SLOT - 1) // SLOT
    dinit = torch.empty([batch, nheads, headdim, dstate], dtype=torch.float32, device=dprev.device)
    block_p = hl.register_block_size(16, headdim)
    block_n = hl.register_block_size(16, dstate)
    for tile_p, tile_n, tile_h, tile_b in hl.tile(
        [headdim, dstate, nheads, batch], block_size=[block_p, block_n, 1, 1]
    ):
        b = tile_b.begin
        h = tile_h.begin
        slot = tile_p.id * nslot_n + tile_n.id
        if dfinal is not None:
            grad = dfinal[b, h, tile_p, tile_n].to(torch.float32)
        else:
            grad = hl.zeros([tile_p, tile_n], dtype=torch.float32)
        for tile_c in hl.tile(nchunks, block_size=1):
            c = nchunks - 1 - tile_c.begin
            dstates[b, c, h, tile_p, tile_n] = grad.to(dstates.dtype)
            decay = torch.exp(dA_cumsum[b, h, c, chunk_size - 1])
            if seq_idx is not None:
                seqlen = seq_idx.size(1)
                c0 = c * chunk_size
                seq_last = hl.load(seq_idx, [b, min(c0 + chunk_size, seqlen) - 1])
                seq_prev = hl.load(seq_idx, [b, max(c0, 1) - 1]) * min(c, 1)
                decay = torch.where(seq_last == seq_prev, decay, 0.0)
            prev = prev_states[b, c, h, tile_p, tile_n].to(torch.float32)
            ddA_last[slot, b, h, c] = decay * torch.sum(torch.sum(grad * prev, dim=1), dim=0)
            grad = decay * grad + dprev[b, c, h, tile_p, tile_n]
        dinit[b, h, tile_p, tile_n] = grad
    return dinit


# --- host launcher --------------------------------------------------------------------


def entering_weights(dA_cumsum: torch.Tensor, seq_idx: torch.Tensor | None, seqlen: int) -> torch.Tensor:
    """w[b, h, c, l] = exp(dA_cumsum[b, h, c, l]) where position l of chunk c sees the state
    entering the chunk (with seq_idx: its sequence is the one of the position before the
    chunk, or sequence 0 in the first chunk, as the fused kernel has it), else 0."""
    w = torch.exp(dA_cumsum)
    if seq_idx is None:
        return w
    batch, _, nchunks, chunk_size = dA_cumsum.shape
    pad = nchunks * chunk_size - seqlen
    seq = torch.nn.functional.pad(seq_idx, (0, pad), value=-1).view(batch, nchunks, chunk_size)
    starts = torch.arange(nchunks, device=seq_idx.device) * chunk_size
    entering = seq_idx[:, (starts - 1).clamp(min=0)] * (starts > 0)  # (batch, nchunks)
    sees = seq == entering[:, :, None]
    return torch.where(sees[:, None], w, 0.0)


def _launch(dy: torch.Tensor, z: torch.Tensor | None, C: torch.Tensor, dA_cumsum: torch.Tensor,
            prev_states: torch.Tensor, dfinal: torch.Tensor | None,
            seq_idx: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`chunk_state_passing_bwd._launch`'s outputs, in two kernels (see the module docstring)."""
    batch, seqlen, nheads, headdim = dy.shape
    nchunks, dstate = dA_cumsum.shape[2], C.shape[3]
    dout = dy if z is None else (dy.float() * torch.nn.functional.silu(z.float())).to(dy.dtype)
    dA = dA_cumsum.contiguous()
    dprev = chunk_state._launch(C, dout, entering_weights(dA, seq_idx, seqlen), torch.zeros_like(dA), None)
    dstates = torch.empty((batch, nchunks, nheads, headdim, dstate), dtype=dy.dtype, device=dy.device)
    ddA_last = torch.zeros((last_slots(headdim, dstate), batch, nheads, nchunks), dtype=torch.float32, device=dy.device)
    args = (dstates, ddA_last, dprev, dA, prev_states.to(dy.dtype),
            None if dfinal is None else dfinal.contiguous(), seq_idx)
    dinit = runtime.run(SSD_STATE_PASSING_BWD, args)
    return dstates, ddA_last, dinit


# --- runtime declaration ----------------------------------------------------------------


def _dims_from_args(args: Sequence[Any]) -> dict[str, int]:
    _dstates, _part, dprev, dA, _prev, dfinal, seq_idx = args
    batch, nchunks, nheads, headdim, dstate = dprev.shape
    chunk_size = dA.shape[3]
    return {"batch": batch, "seqlen": nchunks * chunk_size, "nheads": nheads, "headdim": headdim,
            "dstate": dstate, "chunk_size": chunk_size, "has_seq_idx": int(seq_idx is not None),
            "has_dfinal": int(dfinal is not None)}


# Default: 16 x 64 state blocks, 4 warps, 2 stages. On the H200 (bf16, batch 2,
# seqlen 8192) it was the fastest of seven configs at Mamba2-2.7B (0.093 ms; 16 x 32: 0.122)
# and Zamba2-2.7B, and within 1% of the fastest at Falcon-H1-0.5B and Nemotron-3 Nano.
_DEFAULT = common.clamped_default([16, 64], ("headdim", "dstate"), 4, 2)


SSD_STATE_PASSING_BWD = runtime.RuntimeKernel(
    key=keys.SSD_STATE_PASSING_BWD,
    kernel=state_passing_bwd_kernel,
    dims_from_args=_dims_from_args,
    default_config=_DEFAULT,
)
