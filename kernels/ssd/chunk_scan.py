"""F5 of the SSD forward: the output.

y[i] = exp(dA[i]) * C[i] . prev_state                                   (state entering the chunk)
     + sum_{j <= i in the chunk} CB[i, j] exp(min(dA[i] - dA[j], 0)) dt~[j] x[j]   (inside the chunk)
     + D x[i];   y *= silu(z) when z is given.

Order: Helion kernel -> host launcher (shape and dtype checks) -> public function ->
runtime declaration (its tuning record: `autotune_cli/tuning/ssd/`). One program owns
block_m positions of one chunk, one head and a block of headdim. Both terms are
tensor-core dots on x's dtype with fp32 accumulation: C against the entering state (over
dstate in block_n steps), then the decayed, causally masked scores against x, walking
only the columns j <= the block's last row (block_k steps). CB comes from F4 (mamba-ssm's
split).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import helion
import helion.language as hl
import torch

from mamba_tune import keys, runtime
from mamba_tune.ssd import common

LOG2E = 1.4426950408889634


@helion.kernel(static_shapes=True, autotuner_fn=runtime.refuse_autotune,
               ignore_warnings=[helion.exc.TensorOperationInWrapper])
def chunk_scan_kernel(
    x: torch.Tensor,  # (batch, seqlen, nheads, headdim)
    cb: torch.Tensor,  # (batch, nchunks, ngroups, chunk_size, chunk_size) fp32, F4's output
    C: torch.Tensor,  # (batch, seqlen, ngroups, dstate)
    dt: torch.Tensor,  # (batch, nheads, nchunks, chunk_size) fp32
    dA_cumsum: torch.Tensor,  # (batch, nheads, nchunks, chunk_size) fp32
    prev_states: torch.Tensor,  # (batch, nchunks, nheads, headdim, dstate), C's dtype
    D: torch.Tensor | None,  # (nheads, headdim), stride 0 over headdim for a per-head D
    z: torch.Tensor | None,  # like x
    seq_idx: torch.Tensor | None,  # (batch, seqlen) int
) -> torch.Tensor:
    batch, seqlen, nheads, headdim = x.shape
    ngroups = C.size(2)
    dstate = C.size(3)
    nchunks = dt.size(2)
    chunk_size = hl.specialize(dt.size(3))
    heads_per_group = nheads // ngroups
    dt_pos = dt.view(batch, nheads, nchunks * chunk_size)
    dA_pos = dA_cumsum.view(batch, nheads, nchunks * chunk_size)
    out = torch.empty_like(x)
    # Tunables (>= 16: tensor-core dot sizes): rows and headdim per program, the step
    # along the chunk's columns and along dstate.
    block_m = hl.register_block_size(16, chunk_size)
    block_p = hl.register_block_size(16, headdim)
    block_k = hl.register_block_size(16, chunk_size)
    block_n = hl.register_block_size(16, dstate)
    # Heads vary fastest: the programs of one chunk run together and share C and CB in L2.
    for tile_h, tile_m, tile_p, tile_b in hl.tile(
        [nheads, seqlen, headdim, batch], block_size=[1, block_m, block_p, 1]
    ):
        b = tile_b.begin
        h = tile_h.begin
        g = h // heads_per_group
        c = tile_m.begin // chunk_size
        c0 = c * chunk_size
        # exp(a - b) as exp2 of log2(e)-scaled values: the decay matrix below is the hot
        # elementwise work (block_m x block_k per tile and head), and exp2 is one MUFU op.
        dA_m = dA_pos[b, h, tile_m] * LOG2E
        # The state entering the chunk, seen from each row.
        acc = hl.zeros([tile_m, tile_p], dtype=torch.float32)
        for tile_n in hl.tile(dstate, block_size=block_n):
            acc = hl.dot(C[b, tile_m, g, tile_n], prev_states[b, c, h, tile_p, tile_n].T, acc=acc)
        scale_m = torch.exp2(dA_m)
        if seq_idx is not None:
            seq_m = seq_idx[b, tile_m]
            # The id entering the chunk: at position c0 - 1, or 0 before chunk 0.
            seq_prev = hl.load(seq_idx, [b, max(c0, 1) - 1]) * min(c, 1)
            scale_m = torch.where(seq_m == seq_prev, scale_m, 0.0)
        acc = acc * scale_m[:, None]
        # Inside the chunk: columns c0 .. the block's last row (causal).
        for tile_k in hl.tile(c0, tile_m.end, block_size=block_k):
            scores = cb[b, c, g, tile_m.index - c0, tile_k.index - c0]
            decay = torch.exp2(torch.clamp(dA_m[:, None] - dA_pos[b, h, tile_k][None, :] * LOG2E, max=0.0))
            scores = scores * decay * dt_pos[b, h, tile_k][None, :]
            scores = torch.where(tile_m.index[:, None] >= tile_k.index[None, :], scores, 0.0)
            acc = hl.dot(scores.to(x.dtype), x[b, tile_k, h, tile_p], acc=acc)
        if D is not None:
            acc = acc + x[b, tile_m, h, tile_p].to(torch.float32) * D[h, tile_p].to(torch.float32)[None, :]
        if z is not None:
            zv = z[b, tile_m, h, tile_p].to(torch.float32)
            acc = acc * zv * torch.sigmoid(zv)
        out[b, tile_m, h, tile_p] = acc.to(out.dtype)
    return out


# --- host launcher --------------------------------------------------------------------


def _check(x: torch.Tensor, cb: torch.Tensor, C: torch.Tensor, dt: torch.Tensor, dA_cumsum: torch.Tensor,
           prev_states: torch.Tensor, D: torch.Tensor | None, z: torch.Tensor | None,
           seq_idx: torch.Tensor | None) -> None:
    batch, seqlen, nheads, headdim, ngroups, dstate, chunk_size, nchunks = common.check_chunk_inputs(
        x, "C", C, dt, dA_cumsum)
    common.check_shape("prev_states", prev_states, (batch, nchunks, nheads, headdim, dstate),
                       "batch, nchunks, nheads, headdim, dstate")
    common.check_shape("CB", cb, (batch, nchunks, ngroups, chunk_size, chunk_size),
                       "batch, nchunks, ngroups, chunk_size, chunk_size")
    if z is not None:
        common.check_shape("z", z, tuple(x.shape), "batch, seqlen, nheads, headdim")
        common.check_float("z", z)
    for name, t in (("x", x), ("C", C), ("prev_states", prev_states)):
        common.check_float(name, t)
    for name, t in (("dt", dt), ("dA_cumsum", dA_cumsum), ("CB", cb)):
        if t.dtype != torch.float32:
            raise ValueError(f"ssd: {name} must be fp32, got {t.dtype}")
    if D is not None:
        common.check_float("D", D)
    common.expand_D(D, nheads, headdim)  # raises on a bad D shape
    common.check_seq_idx(seq_idx, batch, seqlen)
    common.check_device(x.device, cb=cb, C=C, dt=dt, dA_cumsum=dA_cumsum, prev_states=prev_states, D=D,
                        z=z, seq_idx=seq_idx)


def _launch(x: torch.Tensor, cb: torch.Tensor, C: torch.Tensor, dt: torch.Tensor, dA_cumsum: torch.Tensor,
            prev_states: torch.Tensor, D: torch.Tensor | None, z: torch.Tensor | None,
            seq_idx: torch.Tensor | None) -> torch.Tensor:
    nheads, headdim = x.shape[2], x.shape[3]
    # Every dot runs on x's dtype; C and the states follow it (a no-op in the combined path).
    args = (x, cb, C.to(x.dtype), dt.contiguous(), dA_cumsum.contiguous(), prev_states.to(x.dtype),
            common.expand_D(D, nheads, headdim), z, seq_idx)
    return runtime.run(SSD_CHUNK_SCAN, args)


# --- public function ------------------------------------------------------------------


def chunk_scan_fwd(
    x: torch.Tensor,
    dt: torch.Tensor,
    dA_cumsum: torch.Tensor,
    C: torch.Tensor,
    prev_states: torch.Tensor,
    CB: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    seq_idx: torch.Tensor | None = None,
) -> torch.Tensor:
    """F5 (mamba-ssm `_chunk_scan_fwd`).

    x, z: (batch, seqlen, nheads, headdim); dt, dA_cumsum: (batch, nheads, nchunks,
    chunk_size) fp32; C: (batch, seqlen, ngroups, dstate); prev_states: (batch,
    nchunks, nheads, headdim, dstate) (from `state_passing_fwd`); CB: (batch, nchunks,
    ngroups, chunk_size, chunk_size) fp32 (from `bmm_chunk_fwd`, with its seq_idx mask);
    D: (nheads,) or (nheads, headdim); seq_idx: (batch, seqlen) int.
    Returns out (batch, seqlen, nheads, headdim) in x's dtype.
    """
    _check(x, CB, C, dt, dA_cumsum, prev_states, D, z, seq_idx)
    return _launch(x, CB, C, dt, dA_cumsum, prev_states, D, z, seq_idx)


# --- runtime declaration ----------------------------------------------------------------


def _dims_from_args(args: Sequence[Any]) -> dict[str, int]:
    x, _cb, C, dt, _dA, _ps, D, z, seq_idx = args
    batch, seqlen, nheads, headdim = x.shape
    return {"batch": batch, "seqlen": seqlen, "nheads": nheads, "headdim": headdim, "ngroups": C.shape[2],
            "dstate": C.shape[3], "chunk_size": dt.shape[3], "has_D": int(D is not None),
            "has_z": int(z is not None), "has_seq_idx": int(seq_idx is not None)}


# Default (no tuned entry): the config all twelve H200 entries converged on, at five presets' dims
# (Helion's own default, 16-wide blocks, was 1.3-2x slower there), and 7 of the 8 H100 entries; the
# bundles hold none since the fused-bmm form was deleted (the source changed) until a GPU re-tunes it.
_DEFAULT = common.clamped_default([64, 64, 32, 64], ("chunk_size", "headdim", "chunk_size", "dstate"), 4, 3)


SSD_CHUNK_SCAN = runtime.RuntimeKernel(
    key=keys.SSD_CHUNK_SCAN,
    kernel=chunk_scan_kernel,
    dims_from_args=_dims_from_args,
    default_config=_DEFAULT,
)
