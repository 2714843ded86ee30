"""Tuning record of `kernels/ssd/selective_state_update.py` (one decoding step): inputs at a
shape, the fp32 check, the baseline, seeds.

The kernel updates its state argument in place. Helion's search clones mutated arguments
for each candidate; the final check (`Problem.outputs`) reads the state, then puts the
initial state back, so that every checked run starts from the state the reference saw.
Timing runs keep stepping the same state (a decaying recurrence: it stays finite).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from autotune_cli.reference import selective_state_update_ref
from autotune_cli.tuning.record import Baseline, Problem, TunableKernel, mamba_ssm_version
from mamba_tune.ssd import selective_state_update as kernel


@dataclasses.dataclass
class DecodeInputs:
    """Seeded public-function inputs of one decoding step (heads form) at some key dims."""

    state: torch.Tensor
    x: torch.Tensor
    dt: torch.Tensor
    A: torch.Tensor
    B: torch.Tensor
    C: torch.Tensor
    D: torch.Tensor | None
    z: torch.Tensor | None
    dt_bias: torch.Tensor | None
    dt_softplus: bool
    state_batch_indices: torch.Tensor | None

    @classmethod
    def make(cls, dims: dict[str, int], dtype: torch.dtype, device: torch.device | str, seed: int) -> DecodeInputs:
        """dt~ = softplus(dt + dt_bias) log-uniform in [1e-3, 1e-1] and A = -U[0.5, 4] per head
        (as the SSD records); with tie_hdim, dt, dt_bias, A and D are stride-0 views over
        headdim (Mamba2.step's `repeat`), else one value per element. With state_batch_indices
        the state has two slots per row, each row names a random one and row 1 is padding."""
        gen = torch.Generator(device="cpu").manual_seed(seed)
        b, H, P, G, N = dims["batch"], dims["nheads"], dims["headdim"], dims["ngroups"], dims["dstate"]
        tie = bool(dims["tie_hdim"])
        device = torch.device(device)

        def rand(*shape: int, dt: torch.dtype = dtype) -> torch.Tensor:
            return torch.randn(*shape, generator=gen).to(dt).to(device)

        def unif(lo: float, hi: float, *shape: int) -> torch.Tensor:
            return torch.rand(*shape, generator=gen) * (hi - lo) + lo

        per = (H,) if tie else (H, P)  # one value per head, or per (head, headdim row)
        softplus, has_bias = bool(dims["dt_softplus"]), bool(dims["has_dt_bias"])
        dt_target = torch.exp(unif(math.log(1e-3), math.log(1e-1), b, *per))
        bias = torch.exp(unif(math.log(1e-3), math.log(1e-1), *per))
        if softplus:
            raw = torch.log(torch.expm1(dt_target)) + 0.5 * torch.randn(b, *per, generator=gen)
            if has_bias:
                raw = raw - torch.log(torch.expm1(bias))
        else:
            raw = dt_target - (bias if has_bias else 0.0)
        dt_bias = (torch.log(torch.expm1(bias)) if softplus else bias) if has_bias else None
        A = -unif(0.5, 4.0, H) if tie else -unif(0.5, 4.0, H, P, N)
        D = unif(0.5, 1.5, *per) if dims["has_D"] else None
        dt = raw.to(dtype).to(device)
        A, D = A.to(device), None if D is None else D.to(device)
        dt_bias = None if dt_bias is None else dt_bias.to(device)
        if tie:
            dt = dt[:, :, None].expand(b, H, P)
            A = A[:, None, None].expand(H, P, N)
            D = None if D is None else D[:, None].expand(H, P)
            dt_bias = None if dt_bias is None else dt_bias[:, None].expand(H, P)
        sbi = None
        state_batch = b
        if dims["has_state_batch_indices"]:
            state_batch = 2 * b
            sbi = torch.randperm(state_batch, generator=gen)[:b].to(torch.int32)
            if b > 1:
                sbi[1] = -1
            sbi = sbi.to(device)
        state_dtype = torch.float32 if dims["fp32_state"] else dtype
        return cls(state=rand(state_batch, H, P, N, dt=state_dtype), x=rand(b, H, P), dt=dt, A=A,
                   B=rand(b, G, N), C=rand(b, G, N), D=D, z=rand(b, H, P) if dims["has_z"] else None,
                   dt_bias=dt_bias, dt_softplus=softplus, state_batch_indices=sbi)

    def kwargs(self) -> dict[str, Any]:
        """Keyword arguments of `selective_state_update` after state, x, dt, A, B, C."""
        return {"D": self.D, "z": self.z, "dt_bias": self.dt_bias, "dt_softplus": self.dt_softplus,
                "state_batch_indices": self.state_batch_indices}

    def positional(self) -> tuple[torch.Tensor, ...]:
        return self.state, self.x, self.dt, self.A, self.B, self.C


def _up(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.float()


def _make_problem(dims: dict[str, int], dtype: torch.dtype, device: torch.device, seed: int) -> Problem:
    inp = DecodeInputs.make(dims, dtype, device, seed)
    state0 = inp.state.clone()  # what the reference starts from; `outputs` restores it
    args = kernel.kernel_args(*inp.positional(), inp.D, inp.z, inp.dt_bias, inp.dt_softplus, inp.state_batch_indices)

    def ref(lowp: bool) -> dict[str, torch.Tensor]:
        if lowp:
            out, state = selective_state_update_ref(state0, inp.x, inp.dt, inp.A, inp.B, inp.C, upcast=False,
                                                    **inp.kwargs())
        else:
            out, state = selective_state_update_ref(state0.float(), inp.x.float(), inp.dt.float(), inp.A.float(),
                                                    inp.B.float(), inp.C.float(), _up(inp.D), _up(inp.z),
                                                    _up(inp.dt_bias), inp.dt_softplus, inp.state_batch_indices)
        return {"out": out.float(), "state": state.float()}

    def outputs(res: Any) -> dict[str, torch.Tensor]:
        got = {"out": res.float(), "state": inp.state.to(torch.float32, copy=True)}
        inp.state.copy_(state0)
        return got

    b, H, P = inp.x.shape
    rows = b if inp.state_batch_indices is None else b - int(b > 1)
    io = inp.x.element_size() * b * H * P * (2 + int(inp.z is not None))  # x, out (and z)
    bc = 2 * inp.B.numel() * inp.B.element_size()
    return Problem(
        args=args,
        reference=lambda: ref(False),
        lowp_reference=lambda: ref(True),
        outputs=outputs,
        # The state dominates: read and written once per used row.
        bytes_moved=2 * rows * inp.state[0].numel() * inp.state.element_size() + io + bc,
    )


def _baseline(dims: dict[str, int], dtype: torch.dtype, device: torch.device, seed: int) -> Baseline | None:
    if device.type != "cuda" or not dims["has_dt_bias"]:
        # (mamba-ssm 2.3.2.post1's launcher reads dt_bias.stride() unconditionally: no call without it.)
        return None
    try:
        from mamba_ssm.ops.triton.selective_state_update import selective_state_update
    except ImportError:
        return None
    inp = DecodeInputs.make(dims, dtype, device, seed)

    def fn() -> Any:
        return selective_state_update(*inp.positional(), **inp.kwargs())

    return Baseline(f"mamba-ssm {mamba_ssm_version()}", fn)


def _seeds(dims: dict[str, int]) -> list[dict[str, Any]]:
    """All of dstate per program with 4-16 headdim rows (mamba-ssm's range), and half of dstate."""
    block_n = kernel.default_config(dims)["block_sizes"][0]
    cap_p = 1 << (dims["headdim"] - 1).bit_length()
    seeds: list[dict[str, Any]] = []
    for bn, bp, warps in ((block_n, 4, 4), (block_n, 8, 4), (block_n, 16, 8), (max(block_n // 2, 16), 8, 4)):
        seed = {"block_sizes": [min(bn, block_n), min(bp, cap_p)], "num_warps": warps, "num_stages": 1}
        if seed not in seeds:
            seeds.append(seed)
    return seeds


SELECTIVE_STATE_UPDATE = TunableKernel(
    runtime=kernel.SELECTIVE_STATE_UPDATE,
    make_problem=_make_problem,
    make_baseline=_baseline,
    seed_configs=_seeds,
    description="decoding step: in-place SSM state update and output (mamba-ssm selective_state_update)",
)
