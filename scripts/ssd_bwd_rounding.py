"""Which rounding in the SSD backward's dx kernel moves ddt, dA and ddt_bias away from fp32 (CPU).

Runs our backward in Helion ref mode, with `chunk_scan_chunk_state_bwd_dx`'s per-position
sums replaced by a torch emulation that rounds F5's chunk-term scores one way or another,
and prints the max-abs error of ddt, dA, ddt_bias and dx against the fp32 reference
(`autotune_cli.reference.ssd_chunked_grads` on the inputs in fp32), next to eager torch in
bf16, the kernel itself, and a torch emulation of mamba-ssm 2.3.2's backward math for these
gradients (scores rounded once for ddt~ and dx; ddA w.r.t. the dA increments from exact
products, `_chunk_scan_bwd_ddAcs_stable`; ddA_chunk_cumsum from fp32 states).

Score modes of the emulation, for y's chunk term (dout . y) and raw_scan (ddt~, dx):
split = two bf16 parts (the kernel before session 15, which now takes both pair sums exact from the
dB/dC kernel without z), round = bf16 once,
exact = fp32, consistent = raw_scan's scores scaled by dt~ of their column before the
rounding, so that dout . y and dt~ ddt~ take the same rounded products.

    python scripts/ssd_bwd_rounding.py [BATCH SEQLEN NHEADS HEADDIM NGROUPS DSTATE CHUNK [SEED [Z]]]

Without a GPU, a few minutes at seqlen 2048 on 2 cores (defaults: 1 2048 4 64 1 128 128 0 0).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("HELION_INTERPRET", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from autotune_cli.reference import ssd_chunked_grads  # noqa: E402
from autotune_cli.tuning.ssd.inputs import SSDInputs  # noqa: E402
from mamba_tune.ssd import (  # noqa: E402
    chunk_cumsum_bwd,
    chunk_scan_chunk_state_bwd_dx,
    chunk_state_passing_bwd,
    combined,
)

BF = torch.bfloat16
NAMES = ("dt", "A", "dt_bias", "x")


def _per_chunk(x: torch.Tensor, B: torch.Tensor, C: torch.Tensor, dt: torch.Tensor) -> tuple[torch.Tensor, ...]:
    b, L, H, P = x.shape
    G, N = C.shape[2], C.shape[3]
    nc, Q = dt.shape[2], dt.shape[3]
    r = H // G
    return (x.float().view(b, nc, Q, H, P), B.float().view(b, nc, Q, G, N).repeat_interleave(r, 3),
            C.float().view(b, nc, Q, G, N).repeat_interleave(r, 3))


def _dout(dy: torch.Tensor, z: torch.Tensor | None, shape: torch.Size, lowp: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(dout in fp32, dout as the dots read it): dy * silu(z) rounded to bf16 with z (as the kernels)."""
    dyf = dy.float().view(shape)
    if z is None:
        return dyf, dyf
    zf = z.float().view(shape)
    f = dyf * zf * torch.sigmoid(zf)
    return f, (f.to(BF).float() if lowp else f)


