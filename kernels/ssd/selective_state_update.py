"""One decoding step of the SSM (mamba-ssm `selective_state_update`): the state updated in place.

For each batch row b, head h (its group g = h // (nheads / ngroups)), headdim row p and
state column n, in fp32:

    dt~            = softplus(dt[b, h, p] + dt_bias[h, p])   (softplus and bias optional)
    state[s, h, p, n] = state[s, h, p, n] * exp(A[h, p, n] * dt~) + dt~ * B[b, g, n] * x[b, h, p]
    out[b, h, p]   = (sum_n state[s, h, p, n] * C[b, g, n] + D[h, p] * x[b, h, p]) * silu(z[b, h, p])

with s = b, or s = state_batch_indices[b] (a negative index is a padding slot: its state
is left alone and its output row is zero). Mamba-2's decode (`Mamba2.step`, transformers'
Mamba-2 family) passes dt, dt_bias and A as stride-0 `repeat`/`expand` views over headdim
(and dstate for A): one dt, dt_bias and A per head. The launcher spots that case (mamba-ssm
calls it tie_hdim): the kernel then reads element 0 of each head's dt, dt_bias and A, once
per program, not once per element (the views go to the kernel as they are: no per-head
view is even made on the host, where each costs microseconds). The 2-D (Mamba-1, no
heads) form runs as one head.

Order: Helion kernel -> host launcher (shape and dtype checks) -> public function ->
runtime declaration (its tuning record: `autotune_cli/tuning/ssd/selective_state_update.py`).
A decode step is a few microseconds of GPU work, so the launch is kept cheap: the checks
read only shapes, strides and dtypes, nothing is copied (the state is updated where it
lies, at any strides), and nothing syncs with the GPU. So state_batch_indices is not
range-checked (as in mamba-ssm): an index >= the state's batch is out of bounds, and two
rows naming one slot race.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import helion
import helion.language as hl
import torch

from mamba_tune import keys, runtime


@helion.kernel(static_shapes=True, autotuner_fn=runtime.refuse_autotune)
def selective_state_update_kernel(
    state: torch.Tensor,  # (state_batch, nheads, headdim, dstate), updated in place
    x: torch.Tensor,  # (batch, nheads, headdim)
    dt: torch.Tensor,  # (batch, nheads, headdim)
    A: torch.Tensor,  # (nheads, headdim, dstate)
    B: torch.Tensor,  # (batch, ngroups, dstate)
    C: torch.Tensor,  # (batch, ngroups, dstate)
    D: torch.Tensor | None,  # (nheads, headdim)
    z: torch.Tensor | None,  # (batch, nheads, headdim)
    dt_bias: torch.Tensor | None,  # (nheads, headdim)
    state_batch_indices: torch.Tensor | None,  # (batch,), < 0: padding
    dt_softplus: hl.constexpr,
    tie_hdim: hl.constexpr,  # dt, dt_bias, A: one value per head (stride 0 over headdim, dstate)
) -> torch.Tensor:
    batch, nheads, headdim = x.shape
    dstate = state.size(3)
    heads_per_group = nheads // B.size(1)
    out = torch.empty([batch, nheads, headdim], dtype=x.dtype, device=x.device)
    block_n = hl.register_block_size(dstate)
    # One program: one batch row, one head, block_p rows of headdim; the dstate columns in
    # block_n steps (a step updates its slice of the state and adds its part of out).
    for tile_b, tile_h, tile_p in hl.tile([batch, nheads, headdim], block_size=[1, 1, None]):
        g = tile_h.begin // heads_per_group
        if state_batch_indices is not None:
            slot = state_batch_indices[tile_b]
            valid = slot >= 0
            row = torch.where(valid, slot, 0).to(torch.int32)  # a padding row reads slot 0, writes nothing
        else:
            row = tile_b.index
        xv = x[tile_b, tile_h, tile_p].to(torch.float32)  # [1, 1, P]
        if tie_hdim:
            dtv = dt[tile_b, tile_h, 0].to(torch.float32)  # [1, 1]: one dt per head
            if dt_bias is not None:
                dtv = dtv + dt_bias[tile_h, 0].to(torch.float32)[None, :]
            if dt_softplus:
                dtv = torch.where(dtv <= 20.0, torch.log1p(torch.exp(dtv)), dtv)
            dA = torch.exp(A[tile_h, 0, 0].to(torch.float32)[None, :] * dtv)[:, :, None, None]
            dtx = (dtv[:, :, None] * xv)[:, :, :, None]
        else:
            dtv = dt[tile_b, tile_h, tile_p].to(torch.float32)  # [1, 1, P]
            if dt_bias is not None:
                dtv = dtv + dt_bias[tile_h, tile_p].to(torch.float32)[None, :, :]
            if dt_softplus:
                dtv = torch.where(dtv <= 20.0, torch.log1p(torch.exp(dtv)), dtv)
            dtx = (dtv * xv)[:, :, :, None]
        acc = hl.zeros([tile_b, tile_h, tile_p], dtype=torch.float32)
        for tile_n in hl.tile(dstate, block_size=block_n):
            s = state[row, tile_h, tile_p, tile_n].to(torch.float32)
            if not tie_hdim:
                dA = torch.exp(A[tile_h, tile_p, tile_n].to(torch.float32)[None, :, :, :] * dtv[:, :, :, None])
            Bv = B[tile_b, g, tile_n].to(torch.float32)[:, None, None, :]
            Cv = C[tile_b, g, tile_n].to(torch.float32)[:, None, None, :]
            s = s * dA + dtx * Bv
            if state_batch_indices is not None:
                hl.store(state, [row, tile_h, tile_p, tile_n], s.to(state.dtype),
                         extra_mask=valid[:, None, None, None])
            else:
                state[row, tile_h, tile_p, tile_n] = s.to(state.dtype)
            # out reads the fp32 state before it is rounded to the state's dtype (as mamba-ssm's kernel).
            acc = acc + torch.sum(s * Cv, dim=3)
        if D is not None:
            acc = acc + xv * D[tile_h, tile_p].to(torch.float32)[None, :, :]
        if z is not None:
            zv = z[tile_b, tile_h, tile_p].to(torch.float32)
            acc = acc * zv * torch.sigmoid(zv)
        if state_batch_indices is not None:
            acc = torch.where(valid[:, None, None], acc, 0.0)
        out[tile_b, tile_h, tile_p] = acc.to(out.dtype)
    return out


# --- host launcher --------------------------------------------------------------------


_FLOATS = frozenset((torch.float32, torch.float16, torch.bfloat16))
_INDEX = frozenset((torch.int32, torch.int64))


def _bad(name: str, t: torch.Tensor, letters: str, expected: tuple[int, ...]) -> ValueError:
    return ValueError(f"selective_state_update: {name} shape {tuple(t.shape)} != ({letters}) = {expected}")


def _check(state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
           C: torch.Tensor, D: torch.Tensor | None, z: torch.Tensor | None, dt_bias: torch.Tensor | None,
           state_batch_indices: torch.Tensor | None) -> None:
    """The heads form's contract (the 2-D form is unsqueezed to it first). Shapes, dtypes and
    devices only, nothing that reads tensor data; written as plain comparisons because it
    runs on every decoding step (a few microseconds in all)."""
    if state.dim() != 4:
        raise ValueError(f"selective_state_update: state must be (batch, nheads, headdim, dstate) or "
                         f"(batch, dim, dstate), got shape {tuple(state.shape)}")
    state_batch, nheads, headdim, dstate = state.shape
    if x.dim() != 3:
        raise ValueError(f"selective_state_update: x must be (batch, nheads, headdim) or (batch, dim), "
                         f"got shape {tuple(x.shape)}")
    batch = x.shape[0]
    if batch == 0 or nheads == 0 or headdim == 0 or dstate == 0:
        raise ValueError(f"selective_state_update: empty state {tuple(state.shape)} or x {tuple(x.shape)}")
    xs = (batch, nheads, headdim)
    if x.shape != xs:
        raise _bad("x", x, "batch, nheads, headdim", xs)
    if dt.shape != xs:
        raise _bad("dt", dt, "batch, nheads, headdim", xs)
    if A.shape != (nheads, headdim, dstate):
        raise _bad("A", A, "nheads, headdim, dstate", (nheads, headdim, dstate))
    if B.dim() != 3:
        raise ValueError(f"selective_state_update: B must be (batch, ngroups, dstate) or (batch, dstate), "
                         f"got shape {tuple(B.shape)}")
    ngroups = B.shape[1]
    if B.shape != (batch, ngroups, dstate):
        raise _bad("B", B, "batch, ngroups, dstate", (batch, ngroups, dstate))
    if ngroups == 0 or nheads % ngroups:
        raise ValueError(f"selective_state_update: ngroups={ngroups} (B's dim 1) does not divide nheads={nheads}")
    if C.shape != B.shape:
        raise _bad("C", C, "batch, ngroups, dstate", tuple(B.shape))
    if D is not None and D.shape != (nheads, headdim):
        raise _bad("D", D, "nheads, headdim", (nheads, headdim))
    if z is not None and z.shape != xs:
        raise _bad("z", z, "batch, nheads, headdim", xs)
    if dt_bias is not None and dt_bias.shape != (nheads, headdim):
        raise _bad("dt_bias", dt_bias, "nheads, headdim", (nheads, headdim))
    device = x.device
    for name, t in (("state", state), ("x", x), ("dt", dt), ("A", A), ("B", B), ("C", C), ("D", D), ("z", z),
                    ("dt_bias", dt_bias)):
        if t is None:
            continue
        if t.dtype not in _FLOATS:
            raise ValueError(f"selective_state_update: {name} dtype {t.dtype} is not one of fp32, fp16, bf16")
        if t.device != device:
            raise ValueError(f"selective_state_update: {name} is on {t.device}, x is on {device}")
    if state_batch_indices is None:
        if state_batch < batch:
            raise ValueError(f"selective_state_update: state batch {state_batch} < x batch {batch} and no "
                             "state_batch_indices")
        return
    if state_batch_indices.shape != (batch,):
        raise _bad("state_batch_indices", state_batch_indices, "batch,", (batch,))
    if state_batch_indices.dtype not in _INDEX:
        raise ValueError(f"selective_state_update: state_batch_indices dtype {state_batch_indices.dtype} "
                         "is not int32 or int64")
    if state_batch_indices.device != device:
        raise ValueError(f"selective_state_update: state_batch_indices is on {state_batch_indices.device}, "
                         f"x is on {device}")


def kernel_args(state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                C: torch.Tensor, D: torch.Tensor | None, z: torch.Tensor | None, dt_bias: torch.Tensor | None,
                dt_softplus: bool, state_batch_indices: torch.Tensor | None) -> tuple[Any, ...]:
    """The Helion kernel's arguments for checked heads-form inputs (the tuning record's too):
    the tensors as given, and tie_hdim when dt, dt_bias (if given) and A repeat one value per
    head over headdim (and dstate for A), as mamba-ssm decides it."""
    a_strides = A.stride()
    tie = (a_strides[2] == 0 and a_strides[1] == 0 and dt.stride()[2] == 0
           and (dt_bias is None or dt_bias.stride()[1] == 0))
    return (state, x, dt, A, B, C, D, z, dt_bias, state_batch_indices, bool(dt_softplus), tie)


# --- public function ------------------------------------------------------------------


def selective_state_update(
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
) -> torch.Tensor:
    """One decoding step, updating `state` in place (mamba-ssm `selective_state_update`).

    Heads form (Mamba-2):      2-D form (Mamba-1, no heads):
      state: (batch, nheads, headdim, dstate)   (batch, dim, dstate)
      x, dt, z: (batch, nheads, headdim)        (batch, dim)
      A: (nheads, headdim, dstate)              (dim, dstate)
      B, C: (batch, ngroups, dstate)            (batch, dstate)
      D, dt_bias: (nheads, headdim)             (dim,)
    state_batch_indices: (batch,) int32/int64, the state row of each batch row (then state's
    batch may differ from x's); a negative index is a padding slot: its output row is zero
    and no state is touched. Without it, row b of x updates state row b.
    dt, dt_bias and A may be stride-0 views over headdim (and dstate for A), as Mamba2.step
    passes them; any strides work, and nothing is copied. Math in fp32; the state is stored
    in its own dtype. Returns out in x's dtype, (batch, nheads, headdim) or (batch, dim).
    """
    has_heads = state.dim() > 3
    if state.dim() == 3:
        state = state.unsqueeze(1)
    if x.dim() == 2:
        x = x.unsqueeze(1)
    if dt.dim() == 2:
        dt = dt.unsqueeze(1)
    if A.dim() == 2:
        A = A.unsqueeze(0)
    if B.dim() == 2:
        B = B.unsqueeze(1)
    if C.dim() == 2:
        C = C.unsqueeze(1)
    if D is not None and D.dim() == 1:
        D = D.unsqueeze(0)
    if z is not None and z.dim() == 2:
        z = z.unsqueeze(1)
    if dt_bias is not None and dt_bias.dim() == 1:
        dt_bias = dt_bias.unsqueeze(0)
    _check(state, x, dt, A, B, C, D, z, dt_bias, state_batch_indices)
    out = runtime.run(SELECTIVE_STATE_UPDATE, kernel_args(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus,
                                                          state_batch_indices))
    return out if has_heads else out.squeeze(1)


# --- runtime declaration ----------------------------------------------------------------


def _dims_from_args(args: Sequence[Any]) -> dict[str, int]:
    state, x, _dt, _A, B, _C, D, z, dt_bias, sbi, softplus, tie = args
    batch, nheads, headdim = x.shape
    return {"batch": batch, "nheads": nheads, "headdim": headdim, "ngroups": B.shape[1], "dstate": state.shape[3],
            "has_D": int(D is not None), "has_z": int(z is not None), "has_dt_bias": int(dt_bias is not None),
            "dt_softplus": int(softplus), "tie_hdim": int(tie), "has_state_batch_indices": int(sbi is not None),
            # The entry's dtype is x's; a state kept in fp32 under low-precision x moves twice the bytes.
            "fp32_state": int(state.dtype == torch.float32 and x.dtype != torch.float32)}


def _pow2_at_least(n: int) -> int:
    return 1 << (max(int(n), 1) - 1).bit_length()


def default_config(dims: dict[str, int]) -> dict[str, Any]:
    """All of dstate in one block, and mamba-ssm's hand-picked headdim rows per program
    (fewer as dstate grows, so that a program holds about 512-1024 state entries)."""
    dstate = dims["dstate"]
    block_p, num_warps = ((32, 4) if dstate <= 16 else (16, 4) if dstate <= 32 else (8, 4) if dstate <= 64
                          else (4, 4) if dstate <= 128 else (4, 8))
    return {"block_sizes": [_pow2_at_least(dstate), min(block_p, _pow2_at_least(dims["headdim"]))],
            "num_warps": num_warps, "num_stages": 1}


SELECTIVE_STATE_UPDATE = runtime.RuntimeKernel(
    key=keys.SELECTIVE_STATE_UPDATE,
    kernel=selective_state_update_kernel,
    dims_from_args=_dims_from_args,
    default_config=default_config,
    dtype_arg=1,
)
