"""F3 of the SSD forward: pass the chunk states along the sequence, as a parallel scan.

s[c] = a[c] * s[c-1] + S[c] with a[c] = exp(dA_last[c]) (0 where a packed sequence ends:
seq_idx) is a linear recurrence, so the pairs (a[c], S[c]) compose associatively:
(a1, s1) . (a2, s2) = (a1 a2, a2 s1 + s2). mamba-ssm walks the chunks one by one in each
program; here a program loads block_c chunks at once and scans them with
`hl.associative_scan` (log2(block_c) combine steps), carrying the block's end state into
the next block. block_c and block_d (the slice of the flattened headdim x dstate state per
program) are tuned: block_c = nchunks scans the whole sequence at once. The kernel is
memory-bound (fp32 states in, low-precision states out): on the H200 at Nemotron-3 Nano's
sizes the best hand-picked config, block_d 2048 and block_c 4, ran at the copy bandwidth
(0.105 ms; mamba-ssm 0.104 ms), so wide contiguous rows matter more than a wide scan.
Helion's default config (block_d 32) takes 0.20 ms: tune it.

Order: Helion kernel -> host launcher (shape and dtype checks) -> public function ->
runtime declaration (its tuning record: `autotune_cli/tuning/ssd/`). The scan runs in
fp32; the states entering each chunk are written in the output dtype (mamba-ssm: C's
dtype, what F5 feeds its dot), the final state in fp32."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import helion
import helion.language as hl
import torch

from mamba_tune import keys, runtime, vocab
from mamba_tune.ssd import common


def _combine(
    a1: torch.Tensor, s1: torch.Tensor, a2: torch.Tensor, s2: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    # (a1, s1) then (a2, s2): decay products and the state after both.
    return a1 * a2, a2 * s1 + s2


@helion.kernel(static_shapes=True, autotuner_fn=runtime.refuse_autotune,
               ignore_warnings=[helion.exc.TensorOperationInWrapper])
def state_passing_kernel(
    out: torch.Tensor,  # (batch, nchunks, nheads, headdim, dstate), written: state entering each chunk
    states: torch.Tensor,  # (batch, nchunks, nheads, headdim, dstate) fp32, from F2
    dA_cumsum: torch.Tensor,  # (batch, nheads, nchunks, chunk_size) fp32, from F1
    initial_states: torch.Tensor | None,  # (batch, nheads, headdim, dstate)
    seq_idx: torch.Tensor | None,  # (batch, seqlen) int
) -> torch.Tensor:
    batch, nchunks, nheads, headdim, dstate = states.shape
    chunk_size = hl.specialize(dA_cumsum.size(3))
    dim = headdim * dstate
    states_flat = states.view(batch, nchunks, nheads, dim)
    out_flat = out.view(batch, nchunks, nheads, dim)
    final = torch.empty([batch, nheads, headdim, dstate], dtype=torch.float32, device=states.device)
    final_flat = final.view(batch, nheads, dim)
    if initial_states is not None:
        init_flat = initial_states.view(batch, nheads, dim)
    if seq_idx is not None:
        seqlen = seq_idx.size(1)
    # Tunables: the slice of the state per program, and how many chunks one scan step takes.
    block_d = hl.register_block_size(16, dim)
    block_c = hl.register_block_size(2, nchunks)
    for tile_d, tile_h, tile_b in hl.tile([dim, nheads, batch], block_size=[block_d, 1, 1]):
        b = tile_b.begin
        h = tile_h.begin
        if initial_states is not None:
            carry = init_flat[b, h, tile_d].to(torch.float32)
        else:
            carry = hl.zeros([tile_d], dtype=torch.float32)
        out_flat[b, 0, h, tile_d] = carry.to(out.dtype)
        for tile_c in hl.tile(nchunks, block_size=block_c):
            decay = torch.exp(dA_cumsum[b, h, tile_c, chunk_size - 1])
            if seq_idx is not None:
                # The sequence a chunk ends in vs the one the previous chunk ended in (0 before chunk 0).
                end_pos = torch.clamp((tile_c.index + 1) * chunk_size, max=seqlen) - 1
                prev_pos = torch.clamp(tile_c.index * chunk_size - 1, min=0)
                seq_end = hl.load(seq_idx, [b, end_pos])
                seq_prev = torch.where(tile_c.index > 0, hl.load(seq_idx, [b, prev_pos]), 0)
                decay = torch.where(seq_end == seq_prev, decay, 0.0)
            s = states_flat[b, tile_c, h, tile_d]
            a = decay[:, None] + hl.zeros([tile_c, tile_d], dtype=torch.float32)
            a_cum, s_scan = hl.associative_scan(_combine, (a, s), dim=0)
            s_end = s_scan + a_cum * carry[None, :]  # state at the end of each chunk of the block
            hl.store(out_flat, [b, tile_c.index + 1, h, tile_d], s_end.to(out.dtype),
                     extra_mask=(tile_c.index + 1 < nchunks)[:, None])
            last = (tile_c.index == tile_c.end - 1)[:, None]
            carry = torch.sum(torch.where(last, s_end, 0.0), dim=0)
        final_flat[b, h, tile_d] = carry
    return final


# --- host launcher --------------------------------------------------------------------


def _check(states: torch.Tensor, dA_cumsum: torch.Tensor, initial_states: torch.Tensor | None,
           seq_idx: torch.Tensor | None, out_dtype: torch.dtype) -> None:
    if states.dim() != 5:
        raise ValueError("ssd: states must be (batch, nchunks, nheads, headdim, dstate), "
                         f"got shape {tuple(states.shape)}")
    batch, nchunks, nheads, headdim, dstate = states.shape
    if states.dtype != torch.float32:
        raise ValueError(f"ssd: states must be fp32 (F2's output), got {states.dtype}")
    if dA_cumsum.dim() != 4 or dA_cumsum.shape[:3] != (batch, nheads, nchunks):
        raise ValueError(f"ssd: dA_cumsum shape {tuple(dA_cumsum.shape)} != (batch, nheads, nchunks, chunk_size) "
                         f"with (batch, nheads, nchunks) = {(batch, nheads, nchunks)}")
    if dA_cumsum.dtype != torch.float32:
        raise ValueError(f"ssd: dA_cumsum must be fp32 (F1's output), got {dA_cumsum.dtype}")
    chunk_size = dA_cumsum.shape[3]
    common.check_chunk_size(chunk_size)
    if initial_states is not None:
        common.check_float("initial_states", initial_states)
        common.check_shape("initial_states", initial_states, (batch, nheads, headdim, dstate),
                           "batch, nheads, headdim, dstate")
    if seq_idx is not None:
        if seq_idx.dim() != 2 or seq_idx.shape[0] != batch or common.nchunks_of(seq_idx.shape[1], chunk_size) != nchunks:
            raise ValueError(f"ssd: seq_idx shape {tuple(seq_idx.shape)} is not (batch, seqlen) with batch={batch} "
                             f"and ceil(seqlen / chunk_size={chunk_size}) = nchunks={nchunks}")
        common.check_seq_idx(seq_idx, batch, seq_idx.shape[1])
    if not vocab.is_float(out_dtype):
        raise ValueError(f"ssd: out_dtype {out_dtype} is not one of fp32, fp16, bf16")
    common.check_device(states.device, dA_cumsum=dA_cumsum, initial_states=initial_states, seq_idx=seq_idx)


def _launch(states: torch.Tensor, dA_cumsum: torch.Tensor, initial_states: torch.Tensor | None,
            seq_idx: torch.Tensor | None, out_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    states = states.contiguous()
    out = torch.empty(states.shape, dtype=out_dtype, device=states.device)
    init = None if initial_states is None else initial_states.contiguous()
    final = runtime.run(SSD_STATE_PASSING, (out, states, dA_cumsum.contiguous(), init, seq_idx))
    return out, final


# --- public function ------------------------------------------------------------------


def state_passing_fwd(
    states: torch.Tensor,
    dA_cumsum: torch.Tensor,
    initial_states: torch.Tensor | None = None,
    seq_idx: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """F3 (mamba-ssm `_state_passing_fwd`, with the per-chunk state shape kept).

    states: (batch, nchunks, nheads, headdim, dstate) fp32 from `chunk_state_fwd`;
    dA_cumsum: (batch, nheads, nchunks, chunk_size) fp32 from `chunk_cumsum_fwd` (its last
    entry per chunk is the chunk's decay); initial_states: (batch, nheads, headdim, dstate);
    seq_idx: (batch, seqlen) int.
    Returns (prev_states (batch, nchunks, nheads, headdim, dstate) in out_dtype (default
    fp32): the state entering each chunk; final_states (batch, nheads, headdim, dstate) fp32).
    """
    out_dtype = torch.float32 if out_dtype is None else out_dtype
    _check(states, dA_cumsum, initial_states, seq_idx, out_dtype)
    return _launch(states, dA_cumsum, initial_states, seq_idx, out_dtype)


# --- runtime declaration ----------------------------------------------------------------


def _dims_from_args(args: Sequence[Any]) -> dict[str, int]:
    _out, states, dA_cumsum, init, seq_idx = args
    batch, nchunks, nheads, headdim, dstate = states.shape
    chunk_size = dA_cumsum.shape[3]
    return {"batch": batch, "seqlen": nchunks * chunk_size, "nheads": nheads, "headdim": headdim,
            "dstate": dstate, "chunk_size": chunk_size, "has_initial_states": int(init is not None),
            "has_seq_idx": int(seq_idx is not None)}


SSD_STATE_PASSING = runtime.RuntimeKernel(
    key=keys.SSD_STATE_PASSING,
    kernel=state_passing_kernel,
    dims_from_args=_dims_from_args,
)
