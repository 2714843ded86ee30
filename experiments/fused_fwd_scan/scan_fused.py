"""F2 + F3 + F5 of the SSD forward in one kernel: a candidate.

The runtime's forward runs F2 + F3 as one walk over the chunks (chunk_state_passing: one
program per (headdim, dstate) block of a head's state, writing the state entering each chunk
in x's dtype) and then F5 (chunk_scan: each chunk's output from C, that entering state, F4's
C B^T and x). At Nemotron-3 Nano TP1 on an H100 80GB (the h100 bundle's entries) that is
0.152 + 0.229 ms, and the entering states cross memory twice (134 MB written, 134 MB read).

Here one program owns a block of headdim of one head's whole state (block_p x dstate, fp32 in
registers) and walks the chunks in order: for each chunk it writes the output rows (F5's math
and order, against the state rounded to x's dtype as F5 reads it), then folds the chunk's own
state in (F2 + F3's math). The entering states are written only when asked (`states_out`,
for an autograd forward that keeps them). Parallelism is batch x nheads x headdim / block_p
programs (F2 + F3 also splits dstate): few heads (tensor parallelism) may starve it.

Not in the package: `time_scan_fused.py` times it against the runtime's two kernels on a GPU, and
`time_module_fused.py` times mamba-ssm's `Mamba2` training step with it installed (`installed()`:
the runtime's SSD forward runs it, keeping no intermediates, so the backward recomputes F2 + F3
as it does at Nano's dims in the fused layer). No seq_idx (such calls keep the runtime's path).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import helion
import helion.language as hl
import torch
from helion.runtime.settings import RefMode

from mamba_tune.ssd import common

LOG2E = 1.4426950408889634


@helion.kernel(static_shapes=True, ignore_warnings=[helion.exc.TensorOperationInWrapper])
def state_scan_kernel(
    states_out: torch.Tensor | None,  # (batch, nchunks, nheads, headdim, dstate) x's dtype, written when given
    x: torch.Tensor,  # (batch, seqlen, nheads, headdim)
    cb: torch.Tensor,  # (batch, nchunks, ngroups, chunk_size, chunk_size) fp32, F4's output
    B: torch.Tensor,  # (batch, seqlen, ngroups, dstate), x's dtype
    C: torch.Tensor,  # (batch, seqlen, ngroups, dstate), x's dtype
    dt: torch.Tensor,  # (batch, nheads, nchunks, chunk_size) fp32, dt~ from F1
    dA_cumsum: torch.Tensor,  # (batch, nheads, nchunks, chunk_size) fp32
    D: torch.Tensor | None,  # (nheads, headdim)
    z: torch.Tensor | None,  # like x
    initial_states: torch.Tensor | None,  # (batch, nheads, headdim, dstate)
) -> tuple[torch.Tensor, torch.Tensor]:
    batch, seqlen, nheads, headdim = x.shape
    ngroups = B.size(2)
    dstate = hl.specialize(B.size(3))
    nchunks = dt.size(2)
    chunk_size = hl.specialize(dt.size(3))
    heads_per_group = nheads // ngroups
    dt_pos = dt.view(batch, nheads, nchunks * chunk_size)
    dA_pos = dA_cumsum.view(batch, nheads, nchunks * chunk_size)
    out = torch.empty_like(x)
    final = torch.empty([batch, nheads, headdim, dstate], dtype=torch.float32, device=x.device)
    # Tunables: the headdim block per program; F5's rows and columns per step; F2's step.
    block_p = hl.register_block_size(16, headdim)
    block_m = hl.register_block_size(16, chunk_size)
    block_k = hl.register_block_size(16, chunk_size)
    block_s = hl.register_block_size(16, chunk_size)
    for tile_p, tile_h, tile_b in hl.tile([headdim, nheads, batch], block_size=[block_p, 1, 1]):
        b = tile_b.begin
        h = tile_h.begin
        g = h // heads_per_group
        if initial_states is not None:
            s = initial_states[b, h, tile_p, :].to(torch.float32)
        else:
            s = hl.zeros([tile_p, dstate], dtype=torch.float32)
        for tile_l in hl.tile(seqlen, block_size=chunk_size):
            c = tile_l.id
            c0 = tile_l.begin
            s_in = s.to(x.dtype)
            if states_out is not None:
                states_out[b, c, h, tile_p, :] = s_in
            # F5: the chunk's output rows.
            for tile_m in hl.tile(c0, tile_l.end, block_size=block_m):
                dA_m = dA_pos[b, h, tile_m] * LOG2E
                acc = hl.zeros([tile_m, tile_p], dtype=torch.float32)
                acc = hl.dot(C[b, tile_m, g, :], s_in.T, acc=acc)
                acc = acc * torch.exp2(dA_m)[:, None]
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
            # F2 + F3: the chunk's own state, folded into the carried one.
            dA_last = dA_cumsum[b, h, c, chunk_size - 1]
            acc_s = hl.zeros([tile_p, dstate], dtype=torch.float32)
            for tile_k in hl.tile(c0, tile_l.end, block_size=block_s):
                scale = torch.exp(torch.clamp(dA_last - dA_pos[b, h, tile_k], max=0.0)) * dt_pos[b, h, tile_k]
                b_scaled = (B[b, tile_k, g, :].to(torch.float32) * scale[:, None]).to(x.dtype)
                acc_s = hl.dot(x[b, tile_k, h, tile_p].T, b_scaled, acc=acc_s)
            s = torch.exp(dA_last) * s + acc_s
        final[b, h, tile_p, :] = s
    return out, final


def args_for(x: torch.Tensor, cb: torch.Tensor, B: torch.Tensor, C: torch.Tensor, dt_out: torch.Tensor,
             dA_cumsum: torch.Tensor, D: torch.Tensor | None, z: torch.Tensor | None,
             initial_states: torch.Tensor | None, keep_states: bool) -> tuple:
    """The kernel's arguments from the runtime forward's (F1's dt~ and dA_cumsum, F4's cb)."""
    batch, _, nheads, headdim = x.shape
    states = None
    if keep_states:
        states = torch.empty((batch, dt_out.shape[2], nheads, headdim, B.shape[3]), dtype=x.dtype, device=x.device)
    return (states, x, cb, B.to(x.dtype), C.to(x.dtype), dt_out.contiguous(), dA_cumsum.contiguous(),
            common.expand_D(D, nheads, headdim), z,
            None if initial_states is None else initial_states.contiguous())


def state_scan(x: torch.Tensor, cb: torch.Tensor, B: torch.Tensor, C: torch.Tensor, dt_out: torch.Tensor,
               dA_cumsum: torch.Tensor, D: torch.Tensor | None = None, z: torch.Tensor | None = None,
               initial_states: torch.Tensor | None = None, keep_states: bool = False,
               config: helion.Config | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(y, final_states fp32, the entering states or None) on `config` (default: 64-wide blocks, 4 warps)."""
    args = args_for(x, cb, B, C, dt_out, dA_cumsum, D, z, initial_states, keep_states)
    if state_scan_kernel.settings.ref_mode != RefMode.OFF:  # ref mode: the body runs eagerly, no config
        y, final = state_scan_kernel(*args)
        return y, final, args[0]
    if config is None:
        headdim, chunk = x.shape[3], dt_out.shape[3]
        p, m = min(32, headdim), min(64, chunk)
        config = helion.Config(block_sizes=[p, m, min(32, chunk), m], num_warps=4, num_stages=2)
    fn = state_scan_kernel.bind(args).compile_config(config, allow_print=False)
    y, final = fn(*args)
    return y, final, args[0]


@contextlib.contextmanager
def installed(config: helion.Config | None = None) -> Iterator[None]:
    """The runtime's SSD forward (mamba_tune.ssd.combined, the default path: F2 + F3 fused, F4
    split) runs F1, F4 and this kernel on `config` while the block lasts, without seq_idx; it
    returns no intermediates, so an autograd forward keeps none and the backward recomputes them."""
    from mamba_tune.ssd import bmm, chunk_cumsum, combined

    saved = combined._forward

    def forward(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, dt_softplus, dt_limit, fuse,
                fuse_sp):
        if seq_idx is not None or fuse or not fuse_sp:
            return saved(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, dt_softplus, dt_limit,
                         fuse, fuse_sp)
        B, C = B.to(x.dtype), C.to(x.dtype)
        dA_cumsum, dt_out = chunk_cumsum._launch(dt, A, chunk_size, dt_bias, dt_softplus, dt_limit)
        cb = bmm._launch(C, B, chunk_size, None)
        y, final, _ = state_scan(x, cb, B, C, dt_out, dA_cumsum, D, z, initial_states, config=config)
        return y, final, None

    combined._forward = forward
    try:
        yield
    finally:
        combined._forward = saved
