"""The SSD forward, `mamba_chunk_scan_combined`, from the stage kernels.

Launch order (mamba-ssm's `_mamba_chunk_scan_combined_fwd` runs F1 chunk_cumsum -> F2
chunk_state -> F3 state_passing (a scan) -> F4 bmm -> F5 chunk_scan): F1 -> F2 + F3 in one
kernel walking the chunks in order (chunk_state_passing.py: no fp32 chunk states in memory)
-> F4 -> F5.

The backward (`ssd_backward`, run by `mamba_chunk_scan_combined` through autograd) recomputes
what the forward did not keep of F1, F2 + F3 and F4 (the forward keeps no output, and of the
intermediates no more bytes than mamba-ssm keeps of its output: SAVE_INTERMEDIATES), then runs
four fused kernels: chunk_state_passing_bwd (B2 + B3, reverse over chunks; or F2's kernel then
state_passing_bwd's elementwise walk, per shape: `split_state_passing_bwd`),
chunk_scan_chunk_state_bwd_dx (B1 + B4 + B9: dx, dz, dD, per-position ddt/ddA sums),
chunk_state_scan_bwd_dbdc (B5-B8: dB, dC; or dbdc_two_pass's two passes, per shape: `two_pass_dbdc`) and chunk_cumsum_bwd (B10
and ddA's glue). Every reduction has a fixed order (no atomics across programs), so gradients
are bitwise reproducible.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import helion
import torch

from mamba_tune import paths, vocab
from mamba_tune.keys import split_state_passing_bwd, two_pass_dbdc
from mamba_tune.ssd import (
    bmm,
    chunk_cumsum,
    chunk_cumsum_bwd,
    chunk_scan,
    chunk_scan_chunk_state_bwd_dx,
    chunk_state_passing,
    chunk_state_passing_bwd,
    chunk_state_scan_bwd_dbdc,
    chunk_state_varlen,
    common,
    dbdc_two_pass,
    state_passing_bwd,
)

# F2 + F3 fused (sequential over chunks, one program per state tile walks every chunk), not
# F2 then a scan F3: it never writes the fp32 chunk states (268 MB each way at Nemotron-3
# Nano's sizes). Measured on the H200 with tuned configs: the whole forward 0.417 ms against
# 0.514 ms split at Nano (fused 0.151 ms against F2 0.144 + F3 0.102 ms; mamba-ssm 0.622 ms),
# 0.226 against 0.258 ms at Falcon-H1-0.5B; the split forward and its F3 kernel are deleted.
# With seq_idx, the sequence mask of C B^T computed inside a kernel miscompiles on the
# H200 for some configs (bmm.py's docstring has the measurement), so the forward masks
# F4's output with a torch op instead.


# B2 + B3 (the state gradients) as one walk over the chunks with a dot per step
# (`chunk_state_passing_bwd`) or as F2's kernel for every chunk's term then an elementwise walk
# (`state_passing_bwd`): `split_state_passing_bwd` (mamba_tune.keys) picks one per shape (the registry's
# "ssd_state_passing_bwd", mamba_tune.paths, names the variable that overrides it).


def _sp_bwd_split(batch: int, nheads: int, chunk_size: int) -> bool:
    rule = "split" if split_state_passing_bwd(batch, nheads, chunk_size) else "fused"
    return paths.choose("ssd_state_passing_bwd", rule) == "split"


# B5-B8 (dB, dC) in one kernel (`chunk_state_scan_bwd_dbdc`, each dCB tile built by the program
# of its rows and again by the program of its columns, and once per dstate block) or in two
# passes (`dbdc_two_pass`: each tile once, through a head-summed buffer): `two_pass_dbdc` (mamba_tune.keys) picks
# one per shape (the registry's "ssd_dbdc", mamba_tune.paths).


def dbdc_launch(dy: torch.Tensor, z: torch.Tensor | None, x: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                dt: torch.Tensor, dA_cumsum: torch.Tensor, prev_states: torch.Tensor, dstates: torch.Tensor,
                seq_idx: torch.Tensor | None, rows: torch.Tensor | None, cb: torch.Tensor | None,
                dB: torch.Tensor | None = None, dC: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """dB and dC on the path `two_pass_dbdc` (or its variable, mamba_tune.paths) picks, as
    `chunk_state_scan_bwd_dbdc._launch` (into dB and dC when given)."""
    two = paths.choose("ssd_dbdc", "two" if two_pass_dbdc(B.shape[3]) else "one") == "two"
    launch = dbdc_two_pass._launch if two else chunk_state_scan_bwd_dbdc._launch
    return launch(dy, z, x, B, C, dt, dA_cumsum, prev_states, dstates, seq_idx, rows, cb, dB, dC)


def state_passing_bwd_launch(dy: torch.Tensor, z: torch.Tensor | None, C: torch.Tensor, dA_cumsum: torch.Tensor,
                             prev_states: torch.Tensor, dfinal: torch.Tensor | None, seq_idx: torch.Tensor | None
                             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """B2 + B3 on the path `split_state_passing_bwd` (or its variable, mamba_tune.paths) picks: (dstates,
    ddA_last partials, dinitial_states), as `chunk_state_passing_bwd._launch` returns them."""
    batch, _, nheads, _ = dy.shape
    path = state_passing_bwd if _sp_bwd_split(batch, nheads, dA_cumsum.shape[3]) else chunk_state_passing_bwd
    return path._launch(dy, z, C, dA_cumsum, prev_states, dfinal, seq_idx)


def _check(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, chunk_size: int,
           D: torch.Tensor | None, z: torch.Tensor | None, dt_bias: torch.Tensor | None,
           initial_states: torch.Tensor | None, seq_idx: torch.Tensor | None,
           dt_limit: tuple[float, float]) -> None:
    if x.dim() != 4:
        raise ValueError(f"ssd: x must be (batch, seqlen, nheads, headdim), got shape {tuple(x.shape)}")
    batch, seqlen, nheads, headdim = x.shape
    if 0 in x.shape:
        raise ValueError(f"ssd: empty x (batch, seqlen, nheads, headdim) = {tuple(x.shape)}")
    if B.dim() != 4:
        raise ValueError(f"ssd: B must be (batch, seqlen, ngroups, dstate), got shape {tuple(B.shape)}")
    ngroups, dstate = B.shape[2], B.shape[3]
    common.check_groups(nheads, ngroups)
    common.check_chunk_size(chunk_size)
    common.check_shape("dt", dt, (batch, seqlen, nheads), "batch, seqlen, nheads")
    common.check_shape("A", A, (nheads,), "nheads,")
    common.check_shape("B", B, (batch, seqlen, ngroups, dstate), "batch, seqlen, ngroups, dstate")
    common.check_shape("C", C, (batch, seqlen, ngroups, dstate), "batch, seqlen, ngroups, dstate of B")
    for name, t in (("x", x), ("dt", dt), ("A", A), ("B", B), ("C", C), ("D", D), ("z", z), ("dt_bias", dt_bias),
                    ("initial_states", initial_states)):
        if t is not None:
            common.check_float(name, t)
    if z is not None:
        common.check_shape("z", z, tuple(x.shape), "batch, seqlen, nheads, headdim")
    if dt_bias is not None:
        common.check_shape("dt_bias", dt_bias, (nheads,), "nheads,")
    if initial_states is not None:
        common.check_shape("initial_states", initial_states, (batch, nheads, headdim, dstate),
                           "batch, nheads, headdim, dstate")
    common.expand_D(D, nheads, headdim)
    common.check_seq_idx(seq_idx, batch, seqlen)
    common.check_device(x.device, dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=dt_bias,
                        initial_states=initial_states, seq_idx=seq_idx)
    if len(dt_limit) != 2 or not dt_limit[0] <= dt_limit[1]:
        raise ValueError(f"ssd: dt_limit {dt_limit} must be (min, max) with min <= max")


def ssd_forward(
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
    dt_limit: tuple[float, float] = vocab.DT_LIMIT_NONE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward pipeline; returns (out, final_states). Shapes as `mamba_chunk_scan_combined`."""
    _check(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, dt_limit)
    out, final_states, _inter = _forward(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx,
                                         dt_softplus, dt_limit)
    return out, final_states


