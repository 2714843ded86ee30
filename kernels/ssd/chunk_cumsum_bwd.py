"""B10 of the SSD backward with its torch glue: d dA_cumsum assembled, the cumsum's and dt~'s backward.

Per chunk and head, from the per-position sums of chunk_scan_chunk_state_bwd_dx.py
(rows: ddt~ not through dA, its F2 part, dout . y) and the state passing's d dA_last:

  ddA_l   = dout_l . y_l - dt~_l ddt~_l                  (every exp() term at position l)
  extra   = sum_l dt~_l ddt~state_l + ddA_last             (terms of the chunk's last dA)
  r_l     = sum_{k >= l} ddA_k + extra                      (reverse cumsum: dA_cumsum's backward)
  ddt~_l += A r_l;  dA = sum dt~_l r_l
  ddt_l   = ddt~_l * [dt~ not clamped] * (sigmoid(dt_l + dt_bias) with softplus, up to 20)
  ddt_bias = sum ddt_l

The clamp's gradient is mamba-ssm's (`_chunk_cumsum_bwd_kernel`): zero where softplus
(dt + dt_bias) lies outside dt_limit, passed through at the bounds. mamba-ssm assembles
ddA with torch ops between kernels (flip-cumsum-flip and partial-sum adds); here all of
it is one pass over (batch, nheads, seqlen). dA and ddt_bias come out as one partial per
(batch, chunk) that the host sums in a fixed order (no atomics).

Order: Helion kernel -> host launcher -> tuning record.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import helion
import helion.language as hl
import torch

from kernels import runtime
from kernels.reference import chunk_cumsum_ref
from kernels.registry import Baseline, ModelShape, Problem, TunableKernel, register
from kernels.ssd import bwd_common, common


@helion.kernel(static_shapes=True, autotuner_fn=runtime.refuse_autotune)
def chunk_cumsum_bwd_kernel(
    rows: torch.Tensor,  # (3, slots_p, batch, nheads, nchunks * chunk_size) fp32
    ddA_last: torch.Tensor,  # (slots, batch, nheads, nchunks) fp32
    dt: torch.Tensor,  # (batch, seqlen, nheads), the forward's input
    A: torch.Tensor,  # (nheads,)
    dt_bias: torch.Tensor | None,  # (nheads,)
    dt_min: float,
    dt_max: float,
    chunk_size: hl.constexpr,
    dt_softplus: hl.constexpr,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    batch, seqlen, nheads = dt.shape
    nchunks = (seqlen + chunk_size - 1) // chunk_size
    nslot_p = rows.size(1)
    nslot_s = ddA_last.size(0)
    ddt = torch.empty_like(dt)
    dA_part = torch.empty([batch, nchunks, nheads], dtype=torch.float32, device=dt.device)
    dbias_part = torch.empty([batch, nchunks, nheads], dtype=torch.float32, device=dt.device)
    block_h = hl.register_block_size(nheads)
    for tile_b, tile_l, tile_h in hl.tile(
        [batch, nchunks * chunk_size, nheads], block_size=[1, chunk_size, block_h]
    ):
        b = tile_b.begin
        c = tile_l.id
        valid = tile_l.index < seqlen
        # dt~ recomputed as F1 does, in (heads, positions) orientation.
        v = hl.load(dt, [b, tile_l, tile_h], extra_mask=valid[:, None]).to(torch.float32).T
        if dt_bias is not None:
            v = v + dt_bias[tile_h].to(torch.float32)[:, None]
        raw = v
        if dt_softplus:
            v = torch.where(v <= 20.0, torch.log1p(torch.exp(v)), v)
        inside = (v >= dt_min) & (v <= dt_max)
        v = torch.where(valid[None, :], torch.clamp(v, min=dt_min, max=dt_max), 0.0)
        ddt_x = hl.zeros([tile_h, tile_l], dtype=torch.float32)
        ddt_state = hl.zeros([tile_h, tile_l], dtype=torch.float32)
        dydot = hl.zeros([tile_h, tile_l], dtype=torch.float32)
        for tile_s in hl.tile(nslot_p, block_size=1):
            s = tile_s.begin
            ddt_x = ddt_x + rows[0, s, b, tile_h, tile_l]
            ddt_state = ddt_state + rows[1, s, b, tile_h, tile_l]
            dydot = dydot + rows[2, s, b, tile_h, tile_l]
        extra = torch.sum(v * ddt_state, dim=1)
        for tile_s in hl.tile(nslot_s, block_size=1):
            extra = extra + ddA_last[tile_s.begin, b, tile_h, c]
        ddA = dydot - v * ddt_x
        csum = torch.cumsum(ddA, dim=1)
        rev = torch.sum(ddA, dim=1)[:, None] - csum + ddA + extra[:, None]
        a = A[tile_h].to(torch.float32)
        dv = ddt_x + a[:, None] * rev
        dA_part[b, c, tile_h] = torch.sum(v * rev, dim=1)
        dv = torch.where(inside & valid[None, :], dv, 0.0)
        if dt_softplus:
            dv = torch.where(raw <= 20.0, dv * torch.sigmoid(raw), dv)
        dbias_part[b, c, tile_h] = torch.sum(dv, dim=1)
        hl.store(ddt, [b, tile_l, tile_h], dv.T.to(ddt.dtype), extra_mask=valid[:, None])
    return ddt, dA_part, dbias_part


# --- host launcher --------------------------------------------------------------------


def _launch(rows: torch.Tensor, ddA_last: torch.Tensor, dt: torch.Tensor, A: torch.Tensor,
            dt_bias: torch.Tensor | None, dt_softplus: bool, dt_limit: tuple[float, float],
            chunk_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Returns (ddt like dt, dA (nheads,) fp32, ddt_bias (nheads,) fp32 or None)."""
    args = (rows, ddA_last, dt, A.contiguous(), None if dt_bias is None else dt_bias.contiguous(),
            float(dt_limit[0]), float(dt_limit[1]), int(chunk_size), bool(dt_softplus))
    ddt, dA_part, dbias_part = runtime.run(SSD_CHUNK_CUMSUM_BWD, args)
    return ddt, dA_part.sum(dim=(0, 1)), None if dt_bias is None else dbias_part.sum(dim=(0, 1))


