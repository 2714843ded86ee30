"""Inputs of the SSD backward's tuning records: one set of stage inputs for every kernel.

`StageInputs` draws `mamba_chunk_scan_combined`'s inputs (inputs.SSDInputs), an output
gradient dy (and dfinal_states), seeded chunk states S (from which the states entering
each chunk follow by the fp32 state passing) and seeded state gradients G (what the dx
and dB/dC kernels read as dstates): random stage inputs, as F5's record uses random
entering states, so that building a problem costs no more than the forward's records do
(the lowering checks build them on the CPU at model sizes). The expected outputs come
from autograd through the fp32 reference stages (`stage_grads`), evaluated only when
asked for: F3 (S -> entering states, final states), F4, F5 with dy, F2 with G.
"""

from __future__ import annotations

import dataclasses

import torch

from autotune_cli.reference import (
    bmm_chunk_ref,
    chunk_cumsum_ref,
    chunk_scan_ref,
    chunk_state_ref,
    state_passing_ref,
)
from autotune_cli.tuning.ssd import inputs

# Flags a backward stage's dims may leave out: the Mamba-2 mixer's call.
MIXER_FLAGS = {"has_dt_bias": 1, "dt_softplus": 1, "has_D": 1, "has_z": 0, "has_seq_idx": 0,
               "has_initial_states": 0}


