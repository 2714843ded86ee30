"""Tuning records of the gated norm (`kernels/norm/gated.py`): inputs, seeds, baselines."""

from __future__ import annotations

from typing import Any

import torch

from autotune_cli.reference import gated_norm_ref
from autotune_cli.tuning.record import (
    Baseline,
    Problem,
    TunableKernel,
    mamba_ssm_version,
)
from mamba_tune.norm import gated


class _NormInputs:
    """Random inputs for one norm problem (seeded), in the layouts the kernels take."""

    def __init__(self, dims: dict[str, int], dtype: torch.dtype, device: torch.device, seed: int):
        gen = torch.Generator(device="cpu").manual_seed(seed)
        rows, d, gs = dims["rows"], dims["d"], dims["group_size"]
        wdtype = torch.float32 if dims["weight_fp32"] else dtype

        def rand(*shape, dt=dtype, scale=1.0, offset=0.0):
            return (torch.randn(*shape, generator=gen) * scale + offset).to(dt).to(device)

        self.x = rand(rows, d)
        self.z = rand(rows, d) if dims["has_z"] else None
        self.w = rand(d, dt=wdtype, scale=0.1, offset=1.0)
        self.b = rand(d, dt=wdtype, scale=0.1) if dims["has_bias"] else None
        self.dy = rand(rows, d)
        self.eps = 1e-6
        self.gs = gs
        self.nbg = bool(dims["norm_before_gate"])
        self.rms = bool(dims["is_rms"])

    def ref(self, upcast: bool, with_grad: bool):
        leaves = [t for t in (self.x, self.z, self.w, self.b)]
        if upcast:
            leaves = [None if t is None else t.float() for t in leaves]
        leaves = [None if t is None else t.detach().requires_grad_(with_grad) for t in leaves]
        x, z, w, b = leaves
        out = gated_norm_ref(x, w, b, z, self.eps, self.gs, self.nbg, self.rms, upcast=False)
        if not with_grad:
            return {"out": out.float()}
        grads = torch.autograd.grad(out, [t for t in leaves if t is not None], self.dy.to(out.dtype))
        names = [n for n, t in zip(("dx", "dz", "dw", "db"), leaves) if t is not None]
        # The backward also gives the output back, recomputed (the fused layer's call).
        return {**{n: g.float() for n, g in zip(names, grads)}, "out": out.detach().float()}