def _terms(x: torch.Tensor, B: torch.Tensor, C: torch.Tensor, cb: torch.Tensor, dt: torch.Tensor,
           dA: torch.Tensor, prev: torch.Tensor, dstates: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """x, y's state term, raw_state (b c q h p), the scores S[l, j] = CB exp(dA_l - dA_j), causal (b c h l j)."""
    xf, Bf, Cf = _per_chunk(x, B, C, dt)
    H = x.shape[2]
    dAq = dA.permute(0, 2, 3, 1)
    y_state = torch.einsum("bcqhn,bchpn->bcqhp", Cf, prev.float()) * torch.exp(dAq)[..., None]
    weight = torch.exp(torch.clamp(dAq[:, :, -1:, :] - dAq, max=0.0))
    raw_state = torch.einsum("bcqhn,bchpn->bcqhp", Bf, dstates.float()) * weight[..., None]
    dAh = dA.permute(0, 2, 1, 3)
    Q = dt.shape[3]
    causal = torch.tril(torch.ones(Q, Q, dtype=torch.bool))
    decay = torch.exp(torch.clamp(dAh[..., :, None] - dAh[..., None, :], max=0.0))
    S = torch.where(causal, cb.repeat_interleave(H // cb.shape[2], 2) * decay, 0.0)
    return xf, y_state, raw_state, S


def _apply(scores: torch.Tensor, v: torch.Tensor, mode: str) -> torch.Tensor:
    """scores (b c h l j) times v (b c j h p) with the scores rounded as `mode` says."""
    if mode == "split":
        hi = scores.to(BF).float()
        scores = hi + (scores - hi).to(BF).float()
    elif mode == "round":
        scores = scores.to(BF).float()
    elif mode != "exact":
        raise ValueError(f"unknown score mode {mode!r}")
    return torch.einsum("bchlj,bcjhp->bclhp", scores, v)


def emulated_rows(dy: torch.Tensor, z: torch.Tensor | None, x: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                  cb: torch.Tensor, dt: torch.Tensor, dA: torch.Tensor, prev: torch.Tensor, dstates: torch.Tensor,
                  D: torch.Tensor | None, y_mode: str, scan_mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The dx kernel's rows (3, 1, batch, nheads, nchunks * chunk) and dx, with the chunk-term scores rounded as asked."""
    b, L, H, P = x.shape
    xf, y, raw_state, S = _terms(x, B, C, cb, dt, dA, prev, dstates)
    dout_f, dout = _dout(dy, z, xf.shape, True)
    dth = dt.permute(0, 2, 1, 3)
    dtq = dt.permute(0, 2, 3, 1)[..., None]
    y = y + _apply(S * dth[..., None, :], xf, y_mode)
    if scan_mode == "consistent":
        scale = torch.where(dth.abs() >= 1e-20, dth, 1.0)
        scaled = _apply(S.transpose(-1, -2) * scale[..., :, None], dout, "round")
        scale_q = scale.permute(0, 1, 3, 2)[..., None]
        raw_scan = scaled / scale_q
        dx = raw_state * dtq + scaled * (dtq / scale_q)
    else:
        raw_scan = _apply(S.transpose(-1, -2), dout, scan_mode)
        dx = (raw_state + raw_scan) * dtq
    if D is not None:
        dx = dx + dout_f * D.float().view(1, 1, 1, H, -1)
    raw = raw_state + raw_scan
    rows = torch.stack([(xf * raw).sum(-1), (xf * raw_state).sum(-1), (dout * y).sum(-1)])
    return rows.permute(0, 1, 4, 2, 3).reshape(3, 1, b, H, -1), dx.reshape(b, L, H, P)


def mamba_ssm_emulated(dy: torch.Tensor, z: torch.Tensor | None, x: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                       cb: torch.Tensor, dt: torch.Tensor, dA: torch.Tensor, prev: torch.Tensor,
                       dstates: torch.Tensor, ddA_chunk: torch.Tensor, A: torch.Tensor, dt_in: torch.Tensor,
                       dt_bias: torch.Tensor | None, softplus: bool) -> dict[str, torch.Tensor]:
    """ddt, dA, ddt_bias as mamba-ssm 2.3.2's backward computes them (no dt_limit): ddt~ from
    scores rounded once; ddA w.r.t. the increments dt~ A: the scan term from exact pair
    products (strictly causal), the state terms by reverse / exclusive cumsums; ddA_chunk is
    its state passing's term (from fp32 states)."""
    b, L, H, P = x.shape
    Q = dt.shape[3]
    xf, y_state, raw_state, S = _terms(x, B, C, cb, dt, dA, prev, dstates)
    _, dout = _dout(dy, z, xf.shape, True)
    dth = dt.permute(0, 2, 1, 3)
    dtq = dt.permute(0, 2, 3, 1)
    raw_scan = _apply(S.transpose(-1, -2), dout, "round")
    ddt_x = (xf * (raw_state + raw_scan)).sum(-1).permute(0, 3, 1, 2)
    strict = torch.tril(torch.ones(Q, Q, dtype=torch.bool), -1)
    M = torch.where(strict, torch.einsum("bcmhp,bcnhp->bchmn", dout, xf) * S * dth[..., None, :], 0.0)
    # d increment s = sum_{m >= s > n} M[m, n]
    below = torch.where(strict, torch.cumsum(M, dim=-1), 0.0).sum(-2)
    scan = torch.zeros_like(below)
    scan[..., 1:] = below[..., :-1]
    prev_term = (dout * y_state).sum(-1).permute(0, 3, 1, 2).clone()
    prev_term[..., -1] += ddA_chunk
    t = (dtq * (xf * raw_state).sum(-1)).permute(0, 3, 1, 2)
    nxt = torch.zeros_like(t)
    nxt[..., 1:] = torch.cumsum(t, -1)[..., :-1]
    ddA = scan.permute(0, 2, 1, 3) + prev_term.flip(-1).cumsum(-1).flip(-1) + nxt
    dv = (ddt_x + A.float()[None, :, None, None] * ddA).reshape(b, H, -1)[..., :L]
    raw_dt = dt_in.float().permute(0, 2, 1) + (0.0 if dt_bias is None else dt_bias.float()[None, :, None])
    if softplus:
        dv = torch.where(raw_dt <= 20.0, dv * torch.sigmoid(raw_dt), dv)
    return {"dt": dv.permute(0, 2, 1).to(dt_in.dtype), "A": (ddA * dt).sum((0, 2, 3)), "dt_bias": dv.sum((0, 2))}


def main(argv: list[str]) -> None:
    vals = [int(a) for a in argv]
    b, L, H, P, G, N, Q = vals[:7] if len(vals) >= 7 else (1, 2048, 4, 64, 1, 128, 128)
    seed = vals[7] if len(vals) > 7 else 0
    with_z = bool(vals[8]) if len(vals) > 8 else False
    dims = {"batch": b, "seqlen": L, "nheads": H, "headdim": P, "ngroups": G, "dstate": N, "chunk_size": Q,
            "has_dt_bias": 1, "dt_softplus": 1, "has_D": 1, "has_z": int(with_z)}
    i = SSDInputs.make(dims, BF, "cpu", seed)
    dy = torch.randn(*i.x.shape, generator=torch.Generator().manual_seed(seed + 1)).to(BF)
    u = i.upcast()
    ref = ssd_chunked_grads(u.x, u.dt, u.A, u.B, u.C, Q, dy.float(), **u.kwargs())
    low = ssd_chunked_grads(i.x, i.dt, i.A, i.B, i.C, Q, dy, upcast=False, **i.kwargs())
    inter = combined._recompute(i.x, i.dt, i.A, i.B, i.C, Q, i.dt_bias, None, None, True, i.dt_limit)
    dstates, ddA_last, _ = chunk_state_passing_bwd._launch(dy, i.z, i.C, inter.dA_cumsum, inter.prev_states, None,
                                                           None)
    # The same stages in fp32 (inputs upcast): fp32 states, state gradients and ddA_last.
    inter32 = combined._recompute(u.x, u.dt, u.A, u.B, u.C, Q, u.dt_bias, None, None, True, u.dt_limit)
    dstates32, ddA_last32, _ = chunk_state_passing_bwd._launch(dy.float(), u.z, u.C, inter32.dA_cumsum,
                                                               inter32.prev_states, None, None)
    ddA_last32 = ddA_last32.sum(0, keepdim=True)

    def grads(rows: torch.Tensor, last: torch.Tensor, dx: torch.Tensor) -> dict[str, torch.Tensor]:
        ddt, dA, dbias = chunk_cumsum_bwd._launch(rows, last, i.dt, i.A, i.dt_bias, True, i.dt_limit, Q)
        return {"dt": ddt, "A": dA, "dt_bias": dbias, "x": dx.to(BF)}

    def line(label: str, got: dict[str, torch.Tensor]) -> None:
        errs = ((got[n].float() - ref[n].float()).abs().max().item() for n in NAMES)
        print(f"{label:46s} " + " ".join(f"{e:9.3g}" for e in errs))

    print(f"batch {b} seqlen {L} nheads {H} headdim {P} ngroups {G} dstate {N} chunk {Q} z {int(with_z)} "
          f"seed {seed}; max |fp32 gradient|: "
          + ", ".join(f"d{n} {ref[n].abs().max().item():.3g}" for n in NAMES))
    print(f"{'max abs error vs fp32':46s} " + " ".join(f"{'d' + n:>9s}" for n in NAMES))
    line("eager torch bf16", low)
    args = (dy, i.z, i.x, i.B, i.C, inter.cb, inter.dt_out, inter.dA_cumsum, inter.prev_states, dstates, i.D)
    dx, _dz, rows, _dD = chunk_scan_chunk_state_bwd_dx._launch(*args, None)
    line("the dx kernel", grads(rows, ddA_last, dx))
    for y_mode, scan_mode in (("split", "split"), ("round", "split"), ("split", "round"), ("round", "round"),
                              ("round", "consistent"), ("exact", "exact")):
        rows, dx = emulated_rows(*args, y_mode, scan_mode)
        line(f"emulated: y {y_mode}, raw_scan {scan_mode}", grads(rows, ddA_last, dx))
    rows, dx = emulated_rows(*args, "split", "split")
    line("  split, ddA_last from fp32 states", grads(rows, ddA_last32, dx))
    rows, dx = emulated_rows(*args[:9], dstates32, i.D, "split", "split")
    line("  split, fp32 state gradients", grads(rows, ddA_last, dx))
    rows, dx = emulated_rows(*args[:8], inter32.prev_states, dstates, i.D, "split", "split")
    line("  split, fp32 states in dout . y", grads(rows, ddA_last, dx))
    mamba = mamba_ssm_emulated(*args[:10], ddA_last32.sum(0), i.A, i.dt, i.dt_bias, True)
    line("mamba-ssm emulated (dx: raw_scan round)", {**mamba, "x": emulated_rows(*args, "round", "round")[1].to(BF)})


if __name__ == "__main__":
    main(sys.argv[1:])