def _forward(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, chunk_size: int,
             D: torch.Tensor | None, z: torch.Tensor | None, dt_bias: torch.Tensor | None,
             initial_states: torch.Tensor | None, seq_idx: torch.Tensor | None, dt_softplus: bool,
             dt_limit: tuple[float, float]) -> tuple[torch.Tensor, torch.Tensor, SSDIntermediates]:
    """The checked forward; returns (out, final_states, intermediates). The intermediates are
    the backward's own (what `_recompute` gives for these inputs)."""
    # The dots take one dtype: B and C follow x (mamba-ssm mixes them; models pass one dtype).
    B, C = B.to(x.dtype), C.to(x.dtype)
    dA_cumsum, dt_out = chunk_cumsum._launch(dt, A, chunk_size, dt_bias, dt_softplus, dt_limit)
    # The states entering each chunk are rounded to the dots' dtype for F5 (as mamba-ssm);
    # the final state stays fp32.
    prev_states, final_states = chunk_state_passing._launch(B, x, dt_out, dA_cumsum, initial_states, seq_idx, x.dtype)
    cb = bmm._launch(C, B, chunk_size, seq_idx)
    out = chunk_scan._launch(x, cb, C, dt_out, dA_cumsum, prev_states, D, z, seq_idx)
    return out, final_states, SSDIntermediates(dA_cumsum, dt_out, prev_states, cb)


