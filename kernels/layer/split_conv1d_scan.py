"""Mamba-2's fused layer, `mamba_split_conv1d_scan_combined` (mamba-ssm's `use_mem_eff_path=True`).

One call from the in_proj output to the out_proj output:
zxbcdt -> split [z0 x0 | z | xBC | dt] -> causal depthwise conv1d (+ SiLU) of xBC ->
split x, B, C -> SSD (`mamba_tune.ssd.combined`) -> gated RMSNorm with z (or the SSD's own
z gate when there is no norm weight) -> [SwiGLU(z0, x0) | y] -> out_proj (a torch GEMM).
The conv1d runs `mamba_tune.conv1d`, the SSD its stage kernels, the norm
`mamba_tune.norm.gated`; the split and the d_mlp SwiGLU are views and torch ops.

Memory: mamba-ssm's fused layer keeps its inputs, its SSD output and the norm's rstd between
forward and backward. Here the forward keeps its inputs (zxbcdt and the weights) and, in no
more bytes than mamba-ssm's SSD output and rstd, the SSD output where the backward needs it
(the norm's backward, out_proj's weight gradient) and then what fits of the SSD's
intermediates (`_keep`, with the rule of `mamba_tune.ssd.combined.SAVE_INTERMEDIATES`). The
backward recomputes the conv, the norm's statistics and output (inside the norm's backward, one
pass), and what was not kept of the SSD (the output: `ssd_recompute_forward`; F1-F4:
`ssd_intermediates`). Its transient buffers are freed stage by stage.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NoReturn

import helion
import torch
import torch.nn.functional as F

from mamba_tune import vocab
from mamba_tune.conv1d import conv1d_backward, conv1d_forward
from mamba_tune.norm import gated
from mamba_tune.ssd import combined
from mamba_tune.ssd.combined import (
    SSDIntermediates,
    SSDSaved,
    keep_within,
    nbytes,
    ssd_backward,
    ssd_forward_with_intermediates,
    ssd_intermediates,
    ssd_recompute_forward,
)

ACTIVATIONS = (None, "silu", "swish")


@dataclasses.dataclass(frozen=True)
class _Dims:
    batch: int
    seqlen: int
    nheads: int
    headdim: int
    ngroups: int
    dstate: int
    d_mlp: int  # mamba-ssm's d_nonssm: the SwiGLU part's width (z0 and x0 each)

    @property
    def dim(self) -> int:
        return self.nheads * self.headdim

    @property
    def conv_dim(self) -> int:
        return self.dim + 2 * self.ngroups * self.dstate

    @property
    def splits(self) -> list[int]:
        """zxbcdt's last dim as [z0 x0, z, xBC, dt]."""
        return [2 * self.d_mlp, self.dim, self.conv_dim, self.nheads]


def _fail(message: str) -> NoReturn:
    raise ValueError(f"mamba_split_conv1d_scan_combined: {message}")


