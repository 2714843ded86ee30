"""Gated RMSNorm benchmark: ours (configs from the bundles) vs mamba-ssm, in one process.

Inputs are the call the Mamba-2 mixer makes: x and z (batch*seqlen, nheads*headdim) in the
given dtype, an fp32 weight, group_size = d / ngroups, z gate after the norm. Both sides
are timed at the same level: the host launcher (kernel plus partial-sum epilogue): kernel
time (L2 flushed), wall time of back-to-back calls (host work included) and the same calls
replayed from a CUDA graph (no host work; None if a side cannot be captured).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from autotune_cli.benchmarks.common import graph_ms, wall_ms
from autotune_cli.timing import gpu_median_ms
from autotune_cli.tuning import ModelShape
from autotune_cli.tuning import norm as norm_tuning
from mamba_tune import runtime
from mamba_tune.bundle import entry_key
from mamba_tune.norm import gated
from mamba_tune.vocab import dtype_name


def _mamba_ssm() -> Any:
    try:
        from mamba_ssm.ops.triton import layernorm_gated
    except ImportError:
        return None
    return layernorm_gated


def _bench_shape(label: str, shape: ModelShape, dtype: torch.dtype, lg: Any) -> list[dict[str, Any]]:
    dims = norm_tuning.GATED_NORM_FWD.dims_for(shape)
    rows, d, gs = dims["rows"], dims["d"], dims["group_size"]
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(rows, d, device="cuda", dtype=dtype, generator=gen)
    z = torch.randn(rows, d, device="cuda", dtype=dtype, generator=gen)
    dy = torch.randn(rows, d, device="cuda", dtype=dtype, generator=gen)
    w = 1 + 0.1 * torch.randn(d, device="cuda", dtype=torch.float32, generator=gen)
    eps = 1e-6
    _, _, rstd = gated._fwd(x, z, w, None, eps, gs, False, True)
    ops = {
        "fwd": (lambda: gated._fwd(x, z, w, None, eps, gs, False, True), gated.GATED_NORM_FWD, False),
        "bwd": (lambda: gated._bwd(dy, x, z, w, None, None, rstd, gs, False, True), gated.GATED_NORM_BWD, True),
    }
    base: dict[str, Any] = {}
    if lg is not None:
        _, _, base_rstd = lg._layer_norm_fwd(x, w, None, eps, z=z, group_size=gs, norm_before_gate=False,
                                             is_rms_norm=True)
        base["fwd"] = lambda: lg._layer_norm_fwd(x, w, None, eps, z=z, group_size=gs, norm_before_gate=False,
                                                 is_rms_norm=True)
        base["bwd"] = lambda: lg._layer_norm_bwd(dy, x, w, None, eps, None, base_rstd, z, gs, False, True)
    out = []
    for name, (ours, tk, bwd) in ops.items():
        nbytes = norm_tuning._norm_bytes(dims, dtype, bwd=bwd)
        key = entry_key(tk.name, dims, dtype_name(dtype))
        ours_ms = gpu_median_ms(ours, rep_ms=200)
        # Read after the first call: that is when the runtime resolves (and records) the config.
        source = runtime.resolutions().get(key, "?")
        row: dict[str, Any] = {
            "family": "norm", "model": label, "op": f"gated_norm_{name}", "dtype": str(dtype).split(".")[-1],
            "shape": f"rows={rows} d={d} group_size={gs}", "config": source,
            "ours_ms": ours_ms, "ours_wall_ms": wall_ms(ours), "ours_graph_ms": graph_ms(ours),
            "ours_gbps": nbytes / (ours_ms * 1e-3) / 1e9,
        }
        if name in base:
            base_ms = gpu_median_ms(base[name], rep_ms=200)
            row.update(baseline="mamba-ssm", baseline_ms=base_ms, baseline_wall_ms=wall_ms(base[name]),
                       baseline_graph_ms=graph_ms(base[name]), baseline_gbps=nbytes / (base_ms * 1e-3) / 1e9, speedup=base_ms / ours_ms)
        out.append(row)
    return out


def bench_norm(model_shapes: list[tuple[str, ModelShape]], dtype: torch.dtype) -> list[dict[str, Any]]:
    lg = _mamba_ssm()
    return [row for label, shape in model_shapes for row in _bench_shape(label, shape, dtype, lg)]


def lookup_us(iters: int = 20000) -> float:
    """Host cost (us) of finding the compiled kernel for a call that has been seen before."""
    x = torch.randn(64, 2, 32, device="cuda", dtype=torch.bfloat16)
    w = torch.ones(2, 32, device="cuda")
    args = (x, x, w, None, 1e-6, False, True)
    runtime.run(gated.GATED_NORM_FWD, args)
    t0 = time.perf_counter()
    for _ in range(iters):
        runtime.lookup(gated.GATED_NORM_FWD, args)
    return (time.perf_counter() - t0) * 1e6 / iters