# --- tuning record --------------------------------------------------------------------

DIMS = ("batch", "seqlen", "nheads", "chunk_size", "has_dt_bias", "dt_softplus")


def _dims_for(shape: ModelShape) -> dict[str, int]:
    return common.pick(common.mixer_dims(shape), DIMS)


def _dims_from_args(args: Sequence[Any]) -> dict[str, int]:
    _rows, _last, dt, _A, dt_bias, _lo, _hi, chunk_size, softplus = args
    batch, seqlen, nheads = dt.shape
    return {"batch": batch, "seqlen": seqlen, "nheads": nheads, "chunk_size": int(chunk_size),
            "has_dt_bias": int(dt_bias is not None), "dt_softplus": int(softplus)}


class _StageInputs:
    """dt, A, dt_bias as the combined call draws them; the per-position sums (rows) and the
    state passing's d dA_last seeded (this stage does not care where they come from; zero
    past seqlen, as the dx kernel leaves them)."""

    def __init__(self, dims: dict[str, int], dtype: torch.dtype, device: torch.device, seed: int):
        small = {**bwd_common.MIXER_FLAGS, **dims, "headdim": 16, "ngroups": 1, "dstate": 16}
        self.inp = i = common.SSDInputs.make(small, dtype, device, seed)
        _, self.dt_out = chunk_cumsum_ref(i.dt, i.A, i.chunk_size, i.dt_bias, i.dt_softplus, i.dt_limit)
        b, H, nc, Q = self.dt_out.shape
        gen = torch.Generator(device="cpu").manual_seed(seed + 3)
        valid = (torch.arange(nc * Q) < i.x.shape[1]).float()
        self.rows = (torch.randn(3, 1, b, H, nc * Q, generator=gen) * valid).to(device)
        self.ddA_last = torch.randn(1, b, H, nc, generator=gen).to(device)

    def ref(self) -> dict[str, torch.Tensor]:
        """The gradients through F1 (fp32 in every implementation: one reference for both bounds)."""
        i = self.inp
        b, H, nc, Q = self.dt_out.shape
        leaves = {"dt": i.dt.detach().clone().requires_grad_(), "A": i.A.detach().clone().requires_grad_()}
        if i.dt_bias is not None:
            leaves["dt_bias"] = i.dt_bias.detach().clone().requires_grad_()
        r = self.rows.sum(1).view(3, b, H, nc, Q)
        ddA = r[2] - self.dt_out * r[0]
        ddA[..., -1] += (self.dt_out * r[1]).sum(-1) + self.ddA_last.sum(0)
        with torch.enable_grad():
            dA, dt_out = chunk_cumsum_ref(leaves["dt"], leaves["A"], i.chunk_size, leaves.get("dt_bias"),
                                          i.dt_softplus, i.dt_limit)
            grads = torch.autograd.grad([dA, dt_out], list(leaves.values()), [ddA, r[0]])
        return {{"dt": "ddt", "A": "dA", "dt_bias": "ddt_bias"}[k]: g.float() for k, g in zip(leaves, grads,
                                                                                             strict=True)}