@dataclasses.dataclass
class SSDIntermediates:
    """What the backward recomputes from the inputs: F1's dA_cumsum and dt~, the states entering
    each chunk (F2 + F3, in x's dtype) and F4's C B^T."""

    dA_cumsum: torch.Tensor
    dt_out: torch.Tensor
    prev_states: torch.Tensor
    cb: torch.Tensor


def _recompute(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, Bx: torch.Tensor, Cx: torch.Tensor,
               chunk_size: int, dt_bias: torch.Tensor | None, initial_states: torch.Tensor | None,
               seq_idx: torch.Tensor | None, dt_softplus: bool, dt_limit: tuple[float, float],
               saved: SSDSaved | None = None) -> SSDIntermediates:
    """The intermediates for the backward: those in `saved` as they are, the others recomputed."""
    saved = saved or SSDSaved()
    if saved.dA_cumsum is not None and saved.dt_out is not None:
        dA_cumsum, dt_out = saved.dA_cumsum, saved.dt_out
    else:
        dA_cumsum, dt_out = chunk_cumsum._launch(dt, A, chunk_size, dt_bias, dt_softplus, dt_limit)
    prev_states = saved.prev_states
    if prev_states is None:
        prev_states, _ = chunk_state_passing._launch(Bx, x, dt_out, dA_cumsum, initial_states, seq_idx, x.dtype)
    cb = saved.cb if saved.cb is not None else bmm._launch(Cx, Bx, chunk_size, seq_idx)
    return SSDIntermediates(dA_cumsum, dt_out, prev_states, cb)


# The autograd forward keeps some of the intermediates its backward would recompute, within
# what mamba-ssm's `MambaChunkScanCombinedFn` keeps beyond the inputs (its output, or the
# output before the z gate, in x's dtype, and dA_cumsum in fp32): so the activations held
# between forward and backward are never larger than mamba-ssm's. Most time saved first:
# the states entering each chunk (F2 + F3, the dearest recompute), F1's dA_cumsum with dt~,
# F4's C B^T; each is kept if it still fits. At Nemotron-3 Nano's dims (dstate = chunk_size)
# the states are exactly the output's size, so they are kept and F1 and F4 are recomputed;
# at dstate 256, chunk 128 (Nemotron-H 47B) the states are twice the output and F1 and F4
# are kept instead. False: keep nothing (every intermediate recomputed, the earlier rule).
SAVE_INTERMEDIATES = True
_SAVE_ORDER = (("prev_states",), ("dA_cumsum", "dt_out"), ("cb",))


@dataclasses.dataclass
class SSDSaved:
    """The intermediates the autograd forward kept (see SAVE_INTERMEDIATES); None: recomputed."""

    dA_cumsum: torch.Tensor | None = None
    dt_out: torch.Tensor | None = None
    prev_states: torch.Tensor | None = None
    cb: torch.Tensor | None = None

    def tensors(self) -> tuple[torch.Tensor | None, ...]:
        return self.dA_cumsum, self.dt_out, self.prev_states, self.cb


def nbytes(t: torch.Tensor) -> int:
    """A tensor's size in memory (what the keep rule counts)."""
    return t.numel() * t.element_size()


def saved_for_backward(x: torch.Tensor, inter: SSDIntermediates) -> SSDSaved:
    """Which of the forward's intermediates the autograd forward keeps (SAVE_INTERMEDIATES)."""
    return keep_within(inter, nbytes(x) + nbytes(inter.dA_cumsum))  # mamba-ssm's output and dA_cumsum


