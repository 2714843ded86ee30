"""fp32 references for the causal depthwise conv1d (the `causal-conv1d` package's semantics).

Two independent levels that check each other:

- `causal_conv1d_ref`: torch's grouped `F.conv1d` over x left-padded with the initial
  states (zeros without them), the output cut to seqlen; with seq_idx, the sum over the
  taps written out (`causal_conv1d_taps_ref`), each tap masked to its own sequence.
- `causal_conv1d_taps_ref`: out[t] = bias + sum_k weight[k] * x[t - (width - 1) + k], the
  tap kept where seq_idx is equal at both positions (positions with seq_idx < 0 are
  padding: output 0, as causal-conv1d's channel-last kernel).

`causal_conv1d_update_ref` is the decode step (conv_state updated in place, the circular
buffer of cache_seqlens and the slots of conv_state_indices), one batch row at a time.

`upcast=False` evaluates in the inputs' dtype (eager PyTorch in low precision): the
error bound of the tests and of the tuner's accuracy check.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _padded(x: torch.Tensor, width: int, initial_states: torch.Tensor | None) -> torch.Tensor:
    """cat(initial_states or zeros, x) along seqlen: (batch, dim, width - 1 + seqlen)."""
    if initial_states is None:
        return F.pad(x, (width - 1, 0))
    return torch.cat([initial_states.to(x.dtype), x], dim=-1)


def causal_conv1d_taps_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    seq_idx: torch.Tensor | None = None,
    initial_states: torch.Tensor | None = None,
    activation: str | None = None,
) -> torch.Tensor:
    """The conv as a sum over its taps (the pre-activation in x's dtype, no upcast)."""
    batch, dim, seqlen = x.shape
    width = weight.shape[1]
    taps = _padded(x, width, initial_states).unfold(-1, width, 1)  # (batch, dim, seqlen, width)
    if seq_idx is not None:
        pos = torch.arange(seqlen, device=x.device)[:, None] - (width - 1) + torch.arange(width, device=x.device)
        s_tap = seq_idx[:, pos.clamp(min=0)]  # (batch, seqlen, width)
        keep = (pos >= 0) & (s_tap == seq_idx[:, :, None])
        taps = taps * keep[:, None].to(taps.dtype)
    out = torch.einsum("bdlk,dk->bdl", taps, weight.to(taps.dtype))
    if bias is not None:
        out = out + bias.to(out.dtype)[:, None]
    if seq_idx is not None:
        out = out * (seq_idx >= 0)[:, None].to(out.dtype)
    return F.silu(out) if activation in ("silu", "swish") else out


def causal_conv1d_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    seq_idx: torch.Tensor | None = None,
    initial_states: torch.Tensor | None = None,
    activation: str | None = None,
    upcast: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (batch, dim, seqlen) in x's dtype, final_states (batch, dim, width - 1)).

    x: (batch, dim, seqlen); weight: (dim, width); bias: (dim,); seq_idx: (batch, seqlen);
    initial_states: (batch, dim, width - 1); activation: None, "silu" or "swish". The final
    states are the last width - 1 positions of cat(initial_states, x).
    """
    dtype = x.dtype
    width = weight.shape[1]
    if upcast:
        x, weight = x.float(), weight.float()
        bias = None if bias is None else bias.float()
        initial_states = None if initial_states is None else initial_states.float()
    else:
        weight = weight.to(x.dtype)
        bias = None if bias is None else bias.to(x.dtype)
    padded = _padded(x, width, initial_states)
    if seq_idx is None:
        out = F.conv1d(padded, weight[:, None, :], bias, groups=x.shape[1])
        out = F.silu(out) if activation in ("silu", "swish") else out
    else:
        out = causal_conv1d_taps_ref(x, weight, bias, seq_idx, initial_states, activation)
    return out.to(dtype), padded[:, :, -(width - 1):].to(dtype)


def causal_conv1d_update_ref(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    cache_seqlens: torch.Tensor | None = None,
    conv_state_indices: torch.Tensor | None = None,
) -> torch.Tensor:
    """The decode step in fp32: out like x ((batch, dim) or (batch, dim, seqlen)); conv_state
    (nstates, dim, state_len) is updated in place (see `mamba_tune.conv1d.update`)."""
    squeeze = x.dim() == 2
    x3 = x.unsqueeze(-1) if squeeze else x
    batch, dim, seqlen = x3.shape
    width = weight.shape[1]
    state_len = conv_state.shape[2]
    out = torch.zeros(batch, dim, seqlen, dtype=torch.float32, device=x.device)
    for b in range(batch):
        slot = b if conv_state_indices is None else int(conv_state_indices[b])
        if slot < 0:  # a padding slot: output 0, no state
            continue
        state = conv_state[slot]
        if cache_seqlens is None:
            window = torch.cat([state[:, state_len - (width - 1):], x3[b]], dim=-1)
            state.copy_(torch.cat([state, x3[b].to(state.dtype)], dim=-1)[:, -state_len:])
        else:
            start = int(cache_seqlens[b]) % state_len
            before = [(start - (width - 1) + j) % state_len for j in range(width - 1)]
            window = torch.cat([state[:, before], x3[b]], dim=-1)
            for t in range(max(0, seqlen - state_len), seqlen):
                state[:, (start + t) % state_len] = x3[b, :, t].to(state.dtype)
        y = F.conv1d(window.float()[None], weight.float()[:, None, :], None if bias is None else bias.float(),
                     groups=dim)[0]
        out[b] = F.silu(y) if activation in ("silu", "swish") else y
    out = out.to(x.dtype)
    return out.squeeze(-1) if squeeze else out
