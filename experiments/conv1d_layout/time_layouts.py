"""Does our causal conv1d care where its channel-last input lives?

The fused layer hands the conv1d xBC as a slice of in_proj's output: a channel-last view whose
positions are d_in_proj elements apart. The tuning records (autotune_cli/tuning/conv1d.py) time
a dense channel-last tensor, positions conv_dim apart. This times our forward and backward and
causal-conv1d's functions (those mamba-ssm's fused layer calls) on both layouts of the same
shape, in one process (do_bench medians, L2 flushed), with the runtime's bundles as they are.

  python experiments/conv1d_layout/time_layouts.py [--batch N] [--seqlen N] [PRESET[@TP] ...]

Default: zamba2-2.7b at batch 4 x 2048 and nemotron-3-nano-30b at batch 2 x 8192. Needs a CUDA
GPU and the causal-conv1d package.
"""

from __future__ import annotations

import argparse
import sys


def main() -> int:
    import torch

    prog = "time_layouts.py"
    if not torch.cuda.is_available():
        print(f"{prog}: needs a CUDA GPU", file=sys.stderr)
        return 2
    try:
        from causal_conv1d.cpp_functions import (
            causal_conv1d_bwd_function,
            causal_conv1d_fwd_function,
        )
    except ImportError as e:
        print(f"{prog}: needs the causal-conv1d package with cpp_functions ({e})", file=sys.stderr)
        return 2
    from autotune_cli.benchmarks.layer import WIDTH, layer_shape
    from autotune_cli.presets import MODEL_PRESETS
    from mamba_tune.conv1d import conv1d_backward, conv1d_forward

    p = argparse.ArgumentParser(prog=prog)
    p.add_argument("presets", nargs="*", metavar="PRESET[@TP]")
    p.add_argument("--batch", type=int)
    p.add_argument("--seqlen", type=int)
    a = p.parse_args()
    runs = []
    for text in a.presets or ["zamba2-2.7b", "nemotron-3-nano-30b"]:
        name, _, tp = text.partition("@")
        if name not in MODEL_PRESETS:
            print(f"{prog}: unknown preset {name!r}; known: {', '.join(MODEL_PRESETS)}", file=sys.stderr)
            return 2
        default_batch, default_seqlen = (4, 2048) if name == "zamba2-2.7b" and not a.presets else (2, 8192)
        runs.append((text, layer_shape(MODEL_PRESETS[name], int(tp or 1), a.batch or default_batch,
                                       a.seqlen or default_seqlen)))
    dev, dt = torch.device("cuda"), torch.bfloat16
    torch.manual_seed(0)
    print(f"{torch.cuda.get_device_name()}: ms (ours, causal-conv1d) and causal-conv1d / ours")
    for label, s in runs:
        weight = torch.randn(s.conv_dim, WIDTH, device=dev, dtype=dt) * WIDTH ** -0.5
        bias = torch.randn(s.conv_dim, device=dev, dtype=dt) * 0.1
        zxbcdt = torch.randn(s.batch, s.seqlen, s.d_in_proj, device=dev, dtype=dt)
        layouts = {
            "layer slice": zxbcdt[..., s.dim:s.dim + s.conv_dim].transpose(1, 2),
            "dense": torch.randn(s.batch, s.seqlen, s.conv_dim, device=dev, dtype=dt).transpose(1, 2),
        }
        dout = torch.randn_like(layouts["dense"])
        for layout, x in layouts.items():
            t = _times(x, weight, bias, dout, conv1d_forward, conv1d_backward, causal_conv1d_fwd_function,
                       causal_conv1d_bwd_function)
            cells = "  ".join(f"{k} {o:.4f} / {c:.4f} ({c / o:.2f}x)" for k, (o, c) in t.items())
            print(f"{label} {s.text()} {layout} (position stride {x.stride(2)}): {cells}", flush=True)
    return 0


def _times(x, weight, bias, dout, ours_fwd, ours_bwd, cc_fwd, cc_bwd):  # noqa: ANN001, ANN202
    """{"fwd": (ours ms, causal-conv1d ms), "bwd": (...)} for one input."""
    from triton.testing import do_bench

    return {
        "fwd": (do_bench(lambda: ours_fwd(x, weight, bias, None, None, None, True)),
                do_bench(lambda: cc_fwd(x, weight, bias, None, None, None, True))),
        "bwd": (do_bench(lambda: ours_bwd(x, weight, bias, dout, None, None, None, None, False, True)),
                do_bench(lambda: cc_bwd(x, weight, bias, dout, None, None, None, None, False, True))),
    }


if __name__ == "__main__":
    sys.exit(main())
