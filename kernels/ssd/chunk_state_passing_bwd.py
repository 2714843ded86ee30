"""B2 + B3 of the SSD backward fused: the state gradients, walking the chunks in reverse.

G_c is the gradient of the state leaving chunk c (the state entering chunk c + 1):
G_C = dfinal_states (or 0); G_c = exp(dA_last[c]) G_{c+1} + dprev_c, with
dprev_c = sum_{l in c} dout_l^T exp(dA_l) C_l (the gradient of the state entering chunk c
through F5's first term). mamba-ssm writes every dprev_c in fp32 (`_chunk_scan_bwd_dstates`)
and reads them back to run the recurrence (`_state_passing_bwd`); here one program owns a
(headdim, dstate) block of one head's gradient and walks the chunks from the last to the
first, so the recurrence stays in fp32 registers and only its per-chunk value is written
(rounded to the dots' dtype: the dx and dB kernels read it as a dot operand).

Per chunk it also writes exp(dA_last[c]) <G_{c+1}, prev_c>, the gradient of dA_last[c]
through the state passing, as one partial per state block (summed in a fixed order by
the cumsum backward: no atomics), and at the end dinitial_states = G_0 (fp32).

With z, dout = dy * silu(z) is formed on load (no gated copy in memory). With seq_idx the
masks are the forward's: a chunk's carry is dropped where its last sequence differs from
the one entering it, and only positions of the entering sequence see the entering state.

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
from mamba_tune.ssd import common

# Partial sums per state block (SLOT): one slot per (16-row headdim block, 16-column dstate
# block), the finest split any config makes (block sizes are >= 16); their count is a key dim.


@helion.kernel(static_shapes=True, autotuner_fn=runtime.refuse_autotune,
               ignore_warnings=[helion.exc.TensorOperationInWrapper])
def chunk_state_passing_bwd_kernel(
    dstates: torch.Tensor,  # (batch, nchunks, nheads, headdim, dstate), written: G_{c+1} for each chunk c
    ddA_last: torch.Tensor,  # (slots, batch, nheads, nchunks) fp32 zeros, written: partial d dA_last
    dy: torch.Tensor,  # (batch, seqlen, nheads, headdim)
    z: torch.Tensor | None,  # like dy
    C: torch.Tensor,  # (batch, seqlen, ngroups, dstate)
    dA_cumsum: torch.Tensor,  # (batch, nheads, nchunks, chunk_size) fp32
    prev_states: torch.Tensor,  # (batch, nchunks, nheads, headdim, dstate): the state entering each chunk
    dfinal: torch.Tensor | None,  # (batch, nheads, headdim, dstate)
    seq_idx: torch.Tensor | None,  # (batch, seqlen) int
) -> torch.Tensor:
    batch, seqlen, nheads, headdim = dy.shape
    ngroups = C.size(2)
    dstate = C.size(3)
    nchunks = dA_cumsum.size(2)
    chunk_size = hl.specialize(dA_cumsum.size(3))
    heads_per_group = nheads // ngroups
    nslot_n = (dstate + SLOT - 1) // SLOT
    dA_pos = dA_cumsum.view(batch, nheads, nchunks * chunk_size)
    dinit = torch.empty([batch, nheads, headdim, dstate], dtype=torch.float32, device=dy.device)
    block_p = hl.register_block_size(16, headdim)
    block_n = hl.register_block_size(16, dstate)
    block_k = hl.register_block_size(16, chunk_size)
    for tile_p, tile_n, tile_h, tile_b in hl.tile(
        [headdim, dstate, nheads, batch], block_size=[block_p, block_n, 1, 1]
    ):
        b = tile_b.begin
        h = tile_h.begin
        g = h // heads_per_group
        slot = tile_p.id * nslot_n + tile_n.id
        if dfinal is not None:
            grad = dfinal[b, h, tile_p, tile_n].to(torch.float32)
        else:
            grad = hl.zeros([tile_p, tile_n], dtype=torch.float32)
        for tile_c in hl.tile(nchunks, block_size=1):
            c = nchunks - 1 - tile_c.begin
            c0 = c * chunk_size
            dstates[b, c, h, tile_p, tile_n] = grad.to(dstates.dtype)
            decay = torch.exp(dA_cumsum[b, h, c, chunk_size - 1])
            if seq_idx is not None:
                seq_last = hl.load(seq_idx, [b, min(c0 + chunk_size, seqlen) - 1])
                seq_prev = hl.load(seq_idx, [b, max(c0, 1) - 1]) * min(c, 1)
                decay = torch.where(seq_last == seq_prev, decay, 0.0)
            prev = prev_states[b, c, h, tile_p, tile_n].to(torch.float32)
            ddA_last[slot, b, h, c] = decay * torch.sum(torch.sum(grad * prev, dim=1), dim=0)
            acc = hl.zeros([tile_p, tile_n], dtype=torch.float32)
            for tile_k in hl.tile(c0, c0 + chunk_size, block_size=block_k):
                valid = tile_k.index < seqlen
                scale = torch.exp(dA_pos[b, h, tile_k])
                if seq_idx is not None:
                    seq_k = hl.load(seq_idx, [b, tile_k], extra_mask=valid)
                    scale = torch.where(seq_k == seq_prev, scale, 0.0)
                scale = torch.where(valid, scale, 0.0)
                dout = hl.load(dy, [b, tile_k, h, tile_p], extra_mask=valid[:, None])
                if z is not None:
                    zv = hl.load(z, [b, tile_k, h, tile_p], extra_mask=valid[:, None]).to(torch.float32)
                    dout = (dout.to(torch.float32) * zv * torch.sigmoid(zv)).to(dy.dtype)
                c_blk = hl.load(C, [b, tile_k, g, tile_n], extra_mask=valid[:, None])
                c_scaled = (c_blk.to(torch.float32) * scale[:, None]).to(dy.dtype)
                acc = hl.dot(dout.T, c_scaled, acc=acc)
            grad = decay * grad + acc
        dinit[b, h, tile_p, tile_n] = grad
    return dinit


# --- host launcher --------------------------------------------------------------------


def _launch(dy: torch.Tensor, z: torch.Tensor | None, C: torch.Tensor, dA_cumsum: torch.Tensor,
            prev_states: torch.Tensor, dfinal: torch.Tensor | None,
            seq_idx: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns (dstates (batch, nchunks, nheads, headdim, dstate) in dy's dtype,
    ddA_last partials (slots, batch, nheads, nchunks) fp32, dinitial_states fp32)."""
    batch, _, nheads, headdim = dy.shape
    nchunks, dstate = dA_cumsum.shape[2], C.shape[3]
    dstates = torch.empty((batch, nchunks, nheads, headdim, dstate), dtype=dy.dtype, device=dy.device)
    ddA_last = torch.zeros((last_slots(headdim, dstate), batch, nheads, nchunks), dtype=torch.float32, device=dy.device)
    args = (dstates, ddA_last, dy, z, C.to(dy.dtype), dA_cumsum.contiguous(), prev_states.to(dy.dtype),
            None if dfinal is None else dfinal.contiguous(), seq_idx)
    dinit = runtime.run(SSD_CHUNK_STATE_PASSING_BWD, args)
    return dstates, ddA_last, dinit