def _norm_bytes(dims: dict[str, int], dtype: torch.dtype, bwd: bool, recompute: bool = False) -> int:
    """Bytes a call moves: the forward reads x (and z), writes out and the statistics; the
    backward reads dy, x (and z) and the statistics, writes dx (and dz); with `recompute` (the
    fused layer's call) it reads no statistics and writes out as well."""
    rows, d = dims["rows"], dims["d"]
    e = torch.finfo(dtype).bits // 8
    n_in = 1 + dims["has_z"] + (1 if bwd else 0)  # x, z, (dy)
    n_out = 1 + (dims["has_z"] if bwd else 0) + (1 if recompute else 0)  # out | dx, dz, (out)
    stats = 0 if recompute else rows * (d // dims["group_size"]) * 4 * (1 if dims["is_rms"] else 2)
    return rows * d * e * (n_in + n_out) + stats


def _make_fwd_problem(dims: dict[str, int], dtype: torch.dtype, device: torch.device, seed: int) -> Problem:
    inp = _NormInputs(dims, dtype, device, seed)
    rows, d, gs = dims["rows"], dims["d"], dims["group_size"]
    v3 = (rows, d // gs, gs)
    args = (inp.x.view(v3), None if inp.z is None else inp.z.view(v3), inp.w.view(-1, gs),
            None if inp.b is None else inp.b.view(-1, gs), inp.eps, inp.nbg, inp.rms)
    return Problem(
        args=args,
        reference=lambda: inp.ref(upcast=True, with_grad=False),
        lowp_reference=lambda: inp.ref(upcast=False, with_grad=False),
        outputs=lambda res: {"out": res[0].reshape(rows, d).float()},
        bytes_moved=_norm_bytes(dims, dtype, bwd=False),
    )


def _make_bwd_problem(dims: dict[str, int], dtype: torch.dtype, device: torch.device, seed: int) -> Problem:
    """The call the fused layer's backward makes (what the training step runs): the statistics
    recomputed in the pass and the forward's output written again, for out_proj's weight
    gradient. The autograd function's backward (statistics given, no output) runs the same
    key's config."""
    inp = _NormInputs(dims, dtype, device, seed)
    rows, d, gs = dims["rows"], dims["d"], dims["group_size"]
    v3 = (rows, d // gs, gs)
    recomputed = torch.empty(v3, dtype=dtype, device=device)
    args = (inp.dy.view(v3), inp.x.view(v3), None if inp.z is None else inp.z.view(v3), inp.w.view(-1, gs),
            None if inp.b is None else inp.b.view(-1, gs), None, None,
            None if inp.z is None else torch.empty(v3, dtype=dtype, device=device), recomputed, inp.eps,
            inp.nbg, inp.rms)

    def outputs(res):
        dx, dz, dw, db = res
        db = db if inp.b is not None else None
        out = {"dx": dx.reshape(rows, d).float(), "out": recomputed.reshape(rows, d).float()}
        if dz is not None:
            out["dz"] = dz.reshape(rows, d).float()
        out["dw"] = dw.reshape(d).float()
        if db is not None:
            out["db"] = db.reshape(d).to(inp.b.dtype).float()
        return out

    return Problem(
        args=args,
        reference=lambda: inp.ref(upcast=True, with_grad=True),
        lowp_reference=lambda: inp.ref(upcast=False, with_grad=True),
        outputs=outputs,
        bytes_moved=_norm_bytes(dims, dtype, bwd=True, recompute=True),
    )


# The search's seeds after the kernel's default (the first seed).
# Forward, (rows per program, elements per thread): a few rows of one group per program
# keeps the whole group in registers. Warps follow the row width so that each thread holds
# 16-32 elements of x (and z): at group 512 that is the 1-4 warps the H200's winners used;
# at whole 5120-wide rows (8192 lanes), 8-32 warps.
_FWD_SEEDS = ((1, 32), (2, 16), (2, 32), (4, 32), (8, 32))
# Backward, (rows_per_program, at least these warps): many row groups (rows /
# rows_per_program x ngroups programs, thousands at Nemotron sizes) is what lifts this
# backward off mamba-ssm's one-program-per-SM schedule.
_BWD_SEEDS = ((32, 4), (64, 4), (64, 8), (128, 8), (256, 8))


def _unique(configs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seeds: list[dict[str, Any]] = []
    for c in configs:
        if c not in seeds:
            seeds.append(c)
    return seeds


def _fwd_seeds(dims: dict[str, int]) -> list[dict[str, Any]]:
    return _unique([gated.GATED_NORM_FWD.default_config(dims)]
                   + [gated.fwd_config(dims, m, per_thread) for m, per_thread in _FWD_SEEDS])


def _bwd_seeds(dims: dict[str, int]) -> list[dict[str, Any]]:
    return _unique([gated.GATED_NORM_BWD.default_config(dims)]
                   + [gated.bwd_config(dims, rpp, w) for rpp, w in _BWD_SEEDS])


def _mamba_ssm_norm():
    try:
        from mamba_ssm.ops.triton import layernorm_gated
    except ImportError:
        return None
    return layernorm_gated, f"mamba-ssm {mamba_ssm_version()}"


def _baseline_fwd(dims, dtype, device, seed) -> Baseline | None:
    found = _mamba_ssm_norm()
    if found is None or device.type != "cuda":
        return None
    lg, name = found
    inp = _NormInputs(dims, dtype, device, seed)

    def fn():
        return lg._layer_norm_fwd(inp.x, inp.w, inp.b, inp.eps, z=inp.z, group_size=inp.gs,
                                  norm_before_gate=inp.nbg, is_rms_norm=inp.rms)

    return Baseline(name, fn)


def _baseline_bwd(dims, dtype, device, seed) -> Baseline | None:
    found = _mamba_ssm_norm()
    if found is None or device.type != "cuda":
        return None
    lg, name = found
    inp = _NormInputs(dims, dtype, device, seed)
    _, mean, rstd = lg._layer_norm_fwd(inp.x, inp.w, inp.b, inp.eps, z=inp.z, group_size=inp.gs,
                                       norm_before_gate=inp.nbg, is_rms_norm=inp.rms)
    recomputed = torch.empty_like(inp.x)

    def fn():  # as mamba-ssm's fused layer calls it: the output recomputed, from the kept rstd
        return lg._layer_norm_bwd(inp.dy, inp.x, inp.w, inp.b, inp.eps, mean, rstd, inp.z, inp.gs,
                                  inp.nbg, inp.rms, recompute_output=True, out=recomputed)

    return Baseline(name, fn)


# A search for one weight dtype may start from the other's entries (the runtime kernels'
# neutral dims: the same config space).
_SEED_ACROSS = gated.GATED_NORM_FWD.neutral_dims

GATED_NORM_FWD = TunableKernel(
    runtime=gated.GATED_NORM_FWD,
    make_problem=_make_fwd_problem,
    make_baseline=_baseline_fwd,
    seed_configs=_fwd_seeds,
    seed_across=_SEED_ACROSS,
    description="gated RMSNorm/LayerNorm forward (mamba-ssm _layer_norm_fwd_1pass_kernel)",
)

GATED_NORM_BWD = TunableKernel(
    runtime=gated.GATED_NORM_BWD,
    make_problem=_make_bwd_problem,
    make_baseline=_baseline_bwd,
    seed_configs=_bwd_seeds,
    seed_across=_SEED_ACROSS,
    description="gated RMSNorm/LayerNorm backward (mamba-ssm _layer_norm_bwd_kernel)",
)

KERNELS = (GATED_NORM_FWD, GATED_NORM_BWD)
