"""One Mamba-2 layer, forward and forward+backward: ours vs mamba-ssm, whole and stage by stage, in one process.

The layer is Mamba2's default training path at a model preset's dims (`autotune_cli.presets`,
divided by the TP degree): in_proj (a torch GEMM) -> `mamba_split_conv1d_scan_combined`
(conv1d + SiLU, SSD, gated RMSNorm with norm_before_gate=False in ngroups groups,
out_proj). Both sides get the same tensors and run the same torch GEMMs (in_proj, and
out_proj inside the fused call): only the conv1d, the SSD and the norm differ. Inputs as
`Mamba2(d_model, d_state, d_conv=4, headdim, ngroups, chunk_size)` builds them: bf16
weights, A = -exp(A_log) in fp32, D per head, dt_bias, conv bias, no out_proj bias, no
seq_idx, no initial states.

Rows (`STAGES`), each with ours_ms, baseline_ms and ratio (= baseline_ms / ours_ms, > 1: ours faster):
- "layer_fwd": in_proj + the fused call; "layer_fwd_bwd": the same plus the gradients of the
  input and every weight for a fixed output gradient (autograd); its row also carries both
  sides' peak memory above what was allocated before the step (MiB). "layer_fwd_bwd_recompute":
  layer_fwd_bwd with ours keeping nothing for the backward beyond its inputs (every SSD
  intermediate and the SSD output recomputed: what keeping them, within the bytes mamba-ssm
  keeps, gains). "layer_fwd_bwd_wall": layer_fwd_bwd's back-to-back calls timed on the host;
  "layer_fwd_bwd_graph": the same calls replayed from a CUDA graph (None for a side that cannot
  be captured): their difference is the host time per step that the GPU does not hide.
- "fused_fwd", "fused_fwd_bwd": the fused call alone (from a given zxbcdt).
- Forward stages on the same intermediates: "in_proj" and "out_proj" (torch GEMMs, the same on
  both sides: timed once, baseline_ms is None), "conv1d" (mamba-ssm: causal-conv1d's
  `causal_conv1d_fwd_function`, when the causal-conv1d package is installed), "ssd"
  (`_mamba_chunk_scan_combined_fwd`), "norm" (`layernorm_gated._layer_norm_fwd`).
- Backward stages: "conv1d_bwd", "ssd_bwd" (ours recomputes its forward's intermediates,
  as mamba-ssm's, which also gets the saved SSD output), "norm_bwd"; "norm_bwd_recompute": the
  norm's backward and the recompute of its output that out_proj's weight gradient needs, as the
  fused backward runs them (ours: its backward recomputing the statistics and the output in the
  pass; mamba-ssm: its backward with recompute_output, from the kept rstd); "out_proj_bwd" and
  "in_proj_bwd": the two torch GEMMs of each projection's backward (input and weight gradients;
  the same on both sides: timed once).
The step account (`benchmarks/account.py`, `--account`) is assembled from these rows.
do_bench medians (L2 flushed between runs). Each forward and backward stage row also carries
ours_graph_ms and baseline_graph_ms: do_bench of one call replayed from a CUDA graph, the stage's
GPU time without the host time of its launches (which do_bench counts where the GPU waits for
them); None for a side that cannot be captured. A side that cannot run (mamba-ssm missing, no
causal-conv1d) gets None.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Callable, Collection
from typing import Any

import torch
import torch.nn.functional as F

from autotune_cli.benchmarks.common import LAYER_STAGES as STAGES
from autotune_cli.benchmarks.common import (
    check_bench,
    configs_since,
    graph_bench_ms,
    graph_ms,
    recomputing,
    wall_ms,
)
from autotune_cli.presets import ModelDims
from autotune_cli.timing import gpu_median_ms
from mamba_tune import runtime
from mamba_tune.vocab import dtype_name

WIDTH = 4  # Mamba2's d_conv
NORM_EPS = 1e-5  # Mamba2's RMSNormGated eps


@dataclasses.dataclass(frozen=True)
class LayerShape:
    """One Mamba-2 layer's sizes on one rank (heads and groups divided by the TP degree)."""

    batch: int
    seqlen: int
    d_model: int
    nheads: int
    headdim: int
    ngroups: int
    dstate: int
    chunk_size: int

    @property
    def dim(self) -> int:
        return self.nheads * self.headdim

    @property
    def conv_dim(self) -> int:
        return self.dim + 2 * self.ngroups * self.dstate

    @property
    def d_in_proj(self) -> int:
        return 2 * self.dim + 2 * self.ngroups * self.dstate + self.nheads

    def text(self) -> str:
        return (f"batch={self.batch} seqlen={self.seqlen} d_model={self.d_model} nheads={self.nheads} "
                f"headdim={self.headdim} ngroups={self.ngroups} dstate={self.dstate} chunk_size={self.chunk_size}")


