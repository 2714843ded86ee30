"""Tuning record of `kernels/ssd/chunk_cumsum_bwd.py` (B10 of the SSD backward): inputs at a shape, the fp32 check, the baseline, seeds."""

from __future__ import annotations

from typing import Any

import torch

from autotune_cli.reference import chunk_cumsum_ref
from autotune_cli.tuning.record import Baseline, Problem, TunableKernel
from autotune_cli.tuning.ssd import bwd_inputs, inputs
from mamba_tune.ssd import chunk_cumsum_bwd as kernel


class _StageInputs:
    """dt, A, dt_bias as the combined call draws them; the per-position sums (rows) and the
    state passing's d dA_last seeded, as many partials of each as the key says (this stage
    does not care where they come from; zero past seqlen, as the dx kernel leaves them)."""

    def __init__(self, dims: dict[str, int], dtype: torch.dtype, device: torch.device, seed: int):
        small = {**bwd_inputs.MIXER_FLAGS, **dims, "headdim": 16, "ngroups": 1, "dstate": 16}
        self.inp = i = inputs.SSDInputs.make(small, dtype, device, seed)
        _, self.dt_out = chunk_cumsum_ref(i.dt, i.A, i.chunk_size, i.dt_bias, i.dt_softplus, i.dt_limit)
        b, H, nc, Q = self.dt_out.shape
        gen = torch.Generator(device="cpu").manual_seed(seed + 3)
        valid = (torch.arange(nc * Q) < i.x.shape[1]).float()
        self.rows = (torch.randn(3, dims["row_partials"], b, H, nc * Q, generator=gen) * valid).to(device)
        self.ddA_last = torch.randn(dims["last_partials"], b, H, nc, generator=gen).to(device)

    def ref(self, leaf_dtypes: bool = False) -> dict[str, torch.Tensor]:
        """The gradients through F1 in fp32 (the inputs' values, upcast: autograd would round a
        bf16 leaf's gradient to bf16). With leaf_dtypes each is rounded to its input's dtype, as
        eager torch in the low dtype returns it (ddt in dt's bf16, as mamba-ssm's): that rounding
        is most of ddt's low-precision error (|ddt| ~ 20 at Nano TP1, where bf16's ulp is 0.125)."""
        i = self.inp
        b, H, nc, Q = self.dt_out.shape
        inputs = {"dt": i.dt, "A": i.A}
        if i.dt_bias is not None:
            inputs["dt_bias"] = i.dt_bias
        leaves = {k: v.detach().float().requires_grad_() for k, v in inputs.items()}
        r = self.rows.sum(1).view(3, b, H, nc, Q)
        ddA = r[2] - self.dt_out * r[0]
        ddA[..., -1] += (self.dt_out * r[1]).sum(-1) + self.ddA_last.sum(0)
        with torch.enable_grad():
            dA, dt_out = chunk_cumsum_ref(leaves["dt"], leaves["A"], i.chunk_size, leaves.get("dt_bias"),
                                          i.dt_softplus, i.dt_limit)
            grads = torch.autograd.grad([dA, dt_out], list(leaves.values()), [ddA, r[0]])
        names = {"dt": "ddt", "A": "dA", "dt_bias": "ddt_bias"}
        return {names[k]: (g.to(inputs[k].dtype) if leaf_dtypes else g).float()
                for k, g in zip(leaves, grads, strict=True)}


def _make_problem(dims: dict[str, int], dtype: torch.dtype, device: torch.device, seed: int) -> Problem:
    s = _StageInputs(dims, dtype, device, seed)
    i = s.inp
    args = (torch.empty_like(i.dt), s.rows, s.ddA_last, i.dt, i.A, i.dt_bias, *map(float, i.dt_limit), i.chunk_size,
            i.dt_softplus)

    def outputs(res: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = {"ddt": res[0].float(), "dA": res[1].sum(dim=(0, 1))}
        if i.dt_bias is not None:
            out["ddt_bias"] = res[2].sum(dim=(0, 1))
        return out

    return Problem(
        args=args,
        reference=s.ref,
        lowp_reference=lambda: s.ref(leaf_dtypes=True),
        outputs=outputs,
        bytes_moved=s.rows.numel() * 4 + 2 * i.dt.numel() * i.dt.element_size(),
    )


def _baseline(dims: dict[str, int], dtype: torch.dtype, device: torch.device, seed: int) -> Baseline | None:
    found = inputs.mamba_ssm_ops()
    if found is None or device.type != "cuda":
        return None
    mods, name = found
    s = _StageInputs(dims, dtype, device, seed)
    i = s.inp
    b, H, nc, Q = s.dt_out.shape
    # One partial of each: mamba-ssm's kernels hand over whole sums.
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
_SEEDS = inputs.fixed_seeds([([16], 4, 2), ([8], 4, 2), ([32], 4, 2)])


SSD_CHUNK_CUMSUM_BWD = TunableKernel(
    runtime=kernel.SSD_CHUNK_CUMSUM_BWD,
    make_problem=_make_problem,
    make_baseline=_baseline,
    seed_configs=_SEEDS,
    description="SSD B10 with its glue: ddA assembled per position, reverse cumsum, ddt through clamp and "
                    "softplus, dA and ddt_bias partials (mamba-ssm _chunk_cumsum_bwd_kernel + torch ops)",
)
