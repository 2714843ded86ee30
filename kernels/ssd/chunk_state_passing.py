"""F2 + F3 fused: chunk states and their passing in one kernel, walking the chunks in order.

The split path writes every chunk's fp32 state (F2) and reads it back to scan (F3): at
Nemotron-3 Nano's sizes that is 268 MB each way, about as long as either kernel's other
work. Here one program owns a (headdim, dstate) block of one head's state and walks the
sequence chunk by chunk: it writes the state entering the chunk (in the output dtype, for
F5), computes the chunk's own state with tensor-core dots (as F2) and folds it in,
s <- exp(dA_last) s + S, in fp32 registers. No fp32 states touch memory.

This is the sequential formulation of F3 (one program per state block walks all chunks),
kept beside the parallel scan of state_passing.py so that both can be measured;
combined.py names the default. The rounding points are F2's (B scaled in fp32, rounded
to x's dtype, fp32 accumulation) and F3's (fp32 recurrence, entering states rounded).

Order: Helion kernel -> host launcher (shape and dtype checks) -> public function ->
runtime declaration (its tuning record: `autotune_cli/tuning/ssd/`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import helion
import helion.language as hl
import torch

from mamba_tune import keys, runtime, vocab
from mamba_tune.ssd import chunk_state, common


@helion.kernel(static_shapes=True, autotuner_fn=runtime.refuse_autotune,
               ignore_warnings=[helion.exc.TensorOperationInWrapper])
def chunk_state_passing_kernel(
    out: torch.Tensor,  # (batch, nchunks, nheads, headdim, dstate), written: state entering each chunk
    x: torch.Tensor,  # (batch, seqlen, nheads, headdim)
    B: torch.Tensor,  # (batch, seqlen, ngroups, dstate)
    dt: torch.Tensor,  # (batch, nheads, nchunks, chunk_size) fp32, dt~ from F1
    dA_cumsum: torch.Tensor,  # (batch, nheads, nchunks, chunk_size) fp32
    initial_states: torch.Tensor | None,  # (batch, nheads, headdim, dstate)
    seq_idx: torch.Tensor | None,  # (batch, seqlen) int
) -> torch.Tensor:
    batch, seqlen, nheads, headdim = x.shape
    ngroups = B.size(2)
    dstate = B.size(3)
    nchunks = dt.size(2)
    chunk_size = hl.specialize(dt.size(3))
    heads_per_group = nheads // ngroups
    dt_pos = dt.view(batch, nheads, nchunks * chunk_size)
    dA_pos = dA_cumsum.view(batch, nheads, nchunks * chunk_size)
    final = torch.empty([batch, nheads, headdim, dstate], dtype=torch.float32, device=x.device)
    # Tunables (>= 16: tensor-core dot sizes): the state block per program, the step along a chunk.
    block_p = hl.register_block_size(16, headdim)
    block_n = hl.register_block_size(16, dstate)
    block_k = hl.register_block_size(16, chunk_size)
    for tile_p, tile_n, tile_h, tile_b in hl.tile(
        [headdim, dstate, nheads, batch], block_size=[block_p, block_n, 1, 1]
    ):
        b = tile_b.begin
        h = tile_h.begin
        g = h // heads_per_group
        if initial_states is not None:
            s = initial_states[b, h, tile_p, tile_n].to(torch.float32)
        else:
            s = hl.zeros([tile_p, tile_n], dtype=torch.float32)
        if seq_idx is not None:
            seq_prev = seq_idx[b, 0] * 0  # the sequence before position 0 is 0
        for tile_l in hl.tile(seqlen, block_size=chunk_size):
            c = tile_l.id
            out[b, c, h, tile_p, tile_n] = s.to(out.dtype)
            dA_last = dA_cumsum[b, h, c, chunk_size - 1]
            decay = torch.exp(dA_last)
            if seq_idx is not None:
                seq_last = hl.load(seq_idx, [b, tile_l.end - 1])
                decay = torch.where(seq_last == seq_prev, decay, 0.0)
                seq_prev = seq_last
            acc = hl.zeros([tile_p, tile_n], dtype=torch.float32)
            for tile_k in hl.tile(tile_l.begin, tile_l.end, block_size=block_k):
                scale = torch.exp(torch.clamp(dA_last - dA_pos[b, h, tile_k], max=0.0)) * dt_pos[b, h, tile_k]
                if seq_idx is not None:
                    scale = torch.where((seq_idx[b, tile_k] == seq_last) & (seq_last >= 0), scale, 0.0)
                b_scaled = (B[b, tile_k, g, tile_n].to(torch.float32) * scale[:, None]).to(x.dtype)
                acc = hl.dot(x[b, tile_k, h, tile_p].T, b_scaled, acc=acc)
            s = decay * s + acc
        final[b, h, tile_p, tile_n] = s
    return final


# --- host launcher --------------------------------------------------------------------


def _launch(B: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, dA_cumsum: torch.Tensor,
            initial_states: torch.Tensor | None, seq_idx: torch.Tensor | None,
            out_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    batch, seqlen, nheads, headdim = x.shape
    out = torch.empty((batch, dt.shape[2], nheads, headdim, B.shape[3]), dtype=out_dtype, device=x.device)
    init = None if initial_states is None else initial_states.contiguous()
    args = (out, x, B.to(x.dtype), dt.contiguous(), dA_cumsum.contiguous(), init, seq_idx)
    final = runtime.run(SSD_CHUNK_STATE_PASSING, args)
    return out, final


# --- public function ------------------------------------------------------------------


def chunk_state_passing_fwd(
    B: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    dA_cumsum: torch.Tensor,
    initial_states: torch.Tensor | None = None,
    seq_idx: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """F2 + F3: `state_passing_fwd(chunk_state_fwd(B, x, dt, dA_cumsum, seq_idx), dA_cumsum, ...)` in one kernel.

    B: (batch, seqlen, ngroups, dstate); x: (batch, seqlen, nheads, headdim); dt,
    dA_cumsum: (batch, nheads, nchunks, chunk_size) fp32 from `chunk_cumsum_fwd`;
    initial_states: (batch, nheads, headdim, dstate); seq_idx: (batch, seqlen) int.
    Returns (prev_states (batch, nchunks, nheads, headdim, dstate) in out_dtype (default
    fp32): the state entering each chunk; final_states (batch, nheads, headdim, dstate) fp32).
    """
    out_dtype = torch.float32 if out_dtype is None else out_dtype
    chunk_state._check(B, x, dt, dA_cumsum, seq_idx)
    batch, _, nheads, headdim = x.shape
    if initial_states is not None:
        common.check_float("initial_states", initial_states)
        common.check_shape("initial_states", initial_states, (batch, nheads, headdim, B.shape[3]),
                           "batch, nheads, headdim, dstate")
        common.check_device(x.device, initial_states=initial_states)
    if not vocab.is_float(out_dtype):
        raise ValueError(f"ssd: out_dtype {out_dtype} is not one of fp32, fp16, bf16")
    return _launch(B, x, dt, dA_cumsum, initial_states, seq_idx, out_dtype)


# --- runtime declaration ----------------------------------------------------------------


def _dims_from_args(args: Sequence[Any]) -> dict[str, int]:
    out, x, B, dt, _dA, init, seq_idx = args
    batch, seqlen, nheads, headdim = x.shape
    return {"batch": batch, "seqlen": seqlen, "nheads": nheads, "headdim": headdim, "ngroups": B.shape[2],
            "dstate": B.shape[3], "chunk_size": dt.shape[3], "has_initial_states": int(init is not None),
            "has_seq_idx": int(seq_idx is not None)}


# Default (no tuned entry): 64 x 64 state blocks, 64 positions a step, 4 warps, 3 stages: the
# shipped H200 entries all use 4 warps and 64-128 wide blocks (Helion's own default was 1.3-2.4x
# slower than them).
_DEFAULT = common.clamped_default([64, 64, 64], ("headdim", "dstate", "chunk_size"), 4, 3)


SSD_CHUNK_STATE_PASSING = runtime.RuntimeKernel(
    key=keys.SSD_CHUNK_STATE_PASSING,
    kernel=chunk_state_passing_kernel,
    dims_from_args=_dims_from_args,
    default_config=_DEFAULT,
)