def _dims(zxbcdt: torch.Tensor, conv1d_weight: torch.Tensor, conv1d_bias: torch.Tensor | None,
          dt_bias: torch.Tensor, A: torch.Tensor, D: torch.Tensor, headdim: int | None, ngroups: int,
          activation: str | None, rmsnorm_weight: torch.Tensor | None, outproj_weight: torch.Tensor | None,
          outproj_bias: torch.Tensor | None) -> _Dims:
    """The layer's sizes from its arguments, or ValueError naming the sizes that disagree."""
    if zxbcdt.dim() != 3 or 0 in zxbcdt.shape:
        _fail(f"zxbcdt must be a non-empty (batch, seqlen, d_in_proj), got shape {tuple(zxbcdt.shape)}")
    if not vocab.is_float(zxbcdt.dtype):
        _fail(f"zxbcdt dtype {zxbcdt.dtype} is not one of fp32, fp16, bf16")
    batch, seqlen, d_in_proj = zxbcdt.shape
    if D.dim() == 1:
        if headdim is None:
            _fail(f"D is per head {tuple(D.shape)}: pass headdim")
        nheads = D.shape[0]
    elif D.dim() == 2:
        nheads = D.shape[0]
        if headdim is not None and headdim != D.shape[1]:
            _fail(f"headdim={headdim} != D's (nheads, headdim) = {tuple(D.shape)}")
        headdim = D.shape[1]
    else:
        _fail(f"D must be (nheads,) or (nheads, headdim), got shape {tuple(D.shape)}")
    if headdim <= 0 or nheads <= 0:
        _fail(f"nheads={nheads} and headdim={headdim} must be positive")
    if ngroups <= 0 or nheads % ngroups:
        _fail(f"ngroups={ngroups} does not divide nheads={nheads}")
    dim = nheads * headdim
    if conv1d_weight.dim() != 2:
        _fail(f"conv1d_weight must be (dim + 2 * ngroups * dstate, width), got shape {tuple(conv1d_weight.shape)}")
    conv_dim = conv1d_weight.shape[0]
    if conv_dim <= dim or (conv_dim - dim) % (2 * ngroups):
        _fail(f"conv1d_weight's {conv_dim} channels != dim {dim} + 2 * ngroups {ngroups} * dstate")
    dstate = (conv_dim - dim) // (2 * ngroups)
    rest = d_in_proj - 2 * dim - 2 * ngroups * dstate - nheads
    if rest < 0 or rest % 2:
        _fail(f"zxbcdt's last dim {d_in_proj} != 2 * d_mlp + 2 * dim {dim} + 2 * ngroups {ngroups} * dstate "
              f"{dstate} + nheads {nheads} for any d_mlp >= 0")
    if conv1d_bias is not None and tuple(conv1d_bias.shape) != (conv_dim,):
        _fail(f"conv1d_bias shape {tuple(conv1d_bias.shape)} != ({conv_dim},)")
    if tuple(dt_bias.shape) != (nheads,):
        _fail(f"dt_bias shape {tuple(dt_bias.shape)} != (nheads,) = ({nheads},)")
    if tuple(A.shape) != (nheads,):
        _fail(f"A shape {tuple(A.shape)} != (nheads,) = ({nheads},)")
    if activation not in ACTIVATIONS:
        _fail(f"activation {activation!r} is not one of {ACTIVATIONS}")
    if rmsnorm_weight is not None and tuple(rmsnorm_weight.shape) != (dim,):
        _fail(f"rmsnorm_weight shape {tuple(rmsnorm_weight.shape)} != (dim,) = ({dim},)")
    d_mlp = rest // 2
    if outproj_weight is not None:
        if outproj_weight.dim() != 2 or outproj_weight.shape[1] != d_mlp + dim:
            _fail(f"outproj_weight shape {tuple(outproj_weight.shape)} != (out_dim, d_mlp + dim) with "
                  f"d_mlp + dim = {d_mlp + dim}")
        if outproj_bias is not None and tuple(outproj_bias.shape) != (outproj_weight.shape[0],):
            _fail(f"outproj_bias shape {tuple(outproj_bias.shape)} != (out_dim,) = ({outproj_weight.shape[0]},)")
    elif outproj_bias is not None:
        _fail("outproj_bias without outproj_weight")
    return _Dims(batch, seqlen, nheads, headdim, ngroups, dstate, d_mlp)


def _swiglu(zx0: torch.Tensor) -> torch.Tensor:
    """silu(z0) * x0 in fp32, rounded to zx0's dtype (mamba-ssm's _swiglu_fwd)."""
    z0, x0 = zx0.float().chunk(2, dim=-1)
    return (F.silu(z0) * x0).to(zx0.dtype)


def _swiglu_bwd(zx0: torch.Tensor, dout: torch.Tensor, dzx0: torch.Tensor) -> None:
    """d(z0, x0) of silu(z0) * x0, fp32 math, written into dzx0 (like zx0) in its dtype."""
    z0, x0 = zx0.float().chunk(2, dim=-1)
    g = dout.float()
    s = torch.sigmoid(z0)
    dz0_out, dx0_out = dzx0.chunk(2, dim=-1)
    dz0_out.copy_(g * x0 * s * (1 + z0 * (1 - s)))
    dx0_out.copy_(g * z0 * s)


