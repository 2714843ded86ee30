"""fp32 references for the Mamba-2 SSD forward (mamba-ssm `mamba_chunk_scan_combined`).

Two independent levels that check each other:

- The chunked form, one function per stage (F1-F5 of the Mamba-2 SSD forward as mamba-ssm splits it),
  written with einsum: `chunk_cumsum_ref`, `chunk_state_ref`, `state_passing_ref`,
  `bmm_chunk_ref`, `chunk_scan_ref`, composed by `ssd_chunked_ref`. These mirror the
  kernels' stage boundaries, so each kernel is checked on its own.
- The plain recurrence `ssd_recurrent_ref` (the paper's minimal listing, one step per
  token): h_t = exp(dt_t A) h_{t-1} + dt_t B_t x_t, y_t = C_t h_t + D x_t, y *= silu(z).

Shapes use the project's letters: x (batch, seqlen, nheads, headdim), dt (batch, seqlen,
nheads), A (nheads,), B and C (batch, seqlen, ngroups, dstate), per-chunk tensors
(batch, nheads, nchunks, chunk_size), states (batch, nchunks, nheads, headdim, dstate).

`seq_idx` (batch, seqlen) marks packed sequences: the state resets where it changes. The
recurrence assumes it is non-negative and nondecreasing along seqlen (packed sequences);
the chunked form follows mamba-ssm's kernels exactly (the sequence before position 0 is
number 0, so `initial_states` belongs to sequence 0; a chunk whose last id is negative
contributes no state).

`upcast=False` evaluates the chunked form the way eager PyTorch would in the inputs' low
dtype (every contraction's operands and result in that dtype; dt, dA_cumsum and the
state passing stay fp32 as in mamba-ssm's own reference): the error bound of the tests.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from mamba_tune.vocab import DT_LIMIT_NONE


def ssd_dt_ref(
    dt: torch.Tensor,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = False,
    dt_limit: tuple[float, float] = DT_LIMIT_NONE,
) -> torch.Tensor:
    """dt~ = clamp(softplus(dt + dt_bias), *dt_limit) in fp32, shaped like dt (batch, seqlen, nheads)."""
    dt = dt.float()
    if dt_bias is not None:
        dt = dt + dt_bias.float()
    if dt_softplus:
        dt = F.softplus(dt)  # threshold 20: identity above, as mamba-ssm's kernel
    return dt.clamp(min=dt_limit[0], max=dt_limit[1])


def _nchunks(seqlen: int, chunk_size: int) -> int:
    return math.ceil(seqlen / chunk_size)


def _pad_seq(t: torch.Tensor, nchunks: int, chunk_size: int) -> torch.Tensor:
    """Zero-pad dim 1 (seqlen) to nchunks * chunk_size and split it: (batch, nchunks, chunk_size, ...)."""
    pad = nchunks * chunk_size - t.shape[1]
    t = F.pad(t, (0, 0) * (t.dim() - 2) + (0, pad))
    return t.unflatten(1, (nchunks, chunk_size))


def _per_head(t: torch.Tensor, nheads: int) -> torch.Tensor:
    """(batch, seqlen, ngroups, dstate) -> (batch, seqlen, nheads, dstate): head h uses group h // (nheads // ngroups)."""
    return t.repeat_interleave(nheads // t.shape[2], dim=2)


def _chunk_seq_idx(seq_idx: torch.Tensor, nchunks: int, chunk_size: int) -> torch.Tensor:
    """seq_idx padded with -1 past seqlen: (batch, nchunks, chunk_size)."""
    pad = nchunks * chunk_size - seq_idx.shape[1]
    return F.pad(seq_idx, (0, pad), value=-1).view(seq_idx.shape[0], nchunks, chunk_size)


def _chunk_last_seq_idx(seq_idx: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """seq_idx at the last valid position of each chunk: (batch, nchunks)."""
    seqlen = seq_idx.shape[1]
    ends = [min((c + 1) * chunk_size, seqlen) - 1 for c in range(_nchunks(seqlen, chunk_size))]
    return seq_idx[:, ends]


# --- F1 ---------------------------------------------------------------------------------


def chunk_cumsum_ref(
    dt: torch.Tensor,
    A: torch.Tensor,
    chunk_size: int,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = False,
    dt_limit: tuple[float, float] = DT_LIMIT_NONE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """F1. Returns (dA_cumsum, dt_out), both (batch, nheads, nchunks, chunk_size) fp32.

    dt_out is dt~ (zero past seqlen); dA_cumsum is the cumsum of dt~ * A inside each chunk
    (constant past seqlen, so its last entry is the chunk's total).
    """
    batch, seqlen, nheads = dt.shape
    nchunks = _nchunks(seqlen, chunk_size)
    dt_out = ssd_dt_ref(dt, dt_bias, dt_softplus, dt_limit)
    dt_out = _pad_seq(dt_out[..., None], nchunks, chunk_size)[..., 0]  # (batch, nchunks, chunk_size, nheads)
    dt_out = dt_out.permute(0, 3, 1, 2).contiguous()
    dA_cumsum = torch.cumsum(dt_out * A.float()[:, None, None], dim=-1)
    return dA_cumsum, dt_out


# --- F2 ---------------------------------------------------------------------------------


def chunk_state_ref(
    B: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    dA_cumsum: torch.Tensor,
    seq_idx: torch.Tensor | None = None,
    upcast: bool = True,
) -> torch.Tensor:
    """F2. Each chunk's own end state, (batch, nchunks, nheads, headdim, dstate) fp32.

    S[c, h, p, n] = sum_l x[l, h, p] B[l, g(h), n] dt~[l] exp(min(dA_last - dA[l], 0)),
    over the positions l of chunk c (with seq_idx: only those in the chunk's last sequence).
    """
    batch, seqlen, nheads, headdim = x.shape
    _, _, nchunks, chunk_size = dt.shape
    xc = _pad_seq(x, nchunks, chunk_size)  # (batch, nchunks, chunk_size, nheads, headdim)
    Bc = _pad_seq(_per_head(B, nheads), nchunks, chunk_size)
    weight = torch.exp(torch.clamp(dA_cumsum[..., -1:] - dA_cumsum, max=0.0)) * dt  # (b, h, c, l)
    if seq_idx is not None:
        seq = _chunk_seq_idx(seq_idx, nchunks, chunk_size)  # (b, c, l)
        last = _chunk_last_seq_idx(seq_idx, chunk_size)[..., None]  # (b, c, 1)
        keep = (seq == last) & (last >= 0)
        weight = weight * keep[:, None].to(weight.dtype)
    if upcast:
        return torch.einsum("bclhn,bhcl,bclhp->bchpn", Bc.float(), weight, xc.float())
    # As the kernels do in low precision: B scaled in fp32, rounded, contracted with x.
    Bw = (Bc.float() * weight.permute(0, 2, 3, 1)[..., None]).to(x.dtype)
    return torch.einsum("bclhn,bclhp->bchpn", Bw, xc).float()


# --- F3 ---------------------------------------------------------------------------------


def state_passing_ref(
    states: torch.Tensor,
    dA_chunk_last: torch.Tensor,
    initial_states: torch.Tensor | None = None,
    seq_idx: torch.Tensor | None = None,
    chunk_size: int | None = None,
    out_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """F3. Returns (prev_states, final_states).

    states: (batch, nchunks, nheads, headdim, dstate); dA_chunk_last: (batch, nheads, nchunks)
    (dA_cumsum[..., -1]); initial_states: (batch, nheads, headdim, dstate).
    prev_states[c] is the state entering chunk c, (batch, nchunks, nheads, headdim, dstate)
    in out_dtype; final_states (batch, nheads, headdim, dstate) fp32. The recurrence over
    chunks, s <- exp(dA_last[c]) s + S[c], runs in fp32 (a plain loop: the clear form).
    With seq_idx the carried state is dropped where a chunk ends in another sequence than
    the previous chunk (the one before chunk 0 is sequence 0).
    """
    batch, nchunks, nheads, headdim, dstate = states.shape
    s = states.new_zeros(batch, nheads, headdim, dstate, dtype=torch.float32)
    if initial_states is not None:
        s = s + initial_states.float()
    decay = torch.exp(dA_chunk_last.float())  # (batch, nheads, nchunks)
    if seq_idx is not None:
        if chunk_size is None:
            raise ValueError("state_passing_ref: seq_idx needs chunk_size")
        last = _chunk_last_seq_idx(seq_idx, chunk_size)  # (batch, nchunks)
        prev = F.pad(last[:, :-1], (1, 0), value=0)
        decay = decay * (last == prev)[:, None, :].to(decay.dtype)
    prev_states = []
    for c in range(nchunks):
        prev_states.append(s)
        s = decay[:, :, c, None, None] * s + states[:, c].float()
    return torch.stack(prev_states, dim=1).to(out_dtype), s


# --- F4 ---------------------------------------------------------------------------------


def bmm_chunk_ref(
    C: torch.Tensor,
    B: torch.Tensor,
    chunk_size: int,
    seq_idx: torch.Tensor | None = None,
    upcast: bool = True,
) -> torch.Tensor:
    """F4. CB[b, c, g, i, j] = sum_n C[i, g, n] B[j, g, n] inside chunk c: (batch, nchunks, ngroups, chunk_size, chunk_size) fp32.

    Rows and columns past seqlen are zero; with seq_idx, entries between different
    sequences are zero.
    """
    batch, seqlen, ngroups, dstate = C.shape
    nchunks = _nchunks(seqlen, chunk_size)
    Cc = _pad_seq(C, nchunks, chunk_size)
    Bc = _pad_seq(B, nchunks, chunk_size)
    if upcast:
        Cc, Bc = Cc.float(), Bc.float()
    cb = torch.einsum("bcign,bcjgn->bcgij", Cc, Bc).float()
    if seq_idx is not None:
        seq = _chunk_seq_idx(seq_idx, nchunks, chunk_size)
        same = (seq[..., :, None] == seq[..., None, :]) & (seq[..., :, None] >= 0)  # padded: -1
        cb = cb * same[:, :, None].to(cb.dtype)
    return cb


# --- F5 ---------------------------------------------------------------------------------


def chunk_scan_ref(
    CB: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    dA_cumsum: torch.Tensor,
    C: torch.Tensor,
    prev_states: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    seq_idx: torch.Tensor | None = None,
    upcast: bool = True,
) -> torch.Tensor:
    """F5. The output (batch, seqlen, nheads, headdim), in x's dtype.

    y[i] = exp(dA[i]) C[i] . prev_state + sum_{j<=i in the chunk} CB[i, j] exp(min(dA[i] - dA[j], 0)) dt~[j] x[j]
           + D x[i];   y *= silu(z) when z is given.
    CB already carries the seq_idx mask (from `bmm_chunk_ref`); seq_idx here drops the
    prev_state term for positions in another sequence than the one entering the chunk.
    """
    batch, seqlen, nheads, headdim = x.shape
    _, _, nchunks, chunk_size = dt.shape
    ngroups = C.shape[2]
    cdt = torch.float32 if upcast else x.dtype
    xc = _pad_seq(x, nchunks, chunk_size)  # (b, c, l, h, p)
    Cc = _pad_seq(_per_head(C, nheads), nchunks, chunk_size)  # (b, c, l, h, n)
    cb = CB.float().repeat_interleave(nheads // ngroups, dim=2)  # (b, c, h, i, j)
    dA = dA_cumsum.permute(0, 2, 1, 3)  # (b, c, h, l)
    decay = torch.exp(torch.clamp(dA[..., :, None] - dA[..., None, :], max=0.0))
    causal = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=x.device).tril()
    scores = (cb * decay * dt.permute(0, 2, 1, 3)[..., None, :]).masked_fill(~causal, 0.0)
    y_diag = torch.einsum("bchij,bcjhp->bcihp", scores.to(cdt), xc.to(cdt))
    scale = torch.exp(dA)  # (b, c, h, l)
    if seq_idx is not None:
        seq = _chunk_seq_idx(seq_idx, nchunks, chunk_size)  # (b, c, l)
        entering = F.pad(seq_idx[:, chunk_size - 1 :: chunk_size][:, : nchunks - 1], (1, 0), value=0)  # (b, c)
        scale = scale * (seq == entering[..., None])[:, :, None, :].to(scale.dtype)
    y_off = torch.einsum("bclhn,bchpn->bclhp", Cc.to(cdt), prev_states.to(cdt))
    y = y_diag + (y_off.float() * scale.permute(0, 1, 3, 2)[..., None]).to(cdt)
    y = y.flatten(1, 2)[:, :seqlen]
    if D is not None:
        Dhp = D.to(cdt) if D.dim() == 2 else D.to(cdt)[:, None]
        y = y + x.to(cdt) * Dhp
    if z is not None:
        y = y * F.silu(z.to(cdt))
    return y.to(x.dtype)


# --- combined: the two levels -----------------------------------------------------------


def ssd_chunked_ref(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    chunk_size: int,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    initial_states: torch.Tensor | None = None,
    seq_idx: torch.Tensor | None = None,
    dt_softplus: bool = False,
    dt_limit: tuple[float, float] = DT_LIMIT_NONE,
    upcast: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The chunked SSD, F1-F5 composed. Returns (out like x, final_states (batch, nheads, headdim, dstate) fp32).

    With upcast=False the states enter F5 rounded to C's dtype, as in mamba-ssm.
    """
    dA_cumsum, dt_out = chunk_cumsum_ref(dt, A, chunk_size, dt_bias, dt_softplus, dt_limit)
    states = chunk_state_ref(B, x, dt_out, dA_cumsum, seq_idx, upcast=upcast)
    prev_states, final_states = state_passing_ref(
        states, dA_cumsum[..., -1], initial_states, seq_idx, chunk_size,
        out_dtype=torch.float32 if upcast else C.dtype,
    )
    CB = bmm_chunk_ref(C, B, chunk_size, seq_idx, upcast=upcast)
    out = chunk_scan_ref(CB, x, dt_out, dA_cumsum, C, prev_states, D, z, seq_idx, upcast=upcast)
    return out, final_states


def ssd_recurrent_ref(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    initial_states: torch.Tensor | None = None,
    seq_idx: torch.Tensor | None = None,
    dt_softplus: bool = False,
    dt_limit: tuple[float, float] = DT_LIMIT_NONE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The sequential recurrence, one token at a time, fp32. Returns (out in x's dtype, final_states fp32).

    h_t = exp(dt~_t A) h_{t-1} + dt~_t x_t B_t^T   (h: (batch, nheads, headdim, dstate))
    y_t = h_t C_t + D x_t;  y *= silu(z).  h_{-1} = initial_states (or 0); with seq_idx,
    h_{t-1} is dropped where seq_idx changes (the id before position 0 is 0).
    """
    batch, seqlen, nheads, headdim = x.shape
    dstate = B.shape[-1]
    dtv = ssd_dt_ref(dt, dt_bias, dt_softplus, dt_limit)  # (b, l, h)
    Bh = _per_head(B, nheads).float()
    Ch = _per_head(C, nheads).float()
    xf = x.float()
    h = x.new_zeros(batch, nheads, headdim, dstate, dtype=torch.float32)
    if initial_states is not None:
        h = h + initial_states.float()
    prev_id = torch.zeros(batch, dtype=torch.long, device=x.device)
    ys = []
    for t in range(seqlen):
        if seq_idx is not None:
            same = (seq_idx[:, t].long() == prev_id).float()[:, None, None, None]
            h = h * same
            prev_id = seq_idx[:, t].long()
        decay = torch.exp(dtv[:, t] * A.float())  # (b, h)
        h = decay[..., None, None] * h + (dtv[:, t, :, None, None] * xf[:, t, :, :, None]) * Bh[:, t, :, None, :]
        ys.append(torch.einsum("bhpn,bhn->bhp", h, Ch[:, t]))
    y = torch.stack(ys, dim=1)
    if D is not None:
        y = y + xf * (D.float() if D.dim() == 2 else D.float()[:, None])
    if z is not None:
        y = y * F.silu(z.float())
    return y.to(x.dtype), h