def layer_shape(dims: ModelDims, tp: int, batch: int, seqlen: int) -> LayerShape:
    """A preset's layer on one of tp ranks: ValueError when tp does not divide nheads and ngroups."""
    if tp < 1 or dims.nheads % tp or dims.ngroups % tp:
        raise ValueError(f"tp={tp} does not divide nheads={dims.nheads} and ngroups={dims.ngroups}")
    return LayerShape(batch=batch, seqlen=seqlen, d_model=dims.d_model, nheads=dims.nheads // tp,
                      headdim=dims.headdim, ngroups=dims.ngroups // tp, dstate=dims.dstate,
                      chunk_size=dims.chunk_size)


@dataclasses.dataclass
class LayerInputs:
    u: torch.Tensor  # (batch, seqlen, d_model)
    in_proj: torch.Tensor  # (d_in_proj, d_model)
    conv_weight: torch.Tensor  # (conv_dim, width)
    conv_bias: torch.Tensor  # (conv_dim,)
    dt_bias: torch.Tensor  # (nheads,)
    A: torch.Tensor  # (nheads,) fp32
    D: torch.Tensor  # (nheads,)
    norm_weight: torch.Tensor  # (dim,)
    out_proj: torch.Tensor  # (d_model, dim)
    dout: torch.Tensor  # (batch, seqlen, d_model): the output gradient of the fwd_bwd rows

    @classmethod
    def make(cls, s: LayerShape, dtype: torch.dtype, device: str = "cuda", seed: int = 0) -> LayerInputs:
        gen = torch.Generator(device=device).manual_seed(seed)

        def rnd(*shape: int, scale: float, dt: torch.dtype = dtype) -> torch.Tensor:
            return (torch.randn(*shape, generator=gen, device=device) * scale).to(dt)

        dt = torch.exp(torch.rand(s.nheads, generator=gen, device=device) * (math.log(0.1) - math.log(0.001))
                       + math.log(0.001))  # Mamba2's dt init in [0.001, 0.1]
        return cls(
            u=rnd(s.batch, s.seqlen, s.d_model, scale=1.0),
            in_proj=rnd(s.d_in_proj, s.d_model, scale=s.d_model ** -0.5),
            conv_weight=rnd(s.conv_dim, WIDTH, scale=WIDTH ** -0.5),
            conv_bias=rnd(s.conv_dim, scale=0.1),
            dt_bias=(dt + torch.log(-torch.expm1(-dt))).to(dtype),  # softplus^-1(dt)
            A=-torch.empty(s.nheads, device=device).uniform_(1, 16, generator=gen),
            D=torch.ones(s.nheads, device=device, dtype=dtype),
            norm_weight=torch.ones(s.dim, device=device, dtype=dtype),
            out_proj=rnd(s.d_model, s.dim, scale=s.dim ** -0.5),
            dout=rnd(s.batch, s.seqlen, s.d_model, scale=1.0),
        )


def _fused_call(fn: Callable[..., Any], s: LayerShape, i: LayerInputs, t: dict[str, torch.Tensor],
                zxbcdt: torch.Tensor) -> torch.Tensor:
    return fn(zxbcdt, t["conv_weight"], t["conv_bias"], t["dt_bias"], t["A"], t["D"], s.chunk_size,
              rmsnorm_weight=t["norm_weight"], rmsnorm_eps=NORM_EPS, outproj_weight=t["out_proj"],
              headdim=s.headdim, ngroups=s.ngroups, norm_before_gate=False)


WEIGHTS = ("in_proj", "conv_weight", "conv_bias", "dt_bias", "A", "D", "norm_weight", "out_proj")


