"""Gated RMSNorm / LayerNorm (mamba-ssm `layernorm_gated`): forward and backward in Helion.

Order: Helion kernels -> host launchers (shape and dtype checks) -> autograd Function ->
public functions and modules -> the runtime declarations (key dims, default configs; the
tuner's records for these kernels are in `autotune_cli/tuning/norm.py`). Layout inside the kernels: x viewed as (rows, ngroups,
group_size), so whole-row norms are ngroups == 1 and grouped norms need no index math.

The backward's parallelism is tuned, not derived from the SM count: `rows_per_program`
(a Helion block size) sets how many row groups run, each keeping one fp32 partial
dweight/dbias row per group. The kernel's host code sums the partials in a fixed order
(no atomics), so dweight has the same bits on every run, no output's shape depends on the
config (Helion's autotuner compares outputs across configs), and the search times the
reduction together with the main pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import helion
import helion.language as hl
import torch

from mamba_tune import keys, runtime, vocab


@helion.kernel(static_shapes=True, autotuner_fn=runtime.refuse_autotune)
def gated_norm_fwd_kernel(
    x: torch.Tensor,  # (rows, ngroups, group_size)
    z: torch.Tensor | None,  # like x
    weight: torch.Tensor,  # (ngroups, group_size)
    bias: torch.Tensor | None,  # like weight
    eps: float,
    norm_before_gate: hl.constexpr,
    is_rms_norm: hl.constexpr,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rows, ngroups, group_size = x.shape
    out = torch.empty_like(x)
    rstd = torch.empty([rows, ngroups], dtype=torch.float32, device=x.device)
    # LayerNorm only; RMS calls get rstd in its place (never read) and skip an allocation,
    # which counts at TP2's ~50 us calls, where both this and mamba-ssm are host-bound.
    mean = rstd
    if not is_rms_norm:
        mean = torch.empty([rows, ngroups], dtype=torch.float32, device=x.device)
    for tile_m, tile_g in hl.tile([rows, ngroups]):
        xv = x[tile_m, tile_g, :].to(torch.float32)
        if z is not None:
            zv = z[tile_m, tile_g, :].to(torch.float32)
            if not norm_before_gate:
                xv = xv * zv * torch.sigmoid(zv)
        if is_rms_norm:
            r = torch.rsqrt(torch.mean(xv * xv, dim=-1) + eps)
            xhat = xv * r[:, :, None]
        else:
            mu = torch.mean(xv, dim=-1)
            xc = xv - mu[:, :, None]
            r = torch.rsqrt(torch.mean(xc * xc, dim=-1) + eps)
            xhat = xc * r[:, :, None]
            mean[tile_m, tile_g] = mu
        y = xhat * weight[tile_g, :].to(torch.float32)[None, :, :]
        if bias is not None:
            y = y + bias[tile_g, :].to(torch.float32)[None, :, :]
        if z is not None:
            if norm_before_gate:
                y = y * zv * torch.sigmoid(zv)
        out[tile_m, tile_g, :] = y.to(out.dtype)
        rstd[tile_m, tile_g] = r
    return out, mean, rstd


@helion.kernel(static_shapes=True, autotuner_fn=runtime.refuse_autotune,
               ignore_warnings=[helion.exc.TensorOperationInWrapper])
def gated_norm_bwd_kernel(
    dy: torch.Tensor,  # (rows, ngroups, group_size)
    x: torch.Tensor,  # like dy
    z: torch.Tensor | None,  # like dy
    weight: torch.Tensor,  # (ngroups, group_size)
    bias: torch.Tensor | None,  # like weight
    mean: torch.Tensor | None,  # (rows, ngroups) fp32, LayerNorm only; with rstd
    rstd: torch.Tensor | None,  # (rows, ngroups) fp32; None: recomputed here from x (and z), with eps
    dz: torch.Tensor | None,  # like x (any row stride), written; with z
    out: torch.Tensor | None,  # like x, written: the forward's output, recomputed (None: not written)
    eps: float,  # read only where rstd is None
    norm_before_gate: hl.constexpr,
    is_rms_norm: hl.constexpr,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor | None]:
    rows, ngroups, group_size = x.shape
    # Rows per program: the tuned parallelism (mamba-ssm fixes it from the SM count).
    rows_per_program = hl.register_block_size(rows)
    nprog = (rows + rows_per_program - 1) // rows_per_program
    dx = torch.empty_like(x)
    dw_part = torch.empty([nprog, ngroups, group_size], dtype=torch.float32, device=x.device)
    db_part = torch.empty([nprog, ngroups, group_size], dtype=torch.float32, device=x.device) if bias is not None else None
    # dx, dz, and one fp32 partial dweight/dbias row per program.
    for tile_p, tile_g in hl.tile([rows, ngroups], block_size=[rows_per_program, None]):
        w = weight[tile_g, :].to(torch.float32)
        acc_dw = hl.zeros([tile_g, group_size], dtype=torch.float32)
        acc_db = hl.zeros([tile_g, group_size], dtype=torch.float32)
        for tile_m in hl.tile(tile_p.begin, tile_p.end):
            xv = x[tile_m, tile_g, :].to(torch.float32)
            dyv = dy[tile_m, tile_g, :].to(torch.float32)
            if z is not None:
                zv = z[tile_m, tile_g, :].to(torch.float32)
                sz = torch.sigmoid(zv)
                if not norm_before_gate:
                    x_og = xv
                    xv = x_og * zv * sz
            # The statistics as the forward computes them where they were not kept.
            if rstd is None:
                if is_rms_norm:
                    xc = xv
                else:
                    xc = xv - torch.mean(xv, dim=-1)[:, :, None]
                r = torch.rsqrt(torch.mean(xc * xc, dim=-1) + eps)[:, :, None]
                xhat = xc * r
            else:
                r = rstd[tile_m, tile_g][:, :, None]
                if is_rms_norm:
                    xhat = xv * r
                else:
                    xhat = (xv - mean[tile_m, tile_g][:, :, None]) * r
            y = xhat * w[None, :, :]
            if bias is not None:
                y = y + bias[tile_g, :].to(torch.float32)[None, :, :]
            if out is not None:
                if z is not None and norm_before_gate:
                    out[tile_m, tile_g, :] = (y * zv * sz).to(out.dtype)
                else:
                    out[tile_m, tile_g, :] = y.to(out.dtype)
            if z is not None:
                if norm_before_gate:
                    dz[tile_m, tile_g, :] = (dyv * y * sz * (1.0 + zv * (1.0 - sz))).to(dz.dtype)
                    dyv = dyv * zv * sz
            wdy = w[None, :, :] * dyv
            c1 = torch.sum(xhat * wdy, dim=-1) / group_size
            if is_rms_norm:
                dxv = (wdy - xhat * c1[:, :, None]) * r
            else:
                c2 = torch.sum(wdy, dim=-1) / group_size
                dxv = (wdy - (xhat * c1[:, :, None] + c2[:, :, None])) * r
            acc_dw = acc_dw + torch.sum(dyv * xhat, dim=0)
            if bias is not None:
                acc_db = acc_db + torch.sum(dyv, dim=0)
            if z is not None:
                if not norm_before_gate:
                    dz[tile_m, tile_g, :] = (dxv * x_og * sz * (1.0 + zv * (1.0 - sz))).to(dz.dtype)
                    dxv = dxv * zv * sz
            dx[tile_m, tile_g, :] = dxv.to(dx.dtype)
        dw_part[tile_p.id, tile_g, :] = acc_dw
        if bias is not None:
            db_part[tile_p.id, tile_g, :] = acc_db
    # Sum the partials in a fixed order (a plain torch reduction in the generated host
    # code, no atomics): the same bits on every run. Returning sums rather than partials
    # keeps every output's shape independent of the config (Helion's autotuner compares
    # outputs across configs), and the search times the reduction with the main pass.
    dw32 = dw_part.sum(0)
    db = dw32  # placeholder without a bias (Helion cannot merge None and a tensor here)
    if bias is not None:
        db = db_part.sum(0)
    return dx, dz, dw32.to(weight.dtype), db


# --- host launchers -------------------------------------------------------------------

def _check_inputs(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    z: torch.Tensor | None,
    group_size: int | None,
) -> int:
    if x.dim() < 1 or x.shape[-1] == 0 or x.numel() == 0:
        raise ValueError(f"gated norm: x must be a non-empty tensor (..., d), got shape {tuple(x.shape)}")
    d = x.shape[-1]
    if not vocab.is_float(x.dtype):
        raise ValueError(f"gated norm: x dtype {x.dtype} is not one of fp32, fp16, bf16")
    if weight.shape != (d,):
        raise ValueError(f"gated norm: weight shape {tuple(weight.shape)} != ({d},) (the last dim of x)")
    if not vocab.is_float(weight.dtype):
        raise ValueError(f"gated norm: weight dtype {weight.dtype} is not one of fp32, fp16, bf16")
    if bias is not None and (bias.shape != (d,) or not vocab.is_float(bias.dtype)):
        raise ValueError(f"gated norm: bias must be ({d},) float, got {tuple(bias.shape)} {bias.dtype}")
    if z is not None:
        if z.shape != x.shape:
            raise ValueError(f"gated norm: z shape {tuple(z.shape)} != x shape {tuple(x.shape)}")
        if z.dtype != x.dtype:
            raise ValueError(f"gated norm: z dtype {z.dtype} != x dtype {x.dtype}")
    for name, t in (("weight", weight), ("bias", bias), ("z", z)):
        if t is not None and t.device != x.device:
            raise ValueError(f"gated norm: {name} is on {t.device}, x is on {x.device}")
    gs = d if group_size is None else int(group_size)
    if gs <= 0 or d % gs != 0:
        raise ValueError(f"gated norm: group_size {group_size} does not divide d={d}")
    return gs


def _fwd(x2, z2, weight, bias, eps, group_size, norm_before_gate, is_rms_norm):
    rows, d = x2.shape
    g = d // group_size
    args = (
        x2.view(rows, g, group_size),
        None if z2 is None else z2.view(rows, g, group_size),
        weight.view(g, group_size),
        None if bias is None else bias.view(g, group_size),
        float(eps),
        bool(norm_before_gate),
        bool(is_rms_norm),
    )
    out, mean, rstd = runtime.run(GATED_NORM_FWD, args)
    return out.view(rows, d), (None if is_rms_norm else mean), rstd


def _bwd(dy2, x2, z2, weight, bias, mean, rstd, group_size, norm_before_gate, is_rms_norm, dz2=None, out2=None,
         eps=None):
    """dz2: where to write dz, (rows, d) with a unit last stride and any row stride (the fused
    layer's slice of its gradient buffer); None: a new buffer.
    rstd (and mean) None: the statistics are recomputed in the pass, with eps (as mamba-ssm's
    fused layer does not: it keeps them). out2: where to write the forward's output, recomputed
    in the same pass (mamba-ssm's `recompute_output`), (rows, d) contiguous; None: not written."""
    rows, d = x2.shape
    g = d // group_size
    v3 = (rows, g, group_size)
    if rstd is None and eps is None:
        raise ValueError("gated norm backward: without rstd, eps is needed to recompute it")
    if out2 is not None and (tuple(out2.shape) != (rows, d) or out2.dtype != x2.dtype or not out2.is_contiguous()):
        raise ValueError(f"gated norm backward: out must be ({rows}, {d}) {x2.dtype} contiguous, got "
                         f"{tuple(out2.shape)} {out2.dtype} strides {out2.stride()}")
    if z2 is not None and dz2 is None:
        dz2 = torch.empty((rows, d), dtype=x2.dtype, device=x2.device)
    args = (
        dy2.view(v3),
        x2.view(v3),
        None if z2 is None else z2.view(v3),
        weight.view(g, group_size),
        None if bias is None else bias.view(g, group_size),
        None if rstd is None else mean,
        rstd,
        None if z2 is None else dz2.view(v3),
        None if out2 is None else out2.view(v3),
        0.0 if eps is None else float(eps),
        bool(norm_before_gate),
        bool(is_rms_norm),
    )
    dx, dz, dw, db = runtime.run(GATED_NORM_BWD, args)
    db = None if bias is None else db.view(d).to(bias.dtype)
    return dx.view(rows, d), (None if dz is None else dz.view(rows, d)), dw.view(d), db


def _rows(t: torch.Tensor) -> torch.Tensor:
    """t (..., d) as (rows, d) with a contiguous last dim and any row stride, copied only if needed.

    Mamba-2 passes z as a column slice of its in_proj output (row stride 2 * d_inner +
    2 * ngroups * dstate + nheads): copying it cost more than the norm itself (0.42x of
    mamba-ssm on the H200). The kernels read rows at any stride (runtime keys on strides).
    """
    t2 = t.reshape(-1, t.shape[-1])  # a view wherever the leading dims collapse
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


# --- autograd -------------------------------------------------------------------------


class GatedNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, z, eps, group_size, norm_before_gate, is_rms_norm):
        gs = _check_inputs(x, weight, bias, z, group_size)
        shape = x.shape
        x2 = _rows(x)
        z2 = None if z is None else _rows(z)
        weight = weight.contiguous()
        bias = None if bias is None else bias.contiguous()
        out, mean, rstd = _fwd(x2, z2, weight, bias, eps, gs, norm_before_gate, is_rms_norm)
        ctx.save_for_backward(x2, weight, bias, mean, rstd, z2)
        ctx.shape, ctx.group_size = shape, gs
        ctx.norm_before_gate, ctx.is_rms_norm = norm_before_gate, is_rms_norm
        return out.view(shape)

    @staticmethod
    def backward(ctx, dy):
        x2, weight, bias, mean, rstd, z2 = ctx.saved_tensors
        dy2 = _rows(dy.to(x2.dtype))
        dx, dz, dw, db = _bwd(
            dy2, x2, z2, weight, bias, mean, rstd, ctx.group_size, ctx.norm_before_gate, ctx.is_rms_norm
        )
        dz = None if dz is None else dz.view(ctx.shape)
        return dx.view(ctx.shape), dw, db, dz, None, None, None, None


# --- public API (same signatures as mamba_ssm.ops.triton.layernorm_gated) -------------


def layernorm_fn(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    z: torch.Tensor | None = None,
    eps: float = 1e-6,
    group_size: int | None = None,
    norm_before_gate: bool = True,
    is_rms_norm: bool = False,
) -> torch.Tensor:
    """Gated LayerNorm/RMSNorm.

    x, z: (..., d); weight, bias: (d,); group_size divides d (None: the whole row).
    Returns norm(x) * silu(z) if norm_before_gate else norm(x * silu(z)), shaped like x.
    """
    return GatedNormFn.apply(x, weight, bias, z, eps, group_size, norm_before_gate, is_rms_norm)


def rmsnorm_fn(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    z: torch.Tensor | None = None,
    eps: float = 1e-6,
    group_size: int | None = None,
    norm_before_gate: bool = True,
) -> torch.Tensor:
    """Gated RMSNorm: `layernorm_fn(..., is_rms_norm=True)`."""
    return GatedNormFn.apply(x, weight, bias, z, eps, group_size, norm_before_gate, True)


class LayerNormGated(torch.nn.Module):
    """mamba_ssm.ops.triton.layernorm_gated.LayerNorm: weight and bias, optional z gate."""

    def __init__(self, hidden_size, eps=1e-5, group_size=None, norm_before_gate=True, device=None, dtype=None):
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.eps, self.group_size, self.norm_before_gate = eps, group_size, norm_before_gate
        self.weight = torch.nn.Parameter(torch.empty(hidden_size, **factory))
        self.bias = torch.nn.Parameter(torch.empty(hidden_size, **factory))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        torch.nn.init.ones_(self.weight)
        torch.nn.init.zeros_(self.bias)

    def forward(self, x, z=None):
        return layernorm_fn(x, self.weight, self.bias, z=z, group_size=self.group_size, eps=self.eps,
                            norm_before_gate=self.norm_before_gate)


class RMSNormGated(torch.nn.Module):
    """mamba_ssm.ops.triton.layernorm_gated.RMSNorm (imported as RMSNormGated by Mamba2)."""

    def __init__(self, hidden_size, eps=1e-5, group_size=None, norm_before_gate=True, device=None, dtype=None):
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.eps, self.group_size, self.norm_before_gate = eps, group_size, norm_before_gate
        self.weight = torch.nn.Parameter(torch.empty(hidden_size, **factory))
        self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        torch.nn.init.ones_(self.weight)

    def forward(self, x, z=None):
        return rmsnorm_fn(x, self.weight, self.bias, z=z, eps=self.eps, group_size=self.group_size,
                          norm_before_gate=self.norm_before_gate)


# --- runtime declarations --------------------------------------------------------------


def _fwd_dims_from_args(args: Sequence[Any]) -> dict[str, int]:
    x, z, w, b, _eps, nbg, rms = args
    rows, g, gs = x.shape
    return {"rows": rows, "d": g * gs, "group_size": gs, "has_z": int(z is not None), "norm_before_gate": int(nbg),
            "has_bias": int(b is not None), "is_rms": int(rms), "weight_fp32": int(w.dtype == torch.float32)}


def _bwd_dims_from_args(args: Sequence[Any]) -> dict[str, int]:
    dy, x, z, w, b, _mean, _rstd, _dz, _out, _eps, nbg, rms = args
    return _fwd_dims_from_args((x, z, w, b, 0.0, nbg, rms))


def _lanes(dims: dict[str, int]) -> int:
    """Register lanes one row of a group takes: the group size padded to a power of two."""
    return 1 << max(int(dims["group_size"]) - 1, 0).bit_length()


def _warps_for(elems: int, per_thread: int) -> int:
    """Warps (a power of two in 1..32) that give each thread about per_thread elements."""
    w = max(1, elems // (32 * per_thread))
    return min(32, 1 << (w.bit_length() - 1))


def fwd_config(dims: dict[str, int], rows: int, per_thread: int) -> dict[str, Any]:
    """A forward config: `rows` rows of one group per program (block_sizes = [rows per tile,
    groups per tile]), with warps for about `per_thread` elements of x (and z) per thread."""
    return {"block_sizes": [rows, 1], "num_warps": _warps_for(rows * _lanes(dims), per_thread)}


def bwd_config(dims: dict[str, int], rows_per_program: int, warps: int) -> dict[str, Any]:
    """A backward config (block_sizes = [rows_per_program, groups per program, rows per inner
    step]): at least `warps` warps, more for wide rows; the inner step and the warps follow
    the row width, about 16 elements of each row tensor per thread."""
    lanes = _lanes(dims)
    w = max(warps, _warps_for(lanes, 16))
    m = max(1, min(8, (32 * w * 16) // lanes))
    return {"block_sizes": [rows_per_program, 1, m], "num_warps": w}


def _fwd_default(dims: dict[str, int]) -> dict[str, Any]:
    # One row per program, 16 elements per thread: the first of the search's seeds.
    return fwd_config(dims, 1, 16)


def _bwd_default(dims: dict[str, int]) -> dict[str, Any]:
    # Helion's default steps 16 rows at a time (of up to 8 groups at once): at 47B's
    # 2048-wide groups that is 32768 fp32 values per row tensor in one 4-warp program,
    # which Triton compiled for minutes on the H200. 16 rows per program, 4+ warps: the
    # first of the search's seeds.
    return bwd_config(dims, 16, 4)


GATED_NORM_FWD = runtime.RuntimeKernel(
    key=keys.GATED_NORM_FWD,
    kernel=gated_norm_fwd_kernel,
    dims_from_args=_fwd_dims_from_args,
    default_config=_fwd_default,
)

GATED_NORM_BWD = runtime.RuntimeKernel(
    key=keys.GATED_NORM_BWD,
    kernel=gated_norm_bwd_kernel,
    dims_from_args=_bwd_dims_from_args,
    default_config=_bwd_default,
)

__all__ = ["layernorm_fn", "rmsnorm_fn", "RMSNormGated", "LayerNormGated", "GATED_NORM_FWD", "GATED_NORM_BWD"]