def _conv(xBC: torch.Tensor, conv1d_weight: torch.Tensor, conv1d_bias: torch.Tensor | None,
          seq_idx: torch.Tensor | None, silu: bool) -> torch.Tensor:
    """The causal depthwise conv1d of xBC (batch, seqlen, conv_dim), as (batch, seqlen, conv_dim)."""
    # xBC is a column slice of zxbcdt: as (batch, conv_dim, seqlen) it is channel-last.
    return conv1d_forward(xBC.transpose(1, 2), conv1d_weight, conv1d_bias, seq_idx, None, None, silu).transpose(1, 2)


def _ssd_inputs(dims: _Dims, xBC_conv: torch.Tensor, z: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """x (b, l, h, p), B and C (b, l, g, n), z (b, l, h, p): views of the conv output and of zxbcdt."""
    x, B, C = torch.split(xBC_conv, [dims.dim, dims.ngroups * dims.dstate, dims.ngroups * dims.dstate], dim=-1)
    lead = (dims.batch, dims.seqlen)
    return (x.unflatten(-1, (dims.nheads, dims.headdim)), B.unflatten(-1, (dims.ngroups, dims.dstate)),
            C.unflatten(-1, (dims.ngroups, dims.dstate)), z.reshape(*lead, dims.nheads, dims.headdim))


@dataclasses.dataclass
class _Options:
    chunk_size: int
    dt_limit: tuple[float, float]
    silu: bool
    rmsnorm_eps: float
    norm_before_gate: bool


def _norm(dims: _Dims, opts: _Options, y: torch.Tensor, z: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The gated RMSNorm of the SSD output y (b, l, dim) with z, in ngroups groups: out (b, l, dim)."""
    gs = dims.dim // dims.ngroups
    gated._check_inputs(y, weight, None, z, gs)
    out, _, _ = gated._fwd(gated._rows(y), gated._rows(z), weight.contiguous(), None, opts.rmsnorm_eps, gs,
                           opts.norm_before_gate, True)
    return out.view(dims.batch, dims.seqlen, dims.dim)


def _autocast_dtype(device: torch.device) -> torch.dtype | None:
    return torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else None


def _out_proj(out: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
              autocast: torch.dtype | None) -> torch.Tensor:
    if weight is None:
        return out
    if autocast is not None:  # as mamba-ssm: the GEMM in the autocast dtype
        out, weight = out.to(autocast), weight.to(autocast)
        bias = None if bias is None else bias.to(autocast)
    return F.linear(out, weight, bias)


def split_conv1d_scan_forward(
    zxbcdt: torch.Tensor, conv1d_weight: torch.Tensor, conv1d_bias: torch.Tensor | None, dt_bias: torch.Tensor,
    A: torch.Tensor, D: torch.Tensor, chunk_size: int, initial_states: torch.Tensor | None = None,
    seq_idx: torch.Tensor | None = None, dt_limit: tuple[float, float] = vocab.DT_LIMIT_NONE,
    activation: str | None = "silu", rmsnorm_weight: torch.Tensor | None = None, rmsnorm_eps: float = 1e-6,
    outproj_weight: torch.Tensor | None = None, outproj_bias: torch.Tensor | None = None,
    headdim: int | None = None, ngroups: int = 1, norm_before_gate: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward without autograd; returns (out, final_states). Arguments as `mamba_split_conv1d_scan_combined`."""
    dims = _dims(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, headdim, ngroups, activation, rmsnorm_weight,
                 outproj_weight, outproj_bias)
    opts = _Options(chunk_size, tuple(dt_limit), activation is not None, rmsnorm_eps, norm_before_gate)
    out, final_states, _y, _inter = _forward(dims, opts, zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D,
                                             initial_states, seq_idx, rmsnorm_weight, outproj_weight, outproj_bias,
                                             _autocast_dtype(zxbcdt.device))
    return out, final_states


def _forward(dims: _Dims, opts: _Options, zxbcdt: torch.Tensor, conv1d_weight: torch.Tensor,
             conv1d_bias: torch.Tensor | None, dt_bias: torch.Tensor, A: torch.Tensor, D: torch.Tensor,
             initial_states: torch.Tensor | None, seq_idx: torch.Tensor | None,
             rmsnorm_weight: torch.Tensor | None, outproj_weight: torch.Tensor | None,
             outproj_bias: torch.Tensor | None, autocast: torch.dtype | None
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, SSDIntermediates]:
    """Returns (out, final_states, the SSD output y (batch, seqlen, dim) before the norm, the SSD's intermediates)."""
    zx0, z, xBC, dt = torch.split(zxbcdt, dims.splits, dim=-1)
    xBC_conv = _conv(xBC, conv1d_weight, conv1d_bias, seq_idx, opts.silu)
    x, B, C, z4 = _ssd_inputs(dims, xBC_conv, z)
    y4, final_states, inter = ssd_forward_with_intermediates(
        x, dt, A, B, C, opts.chunk_size, D=D, z=z4 if rmsnorm_weight is None else None, dt_bias=dt_bias,
        initial_states=initial_states, seq_idx=seq_idx, dt_softplus=True, dt_limit=opts.dt_limit)
    del xBC_conv, x, B, C
    y = out = y4.reshape(dims.batch, dims.seqlen, dims.dim)
    if rmsnorm_weight is not None:
        out = _norm(dims, opts, out, z, rmsnorm_weight)
    if dims.d_mlp > 0:
        out = torch.cat([_swiglu(zx0), out], dim=-1)
    return _out_proj(out, outproj_weight, outproj_bias, autocast), final_states, y, inter


@dataclasses.dataclass
class _Kept:
    """What the autograd forward keeps beyond the inputs (None: recomputed in the backward)."""

    y: torch.Tensor | None = None  # the SSD output (batch, seqlen, dim), before the norm
    ssd: SSDSaved = dataclasses.field(default_factory=SSDSaved)


def _keep(dims: _Dims, y: torch.Tensor, inter: SSDIntermediates, rmsnorm_weight: torch.Tensor | None,
          outproj_weight: torch.Tensor | None) -> _Kept:
    """Keep, within the bytes mamba-ssm's fused layer keeps beyond its inputs (its SSD output
    `out_x` (batch, seqlen, dim) and, with the norm, rstd (batch * seqlen * ngroups fp32)), the
    SSD output where the backward needs it (the norm's backward, out_proj's weight gradient:
    it saves F5's recompute), then the SSD's intermediates as `mamba_chunk_scan_combined` keeps
    them (ssd.combined.SAVE_INTERMEDIATES; none when that is off)."""
    if not combined.SAVE_INTERMEDIATES:
        return _Kept()
    budget = nbytes(y)
    if rmsnorm_weight is not None:
        budget += dims.batch * dims.seqlen * dims.ngroups * 4
    kept = _Kept()
    if rmsnorm_weight is not None or outproj_weight is not None:
        kept.y = y
        budget -= nbytes(y)
    kept.ssd = keep_within(inter, budget)
    return kept


def _head_backward(dims: _Dims, opts: _Options, dout: torch.Tensor, y: torch.Tensor | None, z: torch.Tensor,
                   zx0: torch.Tensor, rmsnorm_weight: torch.Tensor | None, outproj_weight: torch.Tensor | None,
                   outproj_bias: torch.Tensor | None, autocast: torch.dtype | None, dzx0: torch.Tensor,
                   dz_out: torch.Tensor, grads: dict[str, torch.Tensor | None]) -> torch.Tensor:
    """The backward through the layer's head (gated norm, SwiGLU part, out_proj) from dout to the
    SSD: out_proj's and the norm's weight gradients into grads, d(z0, x0) into dzx0 and, with the
    norm, dz into dz_out (its slice of the gradient buffer). Returns dy (..., dim) in zxbcdt's
    dtype: the gradient of the norm's input y with the norm, of the SSD's z-gated output without.
    y: the SSD output (batch, seqlen, dim); None when neither the norm nor out_proj is there.
    The norm's backward recomputes its statistics and, for out_proj's weight gradient, its output
    in the same pass (mamba-ssm's `recompute_output`): out_proj's input gradient comes first."""
    dlin = weight = None
    if outproj_weight is not None:
        weight = outproj_weight if autocast is None else outproj_weight.to(autocast)
        dlin = dout.to(weight.dtype)
        if outproj_bias is not None:
            grads["outproj_bias"] = dlin.sum(dim=(0, 1)).to(outproj_bias.dtype)
        dout = F.linear(dlin, weight.t())
    dout = dout.to(z.dtype)
    if dims.d_mlp > 0:
        _swiglu_bwd(zx0, dout[..., :dims.d_mlp], dzx0)
    dy = dout[..., dims.d_mlp:]
    del dout
    gated_out = y
    if rmsnorm_weight is not None:
        # The norm's backward on the SSD output y (its inputs were checked in the forward), its
        # output (out_proj's input) written on the way.
        assert y is not None
        rows = dims.batch * dims.seqlen
        gated_out = None if outproj_weight is None else y.new_empty(dims.batch, dims.seqlen, dims.dim)
        dy, _dz, dw, _ = gated._bwd(gated._rows(dy), gated._rows(y), gated._rows(z), rmsnorm_weight.contiguous(), None,
                                    None, None, dims.dim // dims.ngroups, opts.norm_before_gate, True,
                                    dz2=dz_out.reshape(rows, dims.dim),
                                    out2=None if gated_out is None else gated_out.view(rows, dims.dim),
                                    eps=opts.rmsnorm_eps)
        grads["rmsnorm_weight"] = dw.to(rmsnorm_weight.dtype)
    if outproj_weight is not None:
        assert gated_out is not None and weight is not None and dlin is not None
        lin_in = gated_out if dims.d_mlp == 0 else torch.cat([_swiglu(zx0), gated_out], dim=-1)
        del gated_out
        grads["outproj_weight"] = torch.einsum("bso,bsd->od", dlin, lin_in.to(weight.dtype)).to(outproj_weight.dtype)
        del lin_in
    return dy


def split_conv1d_scan_backward(
    dout: torch.Tensor, dfinal_states: torch.Tensor | None, zxbcdt: torch.Tensor, conv1d_weight: torch.Tensor,
    conv1d_bias: torch.Tensor | None, dt_bias: torch.Tensor, A: torch.Tensor, D: torch.Tensor, chunk_size: int,
    initial_states: torch.Tensor | None = None, seq_idx: torch.Tensor | None = None,
    dt_limit: tuple[float, float] = vocab.DT_LIMIT_NONE, activation: str | None = "silu",
    rmsnorm_weight: torch.Tensor | None = None, rmsnorm_eps: float = 1e-6,
    outproj_weight: torch.Tensor | None = None, outproj_bias: torch.Tensor | None = None,
    headdim: int | None = None, ngroups: int = 1, norm_before_gate: bool = True,
) -> dict[str, torch.Tensor | None]:
    """Gradients of `split_conv1d_scan_forward`'s (out, final_states) for (dout, dfinal_states).

    Returns {"zxbcdt", "conv1d_weight", "conv1d_bias", "dt_bias", "A", "D", "initial_states",
    "rmsnorm_weight", "outproj_weight", "outproj_bias"}, each like its input, None where it is None.
    """
    dims = _dims(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, headdim, ngroups, activation, rmsnorm_weight,
                 outproj_weight, outproj_bias)
    opts = _Options(chunk_size, tuple(dt_limit), activation is not None, rmsnorm_eps, norm_before_gate)
    return _backward(dims, opts, dout, dfinal_states, zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D,
                     initial_states, seq_idx, rmsnorm_weight, outproj_weight, outproj_bias,
                     _autocast_dtype(zxbcdt.device))


def _backward(dims: _Dims, opts: _Options, dout: torch.Tensor, dfinal_states: torch.Tensor | None,
              zxbcdt: torch.Tensor, conv1d_weight: torch.Tensor, conv1d_bias: torch.Tensor | None,
              dt_bias: torch.Tensor, A: torch.Tensor, D: torch.Tensor, initial_states: torch.Tensor | None,
              seq_idx: torch.Tensor | None, rmsnorm_weight: torch.Tensor | None,
              outproj_weight: torch.Tensor | None, outproj_bias: torch.Tensor | None,
              autocast: torch.dtype | None, kept: _Kept | None = None) -> dict[str, torch.Tensor | None]:
    kept = kept or _Kept()
    b, s = dims.batch, dims.seqlen
    out_dim = dims.d_mlp + dims.dim if outproj_weight is None else outproj_weight.shape[0]
    if tuple(dout.shape) != (b, s, out_dim):
        _fail(f"dout shape {tuple(dout.shape)} != (batch, seqlen, out_dim) = {(b, s, out_dim)}")
    zx0, z, xBC, dt = torch.split(zxbcdt, dims.splits, dim=-1)
    # The kernels write every gradient into its slice of the one buffer autograd returns (dz by
    # the norm's backward or the SSD's, ddt by the SSD's, dxBC by the conv's), as mamba-ssm's
    # fused backward does; the SSD's dx, dB and dC go into one (batch, seqlen, conv_dim)
    # buffer, the conv backward's output gradient.
    dzxbcdt = torch.empty_like(zxbcdt)
    dzx0, dz_out, dxBC_out, ddt_out = torch.split(dzxbcdt, dims.splits, dim=-1)
    dxBC_conv = torch.empty((b, s, dims.conv_dim), dtype=zxbcdt.dtype, device=zxbcdt.device)
    dx_out, dB_out, dC_out = _ssd_inputs(dims, dxBC_conv, z)[:3]
    grads: dict[str, torch.Tensor | None] = {"conv1d_bias": None, "rmsnorm_weight": None, "outproj_weight": None,
                                             "outproj_bias": None}

    # Recompute the conv (its output is not kept), then, where the norm's backward or out_proj's
    # weight gradient needs them, the SSD output (unless kept) and the norm: the SSD
    # intermediates recomputed on the way (those not kept) serve the SSD backward too.
    xBC_conv = _conv(xBC, conv1d_weight, conv1d_bias, seq_idx, opts.silu)
    x, B, C, z4 = _ssd_inputs(dims, xBC_conv, z)
    y = None
    ssd_kw: dict[str, Any] = {"dt_bias": dt_bias, "initial_states": initial_states, "seq_idx": seq_idx,
                              "dt_softplus": True, "dt_limit": opts.dt_limit, "saved": kept.ssd}
    if (outproj_weight is not None or rmsnorm_weight is not None) and kept.y is None:
        y4, inter = ssd_recompute_forward(x, dt, A, B, C, opts.chunk_size, D=D,
                                          z=z4 if rmsnorm_weight is None else None, **ssd_kw)
        y = y4.reshape(b, s, dims.dim)
        del y4
    else:
        y = kept.y
        inter = ssd_intermediates(x, dt, A, B, C, opts.chunk_size, **ssd_kw)
    dy = _head_backward(dims, opts, dout, y, z, zx0, rmsnorm_weight, outproj_weight, outproj_bias, autocast,
                        dzx0, dz_out, grads).reshape(b, s, dims.nheads, dims.headdim)
    y = None  # the head's backward was its last reader
    # Without the norm, z gates the SSD output: the SSD's backward writes dz.
    g = ssd_backward(dy, dfinal_states, x, dt, A, B, C, opts.chunk_size, D=D,
                     z=z4 if rmsnorm_weight is None else None, dt_bias=dt_bias, initial_states=initial_states,
                     seq_idx=seq_idx, dt_softplus=True, dt_limit=opts.dt_limit, intermediates=inter,
                     dx=dx_out, ddt=ddt_out, dB=dB_out, dC=dC_out,
                     dz=dz_out.unflatten(-1, (dims.nheads, dims.headdim)) if rmsnorm_weight is None else None)
    del dy
    del xBC_conv, x, B, C, inter
    del dx_out, dB_out, dC_out
    grads.update({"dt_bias": g["dt_bias"], "A": g["A"], "D": g["D"], "initial_states": g["initial_states"]})
    del g
    dxBC, dweight, dbias, _ = conv1d_backward(xBC.transpose(1, 2), conv1d_weight, conv1d_bias,
                                              dxBC_conv.transpose(1, 2), seq_idx, None, None,
                                              dxBC_out.transpose(1, 2), False, opts.silu)
    if dxBC.data_ptr() != dxBC_out.data_ptr() or dxBC.stride() != dxBC_out.transpose(1, 2).stride():
        dxBC_out.copy_(dxBC.transpose(1, 2))
    grads.update({"zxbcdt": dzxbcdt, "conv1d_weight": dweight.to(conv1d_weight.dtype),
                  "conv1d_bias": None if conv1d_bias is None or dbias is None else dbias.to(conv1d_bias.dtype)})
    return grads


class _MambaSplitConv1dScanCombined(torch.autograd.Function):
    """Autograd for the layer: saves the inputs and, within the bytes mamba-ssm keeps beyond its
    inputs, the SSD output and intermediates (`_keep`); recomputes the rest in the backward."""

    @staticmethod
    def forward(ctx: Any, zxbcdt: torch.Tensor, conv1d_weight: torch.Tensor, conv1d_bias: torch.Tensor | None,
                dt_bias: torch.Tensor, A: torch.Tensor, D: torch.Tensor, initial_states: torch.Tensor | None,
                seq_idx: torch.Tensor | None, rmsnorm_weight: torch.Tensor | None,
                outproj_weight: torch.Tensor | None, outproj_bias: torch.Tensor | None, dims: _Dims,
                opts: _Options) -> tuple[torch.Tensor, torch.Tensor]:
        autocast = _autocast_dtype(zxbcdt.device)
        out, final_states, y, inter = _forward(dims, opts, zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D,
                                               initial_states, seq_idx, rmsnorm_weight, outproj_weight, outproj_bias,
                                               autocast)
        kept = _keep(dims, y, inter, rmsnorm_weight, outproj_weight)
        del y, inter
        ctx.save_for_backward(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, initial_states, seq_idx,
                              rmsnorm_weight, outproj_weight, outproj_bias, kept.y, *kept.ssd.tensors())
        ctx.dims, ctx.opts, ctx.autocast = dims, opts, autocast
        # An unused final_states gets no gradient (None), as in mamba_tune.ssd.combined.
        ctx.set_materialize_grads(False)
        return out, final_states

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor | None, dfinal: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        (zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, initial_states, seq_idx, rmsnorm_weight, outproj_weight,
         outproj_bias, y, *ssd_kept) = ctx.saved_tensors
        if zxbcdt.is_cuda:
            # Autograd's CUDA backward thread has no Triton allocator set (see mamba_tune.ssd.combined).
            helion.runtime.set_triton_allocator()
        dims: _Dims = ctx.dims
        if dout is None:
            out_dim = dims.d_mlp + dims.dim if outproj_weight is None else outproj_weight.shape[0]
            dtype = zxbcdt.dtype if outproj_weight is None else (ctx.autocast or outproj_weight.dtype)
            dout = zxbcdt.new_zeros(dims.batch, dims.seqlen, out_dim, dtype=dtype)
        g = _backward(dims, ctx.opts, dout, dfinal, zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D,
                      initial_states, seq_idx, rmsnorm_weight, outproj_weight, outproj_bias, ctx.autocast,
                      _Kept(y, SSDSaved(*ssd_kept)))
        return (g["zxbcdt"], g["conv1d_weight"], g["conv1d_bias"], g["dt_bias"], g["A"], g["D"], g["initial_states"],
                None, g["rmsnorm_weight"], g["outproj_weight"], g["outproj_bias"], None, None)


def mamba_split_conv1d_scan_combined(
    zxbcdt: torch.Tensor,
    conv1d_weight: torch.Tensor,
    conv1d_bias: torch.Tensor | None,
    dt_bias: torch.Tensor,
    A: torch.Tensor,
    D: torch.Tensor,
    chunk_size: int,
    initial_states: torch.Tensor | None = None,
    seq_idx: torch.Tensor | None = None,
    dt_limit: tuple[float, float] = vocab.DT_LIMIT_NONE,
    return_final_states: bool = False,
    activation: str | None = "silu",
    rmsnorm_weight: torch.Tensor | None = None,
    rmsnorm_eps: float = 1e-6,
    outproj_weight: torch.Tensor | None = None,
    outproj_bias: torch.Tensor | None = None,
    headdim: int | None = None,
    ngroups: int = 1,
    norm_before_gate: bool = True,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Mamba-2's layer from in_proj's output, drop-in for mamba-ssm's
    `mamba_ssm.ops.triton.ssd_combined.mamba_split_conv1d_scan_combined` (with autograd).

    zxbcdt: (batch, seqlen, 2 * d_mlp + 2 * dim + 2 * ngroups * dstate + nheads), dim = nheads * headdim:
        [z0 x0 (SwiGLU, d_mlp each) | z (dim) | xBC (dim + 2 * ngroups * dstate) | dt (nheads)]
    conv1d_weight: (dim + 2 * ngroups * dstate, width); conv1d_bias: (same,) or None
    dt_bias: (nheads,); A: (nheads,); D: (nheads,) (then pass headdim) or (nheads, headdim)
    chunk_size: the SSD's, a power of two >= 16
    initial_states: (batch, nheads, headdim, dstate)
    seq_idx: (batch, seqlen) int32, nondecreasing ids of packed sequences: the conv and the SSD state reset
        where it changes
    dt_limit: dt~ = clamp(softplus(dt + dt_bias), *dt_limit)
    activation: "silu" / "swish" (SiLU after the conv) or None
    rmsnorm_weight: (dim,): y = RMSNorm(y) * silu(z) if norm_before_gate else RMSNorm(y * silu(z)), in groups of
        dim // ngroups; None: y * silu(z) inside the SSD, no norm
    outproj_weight: (out_dim, d_mlp + dim); outproj_bias: (out_dim,) (only with outproj_weight)
    Returns out (batch, seqlen, out_dim) (out_dim = d_mlp + dim without outproj_weight), then with
    return_final_states the SSD's final_states (batch, nheads, headdim, dstate) fp32.

    Differentiable in zxbcdt, the conv weight and bias, dt_bias, A, D, initial_states, rmsnorm_weight and the
    out_proj weight and bias (and through final_states).
    """
    dims = _dims(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, headdim, ngroups, activation, rmsnorm_weight,
                 outproj_weight, outproj_bias)
    opts = _Options(chunk_size, tuple(dt_limit), activation is not None, rmsnorm_eps, norm_before_gate)
    tensors = (zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, initial_states, rmsnorm_weight, outproj_weight,
               outproj_bias)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        out, final_states = _MambaSplitConv1dScanCombined.apply(
            zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, initial_states, seq_idx, rmsnorm_weight,
            outproj_weight, outproj_bias, dims, opts)
    else:
        out, final_states, _y, _inter = _forward(dims, opts, zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D,
                                                 initial_states, seq_idx, rmsnorm_weight, outproj_weight,
                                                 outproj_bias, _autocast_dtype(zxbcdt.device))
    return (out, final_states) if return_final_states else out