def keep_within(inter: SSDIntermediates, budget: int) -> SSDSaved:
    """The intermediates to keep in at most `budget` bytes, most time saved first (none
    without SAVE_INTERMEDIATES)."""
    kept = SSDSaved()
    if not SAVE_INTERMEDIATES:
        return kept
    for names in _SAVE_ORDER:
        size = sum(nbytes(getattr(inter, n)) for n in names)
        if size <= budget:
            budget -= size
            for n in names:
                setattr(kept, n, getattr(inter, n))
    return kept


def ssd_recompute_forward(
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
    dt_limit: tuple[float, float] = vocab.DT_LIMIT_NONE,
    saved: SSDSaved | None = None,
) -> tuple[torch.Tensor, SSDIntermediates]:
    """The forward's output (as `ssd_forward`'s, F1 -> F2 + F3 -> F4 -> F5) with the intermediates
    that `ssd_backward` recomputes, for a backward that needs the SSD output too (the fused
    layer's norm): handing them to `ssd_backward(intermediates=...)` skips its recompute.
    saved: intermediates the forward kept (used as they are; the rest recomputed)."""
    _check(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, dt_limit)
    Bx, Cx = B.to(x.dtype), C.to(x.dtype)
    inter = _recompute(x, dt, A, Bx, Cx, chunk_size, dt_bias, initial_states, seq_idx, dt_softplus, dt_limit, saved)
    out = chunk_scan._launch(x, inter.cb, Cx, inter.dt_out, inter.dA_cumsum, inter.prev_states, D, z, seq_idx)
    return out, inter


def ssd_intermediates(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    chunk_size: int,
    dt_bias: torch.Tensor | None = None,
    initial_states: torch.Tensor | None = None,
    seq_idx: torch.Tensor | None = None,
    dt_softplus: bool = False,
    dt_limit: tuple[float, float] = vocab.DT_LIMIT_NONE,
    saved: SSDSaved | None = None,
) -> SSDIntermediates:
    """`ssd_recompute_forward`'s intermediates without the output (F1, F2 + F3, F4: those not in `saved`)."""
    return _recompute(x, dt, A, B.to(x.dtype), C.to(x.dtype), chunk_size, dt_bias, initial_states, seq_idx,
                      dt_softplus, dt_limit, saved)


def ssd_forward_with_intermediates(
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
    dt_limit: tuple[float, float] = vocab.DT_LIMIT_NONE,
) -> tuple[torch.Tensor, torch.Tensor, SSDIntermediates]:
    """`ssd_forward`, also returning the intermediates it computed on the way (bitwise those
    `ssd_recompute_forward` gives), for an autograd forward that keeps some."""
    _check(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, dt_limit)
    return _forward(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, dt_softplus, dt_limit)


def _check_outputs(x: torch.Tensor, dt: torch.Tensor, B: torch.Tensor, C: torch.Tensor, z: torch.Tensor | None,
                   **outs: torch.Tensor | None) -> None:
    """ValueError naming a given gradient buffer of `ssd_backward` that its kernels cannot write."""
    like = {"dx": x, "ddt": dt, "dB": B, "dC": C, "dz": z}
    for name, out in outs.items():
        if out is None:
            continue
        ref = like[name]
        if ref is None:
            raise ValueError(f"ssd backward: {name} given without its input")
        want = x.dtype if name in ("dB", "dC") else ref.dtype
        if tuple(out.shape) != tuple(ref.shape) or out.dtype != want or out.stride(-1) != 1:
            raise ValueError(f"ssd backward: {name} must be {tuple(ref.shape)} {want} with a unit last stride, got "
                             f"{tuple(out.shape)} {out.dtype} strides {out.stride()}")
        if out.device != x.device:
            raise ValueError(f"ssd backward: {name} is on {out.device}, x on {x.device}")
    if (outs.get("dB") is None) != (outs.get("dC") is None):
        raise ValueError("ssd backward: dB and dC are given together or not at all")


