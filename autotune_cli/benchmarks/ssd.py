"""SSD forward and backward benchmark: ours (configs from the bundles) vs mamba-ssm, stage by stage and whole, in one process.

Inputs are the call the Mamba-2 mixer makes (`autotune_cli.tuning.ssd.inputs.mixer_dims`): D per head,
dt_bias, dt_softplus, no z, no seq_idx, no initial states, at the given model shapes.
Each stage is timed on the same intermediate tensors for both sides (ours from F1), with
`triton.testing.do_bench` medians (L2 flushed between runs). "total" is the whole public
call timed the same way; "total_wall" is back-to-back calls timed on the host (launch gaps
and host work included); "total_graph" is the same back-to-back calls replayed from a CUDA
graph (no host work: with total_wall, it splits wall time into GPU time and host cost;
None for a side that cannot be captured).
"bmm_seq_idx" and "total_seq_idx" repeat F4 and the whole call with packed sequences
(seq_idx with 4 sequences per row, both sides): ours then masks C B^T after F4 (bmm.py).

Forward+backward (autograd, gradients of x, dt, A, B, C, D, dt_bias for a fixed dy, via
`torch.autograd.grad`): "fwd_bwd" (do_bench), "fwd_bwd_wall", "fwd_bwd_graph",
"fwd_bwd_seq_idx"; "fwd_bwd_recompute" and "fwd_bwd_recompute_graph" time ours with the
autograd forward keeping no intermediates (every one recomputed in the backward: what keeping
them within mamba-ssm's saved bytes gains; mamba-ssm as in fwd_bwd); the fwd_bwd rows also carry the peak memory of one step above what was
allocated before it (`torch.cuda.max_memory_allocated`, MiB) and the number of GPU
activities (kernels and memsets) one step launches, for both sides. "bwd_*" rows time each
backward kernel on its tuning record's inputs against the mamba-ssm kernels it replaces
(the record's baseline).

Rows: model, stage, ours_ms, baseline_ms, ratio (= baseline_ms / ours_ms, > 1: ours faster),
tflops and gbps of ours (useful work over ours_ms), plus shape and config provenance.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection
from typing import Any

import torch

from autotune_cli.benchmarks.common import SSD_STAGES as STAGES
from autotune_cli.benchmarks.common import configs_since, graph_ms, recomputing, wall_ms
from autotune_cli.timing import gpu_median_ms
from autotune_cli.tuning import ModelShape
from autotune_cli.tuning.ssd.inputs import SSDInputs, mamba_ssm_ops, mixer_dims
from mamba_tune import runtime
from mamba_tune.keys import state_passing_bwd_dims
from mamba_tune.ssd import (
    bmm,
    chunk_cumsum,
    chunk_scan,
    chunk_state,
    chunk_state_passing,
    combined,
)
from mamba_tune.ssd import chunk_state_scan_bwd_dbdc as dbdc
from mamba_tune.ssd.common import nchunks_of
from mamba_tune.vocab import dtype_name


def _work(shape: ModelShape, dtype: torch.dtype) -> dict[str, tuple[int, int]]:
    """(flops, bytes) of each stage: useful tensor-core work, each tensor read or written once."""
    b, L, H, P = shape.batch, shape.seqlen, shape.nheads, shape.headdim
    G, N, Q = shape.ngroups, shape.dstate, shape.chunk_size
    nc = nchunks_of(L, Q)
    e = torch.finfo(dtype).bits // 8
    x, bc, per_chunk = b * L * H * P * e, b * L * G * N * e, b * H * nc * Q * 4
    states32, states_lo = b * nc * H * P * N * 4, b * nc * H * P * N * e
    cb = b * nc * G * Q * Q * 4
    f_state, f_cb, f_scan = 2 * b * L * H * P * N, b * L * G * Q * N, 2 * b * L * H * P * N + b * L * H * P * Q
    return {
        "chunk_cumsum": (0, b * L * H * e + 2 * per_chunk),
        "chunk_state": (f_state, x + bc + 2 * per_chunk + states32),
        "chunk_state_passing": (f_state, x + bc + 2 * per_chunk + states_lo),
        "bmm": (f_cb, 2 * bc + cb),
        "chunk_scan": (f_scan, 2 * x + bc + cb + states_lo + 2 * per_chunk),
        "total": (f_state + f_cb + f_scan, 2 * x + 2 * bc + b * L * H * e),
        "bmm_seq_idx": (f_cb, 2 * bc + cb + b * L * 4),
    }


# Backward rows -> the tuning record they time.
BWD_KERNELS = {"bwd_state_passing": "ssd_chunk_state_passing_bwd", "bwd_dx": "ssd_chunk_scan_chunk_state_bwd_dx",
               "bwd_dbdc": "ssd_chunk_state_scan_bwd_dbdc", "bwd_cumsum": "ssd_chunk_cumsum_bwd"}
GRAD_INPUTS = ("x", "dt", "A", "B", "C", "D", "dt_bias")


def fwd_bwd_step(fn: Callable[..., Any], i: SSDInputs, dy: torch.Tensor) -> Callable[[], Any]:
    """One training step of the SSD alone: forward, then the gradients of GRAD_INPUTS for dy."""
    leaves = {k: getattr(i, k).detach().clone().requires_grad_() for k in GRAD_INPUTS if getattr(i, k) is not None}
    kwargs = {**i.kwargs(), **{k: v for k, v in leaves.items() if k in ("D", "dt_bias")}}

    def step() -> Any:
        with torch.enable_grad():
            out = fn(leaves["x"], leaves["dt"], leaves["A"], leaves["B"], leaves["C"], i.chunk_size, **kwargs)
            return torch.autograd.grad(out, list(leaves.values()), dy)

    return step


def peak_mib(fn: Callable[[], Any]) -> float:
    """Peak memory of one call above what was allocated before it (MiB)."""
    fn()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


def gpu_activities(fn: Callable[[], Any]) -> int:
    """GPU kernels and memsets one call launches (torch profiler)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def bwd_kernel_calls(shape: ModelShape, dtype: torch.dtype, device: torch.device, stages: Collection[str]
                     ) -> dict[str, tuple[Callable[[], Any], Any]]:
    """Stage -> (our backward kernel on its tuning problem, through the runtime; mamba-ssm's
    matching kernels as a `Baseline`, or None) for each backward-kernel stage in `stages`."""
    from autotune_cli.tuning import get

    out: dict[str, tuple[Callable[[], Any], Any]] = {}
    for stage, name in BWD_KERNELS.items():
        if stage not in stages:
            continue
        tk = get(name)
        # B2 + B3 at the shape, on whichever path the backward takes there (one walk, or F2's
        # kernel then `ssd_state_passing_bwd`'s walk: combined.state_passing_bwd_launch).
        sp = stage == "bwd_state_passing"
        dims = state_passing_bwd_dims(shape) if sp else tk.dims_for(shape)
        problem = tk.make_problem(dims, dtype, device, 0)
        base = tk.make_baseline(dims, dtype, device, 0) if tk.make_baseline and device.type == "cuda" else None
        if sp:
            out[stage] = (lambda args=problem.args: combined.state_passing_bwd_launch(*args[2:])), base
            continue
        # With the dB/dC heads split into runs the host sums the kernel's fp32 partials: part of
        # the stage's work, as mamba-ssm's torch sums of its partials are part of its row.
        summed = name == "ssd_chunk_state_scan_bwd_dbdc"
        out[stage] = (lambda rk=tk.runtime, args=problem.args, summed=summed: _bwd_call(rk, args, summed, dtype)), base
    return out