def _make_problem(dims: dict[str, int], dtype: torch.dtype, device: torch.device, seed: int) -> Problem:
    s = _StageInputs(dims, dtype, device, seed)
    i = s.inp
    args = (s.rows, s.ddA_last, i.dt, i.A, i.dt_bias, *map(float, i.dt_limit), i.chunk_size, i.dt_softplus)

    def outputs(res: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = {"ddt": res[0].float(), "dA": res[1].sum(dim=(0, 1))}
        if i.dt_bias is not None:
            out["ddt_bias"] = res[2].sum(dim=(0, 1))
        return out

    return Problem(
        args=args,
        reference=s.ref,
        lowp_reference=s.ref,
        outputs=outputs,
        bytes_moved=s.rows.numel() * 4 + 2 * i.dt.numel() * i.dt.element_size(),
    )


def _baseline(dims: dict[str, int], dtype: torch.dtype, device: torch.device, seed: int) -> Baseline | None:
    found = common.mamba_ssm_ops()
    if found is None or device.type != "cuda":
        return None
    mods, name = found
    s = _StageInputs(dims, dtype, device, seed)
    i = s.inp
    b, H, nc, Q = s.dt_out.shape
    ddA = s.rows[2, 0].view(b, H, nc, Q)
    ddt_out = s.rows[0, 0].view(b, H, nc, Q)
    ddA_next = torch.zeros_like(ddA)
    dA_last = s.ddA_last[0]

    # mamba-ssm's glue (flip-cumsum-flip, adds) and its cumsum backward kernel.
    def fn() -> Any:
        prev = ddA.clone()
        prev[..., -1] += dA_last
        d = ddA_next + prev.flip([-1]).cumsum(dim=-1).flip([-1])
        return mods["chunk_state"]._chunk_cumsum_bwd(d, ddt_out, i.dt, i.A, dt_bias=i.dt_bias,
                                                     dt_softplus=i.dt_softplus, dt_limit=i.dt_limit)

    return Baseline(name, fn)


# block_sizes = [heads per program].
_SEEDS = common.fixed_seeds([([16], 4, 2), ([8], 4, 2), ([32], 4, 2)])

# Default (no tuned entry): 16 heads per program, as F1.
_DEFAULT = bwd_common.clamped_default([16], ("nheads",), 4, 2)

SSD_CHUNK_CUMSUM_BWD = register(
    TunableKernel(
        name="ssd_chunk_cumsum_bwd",
        family="ssd",
        kernel=chunk_cumsum_bwd_kernel,
        dims=DIMS,
        size_dims=common.size_dims(DIMS),
        dims_for=_dims_for,
        dims_from_args=_dims_from_args,
        make_problem=_make_problem,
        make_baseline=_baseline,
        seed_configs=_SEEDS,
        default_config=_DEFAULT,
        description="SSD B10 with its glue: ddA assembled per position, reverse cumsum, ddt through clamp and "
                    "softplus, dA and ddt_bias partials (mamba-ssm _chunk_cumsum_bwd_kernel + torch ops)",
    )
)
