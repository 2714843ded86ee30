"""The gated norm's backward in one pass that recomputes the forward: a candidate (untimed; see
experiments/README.md).

The fused layer's backward (`mamba_tune.layer.split_conv1d_scan._head_backward`) runs the norm's
forward again (`gated._fwd`: reads y and z, writes the normalized output and rstd) only for rstd
and for the output that out_proj's weight gradient reads, then the norm's backward (reads dy, y,
z, rstd; writes dx, dz). mamba-ssm's fused backward takes dy = dout @ W first, then one norm
backward with `recompute_output=True` that writes the output too, then the weight gradient.
`gated_norm_bwd_recompute_kernel` is that one pass: rstd from y (and z) in the forward's fp32 ops
and reduction, then dx, dz (into a given buffer, any row stride), fixed-order dweight/dbias
partials and the forward's output `out`. `installed()` makes the fused layer's backward take
that order; nothing in `mamba_tune` or `autotune_cli` imports this file. If it wins in the
training step on a GPU, it replaces `gated_norm_bwd_kernel` in `mamba_tune.norm.gated`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import helion
import helion.language as hl
import torch
import torch.nn.functional as F

from mamba_tune import keys, runtime
from mamba_tune.layer import split_conv1d_scan as layer
from mamba_tune.norm import gated


@helion.kernel(static_shapes=True, autotuner_fn=runtime.refuse_autotune,
               ignore_warnings=[helion.exc.TensorOperationInWrapper])
def gated_norm_bwd_recompute_kernel(
    dy: torch.Tensor,  # (rows, ngroups, group_size)
    x: torch.Tensor,  # like dy
    z: torch.Tensor | None,  # like dy
    weight: torch.Tensor,  # (ngroups, group_size)
    bias: torch.Tensor | None,  # like weight
    dz: torch.Tensor | None,  # like x (any row stride), written; with z
    eps: float,
    norm_before_gate: hl.constexpr,
    is_rms_norm: hl.constexpr,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor, torch.Tensor]:
    rows, ngroups, group_size = x.shape
    # The tiling and partials of gated_norm_bwd_kernel (the same config space but for the
    # per-load and per-store lists: its tuned configs' block sizes and warps apply here).
    rows_per_program = hl.register_block_size(rows)
    nprog = (rows + rows_per_program - 1) // rows_per_program
    dx = torch.empty_like(x)
    out = torch.empty_like(x)
    dw_part = torch.empty([nprog, ngroups, group_size], dtype=torch.float32, device=x.device)
    db_part = torch.empty([nprog, ngroups, group_size], dtype=torch.float32, device=x.device) if bias is not None else None
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
            # The forward's statistics, in gated_norm_fwd_kernel's fp32 ops and order.
            if is_rms_norm:
                r = torch.rsqrt(torch.mean(xv * xv, dim=-1) + eps)
                xhat = xv * r[:, :, None]
            else:
                mu = torch.mean(xv, dim=-1)
                xc = xv - mu[:, :, None]
                r = torch.rsqrt(torch.mean(xc * xc, dim=-1) + eps)
                xhat = xc * r[:, :, None]
            # The forward's output (what out_proj's weight gradient reads), then the backward
            # of gated_norm_bwd_kernel.
            y = xhat * w[None, :, :]
            if bias is not None:
                y = y + bias[tile_g, :].to(torch.float32)[None, :, :]
            if z is not None:
                if norm_before_gate:
                    dz[tile_m, tile_g, :] = (dyv * y * sz * (1.0 + zv * (1.0 - sz))).to(dz.dtype)
                    dyv = dyv * zv * sz
                    y = y * zv * sz
            out[tile_m, tile_g, :] = y.to(out.dtype)
            wdy = w[None, :, :] * dyv
            c1 = torch.sum(xhat * wdy, dim=-1) / group_size
            if is_rms_norm:
                dxv = (wdy - xhat * c1[:, :, None]) * r[:, :, None]
            else:
                c2 = torch.sum(wdy, dim=-1) / group_size
                dxv = (wdy - (xhat * c1[:, :, None] + c2[:, :, None])) * r[:, :, None]
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
    # The partials summed in a fixed order on the host side of the kernel, as in
    # gated_norm_bwd_kernel: the same bits on every run, shapes independent of the config.
    dw32 = dw_part.sum(0)
    db = dw32  # placeholder without a bias (Helion cannot merge None and a tensor here)
    if bias is not None:
        db = db_part.sum(0)
    return dx, dz, dw32.to(weight.dtype), db, out


# gated_norm_bwd's dims. Not planned at any layer shape (dims_for None): no spec tunes it and the
# runtime's default path does not run it.
KEY = keys.KernelKey("gated_norm_bwd_recompute", "norm", keys.GATED_NORM_BWD.dims, ("rows",), lambda shape: None,
                     f"{__name__}:gated_norm_bwd_recompute_kernel", neutral_dims=("weight_fp32",))


def _dims_from_args(args: Sequence[Any]) -> dict[str, int]:
    dy, x, z, w, b, _dz, _eps, nbg, rms = args
    return gated._fwd_dims_from_args((x, z, w, b, 0.0, nbg, rms))


# A config for the kernel at these dims, set by `use_config` (a timing's A/B); else
# gated_norm_bwd's default (16 rows per program, 4+ warps).
_CONFIG: dict[str, Any] | None = None


def _default(dims: dict[str, int]) -> dict[str, Any]:
    return dict(_CONFIG) if _CONFIG is not None else gated._bwd_default(dims)


GATED_NORM_BWD_RECOMPUTE = runtime.RuntimeKernel(
    key=KEY,
    kernel=gated_norm_bwd_recompute_kernel,
    dims_from_args=_dims_from_args,
    default_config=_default,
    dtype_arg=1,  # x: the model's dtype
)

# A gated_norm_bwd config's lists with one entry per load or store: this kernel has other
# loads and stores, so these go (Helion fills its defaults); the rest is the same space.
PER_ACCESS = ("indexing", "load_eviction_policies", "atomic_indexing")


def borrowed(config: dict[str, Any]) -> dict[str, Any]:
    """A gated_norm_bwd config as one for this kernel: its block sizes, warps, stages, loop
    orders and program ids; the per-load/store lists left to Helion's defaults."""
    return {k: v for k, v in config.items() if k not in PER_ACCESS}