def ssd_backward(
    dy: torch.Tensor,
    dfinal_states: torch.Tensor | None,
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
    dt_limit: tuple[float, float] = vocab.DT_LIMIT_NONE,
    intermediates: SSDIntermediates | None = None,
    *,
    dx: torch.Tensor | None = None,
    ddt: torch.Tensor | None = None,
    dB: torch.Tensor | None = None,
    dC: torch.Tensor | None = None,
    dz: torch.Tensor | None = None,
) -> dict[str, torch.Tensor | None]:
    """Gradients of `ssd_forward`'s (out, final_states) for output gradients (dy, dfinal_states).

    intermediates: `ssd_recompute_forward`'s for these same inputs (None: recomputed here).
    dx, ddt, dB, dC, dz: where the kernels write those gradients (as mamba-ssm's
    `_mamba_chunk_scan_combined_bwd` takes them): each like its input (x, dt, B, C, z) in shape
    and dtype, with a unit last stride and any others (the fused layer hands in slices of its
    gradient buffers); dB and dC together, in x's dtype; None: new buffers.
    Returns {"x", "dt", "A", "B", "C", "D", "z", "dt_bias", "initial_states"}: each in its
    input's dtype and shape, None where the input is None.
    """
    _check(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, dt_limit)
    common.check_shape("dout", dy, tuple(x.shape), "batch, seqlen, nheads, headdim")
    _check_outputs(x, dt, B, C, z, dx=dx, ddt=ddt, dB=dB, dC=dC, dz=dz)
    dy = dy.to(x.dtype).contiguous()
    Bx, Cx = B.to(x.dtype), C.to(x.dtype)
    # The forward's intermediates (F1, F2 + F3, F4): handed in (the autograd forward's kept ones
    # completed by `_recompute`), or all recomputed from the inputs.
    inter = intermediates or _recompute(x, dt, A, Bx, Cx, chunk_size, dt_bias, initial_states, seq_idx, dt_softplus,
                                        dt_limit)
    dA_cumsum, dt_out, prev_states, cb = inter.dA_cumsum, inter.dt_out, inter.prev_states, inter.cb
    dstates, ddA_last, dinit = state_passing_bwd_launch(dy, z, Cx, dA_cumsum, prev_states, dfinal_states, seq_idx)
    dx, dz, rows, dD = chunk_scan_chunk_state_bwd_dx._launch(dy, z, x, Bx, Cx, cb, dt_out, dA_cumsum, prev_states,
                                                             dstates, D, seq_idx, dx, dz)
    # Without z the dx kernel leaves dout . y (rows[2]) and ddt~'s chunk term (in rows[0]) to it.
    dB, dC = dbdc_launch(dy, z, x, Bx, Cx, dt_out, dA_cumsum, prev_states, dstates, seq_idx,
                         rows if z is None else None, cb if z is None else None, dB, dC)
    ddt, dA, ddt_bias = chunk_cumsum_bwd._launch(rows, ddA_last, dt, A, dt_bias, dt_softplus, dt_limit, chunk_size,
                                                 ddt)
    if D is not None and dD is not None:
        dD = (dD.sum(-1) if D.dim() == 1 else dD).to(D.dtype)
    return {
        "x": dx, "dt": ddt, "A": dA.to(A.dtype), "B": dB.to(B.dtype), "C": dC.to(C.dtype), "D": dD,
        "z": dz, "dt_bias": None if dt_bias is None or ddt_bias is None else ddt_bias.to(dt_bias.dtype),
        "initial_states": None if initial_states is None else dinit.to(initial_states.dtype),
    }


