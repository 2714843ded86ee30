"""Shared pieces of the conv1d family: the shape contract (raising `ValueError` with the offending
sizes), the layouts the kernels take and make, and the default tiles."""

from __future__ import annotations

import torch

from mamba_tune import keys, vocab

ACTIVATIONS = (None, "silu", "swish")
WIDTHS = (2, 3, 4)


def err(message: str) -> ValueError:
    return ValueError(f"causal_conv1d: {message}")


def check_float(name: str, t: torch.Tensor) -> None:
    if not vocab.is_float(t.dtype):
        raise err(f"{name} dtype {t.dtype} is not one of fp32, fp16, bf16")


def check_shape(name: str, t: torch.Tensor, expected: tuple[int, ...], letters: str) -> None:
    if tuple(t.shape) != expected:
        raise err(f"{name} shape {tuple(t.shape)} != ({letters}) = {expected}")


def check_device(device: torch.device, **tensors: torch.Tensor | None) -> None:
    for name, t in tensors.items():
        if t is not None and t.device != device:
            raise err(f"{name} is on {t.device}, x is on {device}")


def check_weight(weight: torch.Tensor, dim: int, bias: torch.Tensor | None) -> int:
    """Checks weight (dim, width) and bias (dim,); returns width."""
    if weight.dim() != 2 or weight.shape[0] != dim:
        raise err(f"weight must be (dim, width) = ({dim}, width), got shape {tuple(weight.shape)}")
    width = weight.shape[1]
    if width not in WIDTHS:
        raise err(f"width {width} (weight shape {tuple(weight.shape)}) is not one of 2, 3, 4")
    check_float("weight", weight)
    if bias is not None:
        check_shape("bias", bias, (dim,), "dim,")
        check_float("bias", bias)
    return width


def check_activation(activation: str | None) -> bool:
    if activation not in ACTIVATIONS:
        raise err(f"activation {activation!r} is not one of None, 'silu', 'swish'")
    return activation is not None


# --- host helpers of the forward and the backward ----------------------------------------

def check_inputs(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, seq_idx: torch.Tensor | None,
           initial_states: torch.Tensor | None, final_states_out: torch.Tensor | None) -> tuple[int, int, int, int]:
    """The shape contract of the forward (and of the backward's inputs); returns (batch, dim, seqlen, width)."""
    if x.dim() != 3:
        raise err(f"x must be (batch, dim, seqlen), got shape {tuple(x.shape)}")
    batch, dim, seqlen = x.shape
    if x.numel() == 0:
        raise err(f"empty x (batch, dim, seqlen) = {tuple(x.shape)}")
    check_float("x", x)
    width = check_weight(weight, dim, bias)
    if seq_idx is not None:
        check_shape("seq_idx", seq_idx, (batch, seqlen), "batch, seqlen")
        if not vocab.is_index(seq_idx.dtype):
            raise err(f"seq_idx dtype {seq_idx.dtype} is not int32 or int64")
        if initial_states is not None or final_states_out is not None:
            # causal-conv1d's rule: with packed sequences there is no one sequence to carry.
            raise err("seq_idx cannot be combined with initial_states or final states (as in causal-conv1d)")
    for name, t in (("initial_states", initial_states), ("final_states_out", final_states_out)):
        if t is not None:
            check_shape(name, t, (batch, dim, width - 1), "batch, dim, width - 1")
            check_float(name, t)
    check_device(x.device, weight=weight, bias=bias, seq_idx=seq_idx, initial_states=initial_states,
                 final_states_out=final_states_out)
    return batch, dim, seqlen, width


def strided(t: torch.Tensor) -> torch.Tensor:
    """t (batch, dim, seqlen) as the kernels take it: its own layout when the seqlen or the
    dim axis is unit-stride (contiguous, channel-last), else a contiguous copy (as causal-conv1d)."""
    if t.stride(2) == 1 or t.stride(1) == 1:
        return t
    return t.contiguous()


def like(x: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """An empty (batch, dim, seqlen) tensor in x's layout (channel-last stays channel-last,
    also for a strided view such as a slice of a wider (batch, seqlen, width) tensor), in
    x's dtype unless `dtype` is given. Never a view (empty_strided, not a transpose): the
    autograd Function returns it, and an in-place op on a view among several outputs raises."""
    batch, dim, seqlen = x.shape
    dtype = x.dtype if dtype is None else dtype
    if x.stride(2) != 1 and x.stride(1) == 1:
        return torch.empty_strided((batch, dim, seqlen), (seqlen * dim, 1, dim), dtype=dtype, device=x.device)
    return torch.empty(batch, dim, seqlen, dtype=dtype, device=x.device)


def dinit_buffer(initial_states: torch.Tensor) -> torch.Tensor:
    """The buffer the backward kernels write dinitial_states (batch, dim, width - 1) into: one like
    initial_states, or at width 2 (batch, dim, 2), whose first column is the gradient (`[..., :1]`).
    Helion drops a size-1 dim's index from a store's pointer, so at width 2 the dx kernel's store of
    a [channels, positions] tile got a [channels, 1] pointer, which Triton refuses to compile."""
    batch, dim, states = initial_states.shape
    if states > 1:
        return torch.empty_like(initial_states)
    return torch.empty(batch, dim, 2, dtype=initial_states.dtype, device=initial_states.device)


def conv_dims(x: torch.Tensor, bias: torch.Tensor | None, seq_idx: torch.Tensor | None,
              initial_states: torch.Tensor | None, width: int, silu: bool) -> dict[str, int]:
    """The key dims every conv1d kernel over x shares (the forward's; the backward's add theirs)."""
    batch, dim, seqlen = x.shape
    return {"batch": batch, "seqlen": seqlen, "dim": dim, "width": int(width), "has_bias": int(bias is not None),
            "has_seq_idx": int(seq_idx is not None), "has_initial_states": int(initial_states is not None),
            "silu": int(silu), "channel_last": channel_last(x)}


def layer_dims(x: torch.Tensor, bias: torch.Tensor | None, seq_idx: torch.Tensor | None,
               initial_states: torch.Tensor | None, width: int, silu: bool) -> dict[str, int]:
    """The key dims of the kernels a layer runs (`conv_dims` and x's rows' stride,
    `mamba_tune.keys.row_stride`): the forward and the channel-last backward."""
    return {**conv_dims(x, bias, seq_idx, initial_states, width, silu),
            "row_stride": keys.row_stride(channel_last=bool(channel_last(x)), strides=tuple(x.stride()))}


def channel_last(x: torch.Tensor) -> int:
    """1 when x (batch, dim, seqlen) steps along dim with unit stride and not along seqlen."""
    return int(x.stride(2) != 1 and x.stride(1) == 1)


def pow2_at_most(n: int, cap: int) -> int:
    return min(cap, max(1, 1 << (max(int(n), 1) - 1).bit_length()))


def tile_of(dims: dict[str, int], elements: int = 4096) -> tuple[int, int]:
    """A default tile (channels, positions): wide along the unit-stride axis (coalesced
    loads and stores), `elements` per program."""
    if dims["channel_last"]:
        bd = pow2_at_most(dims["dim"], 128)
        return bd, pow2_at_most(dims["seqlen"], elements // bd)
    bl = pow2_at_most(dims["seqlen"], 256)
    return pow2_at_most(dims["dim"], elements // bl), bl