@contextlib.contextmanager
def use_config(config: dict[str, Any] | None) -> Iterator[None]:
    """The kernel compiles with `config` (None: the default) while this is open. Drops every
    compiled kernel (`runtime.configure()`) on entry and exit, so that it takes effect."""
    global _CONFIG
    before = _CONFIG
    _CONFIG = config
    runtime.configure()
    try:
        yield
    finally:
        _CONFIG = before
        runtime.configure()


def norm_bwd_recompute(dy2: torch.Tensor, x2: torch.Tensor, z2: torch.Tensor | None, weight: torch.Tensor,
                       bias: torch.Tensor | None, eps: float, group_size: int, norm_before_gate: bool,
                       is_rms_norm: bool, dz2: torch.Tensor | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """(dx, dz, dweight, dbias, out), each (rows, d) but dweight and dbias (d,): `gated._bwd`'s
    gradients without a saved rstd (or mean), and the forward's output out, as `gated._fwd`
    writes it. dy2, x2, z2: (rows, d) with a unit last stride, any row stride; dz2: where to write
    dz (the same form), None: a new buffer."""
    rows, d = x2.shape
    if d % group_size:
        raise ValueError(f"norm_bwd_recompute: group_size {group_size} does not divide d={d}")
    g = d // group_size
    v3 = (rows, g, group_size)
    if z2 is not None and dz2 is None:
        dz2 = torch.empty((rows, d), dtype=x2.dtype, device=x2.device)
    args = (dy2.view(v3), x2.view(v3), None if z2 is None else z2.view(v3), weight.view(g, group_size),
            None if bias is None else bias.view(g, group_size), None if z2 is None else dz2.view(v3), float(eps),
            bool(norm_before_gate), bool(is_rms_norm))
    dx, dz, dw, db, out = runtime.run(GATED_NORM_BWD_RECOMPUTE, args)
    db = None if bias is None else db.view(d).to(bias.dtype)
    return dx.view(rows, d), (None if dz is None else dz.view(rows, d)), dw.view(d), db, out.view(rows, d)


def head_backward(dims: Any, opts: Any, dout: torch.Tensor, y: torch.Tensor | None, z: torch.Tensor,
                  zx0: torch.Tensor, rmsnorm_weight: torch.Tensor | None, outproj_weight: torch.Tensor | None,
                  outproj_bias: torch.Tensor | None, autocast: torch.dtype | None, dzx0: torch.Tensor,
                  dz_out: torch.Tensor, grads: dict[str, torch.Tensor | None]) -> torch.Tensor:
    """`split_conv1d_scan._head_backward` in mamba-ssm's order where the norm and out_proj are both
    there: dout through out_proj first, then the one-pass norm backward (which writes the norm's
    output), then out_proj's weight gradient on it. Without either: the layer's own."""
    if rmsnorm_weight is None or outproj_weight is None:
        return _LAYERS(dims, opts, dout, y, z, zx0, rmsnorm_weight, outproj_weight, outproj_bias, autocast, dzx0,
                       dz_out, grads)
    assert y is not None
    b, s = dims.batch, dims.seqlen
    gated._check_inputs(y, rmsnorm_weight, None, z, dims.dim // dims.ngroups)
    weight = outproj_weight if autocast is None else outproj_weight.to(autocast)
    dlin = dout.to(weight.dtype)
    if outproj_bias is not None:
        grads["outproj_bias"] = dlin.sum(dim=(0, 1)).to(outproj_bias.dtype)
    dout = F.linear(dlin, weight.t()).to(z.dtype)
    if dims.d_mlp > 0:
        layer._swiglu_bwd(zx0, dout[..., :dims.d_mlp], dzx0)
    dy2, _dz, dw, _db, gated_out = norm_bwd_recompute(
        gated._rows(dout[..., dims.d_mlp:]), gated._rows(y), gated._rows(z), rmsnorm_weight.contiguous(), None,
        opts.rmsnorm_eps, dims.dim // dims.ngroups, opts.norm_before_gate, True,
        dz2=dz_out.reshape(b * s, dims.dim))
    del dout
    grads["rmsnorm_weight"] = dw.to(rmsnorm_weight.dtype)
    gated_out = gated_out.view(b, s, dims.dim)
    lin_in = gated_out if dims.d_mlp == 0 else torch.cat([layer._swiglu(zx0), gated_out], dim=-1)
    del gated_out
    grads["outproj_weight"] = torch.einsum("bso,bsd->od", dlin, lin_in.to(weight.dtype)).to(outproj_weight.dtype)
    return dy2


_LAYERS = layer._head_backward


@contextlib.contextmanager
def installed() -> Iterator[None]:
    """The fused layer's backward runs `head_backward` (the one-pass norm backward) while this is open."""
    layer._head_backward = head_backward
    try:
        yield
    finally:
        layer._head_backward = _LAYERS