class _MambaChunkScanCombined(torch.autograd.Function):
    """Autograd for the SSD: saves the inputs and, within what mamba-ssm saves beyond its inputs
    (the output and dA_cumsum), some of the intermediates the backward needs (SAVE_INTERMEDIATES)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                chunk_size: int, D: torch.Tensor | None, z: torch.Tensor | None, dt_bias: torch.Tensor | None,
                initial_states: torch.Tensor | None, seq_idx: torch.Tensor | None, dt_softplus: bool,
                dt_limit: tuple[float, float]) -> tuple[torch.Tensor, torch.Tensor]:
        out, final_states, inter = ssd_forward_with_intermediates(
            x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias, initial_states=initial_states, seq_idx=seq_idx,
            dt_softplus=dt_softplus, dt_limit=dt_limit)
        # Through save_for_backward (not ctx attributes), so saved-tensor hooks (offloading,
        # activation checkpointing) see the kept intermediates too.
        ctx.save_for_backward(x, dt, A, B, C, D, z, dt_bias, initial_states, seq_idx,
                              *saved_for_backward(x, inter).tensors())
        ctx.chunk_size, ctx.dt_softplus, ctx.dt_limit = chunk_size, dt_softplus, dt_limit
        # An unused final_states gets no gradient (None), not a tensor of zeros: the backward
        # then skips reading it, and its kernel key says has_dfinal=0, as the specs tune it.
        ctx.set_materialize_grads(False)
        return out, final_states

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor | None, dfinal: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        x, dt, A, B, C, D, z, dt_bias, initial_states, seq_idx, *kept = ctx.saved_tensors
        if x.is_cuda:
            # Autograd runs CUDA backwards on its own thread, where Triton's allocator (a
            # context variable Helion sets when a kernel's code loads, on the forward's thread)
            # is unset: kernels using TMA descriptors then fail to launch (seen on the H200).
            helion.runtime.set_triton_allocator()
        if dout is None:
            dout = torch.zeros_like(x)
        inter = ssd_intermediates(x, dt, A, B, C, ctx.chunk_size, dt_bias, initial_states, seq_idx, ctx.dt_softplus,
                                  ctx.dt_limit, SSDSaved(*kept))
        g = ssd_backward(dout, dfinal, x, dt, A, B, C, ctx.chunk_size, D=D, z=z, dt_bias=dt_bias,
                         initial_states=initial_states, seq_idx=seq_idx, dt_softplus=ctx.dt_softplus,
                         dt_limit=ctx.dt_limit, intermediates=inter)
        return (g["x"], g["dt"], g["A"], g["B"], g["C"], None, g["D"], g["z"], g["dt_bias"], g["initial_states"],
                None, None, None)


def mamba_chunk_scan_combined(
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
    cu_seqlens: torch.Tensor | None = None,
    dt_softplus: bool = False,
    dt_limit: tuple[float, float] = vocab.DT_LIMIT_NONE,
    return_final_states: bool = False,
    return_varlen_states: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """Mamba-2 SSD, drop-in for `mamba_ssm.ops.triton.ssd_combined.mamba_chunk_scan_combined` (with autograd).

    x: (batch, seqlen, nheads, headdim)
    dt: (batch, seqlen, nheads)
    A: (nheads,)
    B, C: (batch, seqlen, ngroups, dstate), ngroups dividing nheads
    chunk_size: a power of two >= 16 (seqlen need not be a multiple of it)
    D: (nheads,) or (nheads, headdim)
    z: (batch, seqlen, nheads, headdim): out *= silu(z)
    dt_bias: (nheads,); dt_softplus; dt_limit: dt~ = clamp(softplus(dt + dt_bias), *dt_limit)
    initial_states: (batch, nheads, headdim, dstate)
    seq_idx: (batch, seqlen) int, nondecreasing ids of packed sequences: the state resets
        where it changes (initial_states belongs to sequence 0)
    cu_seqlens: (num_sequences + 1,) int, read only with return_varlen_states (batch 1)
    Returns out (batch, seqlen, nheads, headdim) in x's dtype, then with return_final_states
    final_states (batch, nheads, headdim, dstate) fp32, then with return_varlen_states
    varlen_states (num_sequences, nheads, headdim, dstate) in x's dtype: each sequence's
    state at its end (see chunk_state_varlen.py).

    Differentiable in x, dt, A, B, C, D, z, dt_bias and initial_states (and through
    final_states); the backward is deterministic (bitwise equal across runs).
    """
    if return_varlen_states:
        chunk_state_varlen.check_varlen(x, cu_seqlens)
    tensors = (x, dt, A, B, C, D, z, dt_bias, initial_states)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        out, final_states = _MambaChunkScanCombined.apply(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states,
                                                          seq_idx, dt_softplus, dt_limit)
    else:
        out, final_states = ssd_forward(x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias,
                                        initial_states=initial_states, seq_idx=seq_idx, dt_softplus=dt_softplus,
                                        dt_limit=dt_limit)
    if not return_varlen_states:  # mamba-ssm ignores cu_seqlens then
        return (out, final_states) if return_final_states else out
    # mamba-ssm's backward refuses calls with return_varlen_states; here out and final_states
    # stay differentiable and varlen_states (inference prefill) carries no gradient.
    with torch.no_grad():
        varlen = chunk_state_varlen.varlen_states(x, dt, A, B, chunk_size, cu_seqlens, dt_bias=dt_bias,
                                                  initial_states=initial_states, seq_idx=seq_idx,
                                                  dt_softplus=dt_softplus, dt_limit=dt_limit)
    return (out, final_states, varlen) if return_final_states else (out, varlen)