def _leaf(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.detach().clone().requires_grad_(t.is_floating_point())


def _grad(t: torch.Tensor | None) -> torch.Tensor | None:
    if t is None:
        return None
    return torch.zeros_like(t) if t.grad is None else t.grad


@dataclasses.dataclass
class StageInputs:
    inp: inputs.SSDInputs
    dy: torch.Tensor
    dfinal: torch.Tensor | None
    dA_cumsum: torch.Tensor  # (batch, nheads, nchunks, chunk_size) fp32
    dt_out: torch.Tensor  # dt~, same shape, fp32
    chunk_states: torch.Tensor  # S (batch, nchunks, nheads, headdim, dstate) fp32, seeded
    prev_states_lowp: torch.Tensor  # the states entering each chunk, from S, in the inputs' dtype
    dstates_lowp: torch.Tensor  # G, seeded, in the inputs' dtype
    cb: torch.Tensor  # F4's output, fp32
    _grads: dict[bool, dict[str, torch.Tensor]] = dataclasses.field(default_factory=dict)
    _dbdc_sum_terms: torch.Tensor | None = None

    @classmethod
    def make(cls, dims: dict[str, int], dtype: torch.dtype, device: torch.device, seed: int) -> StageInputs:
        full = {**MIXER_FLAGS, **dims}
        i = inputs.SSDInputs.make(full, dtype, device, seed)
        gen = torch.Generator(device="cpu").manual_seed(seed + 7)
        b, _, H, P = i.x.shape
        N = i.B.shape[3]
        dy = torch.randn(*i.x.shape, generator=gen).to(dtype).to(device)
        dfinal = None
        if full.get("has_dfinal", full["has_initial_states"]):
            dfinal = torch.randn(b, H, P, N, generator=gen).to(device)
        dA, dt_out = chunk_cumsum_ref(i.dt, i.A, i.chunk_size, i.dt_bias, i.dt_softplus, i.dt_limit)
        nc = dt_out.shape[2]
        states = (torch.randn(b, nc, H, P, N, generator=gen) * 0.5).to(device)
        dstates = torch.randn(b, nc, H, P, N, generator=gen).to(dtype).to(device)
        prev, _ = state_passing_ref(states, dA[..., -1], i.initial_states, i.seq_idx, i.chunk_size, out_dtype=dtype)
        cb = bmm_chunk_ref(i.C.float(), i.B.float(), i.chunk_size, i.seq_idx)
        return cls(i, dy, dfinal, dA, dt_out, states, prev, dstates, cb)

    def dbdc_sum_terms(self) -> torch.Tensor:
        """What the dB/dC kernel adds to the dx kernel's sums without z (which then hold only
        ddt~'s state term, and nothing of dout . y), (2, batch, nheads, nchunks * chunk_size)
        fp32. From the products P[l, j] = CB[l, j] exp(dA_l - dA_j) (dy_l . x_j), l >= j,
        within each chunk:
          [0] ddt~_j's chunk term, sum_l P[l, j];
          [1] dout_l . y_l: its chunk term sum_j P[l, j] dt~_j, plus its state term
              exp(dA_l) dy_l . (prev_c C_l) (F5's, as chunk_scan_ref has it).
        Computed once (GBs of temporaries at Nano's sizes): both references and every check read it."""
        if self._dbdc_sum_terms is not None:
            return self._dbdc_sum_terms
        i = self.inp
        b, L, H, P = i.x.shape
        nc, Q = self.dt_out.shape[2], self.dt_out.shape[3]
        G = i.C.shape[2]

        def chunks(t: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.pad(t.float(), (0, 0, 0, 0, 0, nc * Q - L)).view(b, nc, Q, H, P)

        w = torch.einsum("bclhp,bcjhp->bhclj", chunks(self.dy), chunks(i.x))
        cb = self.cb[:, :, torch.arange(H, device=i.x.device) // (H // G)].permute(0, 2, 1, 3, 4)
        dA = self.dA_cumsum
        causal = torch.ones(Q, Q, dtype=torch.bool, device=i.x.device).tril()
        prod = cb * torch.exp(torch.clamp(dA[..., :, None] - dA[..., None, :], max=0.0)) * causal * w
        ddt = prod.sum(-2)
        y_state = chunk_scan_ref(torch.zeros_like(self.cb), i.x.float(), self.dt_out, self.dA_cumsum, i.C.float(),
                                 self.prev_states_lowp.float(), seq_idx=i.seq_idx)
        dout_y_state = (self.dy.float() * y_state).sum(-1).permute(0, 2, 1)  # (b, H, L)
        dout_y = (prod * self.dt_out[..., None, :]).sum(-1).reshape(b, H, nc * Q)
        dout_y[..., :L] += dout_y_state
        self._dbdc_sum_terms = torch.stack([ddt.reshape(b, H, nc * Q), dout_y])
        return self._dbdc_sum_terms

    def stage_grads(self, lowp: bool) -> dict[str, torch.Tensor]:
        """Reference gradients of the backward stages, fp32 (lowp=False) or eager torch in
        the inputs' dtype. Keys: the inputs' ("x", "B", "C", "D", "z", "initial_states"),
        "states" (dS, through F3 only), "dA_last" (through F3), "dt_state"/"dA_state"
        (through F2, with G), "dt_scan"/"dA_scan" (through F5)."""
        if lowp in self._grads:
            return self._grads[lowp]
        i = self.inp if lowp else self.inp.upcast()
        upcast = not lowp
        ins = {k: _leaf(getattr(i, k)) for k in ("x", "B", "C", "D", "z", "initial_states")}
        dt_state, dA_state = _leaf(self.dt_out), _leaf(self.dA_cumsum)
        dt_scan, dA_scan = _leaf(self.dt_out), _leaf(self.dA_cumsum)
        dA_last = _leaf(self.dA_cumsum[..., -1])
        states = _leaf(self.chunk_states)
        with torch.enable_grad():
            prev, final = state_passing_ref(states, dA_last, ins["initial_states"], i.seq_idx, i.chunk_size,
                                            out_dtype=torch.float32 if upcast else i.x.dtype)
            cb = bmm_chunk_ref(ins["C"], ins["B"], i.chunk_size, i.seq_idx, upcast=upcast)
            out = chunk_scan_ref(cb, ins["x"], dt_scan, dA_scan, ins["C"], prev, ins["D"], ins["z"], i.seq_idx,
                                 upcast=upcast)
            own = chunk_state_ref(ins["B"], ins["x"], dt_state, dA_state, i.seq_idx, upcast=upcast)
            roots = [out, own]
            grads = [self.dy if lowp else self.dy.float(), self.dstates_lowp.float()]
            if self.dfinal is not None:
                roots.append(final)
                grads.append(self.dfinal)
            torch.autograd.backward(roots, grads)
        result = {k: _grad(t) for k, t in ins.items() if t is not None}
        result.update({"states": _grad(states), "dA_last": _grad(dA_last), "dt_state": _grad(dt_state),
                       "dA_state": _grad(dA_state), "dt_scan": _grad(dt_scan), "dA_scan": _grad(dA_scan)})
        self._grads[lowp] = result
        return result

    def gated_dout(self) -> torch.Tensor:
        """dy * silu(z) in dy's dtype (what mamba-ssm's backward kernels read)."""
        z = self.inp.z
        if z is None:
            return self.dy
        return (self.dy.float() * torch.nn.functional.silu(z.float())).to(self.dy.dtype)
