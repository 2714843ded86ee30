"""F2 of the SSD forward: each chunk's own end state.

S[b, c, h, p, n] = sum_l x[l, h, p] * B[l, g(h), n] * dt~[l] * exp(min(dA_last - dA[l], 0))
over the positions l of chunk c (with seq_idx: those in the chunk's last sequence).

Order: Helion kernel -> host launcher (shape and dtype checks) -> public function ->
runtime declaration (its tuning record: `autotune_cli/tuning/ssd/`). One program owns
one (batch, chunk, head, headdim block, dstate block) and walks the chunk in block_k
steps: B is scaled in fp32, rounded to x's dtype and fed with x to a tensor-core dot
that accumulates in fp32 (mamba-ssm's rounding points: the two differ only by summation
order). States stay fp32: F3 sums them over up to thousands of chunks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import helion
import helion.language as hl
import torch

from mamba_tune import keys, runtime
from mamba_tune.ssd import common


@helion.kernel(static_shapes=True, autotuner_fn=runtime.refuse_autotune,
               ignore_warnings=[helion.exc.TensorOperationInWrapper])
def chunk_state_kernel(
    x: torch.Tensor,  # (batch, seqlen, nheads, headdim)
    B: torch.Tensor,  # (batch, seqlen, ngroups, dstate)
    dt: torch.Tensor,  # (batch, nheads, nchunks, chunk_size) fp32, dt~ from F1
    dA_cumsum: torch.Tensor,  # (batch, nheads, nchunks, chunk_size) fp32
    seq_idx: torch.Tensor | None,  # (batch, seqlen) int
) -> torch.Tensor:
    batch, seqlen, nheads, headdim = x.shape
    ngroups = B.size(2)
    dstate = B.size(3)
    nchunks = dt.size(2)
    chunk_size = hl.specialize(dt.size(3))
    heads_per_group = nheads // ngroups
    # Per-chunk tensors viewed by sequence position (see chunk_cumsum.py).
    dt_pos = dt.view(batch, nheads, nchunks * chunk_size)
    dA_pos = dA_cumsum.view(batch, nheads, nchunks * chunk_size)
    states = torch.empty([batch, nchunks, nheads, headdim, dstate], dtype=torch.float32, device=x.device)
    # Tunables (>= 16: tensor-core dot sizes): the state block per program and the step
    # along the chunk.
    block_p = hl.register_block_size(16, headdim)
    block_n = hl.register_block_size(16, dstate)
    block_k = hl.register_block_size(16, chunk_size)
    # Heads vary fastest: the programs of one chunk run together and share B in L2.
    for tile_h, tile_p, tile_n, tile_l, tile_b in hl.tile(
        [nheads, headdim, dstate, seqlen, batch], block_size=[1, block_p, block_n, chunk_size, 1]
    ):
        b = tile_b.begin
        h = tile_h.begin
        g = h // heads_per_group
        c = tile_l.id
        dA_last = dA_cumsum[b, h, c, chunk_size - 1]
        if seq_idx is not None:
            seq_last = seq_idx[b, tile_l.end - 1]
        acc = hl.zeros([tile_p, tile_n], dtype=torch.float32)
        for tile_k in hl.tile(tile_l.begin, tile_l.end, block_size=block_k):
            scale = torch.exp(torch.clamp(dA_last - dA_pos[b, h, tile_k], max=0.0)) * dt_pos[b, h, tile_k]
            if seq_idx is not None:
                scale = torch.where((seq_idx[b, tile_k] == seq_last) & (seq_last >= 0), scale, 0.0)
            b_scaled = (B[b, tile_k, g, tile_n].to(torch.float32) * scale[:, None]).to(x.dtype)
            acc = hl.dot(x[b, tile_k, h, tile_p].T, b_scaled, acc=acc)
        states[b, c, h, tile_p, tile_n] = acc
    return states


# --- host launcher --------------------------------------------------------------------


def _check(B: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, dA_cumsum: torch.Tensor,
           seq_idx: torch.Tensor | None) -> None:
    batch, seqlen, nheads, headdim, ngroups, dstate, chunk_size, nchunks = common.check_chunk_inputs(
        x, "B", B, dt, dA_cumsum)
    for name, t in (("x", x), ("B", B)):
        common.check_float(name, t)
    for name, t in (("dt", dt), ("dA_cumsum", dA_cumsum)):
        if t.dtype != torch.float32:
            raise ValueError(f"ssd: {name} must be fp32 (F1's output), got {t.dtype}")
    common.check_seq_idx(seq_idx, batch, seqlen)
    common.check_device(x.device, B=B, dt=dt, dA_cumsum=dA_cumsum, seq_idx=seq_idx)


def _launch(B: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, dA_cumsum: torch.Tensor,
            seq_idx: torch.Tensor | None) -> torch.Tensor:
    # The dot feeds x and the scaled B in x's dtype; B in another dtype is cast once here.
    B = B.to(x.dtype)
    args = (x, B, dt.contiguous(), dA_cumsum.contiguous(), seq_idx)
    return runtime.run(SSD_CHUNK_STATE, args)


# --- public function ------------------------------------------------------------------


def chunk_state_fwd(
    B: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    dA_cumsum: torch.Tensor,
    seq_idx: torch.Tensor | None = None,
) -> torch.Tensor:
    """F2 (mamba-ssm `_chunk_state_fwd` with states_in_fp32=True).

    B: (batch, seqlen, ngroups, dstate); x: (batch, seqlen, nheads, headdim);
    dt, dA_cumsum: (batch, nheads, nchunks, chunk_size) fp32 from `chunk_cumsum_fwd`;
    seq_idx: (batch, seqlen) int or None.
    Returns states (batch, nchunks, nheads, headdim, dstate) fp32.
    """
    _check(B, x, dt, dA_cumsum, seq_idx)
    return _launch(B, x, dt, dA_cumsum, seq_idx)


# --- runtime declaration ----------------------------------------------------------------


def _dims_from_args(args: Sequence[Any]) -> dict[str, int]:
    x, B, dt, _dA, seq_idx = args
    batch, seqlen, nheads, headdim = x.shape
    return {"batch": batch, "seqlen": seqlen, "nheads": nheads, "headdim": headdim, "ngroups": B.shape[2],
            "dstate": B.shape[3], "chunk_size": dt.shape[3], "has_seq_idx": int(seq_idx is not None)}


# Default (no tuned entry): the Nano TP1 entry's blocks (1.17x faster than Helion's default there).
_DEFAULT = common.clamped_default([64, 128, 32], ("headdim", "dstate", "chunk_size"), 4, 3)


SSD_CHUNK_STATE = runtime.RuntimeKernel(
    key=keys.SSD_CHUNK_STATE,
    kernel=chunk_state_kernel,
    dims_from_args=_dims_from_args,
    default_config=_DEFAULT,
)