def _bwd_call(rk: runtime.RuntimeKernel, args: tuple[Any, ...], summed: bool, dtype: torch.dtype) -> Any:
    result = runtime.run(rk, args)
    return dbdc.sum_runs(*result, dtype) if summed else result


def _bench_bwd_kernels(shape: ModelShape, dtype: torch.dtype, rep_ms: int,
                       stages: Collection[str]) -> dict[str, tuple[float, float | None, str | None]]:
    warm = max(rep_ms // 8, 5)
    return {stage: (gpu_median_ms(ours, rep_ms, warmup_ms=warm),
                    None if base is None else gpu_median_ms(base.fn, rep_ms, warmup_ms=warm),
                    None if base is None else base.name)
            for stage, (ours, base) in bwd_kernel_calls(shape, dtype, torch.device("cuda"), stages).items()}


def _bench_shape(label: str, shape: ModelShape, dtype: torch.dtype, rep_ms: int,
                 stages: Collection[str]) -> list[dict[str, Any]]:
    # Rows list the configs first resolved at this shape (a key shared with an earlier shape is listed there).
    sources = runtime.resolutions()
    i = SSDInputs.make(mixer_dims(shape), dtype, "cuda", 0)
    s = i  # packed sequences: the same tensors plus seq_idx, made only when a seq_idx row is asked for
    if set(stages) & {"bmm_seq_idx", "total_seq_idx"}:
        # make() draws seq_idx after every other input, so the one draw it adds is all we keep.
        packed = SSDInputs.make({**mixer_dims(shape), "has_seq_idx": 1}, dtype, "cpu", 0)
        s = dataclasses.replace(i, seq_idx=packed.seq_idx.to("cuda"))
    Q = i.chunk_size
    dA, dt_out = chunk_cumsum._launch(i.dt, i.A, Q, i.dt_bias, True, i.dt_limit)
    # The intermediates one stage reads, from our own earlier stages (only when a stage needs them).
    if "chunk_scan" in stages:
        prev, _final = chunk_state_passing._launch(i.B, i.x, dt_out, dA, None, None, dtype)
        cb = bmm._launch(i.C, i.B, Q, None)
    else:
        prev = cb = None
    ours: dict[str, Callable[[], Any]] = {
        "chunk_cumsum": lambda: chunk_cumsum._launch(i.dt, i.A, Q, i.dt_bias, True, i.dt_limit),
        "chunk_state": lambda: chunk_state._launch(i.B, i.x, dt_out, dA, None),
        "chunk_state_passing": lambda: chunk_state_passing._launch(i.B, i.x, dt_out, dA, None, None, dtype),
        "bmm": lambda: bmm._launch(i.C, i.B, Q, None),
        "bmm_seq_idx": lambda: bmm._launch(s.C, s.B, Q, s.seq_idx),
        "chunk_scan": lambda: chunk_scan._launch(i.x, cb, i.C, dt_out, dA, prev, i.D, None, None),
        "total": lambda: combined.mamba_chunk_scan_combined(i.x, i.dt, i.A, i.B, i.C, Q, **i.kwargs()),
        "total_seq_idx": lambda: combined.mamba_chunk_scan_combined(s.x, s.dt, s.A, s.B, s.C, Q, **s.kwargs()),
    }
    base: dict[str, Callable[[], Any]] = {}
    found = mamba_ssm_ops()
    baseline_name = None
    if found is not None:
        mods, baseline_name = found
        dA_last = dA[..., -1]
        cs, sp, bm, sc, cmb = (mods["chunk_state"], mods["state_passing"], mods["bmm"], mods["chunk_scan"],
                               mods["combined"])
        base = {
            "chunk_cumsum": lambda: cs._chunk_cumsum_fwd(i.dt, i.A, Q, dt_bias=i.dt_bias, dt_softplus=True,
                                                         dt_limit=i.dt_limit),
            "chunk_state": lambda: cs._chunk_state_fwd(i.B, i.x, dt_out, dA, states_in_fp32=True),
            "chunk_state_passing": lambda: sp._state_passing_fwd(
                cs._chunk_state_fwd(i.B, i.x, dt_out, dA, states_in_fp32=True).flatten(3), dA_last,
                chunk_size=Q, out_dtype=dtype),
            "bmm": lambda: bm._bmm_chunk_fwd(i.C, i.B, Q, output_dtype=torch.float32),
            "bmm_seq_idx": lambda: bm._bmm_chunk_fwd(s.C, s.B, Q, seq_idx=s.seq_idx, output_dtype=torch.float32),
            "chunk_scan": lambda: sc._chunk_scan_fwd(cb, i.x, dt_out, dA, i.C, prev, D=i.D),
            "total": lambda: cmb.mamba_chunk_scan_combined(i.x, i.dt, i.A, i.B, i.C, Q, **i.kwargs()),
            "total_seq_idx": lambda: cmb.mamba_chunk_scan_combined(s.x, s.dt, s.A, s.B, s.C, Q, **s.kwargs()),
        }
    if {s for s in stages if s.startswith("fwd_bwd")}:
        dy = torch.randn_like(i.x)
        ours["fwd_bwd"] = fwd_bwd_step(combined.mamba_chunk_scan_combined, i, dy)
        ours["fwd_bwd_seq_idx"] = fwd_bwd_step(combined.mamba_chunk_scan_combined, s, dy)
        ours["fwd_bwd_recompute"] = recomputing(ours["fwd_bwd"])
        if found is not None:
            base["fwd_bwd"] = fwd_bwd_step(cmb.mamba_chunk_scan_combined, i, dy)
            base["fwd_bwd_seq_idx"] = fwd_bwd_step(cmb.mamba_chunk_scan_combined, s, dy)
            base["fwd_bwd_recompute"] = base["fwd_bwd"]
    work = _work(shape, dtype)
    shape_text = (f"batch={shape.batch} seqlen={shape.seqlen} nheads={shape.nheads} headdim={shape.headdim} "
                  f"ngroups={shape.ngroups} dstate={shape.dstate} chunk_size={shape.chunk_size}")
    rows = []
    for stage, fn in ours.items():
        if stage not in stages:
            continue
        ours_ms = gpu_median_ms(fn, rep_ms, warmup_ms=max(rep_ms // 8, 5))
        # Forward+backward rows report time only (their work is not the forward's).
        flops, nbytes = (0, 0) if stage.startswith("fwd_bwd") else work[stage if stage in work else "total"]
        row: dict[str, Any] = {
            "family": "ssd", "model": label, "stage": stage, "dtype": dtype_name(dtype), "shape": shape_text,
            "ours_ms": ours_ms, "baseline": baseline_name, "baseline_ms": None, "ratio": None,
            "tflops": flops / (ours_ms * 1e-3) / 1e12 if flops else None,
            "gbps": nbytes / (ours_ms * 1e-3) / 1e9 if nbytes else None,
        }
        if stage in base:
            row["baseline_ms"] = gpu_median_ms(base[stage], rep_ms, warmup_ms=max(rep_ms // 8, 5))
            row["ratio"] = row["baseline_ms"] / ours_ms
        if stage in ("fwd_bwd", "fwd_bwd_recompute"):
            row["ours_peak_mib"] = peak_mib(fn)
            row["ours_gpu_activities"] = gpu_activities(fn)
            if stage in base:
                row["baseline_peak_mib"] = peak_mib(base[stage])
                row["baseline_gpu_activities"] = gpu_activities(base[stage])
        rows.append(row)
    for stage, (t_ours, t_base, bname) in _bench_bwd_kernels(shape, dtype, rep_ms, stages).items():
        rows.append({"family": "ssd", "model": label, "stage": stage, "dtype": dtype_name(dtype),
                     "shape": shape_text, "ours_ms": t_ours, "baseline_ms": t_base, "baseline": bname,
                     "ratio": None if t_base is None else t_base / t_ours, "tflops": None, "gbps": None})
    # Back-to-back calls of the whole forward: timed on the host, and replayed from a CUDA graph.
    back_to_back: dict[str, tuple[str, Callable[[Callable[[], Any]], float | None]]] = {
        "total_wall": ("total", lambda fn: wall_ms(fn, 50)), "total_graph": ("total", graph_ms),
        "fwd_bwd_wall": ("fwd_bwd", lambda fn: wall_ms(fn, 20)), "fwd_bwd_graph": ("fwd_bwd", graph_ms),
        "fwd_bwd_recompute_graph": ("fwd_bwd_recompute", graph_ms)}
    for stage, (what, timer) in back_to_back.items():
        if stage not in stages:
            continue
        t_ours = timer(ours[what])
        t_base = timer(base[what]) if what in base else None
        rows.append({"family": "ssd", "model": label, "stage": stage, "dtype": dtype_name(dtype),
                     "shape": shape_text, "ours_ms": t_ours, "baseline_ms": t_base, "baseline": baseline_name,
                     "ratio": None if t_base is None or t_ours is None else t_base / t_ours,
                     "tflops": None, "gbps": None})
    configs = configs_since(sources)
    for row in rows:
        row["configs"] = configs
    return rows


def bench_ssd(model_shapes: list[tuple[str, ModelShape]], dtype: torch.dtype, rep_ms: int = 200,
              stages: Collection[str] = STAGES) -> list[dict[str, Any]]:
    """Time the SSD stages (default: all of `STAGES`) ours vs mamba-ssm at each (label, shape). CUDA only."""
    if not torch.cuda.is_available():
        raise RuntimeError("bench_ssd needs a CUDA GPU")
    unknown = set(stages) - set(STAGES)
    if unknown:
        raise ValueError(f"unknown SSD stage(s) {sorted(unknown)}; known: {', '.join(STAGES)}")
    with torch.no_grad():
        return [row for label, shape in model_shapes for row in _bench_shape(label, shape, dtype, rep_ms, stages)]


if __name__ == "__main__":
    import argparse
    import json

    from autotune_cli.presets import MODEL_PRESETS

    parser = argparse.ArgumentParser(description="SSD forward and backward: ours vs mamba-ssm at the model presets")
    parser.add_argument("--models", nargs="*", default=list(MODEL_PRESETS), help="preset names")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seqlen", type=int, default=8192)
    parser.add_argument("--rep-ms", type=int, default=200)
    parser.add_argument("--stages", nargs="*", default=list(STAGES), help="rows to time")
    opts = parser.parse_args()
    shapes = [(name, ModelShape(batch=opts.batch, seqlen=opts.seqlen, nheads=m.nheads, headdim=m.headdim,
                                ngroups=m.ngroups, dstate=m.dstate, chunk_size=m.chunk_size))
              for name, m in ((n, MODEL_PRESETS[n]) for n in opts.models)]
    for row in bench_ssd(shapes, torch.bfloat16, opts.rep_ms, opts.stages):
        print(json.dumps(row), flush=True)
