"""Gated RMSNorm benchmark: ours (configs from the bundles) vs mamba-ssm, in one process.

Inputs are the call the Mamba-2 mixer makes: x and z (batch*seqlen, nheads*headdim) in the
given dtype, an fp32 weight, group_size = d / ngroups, z gate after the norm.
"""

from __future__ import annotations

from typing import Any

import torch

from autotune_cli.benchmarks.common import kernel_ms, wall_ms
from kernels import runtime
from kernels.norm import gated
from kernels.registry import ModelShape


def bench_norm(model_shapes: list[tuple[str, ModelShape]], dtype: torch.dtype) -> list[dict[str, Any]]:
    try:
        from mamba_ssm.ops.triton import layernorm_gated as lg
    except ImportError:
        lg = None
    rows_out: list[dict[str, Any]] = []
    for label, shape in model_shapes:
        dims = gated.GATED_NORM_FWD.dims_for(shape)
        assert dims is not None
        rows, d, gs = dims["rows"], dims["d"], dims["group_size"]
        gen = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(rows, d, device="cuda", dtype=dtype, generator=gen)
        z = torch.randn(rows, d, device="cuda", dtype=dtype, generator=gen)
        dy = torch.randn(rows, d, device="cuda", dtype=dtype, generator=gen)
        w = 1 + 0.1 * torch.randn(d, device="cuda", dtype=torch.float32, generator=gen)
        eps = 1e-6

        def ours_fwd():
            return gated._fwd(x, z, w, None, eps, gs, False, True)

        _, _, rstd = ours_fwd()

        def ours_bwd():
            return gated._bwd(dy, x, z, w, None, None, rstd, gs, False, True)

        cases: dict[str, tuple[Any, Any, int]] = {
            "fwd": (ours_fwd, None, gated._norm_bytes(dims, dtype, bwd=False)),
            "bwd": (ours_bwd, None, gated._norm_bytes(dims, dtype, bwd=True)),
        }
        if lg is not None:
            _, _, base_rstd = lg._layer_norm_fwd(x, w, None, eps, z=z, group_size=gs, norm_before_gate=False,
                                                 is_rms_norm=True)
            cases["fwd"] = (ours_fwd, lambda: lg._layer_norm_fwd(x, w, None, eps, z=z, group_size=gs,
                                                                 norm_before_gate=False, is_rms_norm=True),
                            cases["fwd"][2])
            cases["bwd"] = (ours_bwd, lambda: lg._layer_norm_bwd(dy, x, w, None, eps, None, base_rstd, z, gs,
                                                                 False, True), cases["bwd"][2])
        sources = runtime.resolutions()
        for direction, (ours, base, nbytes) in cases.items():
            tk = gated.GATED_NORM_FWD if direction == "fwd" else gated.GATED_NORM_BWD
            key = [k for k in sources if k.startswith(tk.name + "|") and f"rows={rows},d={d}," in k]
            ours_ms = kernel_ms(ours)
            row: dict[str, Any] = {
                "family": "norm", "model": label, "op": f"gated_norm_{direction}", "dtype": str(dtype).split(".")[-1],
                "shape": f"rows={rows} d={d} group_size={gs}", "config": sources.get(key[0], "?") if key else "?",
                "ours_ms": ours_ms, "ours_wall_ms": wall_ms(ours), "ours_gbps": nbytes / (ours_ms * 1e-3) / 1e9,
            }
            if base is not None:
                base_ms = kernel_ms(base)
                row.update(baseline="mamba-ssm", baseline_ms=base_ms, baseline_wall_ms=wall_ms(base),
                           baseline_gbps=nbytes / (base_ms * 1e-3) / 1e9, speedup=base_ms / ours_ms)
            rows_out.append(row)
    return rows_out


def lookup_us(iters: int = 20000) -> float:
    """Host cost (us) of finding the compiled kernel for a call that has been seen before."""
    import time

    x = torch.randn(64, 2, 32, device="cuda", dtype=torch.bfloat16)
    w = torch.ones(2, 32, device="cuda")
    args = (x, x, w, None, 1e-6, False, True)
    runtime.run(gated.GATED_NORM_FWD, args)
    t0 = time.perf_counter()
    for _ in range(iters):
        runtime.lookup(gated.GATED_NORM_FWD, args)
    return (time.perf_counter() - t0) * 1e6 / iters