def layer_step(fn: Callable[..., Any], s: LayerShape, i: LayerInputs, backward: bool,
               with_in_proj: bool = True) -> Callable[[], Any]:
    """The layer (in_proj + fn, or fn alone on a fixed zxbcdt) forward, and with backward the
    gradients of the input (u or zxbcdt) and of every weight for i.dout."""
    t = {k: getattr(i, k).detach().clone().requires_grad_(backward) for k in WEIGHTS}
    u = i.u.detach().clone().requires_grad_(backward)
    zxbcdt = F.linear(i.u, i.in_proj).detach().requires_grad_(backward)

    def step() -> Any:
        with torch.set_grad_enabled(backward):
            x = F.linear(u, t["in_proj"]) if with_in_proj else zxbcdt
            out = _fused_call(fn, s, i, t, x)
            if not backward:
                return out
            leaves = [u if with_in_proj else zxbcdt] + [v for k, v in t.items() if with_in_proj or k != "in_proj"]
            return torch.autograd.grad(out, leaves, i.dout)

    return step


def _stage_fns(s: LayerShape, i: LayerInputs, stages: Collection[str]
               ) -> tuple[dict[str, Callable[[], Any]], dict[str, Callable[[], Any]]]:
    """Ours and mamba-ssm's forward and backward stages on the same intermediates."""
    from mamba_tune.conv1d import conv1d_backward, conv1d_forward
    from mamba_tune.norm import gated
    from mamba_tune.ssd.combined import ssd_backward, ssd_forward

    b, L = s.batch, s.seqlen
    zxbcdt = F.linear(i.u, i.in_proj)
    z, xBC, dt = torch.split(zxbcdt, [s.dim, s.conv_dim, s.nheads], dim=-1)
    xBC_t = xBC.transpose(1, 2)  # channel-last (batch, conv_dim, seqlen), as the fused call passes it
    conv = conv1d_forward(xBC_t, i.conv_weight, i.conv_bias, None, None, None, True).transpose(1, 2)
    x, B, C = torch.split(conv, [s.dim, s.ngroups * s.dstate, s.ngroups * s.dstate], dim=-1)
    x = x.unflatten(-1, (s.nheads, s.headdim))
    B, C = B.unflatten(-1, (s.ngroups, s.dstate)), C.unflatten(-1, (s.ngroups, s.dstate))
    y, _ = ssd_forward(x, dt, i.A, B, C, s.chunk_size, D=i.D, dt_bias=i.dt_bias, dt_softplus=True)
    y2, z2, gs = y.reshape(b * L, s.dim), z.reshape(b * L, s.dim), s.dim // s.ngroups
    normed, _, rstd = gated._fwd(y2, z2, i.norm_weight, None, NORM_EPS, gs, False, True)
    dnormed = torch.randn_like(normed)
    normed_again = torch.empty_like(normed)  # the fused backward's recompute of normed
    dy = torch.randn_like(y)
    dconv = torch.randn_like(xBC_t)
    dout = i.dout
    normed3 = normed.view(b, L, s.dim)
    dzxbcdt = torch.randn_like(zxbcdt)
    u2, dzxbcdt2 = i.u.reshape(b * L, s.d_model), dzxbcdt.reshape(b * L, s.d_in_proj)
    ours: dict[str, Callable[[], Any]] = {
        "in_proj": lambda: F.linear(i.u, i.in_proj),
        "out_proj": lambda: F.linear(normed, i.out_proj),
        "conv1d": lambda: conv1d_forward(xBC_t, i.conv_weight, i.conv_bias, None, None, None, True),
        "ssd": lambda: ssd_forward(x, dt, i.A, B, C, s.chunk_size, D=i.D, dt_bias=i.dt_bias, dt_softplus=True),
        "norm": lambda: gated._fwd(y2, z2, i.norm_weight, None, NORM_EPS, gs, False, True),
        "conv1d_bwd": lambda: conv1d_backward(xBC_t, i.conv_weight, i.conv_bias, dconv, None, None, None, None,
                                              False, True),
        "ssd_bwd": lambda: ssd_backward(dy, None, x, dt, i.A, B, C, s.chunk_size, D=i.D, dt_bias=i.dt_bias,
                                        dt_softplus=True),
        "norm_bwd": lambda: gated._bwd(dnormed, y2, z2, i.norm_weight, None, None, rstd, gs, False, True),
        "norm_bwd_recompute": lambda: gated._bwd(dnormed, y2, z2, i.norm_weight, None, None, None, gs, False, True,
                                                 out2=normed_again, eps=NORM_EPS),
        # As autograd and the fused backward run them: the input gradient, then the weight's.
        "out_proj_bwd": lambda: (F.linear(dout, i.out_proj.t()), torch.einsum("bso,bsd->od", dout, normed3)),
        "in_proj_bwd": lambda: (torch.mm(dzxbcdt2, i.in_proj), torch.mm(dzxbcdt2.t(), u2)),
    }
    base: dict[str, Callable[[], Any]] = {}
    if not x.is_cuda:  # mamba-ssm's Triton kernels run on a GPU only (the ref-mode tests: ours alone)
        return ours, base
    try:
        from mamba_ssm.ops.triton import layernorm_gated, ssd_combined
    except ImportError:
        return ours, base
    fwd = ssd_combined._mamba_chunk_scan_combined_fwd
    base["ssd"] = lambda: fwd(x, dt, i.A, B, C, s.chunk_size, D=i.D, dt_bias=i.dt_bias, dt_softplus=True)
    base["norm"] = lambda: layernorm_gated._layer_norm_fwd(y2, i.norm_weight, None, NORM_EPS, z=z2, group_size=gs,
                                                           norm_before_gate=False, is_rms_norm=True)
    if "ssd_bwd" in stages:
        out_ssd = fwd(x, dt, i.A, B, C, s.chunk_size, D=i.D, dt_bias=i.dt_bias, dt_softplus=True)[0]
        base["ssd_bwd"] = lambda: ssd_combined._mamba_chunk_scan_combined_bwd(
            dy, x, dt, i.A, B, C, out_ssd, s.chunk_size, D=i.D, dt_bias=i.dt_bias, dt_softplus=True)
    if "norm_bwd" in stages or "norm_bwd_recompute" in stages:
        _, _, rstd_b = layernorm_gated._layer_norm_fwd(y2, i.norm_weight, None, NORM_EPS, z=z2, group_size=gs,
                                                       norm_before_gate=False, is_rms_norm=True)
        base["norm_bwd"] = lambda: layernorm_gated._layer_norm_bwd(
            dnormed, y2, i.norm_weight, None, NORM_EPS, None, rstd_b, z=z2, group_size=gs, norm_before_gate=False,
            is_rms_norm=True)
        dz_b, normed_b = torch.empty_like(z2), torch.empty_like(y2)  # as the fused backward: given buffers
        base["norm_bwd_recompute"] = lambda: layernorm_gated._layer_norm_bwd(
            dnormed, y2, i.norm_weight, None, NORM_EPS, None, rstd_b, z=z2, group_size=gs, norm_before_gate=False,
            is_rms_norm=True, recompute_output=True, dz=dz_b, out=normed_b)
    conv_fns = getattr(ssd_combined, "causal_conv1d_fwd_function", None), getattr(
        ssd_combined, "causal_conv1d_bwd_function", None)
    if conv_fns[0] is not None and conv_fns[1] is not None:
        cfwd, cbwd = conv_fns
        base["conv1d"] = lambda: cfwd(xBC_t, i.conv_weight, i.conv_bias, None, None, None, True)
        base["conv1d_bwd"] = lambda: cbwd(xBC_t, i.conv_weight, i.conv_bias, dconv, None, None, None, None, False,
                                          True)
    return ours, base


