"""fp32 reference of one decoding step (mamba-ssm `selective_state_update`).

Per batch row b, head h of group g, headdim row p and state column n:

    dt~ = softplus(dt + dt_bias)                       (bias and softplus optional)
    h'  = exp(dt~ A) h + dt~ B x                       the new state, h = state[s]
    out = (C . h' + D x) * silu(z)                     (D and z optional)

with s = b, or s = state_batch_indices[b] where a negative index is a padding slot
(output zero, state untouched). Functional: returns the new state instead of writing it.
`upcast=False` evaluates the same formula the way eager PyTorch would in x's dtype (every
operand and result in that dtype; the state rounded to its own dtype before C reads it, as
mamba-ssm's `selective_state_update_ref` does): the error bound of the tuner's check.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def selective_state_update_ref(
    state: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = False,
    state_batch_indices: torch.Tensor | None = None,
    upcast: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, new_state): the step's output and the whole state after it.

    Shapes as mamba-ssm's: state (state_batch, nheads, headdim, dstate), x, dt, z (batch,
    nheads, headdim), A (nheads, headdim, dstate), B, C (batch, ngroups, dstate), D,
    dt_bias (nheads, headdim); or the 2-D form without the nheads dim (D, dt_bias (dim,)).
    upcast=True: both fp32. upcast=False: out in x's dtype, new_state in state's dtype.
    """
    has_heads = state.dim() == 4
    if not has_heads:
        state, x, dt, A, B, C = state[:, None], x[:, None], dt[:, None], A[None], B[:, None], C[:, None]
        D = None if D is None else D[None]
        z = None if z is None else z[:, None]
        dt_bias = None if dt_bias is None else dt_bias[None]
    work = torch.float32 if upcast else x.dtype

    def w(t: torch.Tensor) -> torch.Tensor:
        return t.to(work)

    batch, nheads = x.shape[:2]
    rows = (torch.arange(batch, device=x.device) if state_batch_indices is None
            else state_batch_indices.long())
    valid = rows >= 0
    h = w(state[rows.clamp(min=0)])  # (batch, nheads, headdim, dstate)
    dtv = w(dt) if dt_bias is None else w(dt) + w(dt_bias)
    if dt_softplus:
        dtv = F.softplus(dtv)  # threshold 20: identity above, as mamba-ssm's kernel
    rep = nheads // B.shape[1]
    Bh, Ch = w(B).repeat_interleave(rep, dim=1), w(C).repeat_interleave(rep, dim=1)  # (batch, nheads, dstate)
    decay = torch.exp(dtv[..., None] * w(A))
    h = decay * h + torch.einsum("bhp,bhn,bhp->bhpn", dtv, Bh, w(x))
    if not upcast:
        h = h.to(state.dtype).to(work)
    out = torch.einsum("bhpn,bhn->bhp", h, Ch)
    if D is not None:
        out = out + w(D) * w(x)
    if z is not None:
        out = out * F.silu(w(z))
    out = torch.where(valid[:, None, None], out, 0.0)
    new_state = state.to(torch.float32 if upcast else state.dtype).clone()
    new_state[rows[valid]] = h[valid].to(new_state.dtype)
    if not has_heads:
        out, new_state = out[:, 0], new_state[:, 0]
    return out, new_state
