"""Per-sequence final states of packed sequences (mamba-ssm `chunk_state_varlen`).

`mamba_chunk_scan_combined(..., cu_seqlens=..., return_varlen_states=True)` returns, for
each sequence i of a packed row (batch 1, sequence i at positions cu_seqlens[i] to
cu_seqlens[i+1] - 1), the state at its last position. As in mamba-ssm, that is the part
of the sequence's last chunk c up to its end, plus the state entering chunk c decayed to
the end when the sequence started before chunk c:

    S_i = sum_{l in [max(start, c Q), end)} x_l (B_l dt~_l exp(min(dA[end-1] - dA[l], 0)))^T
          + [start < c Q or start == 0] exp(dA[end-1]) prev_states[c]

Written with torch ops, not a Helion kernel: one gather of each sequence's last chunk and
one contraction, with mamba-ssm's rounding points (B scaled in fp32 and rounded to x's
dtype, products summed in fp32, one rounding to the entering states' dtype). mamba-ssm
returns these only for inference prefill (Mamba2 with inference_params and cu_seqlens),
not on the training path. The work is num_sequences x chunk_size positions, at most one
chunk per sequence. Not measured on a GPU yet.

One difference from mamba-ssm 2.3.2.post1: a first sequence that ends within the first
chunk gets initial_states here (`start == 0`, the state entering position 0); mamba-ssm's
kernel drops them there, while it keeps them when the first sequence is longer. Without
initial_states the two agree.

Without seq_idx the entering states are not reset between sequences (mamba-ssm's
behaviour): a sequence that spans a chunk boundary then also carries the sequences
before it. Pass seq_idx matching cu_seqlens for each sequence's own state.
"""

from __future__ import annotations

import torch

from mamba_tune import vocab
from mamba_tune.ssd import chunk_cumsum, chunk_state_passing, common


def check_varlen(x: torch.Tensor, cu_seqlens: torch.Tensor | None) -> None:
    """mamba-ssm's conditions on return_varlen_states, as ValueError (values are not read: no host sync)."""
    if cu_seqlens is None:
        raise ValueError("ssd: return_varlen_states=True needs cu_seqlens (num_sequences + 1,)")
    if x.dim() != 4 or x.shape[0] != 1:
        raise ValueError(f"ssd: return_varlen_states needs batch 1 (sequences packed along seqlen), "
                         f"got x shape {tuple(x.shape)}")
    if cu_seqlens.dim() != 1 or cu_seqlens.shape[0] < 2:
        raise ValueError(f"ssd: cu_seqlens must be (num_sequences + 1,) with at least one sequence, "
                         f"got shape {tuple(cu_seqlens.shape)}")
    if not vocab.is_index(cu_seqlens.dtype):
        raise ValueError(f"ssd: cu_seqlens dtype {cu_seqlens.dtype} is not int32 or int64")
    common.check_device(x.device, cu_seqlens=cu_seqlens)


def chunk_state_varlen(
    B: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    dA_cumsum: torch.Tensor,
    cu_seqlens: torch.Tensor,
    chunk_states: torch.Tensor,
) -> torch.Tensor:
    """mamba-ssm `chunk_state_varlen`: the state of each packed sequence at its end.

    B: (total_seqlen, ngroups, dstate); x: (total_seqlen, nheads, headdim);
    dt, dA_cumsum: (nheads, nchunks, chunk_size) fp32 (F1's outputs of batch row 0);
    cu_seqlens: (num_sequences + 1,) int, 0 = cu_seqlens[0] <= ... <= cu_seqlens[-1] = total_seqlen,
    each sequence non-empty; chunk_states: (nchunks, nheads, headdim, dstate), the states
    entering each chunk. Returns (num_sequences, nheads, headdim, dstate) in chunk_states' dtype.
    """
    total, nheads, headdim = x.shape
    _, nchunks, chunk_size = dt.shape
    ngroups, dstate = B.shape[1], B.shape[2]
    common.check_groups(nheads, ngroups)
    common.check_shape("B", B, (total, ngroups, dstate), "total_seqlen, ngroups, dstate")
    common.check_shape("dt", dt, (nheads, nchunks, chunk_size), "nheads, nchunks, chunk_size")
    common.check_shape("dA_cumsum", dA_cumsum, tuple(dt.shape), "nheads, nchunks, chunk_size")
    common.check_shape("chunk_states", chunk_states, (nchunks, nheads, headdim, dstate),
                       "nchunks, nheads, headdim, dstate")
    starts, ends = cu_seqlens[:-1].long(), cu_seqlens[1:].long()
    c = (ends - 1) // chunk_size  # (nseq,) each sequence's last chunk
    pos = c[:, None] * chunk_size + torch.arange(chunk_size, device=x.device)  # (nseq, Q)
    valid = (pos >= starts[:, None]) & (pos < ends[:, None])
    pos = pos.clamp(max=total - 1)  # past the row's end: masked, read in bounds
    dA = dA_cumsum[:, c].float()  # (nheads, nseq, Q)
    dA_last = dA.gather(2, (ends - 1 - c * chunk_size)[None, :, None].expand(nheads, -1, 1))  # (nheads, nseq, 1)
    scale = torch.exp(torch.clamp(dA_last - dA, max=0.0)) * dt[:, c].float()
    scale = torch.where(valid[None], scale, 0.0).permute(1, 2, 0)  # (nseq, Q, nheads)
    Bh = B[pos].repeat_interleave(nheads // ngroups, dim=2)  # (nseq, Q, nheads, dstate)
    b_scaled = (Bh.float() * scale[..., None]).to(x.dtype)
    states = torch.einsum("slhp,slhn->shpn", x[pos].float(), b_scaled.float())
    # The state entering chunk c is this sequence's when it started before c, or when it
    # starts at 0 (initial_states; zeros without them).
    carry = ((starts < c * chunk_size) | (starts == 0))[:, None, None, None]
    entering = chunk_states[c].float() * torch.exp(dA_last[..., 0]).T[:, :, None, None]
    states = states + torch.where(carry, entering, 0.0)
    return states.to(chunk_states.dtype)


def varlen_states(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    chunk_size: int,
    cu_seqlens: torch.Tensor,
    dt_bias: torch.Tensor | None = None,
    initial_states: torch.Tensor | None = None,
    seq_idx: torch.Tensor | None = None,
    dt_softplus: bool = False,
    dt_limit: tuple[float, float] = vocab.DT_LIMIT_NONE,
) -> torch.Tensor:
    """The varlen states of a `mamba_chunk_scan_combined` call (its checked arguments).

    Runs F1 and F2+F3 again for dt~, dA_cumsum and the entering states (the forward does
    not return them), then `chunk_state_varlen`: about half a forward's work more, on
    prefill calls only. Returns (num_sequences, nheads, headdim, dstate) in x's dtype.
    """
    check_varlen(x, cu_seqlens)
    B = B.to(x.dtype)
    dA_cumsum, dt_out = chunk_cumsum._launch(dt, A, chunk_size, dt_bias, dt_softplus, dt_limit)
    prev_states, _ = chunk_state_passing._launch(B, x, dt_out, dA_cumsum, initial_states, seq_idx, x.dtype)
    return chunk_state_varlen(B[0], x[0], dt_out[0], dA_cumsum[0], cu_seqlens, prev_states[0])