def _timer(rep_ms: int) -> Callable[[str, Callable[[], Any]], float | None]:
    """How a row is timed: back-to-back on the host (_wall), replayed from a CUDA graph (_graph:
    five steps a graph, each keeping its gradients in the graph's pool), else do_bench."""
    def time(stage: str, fn: Callable[[], Any]) -> float | None:
        if stage.endswith("_wall"):
            return wall_ms(fn, 20)
        if stage.endswith("_graph"):
            return graph_ms(fn, calls=5, reps=10)
        return gpu_median_ms(fn, rep_ms, warmup_ms=max(rep_ms // 8, 5))

    return time


def _fused_fns() -> tuple[Callable[..., Any], Callable[..., Any] | None]:
    from mamba_tune.layer import mamba_split_conv1d_scan_combined

    try:
        from mamba_ssm.ops.triton.ssd_combined import mamba_split_conv1d_scan_combined as theirs
    except ImportError:
        theirs = None
    return mamba_split_conv1d_scan_combined, theirs


def _bench_shape(label: str, s: LayerShape, dtype: torch.dtype, rep_ms: int,
                 stages: Collection[str]) -> list[dict[str, Any]]:
    from autotune_cli.benchmarks.ssd import peak_mib

    sources = runtime.resolutions()
    i = LayerInputs.make(s, dtype)
    ours_fn, theirs_fn = _fused_fns()
    if theirs_fn is not None and getattr(sys.modules[theirs_fn.__module__], "causal_conv1d_fwd_function",
                                         None) is None:
        theirs_fn = None  # mamba-ssm's fused call needs the causal-conv1d package
    whole = {"layer_fwd": (False, True), "layer_fwd_bwd": (True, True), "fused_fwd": (False, False),
             "fused_fwd_bwd": (True, False)}
    # Rows that time layer_fwd_bwd's step another way (`_timer`).
    same_step = ("layer_fwd_bwd_recompute", "layer_fwd_bwd_wall", "layer_fwd_bwd_graph")
    ours: dict[str, Callable[[], Any]] = {}
    base: dict[str, Callable[[], Any]] = {}
    for stage, (backward, with_in_proj) in whole.items():
        if stage in stages or stage == "layer_fwd_bwd" and any(k in stages for k in same_step):
            ours[stage] = layer_step(ours_fn, s, i, backward, with_in_proj)
            if theirs_fn is not None:
                base[stage] = layer_step(theirs_fn, s, i, backward, with_in_proj)
    if "layer_fwd_bwd_recompute" in stages:
        ours["layer_fwd_bwd_recompute"] = recomputing(ours["layer_fwd_bwd"])
        if "layer_fwd_bwd" in base:
            base["layer_fwd_bwd_recompute"] = base["layer_fwd_bwd"]
    for stage in ("layer_fwd_bwd_wall", "layer_fwd_bwd_graph"):
        if stage in stages:
            ours[stage] = ours["layer_fwd_bwd"]
            if "layer_fwd_bwd" in base:
                base[stage] = base["layer_fwd_bwd"]
    parts: set[str] = set()  # the forward and backward stage rows: each also timed from a CUDA graph
    if set(stages) - set(whole) - set(same_step):
        o, b = _stage_fns(s, i, stages)
        parts = set(o)
        ours.update({k: v for k, v in o.items() if k in stages})
        base.update({k: v for k, v in b.items() if k in stages})
    timer = _timer(rep_ms)
    rows = []
    for stage in STAGES:
        if stage not in ours or stage not in stages:
            continue
        ours_ms = timer(stage, ours[stage])
        row: dict[str, Any] = {"family": "layer", "model": label, "stage": stage, "dtype": dtype_name(dtype),
                               "shape": s.text(), "ours_ms": ours_ms, "baseline_ms": None, "ratio": None,
                               "baseline": None}
        if stage in base:
            row["baseline_ms"] = timer(stage, base[stage])
            if ours_ms is not None and row["baseline_ms"] is not None:
                row["ratio"] = row["baseline_ms"] / ours_ms
            row["baseline"] = "mamba-ssm"
        if stage in parts:  # the stage's GPU time alone, its launches' host time left out
            row["ours_graph_ms"] = graph_bench_ms(ours[stage], rep_ms)
            row["baseline_graph_ms"] = graph_bench_ms(base[stage], rep_ms) if stage in base else None
        if stage in ("layer_fwd_bwd", "layer_fwd_bwd_recompute"):
            row["ours_peak_mib"] = peak_mib(ours[stage])
            if stage in base:
                row["baseline_peak_mib"] = peak_mib(base[stage])
        rows.append(row)
    configs = configs_since(sources)
    for row in rows:
        row["configs"] = configs
    return rows


def bench_layer(shapes: list[tuple[str, LayerShape]], dtype: torch.dtype, rep_ms: int = 200,
                stages: Collection[str] = STAGES) -> list[dict[str, Any]]:
    """Time the layer rows (default: all of `STAGES`) ours vs mamba-ssm at each (label, shape). CUDA only."""
    check_bench("layer", "layer", stages, STAGES)
    return [row for label, shape in shapes for row in _bench_shape(label, shape, dtype, rep_ms, stages)]
