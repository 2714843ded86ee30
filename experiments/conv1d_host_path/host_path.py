"""What the layer's conv1d calls cost besides their kernels: the callables `time_host_path.py` times.

In the account of mamba-ssm's `Mamba2` step at Zamba2-2.7B batch 4 x 2048 on an H200
(benchmarks/results/h200-module-account-zamba2-b4-l2048.json) the conv1d backward stage, timed
through `conv1d_backward` (the fused layer's call), ran 0.1805 ms against causal-conv1d's 0.1375
ms (0.76x), where the tuning record of the same key, timing the slide kernel alone on the same
layouts, measured 0.1189 ms (1.15x). `conv1d_backward` does more than launch the kernel: input
checks, the output and partial-sum buffers, the kernel's host code (its dweight and dbias
partials summed by torch), and two casts. On a host slow enough that mamba-ssm's eager step waited
3.0 ms, a do_bench median of such a call can be the host's time, not the GPU's. `calls` gives,
for one layer shape, the kernel's compiled host function alone, the layer's whole call and
causal-conv1d's function, forward and backward, on the same inputs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from mamba_tune import runtime
from mamba_tune.conv1d import bwd_slide, common, conv1d_backward, conv1d_forward, fwd


def layer_inputs(batch: int, seqlen: int, dim: int, row_stride: int, device: str,
                 seed: int = 0) -> dict[str, torch.Tensor]:
    """x the xBC slice of an in_proj output (channel-last rows `row_stride` apart), weight, bias and
    dout as the layer has them, bf16."""
    gen = torch.Generator(device=device).manual_seed(seed)

    def rnd(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen, device=device) * scale).to(torch.bfloat16)

    x = rnd(batch, seqlen, row_stride)[..., :dim].transpose(1, 2)
    return {"x": x, "weight": rnd(dim, 4, scale=0.5), "bias": rnd(dim, scale=0.1),
            "dout": rnd(batch, seqlen, dim).transpose(1, 2)}


def calls(t: dict[str, torch.Tensor]) -> dict[str, Callable[[], Any]]:
    """name -> a no-argument call: "fwd kernel" / "bwd kernel" (the runtime's compiled host function
    of its entry, its buffers made once), "fwd call" / "bwd call" (`conv1d_forward` /
    `conv1d_backward`, what the fused layer runs), and with causal-conv1d installed "fwd
    causal-conv1d" / "bwd causal-conv1d" (`causal_conv1d.cpp_functions`, what mamba-ssm's runs)."""
    x, w, b, dout = t["x"], t["weight"], t["bias"], t["dout"]
    fargs = (x, w, b, None, None, common.like(x), 4, True)
    bargs = (x, w, b, dout, None, None, None, common.like(x), None, 4, True)
    f_kernel = runtime.lookup(fwd.CAUSAL_CONV1D_FWD, fargs)
    b_kernel = runtime.lookup(bwd_slide.CAUSAL_CONV1D_BWD_SLIDE, bargs)
    out: dict[str, Callable[[], Any]] = {
        "fwd kernel": lambda: f_kernel(*fargs),
        "fwd call": lambda: conv1d_forward(x, w, b, None, None, None, True),
        "bwd kernel": lambda: b_kernel(*bargs),
        "bwd call": lambda: conv1d_backward(x, w, b, dout, None, None, None, None, False, True),
    }
    try:
        from causal_conv1d.cpp_functions import (
            causal_conv1d_bwd_function,
            causal_conv1d_fwd_function,
        )
    except ImportError:
        return out
    out["fwd causal-conv1d"] = lambda: causal_conv1d_fwd_function(x, w, b, None, None, None, True)
    out["bwd causal-conv1d"] = lambda: causal_conv1d_bwd_function(x, w, b, dout, None, None, None, None, False,
                                                                 True)
    return out