# --- runtime declaration ----------------------------------------------------------------


def _dims_from_args(args: Sequence[Any]) -> dict[str, int]:
    dstates, _part, dy, z, C, dA, _prev, dfinal, seq_idx = args
    batch, seqlen, nheads, headdim = dy.shape
    return {"batch": batch, "seqlen": seqlen, "nheads": nheads, "headdim": headdim, "ngroups": C.shape[2],
            "dstate": C.shape[3], "chunk_size": dA.shape[3], "has_z": int(z is not None),
            "has_seq_idx": int(seq_idx is not None), "has_dfinal": int(dfinal is not None)}


# Default (no tuned entry): 32-row state blocks give 512 programs at Nano TP1 (b 2, H 64, P 64,
# N 128); the 128-wide k step with 2 warps is the Nano entries' (the earlier 64-wide step with 4
# warps was 1.2x slower than them on the H200).
_DEFAULT = common.clamped_default([32, 64, 128], ("headdim", "dstate", "chunk_size"), 2, 2)


SSD_CHUNK_STATE_PASSING_BWD = runtime.RuntimeKernel(
    key=keys.SSD_CHUNK_STATE_PASSING_BWD,
    kernel=chunk_state_passing_bwd_kernel,
    dims_from_args=_dims_from_args,
    default_config=_DEFAULT,
)
